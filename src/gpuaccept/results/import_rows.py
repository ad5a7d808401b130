"""``history --import`` of a fleet: each node's rows made in worker processes (issue #27: fleet scale).

:func:`open_cluster_rows` reads a line-layout cluster report's node lines, and worker processes
(:func:`gpuaccept.results.load.map_valid_lines`) parse and validate them 16 at a time and make each node's
rows (:func:`gpuaccept.results.rows.flatten_entry`; the node's report kept as its line's text, compressed, not
serialised again) with its metrics split into keys, places and numbers
(:class:`gpuaccept.results.rows.SplitMetrics`), so that the one process that writes
(:meth:`gpuaccept.results.store.Store.add_cluster_stream`) only looks up ids and inserts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuaccept.model import ClusterReport
from gpuaccept.results.load import ValidLine, map_valid_lines, open_cluster_lines
from gpuaccept.results.parallel import flat
from gpuaccept.results.rows import Flattened, flatten_entry


def flatten_chunk(stored_at: str, part: list[ValidLine]) -> list[Flattened]:
    """:func:`flatten_entry` of each validated entry of a chunk (its line's text stored as the node's report),
    its metrics split into keys, places and numbers (:class:`gpuaccept.results.rows.SplitMetrics`), in a worker
    process (:func:`gpuaccept.results.load.map_valid_lines`), so that the one process that writes only looks up
    ids. The chunk's nodes number their keys in one list, which goes back to the writer once (pickle sends an
    object once), and is looked up there once: a fleet's nodes measure the same things."""
    keys: dict[tuple[Any, ...], int] = {}
    out = [flatten_entry(data, stored_at, n, text, split=True, keys=keys) for n, _at, data, text in part]
    shared = list(keys)
    for done in out:
        if done.flat is not None and done.flat.split is not None:
            done.flat.split.keys = shared
    return out


def open_cluster_rows(path: Path, stored_at: str, *, workers: int | None = None
                      ) -> tuple[ClusterReport, Iterator[Flattened]]:
    """A line-layout cluster report's header and each node's rows, made in worker processes a chunk at a time
    and read back in the file's order (``history --import`` of a fleet); errors as a one-process read."""
    cluster, raw = open_cluster_lines(path)
    return cluster, flat(map_valid_lines(raw, functools.partial(flatten_chunk, stored_at), workers=workers,
                                         what=f"the node lines of {path}"))
