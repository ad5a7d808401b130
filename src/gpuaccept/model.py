"""The result model read by everything: Metric, CheckResult, NodeReport.

This module imports nothing of gpuaccept's and nothing heavy. Every class
converts to and from plain JSON-able dicts; ``data/report.schema.json``
documents the same shapes.
"""

from __future__ import annotations

import enum
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1

_URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^@\s]*@")
_SECRET_OPTION = re.compile(r"^(--?[A-Za-z0-9-]*(?:password|passwd|token|secret)[A-Za-z0-9-]*=).+$", re.IGNORECASE)


def redact_argv(argv: list[str]) -> list[str]:
    """``argv`` as it may be stored: URL passwords (``postgresql://user:pw@host``) become ``***``,
    as do the values of ``--*password*=``/``--*token*=``/``--*secret*=`` options."""
    out = []
    for arg in argv:
        arg = _URL_CREDENTIALS.sub(r"\1:***@", str(arg))
        out.append(_SECRET_OPTION.sub(r"\1***", arg))
    return out


class Status(str, enum.Enum):
    """Outcome of one check. ``skip`` means "not measurable here", never a pass."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def severity(self) -> int:
        """Order for combining statuses: the worst one wins."""
        return _SEVERITY[self]

    @property
    def is_failure(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


_SEVERITY = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}


def worst(*statuses: Status) -> Status:
    """The most severe of ``statuses`` (``pass`` for none)."""
    if not statuses:
        return Status.PASS
    return max(statuses, key=lambda s: s.severity)


class Verdict(str, enum.Enum):
    """Overall outcome of a node or cluster run."""

    RUNNING = "running"
    SUCCESS = "success"
    FAILURE = "failure"
    INTERRUPTED = "interrupted"
    NOTHING_MEASURED = "nothing_measured"
    """No check failed, but none measured anything either (every one skipped): not a pass."""


@dataclass(frozen=True)
class Threshold:
    """The bound a metric was judged against, as recorded in the report.

    ``op`` is one of ``>=``, ``<=``; ``value`` is in the metric's unit;
    ``severity`` is the status given when the bound is not met. ``clamped``:
    the bound as derived (e.g. a baseline's centre minus five spreads) lay
    outside the values the metric can take and was moved to the edge (a
    bandwidth's lower bound to 0), so every possible value meets it.
    """

    op: str
    value: float
    severity: Status = Status.FAIL
    source: str = "default"
    clamped: bool = False

    def met_by(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return value >= self.value if self.op == ">=" else value <= self.value

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "value": self.value, "severity": self.severity.value,
                             "source": self.source}
        if self.clamped:
            d["clamped"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Threshold:
        return cls(op=d["op"], value=float(d["value"]), severity=Status(d.get("severity", "fail")),
                   source=d.get("source", "default"), clamped=bool(d.get("clamped", False)))


@dataclass(slots=True)
class Metric:
    """One measured number.

    ``device`` is ``cuda:N``, ``cpu`` or absent for node-wide values;
    ``expected`` is the reference in the same unit and ``expected_source``
    where it came from (``baseline:<file>`` for a fleet baseline; absent for
    the check's own reference, such as the SKU spec);
    ``threshold`` is the bound that decided pass or fail; ``tags`` carry
    dimensions such as ``dtype`` or ``size_bytes``. ``performance``: a
    performance figure (every rate, bandwidth or time a check reports, but the
    exceptions of ``gpuaccept.checks.metricnames.NOT_PERFORMANCE``) that should be
    judged against an expectation; one with neither threshold nor expectation
    is "measured, not judged" (:func:`is_not_judged`), and a WARN on a GPU run.
    """

    name: str
    value: float
    unit: str
    device: str | None = None
    expected: float | None = None
    threshold: Threshold | None = None
    tags: dict[str, str | int | float] = field(default_factory=dict)
    expected_source: str | None = None
    performance: bool = False

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "value": _json_number(self.value), "unit": self.unit}
        if self.device is not None:
            d["device"] = self.device
        if self.expected is not None:
            d["expected"] = _json_number(self.expected)
            if self.expected_source is not None:
                d["expected_source"] = self.expected_source
        if self.threshold is not None:
            d["threshold"] = self.threshold.to_dict()
        if self.tags:
            d["tags"] = dict(self.tags)
        if self.performance:
            d["performance"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Metric:
        """The metric of ``d``; its names, unit, device and string tags interned (a fleet's reports repeat
        them hundreds of thousands of times)."""
        thr = d.get("threshold")
        device = d.get("device")
        return cls(
            name=sys.intern(d["name"]),
            value=float(d["value"]) if d["value"] is not None else math.nan,
            unit=sys.intern(d["unit"]),
            device=sys.intern(device) if type(device) is str else device,
            expected=d.get("expected"),
            threshold=Threshold.from_dict(thr) if thr else None,
            tags={sys.intern(k): sys.intern(v) if type(v) is str else v for k, v in d.get("tags", {}).items()},
            expected_source=d.get("expected_source"),
            performance=d.get("performance") is True,
        )


def _json_number(x: float) -> float | None:
    """JSON has no NaN or infinity: they are written as null."""
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    return x


BARE_UNITS = ("", "count", "fraction", "bool")
"""Units not written after a number (``2``, not ``2 count``)."""


def fmt_plain(x: float, digits: int = 6) -> str:
    """``x`` as a person writes a bound: at most ``digits`` significant digits, thousands separated, no
    exponent, no trailing zeros (``100,000``, ``0.005567``, ``593.6``); ``n/a`` when not finite."""
    if not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def miss_text(m: Metric) -> str:
    """``0.005567 < 100,000 TFLOP/s``: a metric that misses its threshold, value, comparison and bound in the
    metric's own unit (the one its bound is written in). The value gets the digits (4 or more) that keep the
    shown comparison true; the bound is shown as written. Empty when ``m`` meets its bound or has none."""
    t = m.threshold
    if t is None or t.met_by(m.value):
        return ""
    if not math.isfinite(m.value):
        return f"n/a (bound {t.op} {fmt_plain(t.value)} {m.unit})".replace(" )", ")")
    rel = "<" if t.op == ">=" else ">"
    for digits in range(4, 18):
        value, bound = fmt_plain(m.value, digits), fmt_plain(t.value, max(6, digits))
        if not Threshold(t.op, float(bound.replace(",", ""))).met_by(float(value.replace(",", ""))):
            break
    return f"{value} {rel} {bound} {m.unit}".rstrip()


NOT_JUDGED = "not_judged"
"""The state of a passing check with a performance figure that found neither a threshold nor an expectation."""


def is_not_judged(m: Metric) -> bool:
    """Whether ``m`` was measured but not judged: a performance figure with neither threshold nor expectation."""
    return m.performance and m.threshold is None and m.expected is None


def not_judged_names(metrics: list[Metric]) -> list[str]:
    """The names of the measured-but-not-judged figures among ``metrics``, each once, in order."""
    return list(dict.fromkeys(m.name for m in metrics if is_not_judged(m)))


@dataclass
class CheckResult:
    """The outcome of one check on one node (or one rank)."""

    name: str
    status: Status
    reason: str
    duration_s: float = 0.0
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    host: str | None = None
    fault: dict[str, Any] | None = None
    """A FAIL's or ERROR's catalogued fault (:func:`gpuaccept.faults.describe`): ``code`` (``GA-XID-079``),
    title, severity, part, origin (``node`` or ``job``), ladder and the ``action`` to take now. None for any other
    status, and in reports written before codes existed."""

    @property
    def code(self) -> str:
        """The fault code (``GA-MEM-001``), "" when there is none."""
        return str(self.fault.get("code", "")) if isinstance(self.fault, dict) else ""

    @property
    def is_rerun(self) -> bool:
        """A deeper re-run from ``run --budget``'s second pass (``details.rerun``): a second result under the
        check's name, after the first pass's. Series, baselines and comparisons use the first pass only."""
        return isinstance(self.details, dict) and "rerun" in self.details

    @property
    def not_judged(self) -> list[str]:
        """Its performance figures that were measured but not judged (:func:`is_not_judged`), by name."""
        return not_judged_names(self.metrics)

    @property
    def state(self) -> str:
        """What every rendering shows: the status, or ``not_judged`` for a PASS with a figure not judged
        (a pass of its other conditions, such as correct results, not of its performance)."""
        return NOT_JUDGED if self.status is Status.PASS and self.not_judged else self.status.value

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "status": self.status.value,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 3),
            "metrics": [m.to_dict() for m in self.metrics],
        }
        if self.not_judged:
            d["not_judged"] = self.not_judged  # derived from the metrics, for readers of the JSON
        if self.details:
            d["details"] = self.details
        if self.rank is not None:
            d["rank"] = self.rank
        if self.host is not None:
            d["host"] = self.host
        if self.fault:
            d["fault"] = dict(self.fault)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckResult:
        return cls(
            name=d["name"],
            status=Status(d["status"]),
            reason=d.get("reason", ""),
            duration_s=float(d.get("duration_s", 0.0)),
            metrics=[Metric.from_dict(m) for m in d.get("metrics", [])],
            details=dict(d.get("details", {})),
            rank=d.get("rank"),
            host=d.get("host"),
            fault=dict(d["fault"]) if isinstance(d.get("fault"), dict) else None,
        )


def fault_tag(result: CheckResult) -> str:
    """`` [GA-MEM-001, now: reset_gpu]``: what a console line adds after a FAIL's or ERROR's reason; "" without a
    fault."""
    f = result.fault
    if not isinstance(f, dict) or not f.get("code"):
        return ""
    return f" [{f['code']}, now: {f.get('action', '?')}]"


def fault_text(fault: dict[str, Any] | None) -> str:
    """``GA-MEM-001 uncorrectable ECC (critical, gpu, the node's fault): now reset_gpu; then reboot_node, ...``;
    "" for none."""
    if not isinstance(fault, dict) or not fault.get("code"):
        return ""
    origin = "caused by a job" if fault.get("origin") == "job" else "the node's fault"
    ladder = [str(s) for s in fault.get("ladder", [])]
    action = str(fault.get("action", ladder[0] if ladder else "?"))
    then = [s for s in ladder if s != action]
    rest = f"; then {', '.join(then)}" if then else ""
    return (f"{fault['code']} {fault.get('title', '')} ({fault.get('severity', '?')}, {fault.get('part', '?')}, "
            f"{origin}): now {action}{rest}")


@dataclass
class NodeReport:
    """Everything one ``gpuaccept run`` measured on one node."""

    run_id: str
    host: str
    profile: str
    started: str
    finished: str | None = None
    verdict: Verdict = Verdict.RUNNING
    checks: list[CheckResult] = field(default_factory=list)
    device: str | None = None
    argv: list[str] = field(default_factory=list)
    version: str = ""
    pod: str | None = None
    """The container (Kubernetes or Run:ai pod) the report came from, when ``host`` names the node it ran on."""
    cpu_only: str | None = None
    """Why the run used no GPU (``"this node has no GPU"``), None for a GPU run: a CPU-only SUCCESS
    says the CPU pipeline passed, never that GPUs were accepted."""
    in_flight: str | None = None
    """The check that was running when the report was last written (a run stopped or killed during it)."""
    budget: dict[str, Any] | None = None
    """``run --budget``'s plan: the budget, the checks kept and their depth, those left out and why, and the
    deeper re-runs of the second pass (:meth:`gpuaccept.node.budget.BudgetPlan.to_dict`)."""
    estimates: dict[str, float] = field(default_factory=dict)
    """Each check's estimated seconds as planned, its process start included
    (:func:`gpuaccept.node.budget.estimates_of`): what later ``--budget`` plans calibrate against
    (:mod:`gpuaccept.node.calibrate`)."""

    def __post_init__(self) -> None:
        self.argv = redact_argv(self.argv)  # nothing secret is written to report.json or the history

    def failed_checks(self) -> list[str]:
        return [c.name for c in self.checks if c.status.is_failure]

    def decide(self, inventory: frozenset[str] | set[str] = frozenset()) -> Verdict:
        """FAILURE when a check failed or errored; NOTHING_MEASURED when the run had checks that
        measure (not in ``inventory``, the checks that only take stock, such as ``env``) and every one
        of them skipped; else SUCCESS (warnings and skips allowed). A run of inventory checks alone
        is judged on them."""
        if self.failed_checks():
            return Verdict.FAILURE
        measuring = [c for c in self.checks if c.name not in inventory]
        if measuring and not any(c.status in (Status.PASS, Status.WARN) for c in measuring):
            return Verdict.NOTHING_MEASURED
        return Verdict.SUCCESS

    def not_judged(self) -> list[tuple[str, str]]:
        """(check, metric) for each performance figure measured but not judged, each once, in check order."""
        return list(dict.fromkeys((c.name, n) for c in self.checks for n in c.not_judged))

    def state_counts(self) -> dict[str, int]:
        """Checks by :attr:`CheckResult.state` (``not_judged`` apart from ``pass``), every state present."""
        return count_states(self.checks)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "host": self.host,
            "started": self.started,
            "finished": self.finished,
            "profile": self.profile,
            "verdict": self.verdict.value,
            "device": self.device,
            "version": self.version,
            "argv": list(self.argv),
            "checks": [c.to_dict() for c in self.checks],
        }
        from gpuaccept.nextsteps import report_next_steps

        for i, steps in report_next_steps(self).items():  # derived: what to do after each FAIL or ERROR
            d["checks"][i]["next_steps"] = steps
        from gpuaccept.trainspeed import report_train_vs_gemm

        for i, rows in report_train_vs_gemm(self).items():  # derived: training TFLOP/s over the GEMM's, not judged
            d["checks"][i]["train_vs_gemm"] = rows
        if self.not_judged():  # derived, for readers of the JSON: checks shown NOT JUDGED, and the figures
            d["not_judged"] = {"checks": self.state_counts()[NOT_JUDGED],
                               "figures": [f"{c}: {m}" for c, m in self.not_judged()]}
        if self.pod is not None:
            d["pod"] = self.pod
        if self.cpu_only is not None:
            d["cpu_only"] = self.cpu_only
        if self.in_flight is not None:
            d["in_flight"] = self.in_flight
        if self.budget is not None:
            d["budget"] = self.budget
        if self.estimates:
            d["estimates"] = dict(self.estimates)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeReport:
        return cls(
            run_id=d["run_id"],
            host=d["host"],
            profile=d["profile"],
            started=d["started"],
            finished=d.get("finished"),
            verdict=Verdict(d["verdict"]),
            checks=[CheckResult.from_dict(c) for c in d.get("checks", [])],
            device=d.get("device"),
            argv=list(d.get("argv", [])),
            version=d.get("version", ""),
            pod=d.get("pod"),
            cpu_only=d.get("cpu_only") or None,
            in_flight=d.get("in_flight"),
            budget=d.get("budget"),
            estimates=_estimates(d.get("estimates")),
        )


MAX_NAMED = 4
"""Figures named by :func:`not_judged_note`; more are counted."""


def not_judged_note(figures: list[tuple[str, str]]) -> str:
    """``3 performance figures not judged: compute gemm_fp32_tflops, ...`` for (check, metric) pairs, the note
    that final ``[RESULT]`` lines add; empty when there are none."""
    if not figures:
        return ""
    named = ", ".join(f"{c} {m}" for c, m in figures[:MAX_NAMED])
    more = f" and {len(figures) - MAX_NAMED} more" if len(figures) > MAX_NAMED else ""
    word = "figure" if len(figures) == 1 else "figures"
    return f"{len(figures)} performance {word} not judged: {named}{more}"


STATES = ("error", "fail", "warn", "pass", NOT_JUDGED, "skip")
"""Every :attr:`CheckResult.state`, worst first."""


def count_states(checks: list[CheckResult]) -> dict[str, int]:
    """``checks`` by :attr:`CheckResult.state`, every state present (0 when none)."""
    counts = dict.fromkeys(STATES, 0)
    for c in checks:
        counts[c.state] += 1
    return counts


def state_label(state: str) -> str:
    """``NOT JUDGED``, ``PASS``...: a state as shown in a table."""
    return state.replace("_", " ").upper()


def _estimates(raw: Any) -> dict[str, float]:
    """A report's ``estimates``, keeping only finite, non-negative numbers under string names (a hand-edited or
    damaged report loses the odd entry, never the report)."""
    if not isinstance(raw, dict):
        return {}
    return {k: float(v) for k, v in raw.items() if isinstance(k, str) and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v) and v >= 0}


class NodeState(str, enum.Enum):
    """How a node took part in a cluster run."""

    REPORTED = "reported"
    MISSING = "missing"


@dataclass
class NodeEntry:
    """One node of a cluster run: its report, or why there is none.

    ``node_rank`` is the launcher's index of the node (0-based) when known.
    """

    host: str
    state: NodeState
    report: NodeReport | None = None
    node_rank: int | None = None
    reason: str = ""

    @property
    def verdict(self) -> Verdict:
        if self.report is None:
            return Verdict.FAILURE
        return self.report.verdict

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"host": self.host, "state": self.state.value, "verdict": self.verdict.value,
                             "node_rank": self.node_rank, "reason": self.reason}
        d["report"] = self.report.to_dict() if self.report is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeEntry:
        rep = d.get("report")
        return cls(host=d["host"], state=NodeState(d["state"]),
                   report=NodeReport.from_dict(rep) if rep else None,
                   node_rank=d.get("node_rank"), reason=d.get("reason", ""))


@dataclass
class ClusterReport:
    """The merged result of a multi-node run. A node that never reported is listed as missing."""

    run_id: str
    backend: str
    started: str
    finished: str | None = None
    expected_nodes: int = 0
    nodes: list[NodeEntry] = field(default_factory=list)
    job_id: str | None = None
    analysis: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        """SUCCESS only when every expected node reported and none failed."""
        if len(self.nodes) < self.expected_nodes:
            return Verdict.FAILURE
        if any(n.verdict is not Verdict.SUCCESS for n in self.nodes):
            return Verdict.FAILURE
        return Verdict.SUCCESS if self.nodes else Verdict.FAILURE

    def failed_nodes(self) -> list[str]:
        return [n.host for n in self.nodes if n.verdict is not Verdict.SUCCESS]

    def cpu_only_nodes(self) -> list[str]:
        """The nodes whose run used no GPU (their SUCCESS is a CPU pipeline's, not a GPU acceptance)."""
        return [n.host for n in self.nodes if n.report is not None and n.report.cpu_only]

    def header_dict(self) -> dict[str, Any]:
        """Every key of :meth:`to_dict` but ``nodes`` and ``analysis``."""
        return {"schema_version": SCHEMA_VERSION, "kind": "cluster", "run_id": self.run_id, "backend": self.backend,
                "job_id": self.job_id, "started": self.started, "finished": self.finished,
                "expected_nodes": self.expected_nodes, "verdict": self.verdict.value}

    def to_dict(self) -> dict[str, Any]:
        return {**self.header_dict(), "nodes": [n.to_dict() for n in self.nodes], "analysis": self.analysis}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterReport:
        return cls(run_id=d["run_id"], backend=d["backend"], started=d["started"], finished=d.get("finished"),
                   expected_nodes=int(d.get("expected_nodes", 0)),
                   nodes=[NodeEntry.from_dict(n) for n in d.get("nodes", [])],
                   job_id=d.get("job_id"), analysis=dict(d.get("analysis", {})))
