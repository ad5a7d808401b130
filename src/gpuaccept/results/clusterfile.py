"""``cluster-report.json`` written and read one node at a time (issue #27: fleet scale).

A cluster of more than :data:`LINE_LAYOUT_MIN_NODES` nodes, or one whose indented text would be too big
to read whole (:data:`gpuaccept.inputs.MAX_INPUT_BYTES`), is written in the *line layout*:
still one JSON document that any JSON reader reads as before, laid out as

    line 1     every key but ``nodes`` (``analysis`` included), then ``"nodes": [``
    line 2..   one node entry per line (compact JSON), each but the last followed by ``,``
    last line  ``]}``

so that :func:`iter_cluster` reads it a line at a time: the file is never held whole, and each
line is bounded (:data:`MAX_HEADER_BYTES`, :data:`MAX_ENTRY_BYTES`) instead of the whole file
(:data:`gpuaccept.inputs.MAX_INPUT_BYTES`). Smaller clusters are written indented, as before.
Validation of what is read is the caller's (:mod:`gpuaccept.results.load`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from gpuaccept.inputs import BadInput, loads_json

LINE_LAYOUT_MIN_NODES = 64
"""Clusters with more nodes than this are written in the line layout."""
MAX_HEADER_BYTES = 256 * 1024 * 1024
"""The most bytes of the first line (the cluster's summary and analysis)."""
MAX_ENTRY_BYTES = 64 * 1024 * 1024
"""The most bytes of one node's line (a node report of a few MB; ``report.json`` itself is not bounded by
the cluster's size)."""
MAX_NODES = 1_000_000
"""The most node lines read (the cluster schema's bound on ``expected_nodes``)."""
NODES_OPEN = '"nodes": ['
CLOSE = "]}"


def write_cluster_file(cluster: Any, fh: TextIO, *, line_layout: bool | None = None) -> None:
    """Write ``cluster`` (a :class:`~gpuaccept.model.ClusterReport`) to ``fh``: indented, as always, when it has
    at most :data:`LINE_LAYOUT_MIN_NODES` nodes and the text fits a whole-file read
    (:data:`gpuaccept.inputs.MAX_INPUT_BYTES`); else (or with ``line_layout``) in the line layout, a node at
    a time."""
    from gpuaccept import inputs

    if not line_layout and len(cluster.nodes) <= LINE_LAYOUT_MIN_NODES:
        text = json.dumps(cluster.to_dict(), indent=2, allow_nan=False) + "\n"
        if line_layout is False or len(text.encode()) <= inputs.MAX_INPUT_BYTES:
            fh.write(text)
            return
        del text
    head = {**cluster.header_dict(), "analysis": cluster.analysis}
    write_line_layout(fh, head, (json.dumps(e.to_dict(), allow_nan=False) for e in cluster.nodes))


def write_line_layout(fh: TextIO, head: dict[str, Any], lines: Iterable[str]) -> None:
    """The line layout: ``head`` (every key but ``nodes``), then each of ``lines`` (a node entry's compact
    JSON, one line each), then the close."""
    text = json.dumps(head, allow_nan=False)
    fh.write(text[:-1] + (", " if len(head) else "") + NODES_OPEN + "\n")
    prev: str | None = None
    for line in lines:
        if prev is not None:
            fh.write(prev + ",\n")
        prev = line
    if prev is not None:
        fh.write(prev + "\n")
    fh.write(CLOSE + "\n")


def _line(fh: Any, limit: int, where: str, what: str) -> str:
    raw: bytes = fh.readline(limit + 1)
    if len(raw) > limit:
        raise BadInput(where, "", f"{what} is longer than {limit // (1024 * 1024)} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(where, "", f"{what}: not UTF-8 text (byte {exc.start})") from None


def is_line_layout(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts like a cluster report in the line layout (reads at most
    its first line; a FIFO or device is never opened here)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as fh:
            first = fh.readline(MAX_HEADER_BYTES + 1)
    except OSError:
        return False
    return first.rstrip(b"\r\n").endswith(NODES_OPEN.encode()) and first.startswith(b"{")


def iter_cluster(path: Path) -> tuple[dict[str, Any], Iterator[tuple[int, dict[str, Any]]]]:
    """The header (every key, ``nodes`` empty) of a line-layout cluster report, and an iterator of
    ``(index, node entry)`` read a line at a time; :class:`~gpuaccept.inputs.BadInput` (an InputError)
    naming the file and line when malformed or cut short. The iterator owns the open file."""
    header, raw = iter_cluster_raw(path)
    return header, ((n, parse_line(where, lineno, body)) for n, where, lineno, body in raw)


def iter_cluster_raw(path: Path) -> tuple[dict[str, Any], Iterator[RawLine]]:
    """:func:`iter_cluster` with each node line left as text: ``(index, file, line number, JSON text)``, for
    :func:`parse_line` elsewhere (a worker process). The framing (commas, the close, the bounds) is checked
    here as the lines are read."""
    where = str(path)
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise BadInput(where, "", f"cannot read: {exc.strerror or type(exc).__name__}") from None
    try:
        first = _line(fh, MAX_HEADER_BYTES, where, "line 1").rstrip("\r\n")
        if not first.endswith(NODES_OPEN):
            raise BadInput(where, "", "not a cluster report in the line layout")
        header = loads_json(first + "]}", f"{where}: line 1")
    except BaseException:
        fh.close()
        raise
    if not isinstance(header, dict):
        fh.close()
        raise BadInput(where, "", "line 1 is not a JSON object")
    return header, _raw_entries(fh, where)


RawLine = tuple[int, str, int, str]
"""A node line as read: (its index among the nodes, the file, its line number, its JSON text)."""


def parse_line(where: str, lineno: int, body: str) -> dict[str, Any]:
    """A node line's entry (strict JSON, bounded depth); BadInput naming the file and line when it is none."""
    data = loads_json(body, f"{where}: line {lineno}")
    if not isinstance(data, dict):
        raise BadInput(where, "", f"line {lineno}: a node entry must be a JSON object")
    return data


def _raw_entries(fh: Any, where: str) -> Iterator[RawLine]:
    with fh:
        n = 0
        ended = comma = False
        for lineno in range(2, MAX_NODES + 3):
            text = _line(fh, MAX_ENTRY_BYTES, where, f"line {lineno}")
            if not text:
                break
            body = text.strip()
            if ended:
                if body:
                    raise BadInput(where, "", f"line {lineno}: text after the closing {CLOSE}")
                continue
            if body == CLOSE:
                if comma:
                    raise BadInput(where, "", f"line {lineno - 1}: a comma before the closing {CLOSE}")
                ended = True
                continue
            if n and not comma:
                raise BadInput(where, "", f"line {lineno - 1}: no comma between two node entries")
            comma = body.endswith(",")
            yield n, where, lineno, body[:-1] if comma else body
            n += 1
        else:
            raise BadInput(where, "", f"more than {MAX_NODES} node lines")
        if not ended:
            raise BadInput(where, "", f"cut short: no closing {CLOSE} after {n} node line(s)")
