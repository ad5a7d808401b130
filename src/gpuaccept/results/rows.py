"""Reports flattened into the history's rows: pure functions, no database.

One ``runs`` row per node report and per cluster report (a node of a cluster
links to it by ``parent``), one ``checks`` row per check, one ``metrics`` row
per metric with its host, device, check, name, value, unit, the tags
``dtype`` and ``size_bytes`` pulled out for queries, and the hardware it
measured (``hw_kind``, ``hw_id``, ``hw_serial``: :mod:`gpuaccept.results.hwid`;
NULL where unknown), and one ``hardware`` row per piece of hardware the node
report names (kind, id, serial, device, beside the host). NaN and infinite values
are stored as NULL. The full report JSON is kept on the run row so a stored run
reads back exactly as it was written (``budget`` included).

A deeper re-run of ``run --budget``'s second pass (:attr:`~gpuaccept.model.CheckResult.is_rerun`) is
stored like any result, its ``checks`` and ``metrics`` rows flagged ``rerun = 1``: the history keeps
it, and the queries that build series (trends, baselines) read the first pass only (``rerun = 0``),
so each run is one value of a series, measured as planned, not two.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.model import ClusterReport, NodeReport
from gpuaccept.results.config_history import config_rows
from gpuaccept.results.hwid import HwId, hardware_of_checks
from gpuaccept.results.timespec import iso_to_epoch

RUN_COLUMNS = ("run_id", "kind", "host", "profile", "backend", "job_id", "started", "started_ts", "finished",
               "verdict", "device", "version", "expected_nodes", "sku", "report_json", "stored_at")
CHECK_COLUMNS = ("name", "status", "reason", "duration_s", "rank", "host", "rerun")
METRIC_COLUMNS = ("host", "check_name", "name", "device", "value", "unit", "expected", "threshold_op",
                  "threshold_value", "dtype", "size_bytes", "tags_json", "rerun", "hw_kind", "hw_id", "hw_serial")
HARDWARE_COLUMNS = ("host", "kind", "hw_id", "serial", "device")


@dataclass
class FlatCheck:
    """A ``checks`` row (values in CHECK_COLUMNS order) and its ``metrics`` rows (METRIC_COLUMNS order)."""

    row: tuple[Any, ...]
    metrics: list[tuple[Any, ...]] = field(default_factory=list)


@dataclass
class FlatRun:
    """A ``runs`` row (RUN_COLUMNS order) with its checks and ``hardware`` rows (HARDWARE_COLUMNS order)."""

    row: tuple[Any, ...]
    checks: list[FlatCheck] = field(default_factory=list)
    hardware: list[tuple[Any, ...]] = field(default_factory=list)
    config: list[tuple[Any, ...]] = field(default_factory=list)
    """``config`` rows (:data:`gpuaccept.results.config_history.CONFIG_COLUMNS` order)."""

    @property
    def run_id(self) -> str:
        return str(self.row[0])

    @property
    def host(self) -> str:
        return str(self.row[2])


def finite(x: float | None) -> float | None:
    """``x`` as a float, or None for None, NaN and infinities (SQL NULL)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def tags_json(tags: dict[str, Any]) -> str:
    """Canonical JSON of a metric's tags (sorted keys, no spaces): equal tags give equal text."""
    return json.dumps(tags, sort_keys=True, separators=(",", ":"), default=str)


_TAGS_CACHE: dict[tuple[tuple[str, type, Any], ...], str] = {}


def tags_json_memo(tags: dict[str, Any]) -> str:
    """:func:`tags_json`, memoised: a fleet's metrics share a few hundred tag sets (bounded cache)."""
    try:
        key = tuple(sorted((k, type(v), v) for k, v in tags.items()))  # the type: 1, 1.0 and True are equal keys
        hit = _TAGS_CACHE.get(key)
    except TypeError:  # an unhashable or unorderable tag value
        return tags_json(tags)
    if hit is None:
        hit = tags_json(tags)
        if len(_TAGS_CACHE) >= 4096:
            _TAGS_CACHE.clear()
        _TAGS_CACHE[key] = hit
    return hit


def node_sku(report: dict[str, Any]) -> str | None:
    """The node's GPU SKU id (``skus.yaml``) from a report dict: ``mixed`` when GPUs differ, None when unknown.

    Read from the env check's NVML GPU list, else from any check's per-device details.
    """
    found: set[str] = set()
    for check in report.get("checks") or []:
        details = check.get("details") or {}
        if not isinstance(details, dict):
            continue
        nvml = details.get("nvml")
        if check.get("name") == "env" and isinstance(nvml, dict):
            for gpu in nvml.get("gpus") or []:
                if isinstance(gpu, dict) and isinstance(gpu.get("sku"), str):
                    found.add(gpu["sku"])
    if not found:
        for check in report.get("checks") or []:
            devices = (check.get("details") or {}).get("devices") if isinstance(check.get("details"), dict) else None
            if isinstance(devices, dict):
                for dev in devices.values():
                    if isinstance(dev, dict) and isinstance(dev.get("sku"), str):
                        found.add(dev["sku"])
    if not found:
        return None
    return found.pop() if len(found) == 1 else "mixed"


def _metric_row(host: str, check_name: str, m: Any, hw: HwId | None, rerun: bool) -> tuple[Any, ...]:
    tags = dict(m.tags)
    dtype = tags.get("dtype")
    size = tags.get("size_bytes")
    size_bytes = int(size) if isinstance(size, (int, float)) and not isinstance(size, bool) and math.isfinite(size) \
        else None
    thr = m.threshold
    return (host, check_name, m.name, m.device, finite(m.value), m.unit, finite(m.expected),
            thr.op if thr else None, finite(thr.value) if thr else None,
            str(dtype) if dtype is not None else None, size_bytes, tags_json_memo(tags), int(rerun),
            hw.kind if hw else None, hw.id if hw else None, hw.serial if hw else None)


def flatten_node(report: NodeReport, stored_at: str, data: dict[str, Any] | None = None) -> FlatRun:
    """Rows for one node report (``data``: its ``to_dict()`` when the caller has it already).
    InputError when its ``started`` time is unreadable."""
    data = report.to_dict() if data is None else data
    started_ts = iso_to_epoch(report.started, f"report {report.run_id}: started")
    row = (report.run_id, "node", report.host, report.profile, None, None, report.started, started_ts,
           report.finished, report.verdict.value, report.device, report.version, None, node_sku(data),
           json.dumps(data, separators=(",", ":")), stored_at)
    hw = hardware_of_checks((c.name, c.details) for c in report.checks)
    checks = []
    for c in report.checks:
        host = c.host or report.host
        ours = host == report.host  # a check merged from another host's ranks measured that host's hardware
        checks.append(FlatCheck(
            row=(c.name, c.status.value, c.reason, finite(c.duration_s), c.rank, host, int(c.is_rerun)),
            metrics=[_metric_row(host, c.name, m, hw.lookup(c.name, m.device) if ours else None, c.is_rerun)
                     for m in c.metrics]))
    hardware = [(report.host, h.kind, h.id, h.serial, device) for h, device in hw.identities()]
    config = config_rows(report.host, ((c.name, c.details) for c in report.checks))
    return FlatRun(row=row, checks=checks, hardware=hardware, config=config)


def flatten_cluster(report: ClusterReport, stored_at: str) -> tuple[FlatRun, list[FlatRun]]:
    """Rows for a cluster report and for each node report in it.

    The cluster row's JSON keeps every node entry (missing nodes with their
    reason) but not the node reports themselves: those are their own rows,
    named in the entry by ``report_run_id`` and ``report_host``.
    """
    data = report.to_dict()
    nodes = []
    for entry, entry_dict in zip(report.nodes, data["nodes"], strict=True):
        if entry.report is not None:
            nodes.append(flatten_node(entry.report, stored_at, entry_dict["report"]))
            entry_dict["report"] = None
            entry_dict["report_run_id"] = entry.report.run_id
            entry_dict["report_host"] = entry.report.host
    started_ts = iso_to_epoch(report.started, f"cluster report {report.run_id}: started")
    skus = {n.row[RUN_COLUMNS.index("sku")] for n in nodes} - {None}
    sku = (skus.pop() if len(skus) == 1 else "mixed") if skus else None
    row = (report.run_id, "cluster", "", None, report.backend, report.job_id, report.started, started_ts,
           report.finished, report.verdict.value, None, None, report.expected_nodes, sku,
           json.dumps(data, separators=(",", ":")), stored_at)
    return FlatRun(row=row), nodes
