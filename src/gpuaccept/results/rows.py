"""Reports flattened into the history's rows: pure functions, no database.

One ``runs`` row per node report and per cluster report (a node of a cluster
links to it by ``parent``), one ``checks`` row per check, one ``metrics`` row
per metric with its host, device, check, name, value, unit, the tags
``dtype`` and ``size_bytes`` pulled out for queries, and the hardware it
measured (``hw_kind``, ``hw_id``, ``hw_serial``: :mod:`gpuaccept.results.hwid`;
NULL where unknown), and one ``hardware`` row per piece of hardware the node
report names (kind, id, serial, device, beside the host). NaN and infinite values
are stored as NULL. The full report is kept on the run row so a stored run
reads back exactly as it was written (``budget`` included): since schema v7 as zlib-compressed compact JSON in
``report_z`` (about 6x smaller; ``report_json`` is then empty), read back by :func:`unpack_report`.

A cluster report is flattened a node at a time (:class:`ClusterRows`), so a store can take a cluster report
read a node line at a time (:func:`gpuaccept.results.load.open_cluster`) in bounded memory.

A deeper re-run of ``run --budget``'s second pass (:attr:`~gpuaccept.model.CheckResult.is_rerun`) is
stored like any result, its ``checks`` and ``metrics`` rows flagged ``rerun = 1``: the history keeps
it, and the queries that build series (trends, baselines) read the first pass only (``rerun = 0``),
so each run is one value of a series, measured as planned, not two.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.errors import InputError
from gpuaccept.model import ClusterReport, NodeEntry, NodeReport, Verdict
from gpuaccept.results.config_history import config_rows
from gpuaccept.results.hwid import HwId, hardware_of_checks
from gpuaccept.results.timespec import iso_to_epoch

RUN_COLUMNS = ("run_id", "kind", "host", "profile", "backend", "job_id", "started", "started_ts", "finished",
               "verdict", "device", "version", "expected_nodes", "sku", "report_json", "stored_at", "report_z")
CHECK_COLUMNS = ("name", "status", "reason", "duration_s", "rank", "host", "rerun")
METRIC_COLUMNS = ("host", "check_name", "name", "device", "value", "unit", "expected", "threshold_op",
                  "threshold_value", "dtype", "size_bytes", "tags_json", "rerun", "hw_kind", "hw_id", "hw_serial")
HARDWARE_COLUMNS = ("host", "kind", "hw_id", "serial", "device")
ZLIB_LEVEL = 3
"""zlib level of a stored report: 1-3 cost the same (about 1.6 ms per 160 KB node report), 6 three times that."""
MAX_REPORT_BYTES = 256 * 1024 * 1024
"""The most bytes a stored report decompresses to (a damaged or hostile database is refused, not inflated)."""


ENTRY_MARK = b"E"
"""The byte before the zlib stream of a ``report_z`` that holds a cluster report's node line as read (schema v8):
the node's report is that entry's ``report``. A zlib stream never starts with it (its low nibble is not 8)."""


def pack_report(data: dict[str, Any]) -> bytes:
    """A report dict as the history stores it (``report_z``): zlib of its compact JSON."""
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), ZLIB_LEVEL)


def pack_entry_text(text: str) -> bytes:
    """A cluster report's node line as read (validated, its ``report`` a node report) as ``report_z`` stores it:
    :data:`ENTRY_MARK`, then zlib of the text. Not dumped again: ``history --import`` of a fleet spent more time
    re-serialising each node's report than compressing it."""
    return ENTRY_MARK + zlib.compress(text.encode(), ZLIB_LEVEL)


def unpack_report(text: str | None, packed: bytes | None, where: str) -> dict[str, Any]:
    """The report dict of a ``runs`` row: ``report_z`` when set (schema v7), else the ``report_json`` text of a
    run stored before. InputError naming ``where`` when it cannot be read."""
    try:
        if packed is not None:
            packed = bytes(packed)
            entry = packed[:1] == ENTRY_MARK
            inflate = zlib.decompressobj()
            raw = inflate.decompress(packed[1:] if entry else packed, MAX_REPORT_BYTES)
            if inflate.unconsumed_tail or not inflate.eof:
                raise ValueError(f"not a whole zlib stream, or over {MAX_REPORT_BYTES // (1024 * 1024)} MiB")
            data = json.loads(raw)
            if entry:
                data = data.get("report") if isinstance(data, dict) else None
        else:
            data = json.loads(text or "")
    except (ValueError, zlib.error) as exc:
        raise InputError(f"{where}: the stored report cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{where}: the stored report is not a JSON object")
    return data


@dataclass
class FlatCheck:
    """A ``checks`` row (values in CHECK_COLUMNS order) and its ``metrics`` rows (METRIC_COLUMNS order)."""

    row: tuple[Any, ...]
    metrics: list[tuple[Any, ...]] = field(default_factory=list)


@dataclass
class SplitMetrics:
    """A node run's metric rows split as the history stores them (:mod:`gpuaccept.results.metricrows`), before
    any id is known: its distinct keys and places (``KEY_COLUMNS``, ``PLACE_COLUMNS`` tuples), and per check, in
    order, each metric as (key index, place index, value, expected, threshold op, threshold value, rerun)."""

    keys: list[tuple[Any, ...]]
    places: list[tuple[Any, ...]]
    checks: list[list[tuple[Any, ...]]]


@dataclass
class FlatRun:
    """A ``runs`` row (RUN_COLUMNS order) with its checks and ``hardware`` rows (HARDWARE_COLUMNS order)."""

    row: tuple[Any, ...]
    checks: list[FlatCheck] = field(default_factory=list)
    hardware: list[tuple[Any, ...]] = field(default_factory=list)
    config: list[tuple[Any, ...]] = field(default_factory=list)
    """``config`` rows (:data:`gpuaccept.results.config_history.CONFIG_COLUMNS` order)."""
    split: SplitMetrics | None = None
    """The checks' metric rows already split into keys, places and numbers (``flatten_node_data(split=True)``,
    in a worker process; each check's ``metrics`` then empty), or None."""

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


_TAGS_CACHE: dict[tuple[Any, ...], tuple[str, str | None, int | None]] = {}


def _tags_key(tags: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable key that tells tag sets apart: the keys, the values and their types (1, 1.0 and True are
    equal values), in the dict's order (the same tags in another order only make another cache entry).
    TypeError for an unhashable value."""
    values = tags.values()
    key = (*tags, *values, *map(type, values))
    hash(key)
    return key


def _tag_columns(tags: dict[str, Any]) -> tuple[str, str | None, int | None]:
    """The ``tags_json``, ``dtype`` and ``size_bytes`` columns of a metric's tags (uncached)."""
    dtype = tags.get("dtype")
    size = tags.get("size_bytes")
    size_bytes = int(size) if isinstance(size, (int, float)) and not isinstance(size, bool) and math.isfinite(size) \
        else None
    return tags_json(tags), str(dtype) if dtype is not None else None, size_bytes


def _tag_columns_memo(tags: dict[str, Any]) -> tuple[str, str | None, int | None]:
    """:func:`_tag_columns`, memoised: a fleet's metrics share a few hundred tag sets (bounded cache)."""
    try:
        key = _tags_key(tags)
    except TypeError:  # an unhashable tag value
        return _tag_columns(tags)
    hit = _TAGS_CACHE.get(key)
    if hit is None:
        hit = _tag_columns(tags)
        if len(_TAGS_CACHE) >= 4096:
            _TAGS_CACHE.clear()
        _TAGS_CACHE[key] = hit
    return hit


def tags_json_memo(tags: dict[str, Any]) -> str:
    """:func:`tags_json`, memoised: a fleet's metrics share a few hundred tag sets (bounded cache)."""
    return _tag_columns_memo(tags)[0]


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


def _split_metric(host: str, check_name: str, m: dict[str, Any], lookup: Callable[[str, Any], HwId | None] | None,
                  rerun: bool, keys: dict[tuple[Any, ...], int], places: dict[tuple[Any, ...], int]
                  ) -> tuple[Any, ...]:
    """A metric given as its report JSON as one :class:`SplitMetrics` row, its key and place numbered in ``keys``
    and ``places`` (the columns of :func:`_metric_row`, without building its row first)."""
    tags_text, dtype, size_bytes = _tag_columns_memo(m.get("tags") or {})
    device = m.get("device")
    hw = lookup(check_name, device) if lookup else None
    key = (check_name, m["name"], m["unit"], tags_text, dtype, size_bytes)
    place = (host, device, hw.kind, hw.id, hw.serial) if hw else (host, device, None, None, None)
    thr = m.get("threshold")
    return (keys.setdefault(key, len(keys)), places.setdefault(place, len(places)), finite(m["value"]),
            finite(m.get("expected")), thr["op"] if thr else None, finite(thr["value"]) if thr else None, int(rerun))


def _metric_row(host: str, check_name: str, m: dict[str, Any], hw: HwId | None, rerun: bool) -> tuple[Any, ...]:
    """The METRIC_COLUMNS row of a metric given as its report JSON (``Metric.to_dict``)."""
    tags_text, dtype, size_bytes = _tag_columns_memo(m.get("tags") or {})
    thr = m.get("threshold")
    return (host, check_name, m["name"], m.get("device"), finite(m["value"]), m["unit"], finite(m.get("expected")),
            thr["op"] if thr else None, finite(thr["value"]) if thr else None, dtype, size_bytes, tags_text,
            int(rerun), hw.kind if hw else None, hw.id if hw else None, hw.serial if hw else None)


def flatten_node(report: NodeReport, stored_at: str, data: dict[str, Any] | None = None) -> FlatRun:
    """Rows for one node report (``data``: its ``to_dict()`` when the caller has it already).
    InputError when its ``started`` time is unreadable."""
    return flatten_node_data(report.to_dict() if data is None else data, stored_at)


def flatten_node_data(data: dict[str, Any], stored_at: str, packed: bytes | None = None, split: bool = False,
                      keys: dict[tuple[Any, ...], int] | None = None) -> FlatRun:
    """Rows for one node report given as its JSON (``NodeReport.to_dict``, or a report file's validated JSON,
    stored as it is; ``packed``: its ``report_z`` when the caller has it, :func:`pack_entry_text`; ``split``:
    its metrics as :class:`SplitMetrics` in ``split``, not as rows, their keys numbered in ``keys`` when given,
    shared by several nodes). InputError when its ``started`` time is unreadable."""
    run_id, host = data["run_id"], data["host"]
    checks_data = data.get("checks") or []
    row = (run_id, "node", host, data["profile"], None, None, data["started"],
           iso_to_epoch(data["started"], f"report {run_id}: started"), data.get("finished"), data["verdict"],
           data.get("device"), data.get("version", ""), None, node_sku(data), "", stored_at,
           pack_report(data) if packed is None else packed)
    hw = hardware_of_checks((c["name"], c.get("details", {})) for c in checks_data)
    checks = []
    keys = {} if keys is None else keys
    places: dict[tuple[Any, ...], int] = {}
    split_checks: list[list[tuple[Any, ...]]] = []
    for c in checks_data:
        name, details = c["name"], c.get("details", {})
        rerun = isinstance(details, dict) and "rerun" in details  # CheckResult.is_rerun
        where = c.get("host") or host
        ours = where == host  # a check merged from another host's ranks measured that host's hardware
        lookup = hw.lookup if ours else None
        metrics = c.get("metrics") or []
        if split:
            split_checks.append([_split_metric(where, name, m, lookup, rerun, keys, places) for m in metrics])
        checks.append(FlatCheck(
            row=(name, c["status"], c.get("reason", ""), finite(c.get("duration_s", 0.0)), c.get("rank"), where,
                 int(rerun)),
            metrics=[] if split else [_metric_row(where, name, m, lookup(name, m.get("device")) if lookup else None,
                                                  rerun) for m in metrics]))
    hardware = [(host, h.kind, h.id, h.serial, device) for h, device in hw.identities()]
    config = config_rows(host, ((c["name"], c.get("details", {})) for c in checks_data))
    return FlatRun(row=row, checks=checks, hardware=hardware, config=config,
                   split=SplitMetrics(list(keys), list(places), split_checks) if split else None)


@dataclass
class Flattened:
    """A node entry as the cluster's row keeps it (``data``: the entry without its report, with its verdict and
    the node run it names) and its node run's rows (``flat``; None for a missing node)."""

    data: dict[str, Any]
    flat: FlatRun | None


def flatten_entry(entry: NodeEntry | dict[str, Any], stored_at: str, index: int, text: str | None = None,
                  split: bool = False, keys: dict[tuple[Any, ...], int] | None = None) -> Flattened:
    """The rows of the ``index``-th node entry of a cluster (a NodeEntry, or a cluster report file's validated
    JSON of one: stored as read, not rebuilt; ``text``: that JSON's line as read, then stored as the node's
    report, :func:`pack_entry_text`; ``split``, ``keys``: as :func:`flatten_node_data`); pure, so a worker
    process may make them. InputError when it cannot be stored."""
    if isinstance(entry, NodeEntry):
        report = entry.report.to_dict() if entry.report is not None else None
        data = dataclasses.replace(entry, report=None).to_dict()
    else:
        report = entry.get("report")
        try:
            data = NodeEntry.from_dict({**entry, "report": None}).to_dict()
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"node entry {index}: {type(exc).__name__}: {exc}") from None
    data["verdict"] = report["verdict"] if report is not None else Verdict.FAILURE.value  # NodeEntry.verdict
    if report is None:
        return Flattened(data, None)
    try:
        flat = flatten_node_data(report, stored_at, None if text is None else pack_entry_text(text), split, keys)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"node entry {index} ({data['host']}): not a node report that can be "
                         f"stored: {type(exc).__name__}: {exc}") from None
    data["report_run_id"] = flat.run_id
    data["report_host"] = flat.host
    return Flattened(data, flat)


class ClusterRows:
    """The rows of a cluster report built a node at a time: :meth:`add` each node entry (its node run's rows
    come back), then :meth:`run` gives the cluster's own row.

    The cluster row's report keeps every node entry (missing nodes with their reason) but not the node
    reports themselves: those are their own rows, named in the entry by ``report_run_id`` and ``report_host``.
    Only those small entries are held, never the node reports. InputError when ``started`` is unreadable.
    """

    def __init__(self, header: ClusterReport, stored_at: str) -> None:
        self.header = header
        self.stored_at = stored_at
        self.started_ts = iso_to_epoch(header.started, f"cluster report {header.run_id}: started")
        self.entries: list[dict[str, Any]] = []
        self.skus: set[str] = set()
        self.all_success = True

    def add(self, entry: NodeEntry | dict[str, Any] | Flattened) -> FlatRun | None:
        """Note ``entry`` (a NodeEntry, or a cluster report file's validated JSON of one, or either already
        :func:`flatten_entry`'d) in the cluster's report; its node run's rows (None for a missing node).
        InputError when it cannot be stored."""
        done = entry if isinstance(entry, Flattened) else flatten_entry(entry, self.stored_at, len(self.entries))
        data, flat = done.data, done.flat
        self.entries.append(data)
        self.all_success = self.all_success and data["verdict"] == Verdict.SUCCESS.value
        if flat is not None:
            sku = flat.row[RUN_COLUMNS.index("sku")]
            if sku is not None:
                self.skus.add(sku)
        return flat

    def verdict(self) -> Verdict:
        """:attr:`ClusterReport.verdict` of the entries added: SUCCESS only when every expected node reported and
        none failed."""
        n = len(self.entries)
        return Verdict.SUCCESS if n and n >= self.header.expected_nodes and self.all_success else Verdict.FAILURE

    def run(self) -> FlatRun:
        """The cluster's ``runs`` row, for the entries added so far."""
        h = self.header
        data = {**h.header_dict(), "verdict": self.verdict().value, "nodes": self.entries, "analysis": h.analysis}
        sku = (next(iter(self.skus)) if len(self.skus) == 1 else "mixed") if self.skus else None
        row = (h.run_id, "cluster", "", None, h.backend, h.job_id, h.started, self.started_ts, h.finished,
               data["verdict"], None, None, h.expected_nodes, sku, "", self.stored_at, pack_report(data))
        return FlatRun(row=row)


def flatten_cluster(report: ClusterReport, stored_at: str) -> tuple[FlatRun, list[FlatRun]]:
    """Rows for a cluster report and for each node report in it (:class:`ClusterRows`)."""
    rows = ClusterRows(report, stored_at)
    nodes = [flat for entry in report.nodes if (flat := rows.add(entry)) is not None]
    return rows.run(), nodes
