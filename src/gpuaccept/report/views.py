"""What every rendering needs from a report: node list, counts, outliers, metric groupings, number formats.

Pure functions over :mod:`gpuaccept.model`; nothing here writes or imports
anything heavy. Node reports and cluster reports are both seen as a list of
:class:`NodeView` so each renderer has one code path.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuaccept.model import (
    BARE_UNITS,
    CheckResult,
    ClusterReport,
    Metric,
    NodeReport,
    NodeState,
    Status,
    Verdict,
    count_states,
    fmt_plain,
    miss_text,
)
from gpuaccept.model import STATES as STATES  # every shown state, worst first, re-exported
from gpuaccept.model import state_label as state_label
from gpuaccept.report.units import fmt_number as fmt_number  # the shared number formats, re-exported
from gpuaccept.report.units import fmt_value as fmt_value
from gpuaccept.results.rows import tags_json_memo

STATUS_ORDER = (Status.ERROR, Status.FAIL, Status.WARN, Status.PASS, Status.SKIP)
# Units whose larger values are better when no threshold says otherwise.
_HIGHER_BETTER_UNITS = {"TFLOP/s", "GFLOP/s", "GB/s", "GiB/s", "MB/s", "Gbit/s", "it/s", "samples/s"}
_LOWER_BETTER_UNITS = {"ms", "us", "s", "C"}


@dataclass
class NodeView:
    """One node of a run: its report, or the reason it has none (a missing node of a cluster)."""

    host: str
    report: NodeReport | None
    reason: str = ""
    node_rank: int | None = None

    @property
    def verdict(self) -> Verdict:
        return self.report.verdict if self.report is not None else Verdict.FAILURE

    @property
    def missing(self) -> bool:
        return self.report is None

    @property
    def checks(self) -> list[CheckResult]:
        """The report's checks, plus an ERROR for what an unfinished run left undone (see :func:`unfinished`)."""
        return [*self.report.checks, *unfinished(self.report)] if self.report is not None else []


def unfinished(report: NodeReport) -> list[CheckResult]:
    """An ERROR for the check a stopped or killed run was running (``in_flight``), or, for a report
    left ``running`` with none in flight, one named ``run``: such a run is never shown as clean."""
    if report.verdict not in (Verdict.RUNNING, Verdict.INTERRUPTED):
        return []
    stopped = report.verdict is Verdict.INTERRUPTED
    how = ("interrupted while it ran" if stopped
           else "did not finish: the run ended without a verdict (killed, or still running)")
    if report.in_flight:
        return [CheckResult(report.in_flight, Status.ERROR, how, details={"unfinished": True})]
    why = ("the run was interrupted before it finished" if stopped
           else "the run did not finish: no verdict (killed, or still running)")
    return [CheckResult("run", Status.ERROR, why, details={"unfinished": True})]


def node_views(report: NodeReport | ClusterReport) -> list[NodeView]:
    """The nodes of ``report`` in report order (a node report is one node)."""
    if isinstance(report, NodeReport):
        return [NodeView(report.host, report)]
    views = []
    for entry in report.nodes:
        rep = entry.report if entry.state is NodeState.REPORTED else None
        reason = entry.reason or ("" if rep is not None else "no report")
        views.append(NodeView(entry.host, rep, reason, entry.node_rank))
    return views


def verdict_of(report: NodeReport | ClusterReport) -> Verdict:
    return report.verdict


def cpu_only_text(report: NodeReport | ClusterReport) -> str | None:
    """``CPU only: <why>`` for a run that used no GPU (for a cluster: which nodes), None for a GPU run;
    renderers put it beside the verdict so that a CPU-only SUCCESS never reads as a GPU acceptance."""
    if isinstance(report, NodeReport):
        return f"CPU only: {report.cpu_only}" if report.cpu_only else None
    hosts = report.cpu_only_nodes()
    if not hosts:
        return None
    shown = ", ".join(hosts[:8]) + (", ..." if len(hosts) > 8 else "")
    return f"CPU only on {len(hosts)} of {len(report.nodes)} node(s): {shown}"


def check_host(check: CheckResult, node: NodeView) -> str:
    """The host a check ran on (a rank's own host when recorded, else the node's)."""
    return check.host or node.host


def status_counts(nodes: Iterable[NodeView]) -> dict[Status, int]:
    """Checks by status over ``nodes``, every status present (0 when none)."""
    counts = dict.fromkeys(STATUS_ORDER, 0)
    for n in nodes:
        for c in n.checks:
            counts[c.status] += 1
    return counts


def state_counts(nodes: Iterable[NodeView]) -> dict[str, int]:
    """Checks by shown state over ``nodes`` (:attr:`gpuaccept.model.CheckResult.state`: a pass with a
    performance figure not judged counts as ``not_judged``, not as ``pass``), every state present."""
    return count_states([c for n in nodes for c in n.checks])


def not_judged(nodes: Iterable[NodeView]) -> list[tuple[str, str, str]]:
    """(host, check, metric) for each performance figure measured but not judged, each once, in order."""
    return list(dict.fromkeys((check_host(c, n), c.name, name) for n in nodes for c in n.checks
                              for name in c.not_judged))


def check_names(nodes: Iterable[NodeView]) -> list[str]:
    """Check names in the order they first appear."""
    seen: dict[str, None] = {}
    for n in nodes:
        for c in n.checks:
            seen.setdefault(c.name, None)
    return list(seen)


def problems(nodes: Sequence[NodeView]) -> list[tuple[NodeView, CheckResult]]:
    """(node, check) for every check that is not pass or skip, worst first, then by host."""
    rows = [(n, c) for n in nodes for c in n.checks if c.status in (Status.ERROR, Status.FAIL, Status.WARN)]
    return sorted(rows, key=lambda r: (-r[1].status.severity, r[0].host, r[1].name))


def next_steps_of(nodes: Sequence[NodeView]) -> list[tuple[str, CheckResult, dict[str, list[str]]]]:
    """(host, check, its next steps) for every failed or errored check, in :func:`problems` order; the commands
    name the run's other hosts where a command takes several (``isolate --nodes``)."""
    from gpuaccept.nextsteps import next_steps

    hosts = [n.host for n in nodes]
    out = []
    for n, c in problems(nodes):
        steps = next_steps(c, n.report, hosts if len(hosts) > 1 else None)
        if steps:
            out.append((check_host(c, n), c, steps))
    return out


def shown_name(result: CheckResult) -> str:
    """The check's name, with the rank and host of a distributed run's per-rank result (``collectives (rank 1 on
    gpu02)``), marked ``(re-run)`` for a deeper re-run of ``run --budget``'s second pass."""
    where = ""
    if result.rank is not None:
        where = f" (rank {result.rank}" + (f" on {result.host}" if result.host else "") + ")"
    return f"{result.name}{where}" + (" (re-run)" if result.is_rerun else "")


def failed_names(report: NodeReport) -> list[str]:
    """The failed checks as :func:`shown_name` names them (each rank of a distributed run apart), in order, once."""
    return list(dict.fromkeys(shown_name(c) for c in report.checks if c.status.is_failure))


def tags_key(tags: dict[str, Any]) -> str:
    """Canonical text of a tag dict (sorted keys): equal tags give equal keys (memoised: a fleet shares a few)."""
    return tags_json_memo(tags)


@dataclass(frozen=True)
class Outlier:
    """One entry of ``ClusterReport.analysis["outliers"]`` (computed by gpuaccept.results.analysis).

    ``z`` is the robust z-score, ``median``/``mad`` the reference group's
    statistics in the metric's unit, ``direction`` ``low`` or ``high``.
    """

    host: str
    device: str | None
    check: str
    metric: str
    tags: dict[str, Any]
    value: float
    median: float | None
    mad: float | None
    z: float | None
    direction: str
    scope: str
    unit: str = ""

    @property
    def key(self) -> tuple[str, str | None, str, str, str]:
        return (self.host, self.device, self.check, self.metric, tags_key(self.tags))


def _same(a: Any, b: Any) -> bool:
    if a == b:
        return True
    return a is not None and b is not None and str(a) == str(b)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def analysis_of(report: NodeReport | ClusterReport, analysis: dict[str, Any] | None = None) -> dict[str, Any]:
    """``analysis`` when given, else the cluster report's own analysis (a node report has none)."""
    if analysis is not None:
        return analysis
    return report.analysis if isinstance(report, ClusterReport) else {}


def analysis_coverage(report: NodeReport | ClusterReport, analysis: dict[str, Any] | None = None,
                      ) -> dict[str, Any] | None:
    """The coverage of the outlier analysis (:func:`gpuaccept.results.coverage.coverage_of`: SKU/metric groups,
    how many compared fully, partly, not at all and why), or None when there is no analysis."""
    from gpuaccept.results.coverage import coverage_of

    found = analysis_of(report, analysis)
    if not isinstance(found, dict) or not any(k in found for k in ("coverage", "stats")):
        return None
    return coverage_of(found)


def outliers(report: NodeReport | ClusterReport, analysis: dict[str, Any] | None = None) -> list[Outlier]:
    """The outliers of ``analysis`` (default: the report's own), largest |z| first.

    Entries without host, check, metric and a numeric value are ignored.
    """
    analysis = analysis_of(report, analysis)
    raw = analysis.get("outliers") if isinstance(analysis, dict) else None
    out: list[Outlier] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        host, check, metric = item.get("host"), item.get("check"), item.get("metric")
        value = _num(item.get("value"))
        if not all(isinstance(s, str) for s in (host, check, metric)) or value is None:
            continue
        device = item.get("device")
        tags = item.get("tags")
        out.append(Outlier(host=str(host), device=device if isinstance(device, str) else None, check=str(check),
                           metric=str(metric), tags=dict(tags) if isinstance(tags, dict) else {}, value=value,
                           median=_num(item.get("median")), mad=_num(item.get("mad")), z=_num(item.get("z")),
                           direction=str(item.get("direction") or ""), scope=str(item.get("scope") or ""),
                           unit=str(item.get("unit") or "")))
    return sorted(out, key=lambda o: -abs(o.z) if o.z is not None else 0.0)


class OutlierIndex:
    """Looks up whether a metric (or a host and metric name) was flagged as an outlier."""

    def __init__(self, items: Sequence[Outlier]) -> None:
        self.items = list(items)
        self._by_host_metric: dict[tuple[str, str, str], list[Outlier]] = {}
        for o in items:
            self._by_host_metric.setdefault((o.host, o.check, o.metric), []).append(o)

    def find(self, host: str, check: str, m: Metric) -> Outlier | None:
        """The outlier entry for metric ``m`` of ``check`` on ``host``: same device, and every tag of the entry
        equal in ``m`` (the analysis drops tags such as ``stat`` that do not identify a measurement)."""
        for o in self._by_host_metric.get((host, check, m.name), []):
            if o.device == m.device and all(_same(m.tags.get(k), v) for k, v in o.tags.items()):
                return o
        return None

    def node_level(self, host: str, check: str, name: str) -> list[Outlier]:
        """Entries without a device for a metric measured per GPU: the node as a whole is off."""
        return [o for o in self._by_host_metric.get((host, check, name), []) if o.device is None]

    def for_host_metric(self, host: str, check: str, name: str) -> list[Outlier]:
        return self._by_host_metric.get((host, check, name), [])

    def hosts(self) -> set[str]:
        return {o.host for o in self.items}


def direction(m: Metric) -> int:
    """+1 when larger values are better, -1 when smaller are, 0 when unknown (threshold first, then unit)."""
    if m.threshold is not None:
        return 1 if m.threshold.op == ">=" else -1
    if m.unit in _HIGHER_BETTER_UNITS:
        return 1
    if m.unit in _LOWER_BETTER_UNITS or m.name.endswith("_errors"):
        return -1
    return 0


def threshold_met(m: Metric) -> bool | None:
    """Whether ``m`` meets its threshold (None when it has none)."""
    if m.threshold is None:
        return None
    return m.threshold.met_by(m.value)


def reference_label(m: Metric, default: str = "expected") -> str:
    """What ``m.expected`` is called where it is shown: ``baseline`` when a fleet baseline set it, ``fabric``
    when it was derived from the fabric (:mod:`gpuaccept.hw.fabric_expect`), else ``default``."""
    source = m.expected_source or ""
    if source.startswith("baseline"):
        return "baseline"
    return "fabric" if source.startswith("fabric") else default


def reference_note(m: Metric) -> str:
    """How a fabric-derived expectation was derived (``8x NDR 400 Gb/s per node = 400 GB/s, efficiency
    0.85``); empty for other references."""
    source = m.expected_source or ""
    return source.partition(":")[2].strip() if m.expected is not None and source.startswith("fabric") else ""


def reference_text(m: Metric, default: str = "expected") -> str:
    """``baseline 26.33 GB/s`` / ``spec 989.4 TFLOP/s`` / ``fabric 340 GB/s (8x NDR 400 Gb/s per node =
    400 GB/s, efficiency 0.85)``, in the value's display unit, or in the metric's own unit beside a missed
    bound (as :func:`bound_text`); empty without a reference."""
    if m.expected is None:
        return ""
    note = reference_note(m)
    shown = (fmt_plain(m.expected) + ("" if m.unit in BARE_UNITS else f" {m.unit}") if threshold_met(m) is False
             else fmt_value(m.expected, m.unit, like=m.value))  # beside a missed bound: in the bound's unit
    return (f"{reference_label(m, default)} {shown}"
            + (f" ({note})" if note else ""))


def bound_text(m: Metric) -> str:
    """``>= 593.6 TFLOP/s``; a missed bound as written, in the metric's own unit (as :func:`value_text`
    shows the value then: ``>= 100,000 TFLOP/s``); a bound clamped to the edge of the metric's values says so
    (``>= 0 GB/s (clamped: baseline spread too wide to bound)``). Empty without a threshold."""
    t = m.threshold
    if t is None:
        return ""
    missed = not t.met_by(m.value)
    written = f"{t.op} {fmt_plain(t.value)}" + ("" if m.unit in BARE_UNITS else f" {m.unit}")
    text = written if missed else f"{t.op} {fmt_value(t.value, m.unit, like=m.value)}"
    if t.clamped:
        what = "baseline spread" if t.source.startswith("baseline") else "rule"
        text += f" (clamped: {what} too wide to bound)"
    return text


def value_text(m: Metric) -> str:
    """``612 TFLOP/s``: the value in its display unit (:func:`fmt_value`), or, when it misses its threshold, in
    the unit the bound is written in, with the digits that keep the comparison true (``0.005567 TFLOP/s``)."""
    shown = miss_text(m)
    if not shown or not math.isfinite(m.value):
        return fmt_value(m.value, m.unit)
    return shown.split(" ")[0] + ("" if m.unit in BARE_UNITS else f" {m.unit}")


def metric_status(m: Metric) -> Status:
    """PASS, or the threshold's severity when the value misses it (PASS when there is no threshold)."""
    met = threshold_met(m)
    if met is None or met:
        return Status.PASS
    return m.threshold.severity if m.threshold is not None else Status.PASS


def headline_metric(check: CheckResult, key: str | None = None) -> Metric | None:
    """A check's headline metric, the one definition every rendering (console, Markdown, HTML) shows.

    1. A metric that misses its threshold: the one furthest beyond its bound
       (what explains a failure or warning).
    2. Else the check's key metric (:func:`key_pattern`, a glob): the first
       name it matches (in the check's metric order, the same from run to
       run), its weakest value over devices (lowest where higher is better,
       highest where lower is).
    3. Else the first metric with a reference (``expected``) and a direction,
       its weakest value against that reference over devices; else None.
    """
    finite = [m for m in check.metrics if math.isfinite(m.value)]
    missed = [m for m in finite if threshold_met(m) is False]
    if missed:
        def margin(m: Metric) -> float:
            thr = m.threshold
            assert thr is not None
            scale = abs(thr.value) or 1.0
            return (m.value - thr.value) / scale if thr.op == ">=" else (thr.value - m.value) / scale
        return min(missed, key=margin)
    pattern = key_pattern(check, key)
    if pattern:
        import fnmatch

        hits = [m for m in finite if fnmatch.fnmatchcase(m.name, pattern)]
        if hits:
            hits = [m for m in hits if m.name == hits[0].name]
            return min(hits, key=lambda m: m.value * (direction(m) or 1))
    ref = [m for m in finite if m.expected and direction(m) != 0]
    if ref:
        ref = [m for m in ref if m.name == ref[0].name]
        return min(ref, key=lambda m: direction(m) * m.value / float(m.expected or 1.0))
    return None


def key_pattern(check: CheckResult, key: str | None = None) -> str | None:
    """The glob naming a check's key metric: the one the check chose for its device (``details.key_metric``),
    else ``key`` (the caller's ``Check.key_metric``), else the registered check class's ``key_metric``."""
    chosen = check.details.get("key_metric") if isinstance(check.details, dict) else None
    if isinstance(chosen, str) and chosen:
        return chosen
    if key:
        return key
    from gpuaccept.checks import registry
    from gpuaccept.errors import GpuacceptError

    try:
        cls = registry().get(check.name)
    except GpuacceptError:  # a broken plugin must not stop a report from rendering
        return None
    pattern = getattr(cls, "key_metric", None) if cls is not None else None
    return pattern if isinstance(pattern, str) and pattern else None


def fmt_bytes(n: float) -> str:
    """Binary-prefixed byte count as nccl-tests labels sizes: ``1 KiB``, ``256 MiB``, ``8 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    h, minutes = divmod(minutes, 60)
    return f"{h} h {minutes:02d} min"


def fmt_tags(tags: dict[str, Any], skip: Iterable[str] = ()) -> str:
    """``dtype=bf16 size_bytes=1 GiB`` (sizes in binary units), keys sorted."""
    skip_set = set(skip)
    parts = []
    for k in sorted(tags):
        if k in skip_set:
            continue
        v = tags[k]
        if k.endswith("_bytes") and isinstance(v, (int, float)) and not isinstance(v, bool):
            parts.append(f"{k}={fmt_bytes(v)}")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)


def device_sort_key(device: str | None) -> tuple[int, int, str]:
    """Order ``cuda:2`` before ``cuda:10``; node-wide (None) first."""
    if device is None:
        return (0, 0, "")
    head, _, idx = device.partition(":")
    return (1, int(idx), head) if idx.isdigit() else (2, 0, device)
