"""Reading a report to render: from a file, a run directory, or the history store by run id.

A reference is tried in this order:

1. an existing file: a node ``report.json`` or a cluster report (JSON with ``"kind": "cluster"``; one in the
   line layout of :mod:`gpuaccept.results.clusterfile` is read a node at a time, see :func:`open_cluster`);
2. an existing directory: its ``cluster-report.json``, else its ``report.json``, else its
   ``results.jsonl`` (a run whose report.json was lost: an ``interrupted`` report is rebuilt
   from the check results, the run id from the directory name);
3. a run id (or a unique prefix) in the history store (``--db``, ``$GPUACCEPT_DB``, or the default);
4. a run id as a directory under the report directory (``<report-dir>/<run-id>/report.json``).

Anything malformed raises :class:`~gpuaccept.errors.InputError` naming the file
and what is wrong with it. This is the one definition of a valid report: every
command that reads reports (``report``, ``compare``, ``baseline``, ``analyze``,
``history --import``) validates through :func:`report_from_dict`: a node report
against the published JSON Schema (``data/report.schema.json``), a cluster
report against :data:`CLUSTER_SCHEMA` and each of its node reports against the
node schema (both compiled by :mod:`gpuaccept.results.fastcheck`); run ids must be safe as a file name
(:data:`RUN_ID_PATTERN`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from gpuaccept.argtypes import RUN_ID_PATTERN
from gpuaccept.errors import GpuacceptError, InputError
from gpuaccept.inputs import load_json_file, loads_json, one_line, read_text
from gpuaccept.model import SCHEMA_VERSION, CheckResult, ClusterReport, NodeEntry, NodeReport, Verdict
from gpuaccept.results.clusterfile import RawLine, is_line_layout, iter_cluster_raw, parse_line
from gpuaccept.results.fastcheck import Problem, compile_schema

CLUSTER_FILE = "cluster-report.json"
NODE_FILE = "report.json"
RESULTS_FILE = "results.jsonl"


Report = NodeReport | ClusterReport

_DATE = {"type": "string", "minLength": 1, "maxLength": 64}
CLUSTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema_version", "kind", "run_id", "backend", "started", "nodes"],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "kind": {"const": "cluster"},
        "run_id": {"type": "string", "pattern": RUN_ID_PATTERN.pattern},
        "backend": {"type": "string", "minLength": 1},
        "job_id": {"type": ["string", "null"]},
        "started": _DATE,
        "finished": {"anyOf": [_DATE, {"type": "null"}]},
        "expected_nodes": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
        "verdict": {"enum": ["running", "success", "failure", "interrupted"]},
        "analysis": {"type": "object"},
        "nodes": {"type": "array", "items": {
            "type": "object",
            "required": ["host", "state"],
            "additionalProperties": False,
            "properties": {
                "host": {"type": "string", "minLength": 1},
                "state": {"enum": ["reported", "missing"]},
                "report": {"type": ["object", "null"]},
                "node_rank": {"type": ["integer", "null"], "minimum": 0},
                "reason": {"type": "string"},
                "verdict": {"type": "string"},
            },
        }},
    },
}
"""The shape of ``cluster-report.json`` (each node's ``report`` is checked against the node schema)."""
_ENTRY_SCHEMA: dict[str, Any] = CLUSTER_SCHEMA["properties"]["nodes"]["items"]


@functools.lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    from importlib import resources

    text = resources.files("gpuaccept").joinpath("data/report.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def check_run_id(run_id: Any, where: str) -> str:
    """``run_id`` when it is safe to use as a file and directory name; InputError otherwise."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        shown = one_line(repr(run_id))[:80]
        raise InputError(f"{where}: run_id {shown} is not a valid run id (letters, digits and ._:@+=- only, "
                         "no path separator, not starting with a dot)")
    return run_id


def _newer(data: dict[str, Any], where: str) -> None:
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise InputError(f"{where}: written by a newer gpuaccept: schema_version {version} > {SCHEMA_VERSION}; "
                         "upgrade gpuaccept to read it")


@functools.cache
def _fast(kind: str) -> Callable[[Any], Problem | None]:
    """The compiled validator of ``kind``: ``node``, ``check`` (one results.jsonl line) or ``cluster``."""
    if kind in ("cluster", "entry"):
        return compile_schema(CLUSTER_SCHEMA if kind == "cluster" else _ENTRY_SCHEMA)
    return compile_schema(_schema(), "#/$defs/check" if kind == "check" else None)


def _validate(data: Any, kind: str, where: str, what: str) -> None:
    """InputError naming the first problem when ``data`` breaks the ``kind`` schema. The compiled
    validator decides; only a rejected input is run through jsonschema too, for its familiar message."""
    problem = _fast(kind)(data)
    if problem is None:
        return
    import jsonschema

    schema = {"cluster": CLUSTER_SCHEMA, "entry": _ENTRY_SCHEMA}.get(kind) or _schema()
    if kind == "check":
        schema = {"$ref": "#/$defs/check", "$defs": schema["$defs"]}
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(data))
    at, message = problem if error is None else (tuple(error.absolute_path), error.message)
    path = "/".join(str(p) for p in at) or "(top level)"
    raise InputError(f"{where}: not a valid gpuaccept {what} at {one_line(path)[:120]}: {one_line(message)[:200]}")


def _validate_node(data: Any, where: str) -> None:
    """Raise InputError when ``data`` does not follow the report JSON schema."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: not a gpuaccept report (expected a JSON object, got {type(data).__name__})")
    _newer(data, where)
    _validate(data, "node", where, "report")
    check_run_id(data["run_id"], where)


def report_from_dict(data: Any, where: str) -> Report:
    """A NodeReport or ClusterReport from parsed JSON; InputError naming ``where`` when malformed."""
    if isinstance(data, dict) and data.get("kind") == "cluster":
        _newer(data, where)
        _validate(data, "cluster", where, "cluster report")
        for i, entry in enumerate(data["nodes"]):
            if entry.get("report") is not None:
                _validate_node(entry["report"], f"{where}: nodes[{i}] ({one_line(entry['host'])[:80]})")
        try:
            return ClusterReport.from_dict(data)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{where}: not a valid cluster report: {type(exc).__name__}: "
                             f"{one_line(str(exc))[:200]}") from None
    _validate_node(data, where)
    try:
        return NodeReport.from_dict(data)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"{where}: not a valid gpuaccept report: {type(exc).__name__}: "
                         f"{one_line(str(exc))[:200]}") from None


def load_file(path: Path) -> Report:
    """Read and validate a report file (bounded in size, strict JSON, finite numbers); a cluster report in the
    line layout (:mod:`gpuaccept.results.clusterfile`) is read a node at a time, each line bounded instead."""
    if is_line_layout(path):
        cluster, nodes = open_cluster(path)
        cluster.nodes.extend(nodes)
        return cluster
    return report_from_dict(load_json_file(path, "gpuaccept report"), str(path))


def open_cluster(path: Path) -> tuple[ClusterReport, Iterator[NodeEntry]]:
    """A cluster report read incrementally: its header as a ClusterReport with no nodes (``analysis`` included),
    and an iterator of its validated node entries, read one line at a time. A file in the line layout is
    streamed; any other cluster report file is read whole (bounded by
    :data:`gpuaccept.inputs.MAX_INPUT_BYTES`). InputError names the file (and line) when malformed."""
    where = str(path)
    if not is_line_layout(path):
        report = load_file(path)
        if not isinstance(report, ClusterReport):
            raise InputError(f"{where}: a node report, not a cluster report")
        nodes, report.nodes = report.nodes, []
        return report, iter(nodes)
    cluster, valid = open_cluster_raw(path)
    return cluster, (entry_from_dict(data, at) for at, data in valid)


def open_cluster_raw(path: Path) -> tuple[ClusterReport, Iterator[tuple[str, dict[str, Any]]]]:
    """:func:`open_cluster` of a file in the line layout with each node entry validated but left as parsed JSON,
    paired with where it is (``FILE: nodes[i]``), for a reader that builds only part of it
    (:func:`entry_from_dict`; ``gpuaccept report`` of a fleet, :mod:`gpuaccept.report.slim`)."""
    cluster, raw = open_cluster_lines(path)
    return cluster, ((at, data) for _n, at, data in map(validated_entry, raw))


def open_cluster_chunks(path: Path, fn: Callable[[list[ValidEntry]], R], *, workers: int | None = None
                        ) -> tuple[ClusterReport, Iterator[R]]:
    """:func:`open_cluster_raw` with the node lines parsed, validated and given to ``fn`` a chunk at a time in
    worker processes (:func:`map_valid_chunks`)."""
    cluster, raw = open_cluster_lines(path)
    return cluster, map_valid_chunks(raw, fn, workers=workers, what=f"the node lines of {path}")


def map_valid_chunks(raw: Iterator[RawLine], fn: Callable[[list[ValidEntry]], R], *, workers: int | None = None,
                     what: str = "the node lines") -> Iterator[R]:
    """The node lines of :func:`open_cluster_lines` parsed, validated and given to ``fn`` a chunk at a time in
    worker processes (:func:`gpuaccept.results.parallel.ordered_chunks`): ``fn`` gets each chunk's
    ``(index, FILE: nodes[i], entry)`` and its results come back in the file's order. The same errors, in
    the same order, as a read in one process. ``fn``: a module-level function or a partial of one."""
    from gpuaccept.results.parallel import ordered_chunks

    _fast("entry"), _fast("node")  # compiled once here, not in every worker
    return ordered_chunks(functools.partial(_validated_chunk, fn), raw, workers=workers, what=what)


ValidEntry = tuple[int, str, dict[str, Any]]
"""A validated node entry: its index, where it is (``FILE: nodes[i]``) and its parsed JSON."""
ValidLine = tuple[int, str, dict[str, Any], str]
"""A validated node entry with its line's JSON text as read (:func:`map_valid_lines`)."""
R = TypeVar("R")


def validated_entry(line: RawLine) -> ValidEntry:
    """A node line parsed and validated (InputError naming the file and line, or the node, when malformed)."""
    n, where, lineno, body = line
    data = parse_line(where, lineno, body)
    at = f"{where}: nodes[{n}]"
    _validate(data, "entry", at, "cluster report node")
    if data.get("report") is not None:
        _validate_node(data["report"], f"{at} ({one_line(data['host'])[:80]})")
    return n, at, data


def _validated_chunk(fn: Callable[[list[ValidEntry]], R], lines: list[RawLine]) -> R:
    return fn([validated_entry(line) for line in lines])


def _validated_lines(fn: Callable[[list[ValidLine]], R], lines: list[RawLine]) -> R:
    return fn([(*validated_entry(line), line[3]) for line in lines])


def map_valid_lines(raw: Iterator[RawLine], fn: Callable[[list[ValidLine]], R], *, workers: int | None = None,
                    what: str = "the node lines") -> Iterator[R]:
    """:func:`map_valid_chunks` whose ``fn`` also gets each line's JSON text as read (to store it as it is)."""
    from gpuaccept.results.parallel import ordered_chunks

    _fast("entry"), _fast("node")
    return ordered_chunks(functools.partial(_validated_lines, fn), raw, workers=workers, what=what)


def open_cluster_lines(path: Path) -> tuple[ClusterReport, Iterator[RawLine]]:
    """A line-layout cluster report's validated header (no nodes) and its node lines as text
    (:func:`gpuaccept.results.clusterfile.iter_cluster_raw`), for :func:`map_valid_chunks`."""
    where = str(path)
    header, raw = iter_cluster_raw(path)
    try:
        if header.get("kind") != "cluster":
            raise InputError(f"{where}: line 1: not a cluster report (no \"kind\": \"cluster\")")
        _newer(header, where)
        _validate(header, "cluster", where, "cluster report")
        try:
            cluster = ClusterReport.from_dict(header)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{where}: not a valid cluster report: {type(exc).__name__}: "
                             f"{one_line(str(exc))[:200]}") from None
    except BaseException:
        getattr(raw, "close", lambda: None)()
        raise
    return cluster, raw


def entry_from_dict(data: dict[str, Any], at: str) -> NodeEntry:
    """The NodeEntry of a validated node entry; InputError naming ``at`` when it still does not make one."""
    try:
        return NodeEntry.from_dict(data)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"{at}: not a valid node entry: {type(exc).__name__}: "
                         f"{one_line(str(exc))[:200]}") from None


def open_cluster_data(path: Path) -> tuple[ClusterReport, Iterator[dict[str, Any]]]:
    """:func:`open_cluster_raw` without the places: each node entry as its validated JSON object, not rebuilt as
    model objects (for ``history --import``, which stores the data as read). InputError as there."""
    cluster, valid = open_cluster_raw(path)
    return cluster, (data for _at, data in valid)


def _started_from(run_id: str, results: Path) -> str:
    stamp = run_id.split("-", 1)[0]
    try:
        when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        when = datetime.fromtimestamp(results.stat().st_mtime, timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def load_results_dir(path: Path) -> NodeReport:
    """The ``interrupted`` node report rebuilt from a run directory's ``results.jsonl`` alone.

    The run id is the directory's name, the host the one the results name (else the
    one in the run id), the start the run id's time stamp (else the file's time);
    ``results.jsonl`` does not record the profile, so it reads as the default,
    ``standard``. A torn last line (a run killed while writing) is left out.
    """
    results = path / RESULTS_FILE
    where = str(results)
    run_id = check_run_id(path.resolve().name, str(path))
    checks: list[CheckResult] = []
    lines = read_text(results, "results.jsonl").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = loads_json(line, f"{where}: line {n}")
        except InputError:
            if n == len(lines):
                break
            raise
        _validate(data, "check", f"{where}: line {n}", "check result")
        try:
            checks.append(CheckResult.from_dict(data))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{where}: line {n}: not a check result: {one_line(str(exc))[:200]}") from None
    if not checks:
        raise InputError(f"{where}: no check results (and no {NODE_FILE} beside it)")
    host = next((c.host for c in checks if c.host), None)
    if host is None:
        m = re.match(r"^\d{8}T\d{6}Z-(.+)-[0-9a-f]{4}$", run_id)
        host = m.group(1) if m else "unknown"
    return NodeReport(run_id=run_id, host=host, profile="standard", started=_started_from(run_id, results),
                      verdict=Verdict.INTERRUPTED, checks=checks)


def load_dir(path: Path) -> Report:
    """The report in a run directory: ``cluster-report.json`` first, else ``report.json``, else a
    report rebuilt from ``results.jsonl``."""
    for name in (CLUSTER_FILE, NODE_FILE):
        candidate = path / name
        if candidate.is_file():
            return load_file(candidate)
    if (path / RESULTS_FILE).is_file():
        return load_results_dir(path)
    runs = sorted(p.name for p in path.iterdir() if (p / NODE_FILE).is_file() or (p / CLUSTER_FILE).is_file()) \
        if path.is_dir() else []
    if runs:
        shown = ", ".join(runs[-3:])
        raise InputError(f"{path}: a report directory holding {len(runs)} runs; name one (latest: {shown})")
    raise InputError(f"{path}: no {CLUSTER_FILE} or {NODE_FILE} in this directory")


def narrow_to_host(report: Report, host: str | None) -> Report:
    """The node report of ``host`` inside a cluster report (``report`` unchanged when ``host`` is None)."""
    if host is None:
        return report
    if isinstance(report, NodeReport):
        if report.host != host:
            raise InputError(f"run {report.run_id} is from host {report.host}, not {host}")
        return report
    for entry in report.nodes:
        if entry.host == host:
            if entry.report is None:
                raise InputError(f"host {host} did not report in cluster run {report.run_id}: "
                                 f"{entry.reason or 'missing'}")
            return entry.report
    hosts = ", ".join(e.host for e in report.nodes[:8])
    raise InputError(f"host {host} is not part of cluster run {report.run_id} (hosts: {hosts})")


def load_report(ref: str, *, db: str | None = None, host: str | None = None,
                report_dir: str | None = None) -> Report:
    """The report that ``ref`` names (see the module docstring for the lookup order)."""
    path = Path(ref).expanduser()
    if path.is_file():
        return narrow_to_host(load_file(path), host)
    if path.is_dir():
        return narrow_to_host(load_dir(path), host)
    if path.exists():
        raise InputError(f"{ref}: not a regular file or directory (a device, pipe or socket); give a report "
                         "file, a run directory or a run id")
    looks_like_path = "/" in ref or ref.endswith(".json")
    if looks_like_path:
        raise InputError(f"{ref}: no such file or directory")
    store_error: GpuacceptError | None = None
    try:
        return narrow_to_host(_from_store(ref, db, host), host)
    except GpuacceptError as exc:
        store_error = exc
    if report_dir:
        run_dir = Path(report_dir).expanduser() / ref
        if run_dir.is_dir():
            return narrow_to_host(load_dir(run_dir), host)
    raise InputError(f"{ref}: not a file, and not a run in the history ({store_error})")


def _from_store(run_id: str, db: str | None, host: str | None) -> Report:
    from gpuaccept.results.dburl import resolve_db_url
    from gpuaccept.results.history import open_store

    url = resolve_db_url(db)
    if url.kind == "sqlite" and url.path is not None and not url.path.exists():
        raise InputError(f"no history database at {url.path}")  # do not create one just to look
    store = open_store(url, read_only=True)
    try:
        return store.get_run(run_id, host=host).report
    finally:
        store.close()
