"""Reading a report to render: from a file, a run directory, or the history store by run id.

A reference is tried in this order:

1. an existing file: a node ``report.json`` or a cluster report (JSON with ``"kind": "cluster"``);
2. an existing directory: its ``cluster-report.json``, else its ``report.json``;
3. a run id (or a unique prefix) in the history store (``--db``, ``$GPUACCEPT_DB``, or the default);
4. a run id as a directory under the report directory (``<report-dir>/<run-id>/report.json``).

Anything malformed raises :class:`~gpuaccept.errors.InputError` naming the file
and what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuaccept.errors import GpuacceptError, InputError
from gpuaccept.model import SCHEMA_VERSION, ClusterReport, NodeReport

CLUSTER_FILE = "cluster-report.json"
NODE_FILE = "report.json"

Report = NodeReport | ClusterReport


def _schema() -> dict[str, Any]:
    from importlib import resources

    text = resources.files("gpuaccept").joinpath("data/report.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _validate_node(data: Any, where: str) -> None:
    """Raise InputError when ``data`` does not follow the report JSON schema."""
    import jsonschema

    if not isinstance(data, dict):
        raise InputError(f"{where}: not a gpuaccept report (expected a JSON object, got {type(data).__name__})")
    if isinstance(data.get("schema_version"), int) and data["schema_version"] > SCHEMA_VERSION:
        raise InputError(f"{where}: report schema version {data['schema_version']} is newer than this gpuaccept "
                         f"understands ({SCHEMA_VERSION}); upgrade gpuaccept")
    validator = jsonschema.Draft202012Validator(_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise InputError(f"{where}: not a valid gpuaccept report at {path}: {error.message}")


def report_from_dict(data: Any, where: str) -> Report:
    """A NodeReport or ClusterReport from parsed JSON; InputError naming ``where`` when malformed."""
    if isinstance(data, dict) and data.get("kind") == "cluster":
        nodes = data.get("nodes")
        if not isinstance(nodes, list):
            raise InputError(f"{where}: cluster report without a 'nodes' list")
        for i, entry in enumerate(nodes):
            if not isinstance(entry, dict) or not isinstance(entry.get("host"), str):
                raise InputError(f"{where}: nodes[{i}] is not a node entry with a 'host'")
            if entry.get("report") is not None:
                _validate_node(entry["report"], f"{where}: nodes[{i}] ({entry['host']})")
        try:
            return ClusterReport.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: not a valid cluster report: {type(exc).__name__}: {exc}") from None
    _validate_node(data, where)
    try:
        return NodeReport.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{where}: not a valid gpuaccept report: {type(exc).__name__}: {exc}") from None


def load_file(path: Path) -> Report:
    """Read and validate a report file."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a gpuaccept report (not UTF-8 text)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    return report_from_dict(data, str(path))


def load_dir(path: Path) -> Report:
    """The report in a run directory: ``cluster-report.json`` first, else ``report.json``."""
    for name in (CLUSTER_FILE, NODE_FILE):
        candidate = path / name
        if candidate.is_file():
            return load_file(candidate)
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
    store = open_store(url)
    try:
        return store.get_run(run_id, host=host).report
    finally:
        store.close()
