"""Prometheus metrics from reports: the node_exporter textfile format, and the families serve-metrics exposes.

Families (all gauges; ``host`` is the node, ``gpu`` the CUDA ordinal or empty
for node-wide values):

- ``gpuaccept_metric{host,gpu,check,metric,unit[,op,dtype,...]}``: every measured value,
  in its unit (the report's metric; NaN values are left out);
- ``gpuaccept_metric_expected`` and ``gpuaccept_metric_threshold{...,bound="min|max"}``: its reference and bound;
- ``gpuaccept_metric_outlier_zscore``: robust z of values the cluster analysis flagged;
- ``gpuaccept_check_status{host,check,status}``: 1 for the check's status, 0 for the other four;
- ``gpuaccept_check_duration_seconds{host,check}``;
- ``gpuaccept_check_fault{host,check,code,severity,origin,action}`` = 1 for each FAIL or ERROR: its fault code
  (docs: reference/fault-codes), severity, origin (``node`` or ``job``) and the remediation step to take now
  (a series of its own, so ``check_status`` keeps its labels whatever the code);
- ``gpuaccept_check_not_judged{host,check}``: how many of the check's performance figures were measured with
  neither threshold nor expectation (0: all judged); ``gpuaccept_metric_not_judged{host,check,metric}`` = 1
  names each (a passing check with any is shown as NOT JUDGED, its ``check_status`` stays ``pass``);
- ``gpuaccept_node_verdict{host,verdict}``: 1 for the run's verdict, 0 for the others;
- ``gpuaccept_node_cpu_only{host}``: 1 when the host's run used no GPU (its verdict is a CPU pipeline's,
  not a GPU acceptance; the reason is in report.json's ``cpu_only``), 0 for a GPU run;
- ``gpuaccept_node_reported{host}``: 0 for a node of a cluster run that sent no report;
- ``gpuaccept_run_timestamp_seconds{host}`` and ``gpuaccept_run_duration_seconds{host}``;
- ``gpuaccept_run_info{host,run_id,profile,version}`` = 1;
- ``gpuaccept_cluster_nodes{state}`` and ``gpuaccept_cluster_verdict{verdict}`` for a cluster run;
- ``gpuaccept_analysis_groups{coverage}`` with an outlier analysis: its SKU/metric groups (``all``), those
  compared every way that applies (``fully``), one way only (``partly``), not at all (``not_compared``), and
  for an analysis stored before coverage was recorded, not across nodes with the rest unknown (``unknown``);
- ``gpuaccept_budget_seconds{host}`` and ``gpuaccept_budget_left_out{host,check}`` = 1 for a ``run --budget``:
  its window, and each check the budget left out (it has no status series: it did not run).

**Re-runs** (``run --budget``'s deeper second pass: a second result under a check's name) carry the label
``rerun="1"`` on their ``gpuaccept_metric*``, ``gpuaccept_check_status`` and
``gpuaccept_check_duration_seconds`` samples; first-pass samples have ``rerun=""``, which Prometheus
treats as no label at all. So a first-pass series keeps its identity from run to run, whether or not a
run had re-runs, and stays comparable over time (``{rerun=""}`` selects it); the re-run, measured at
another depth on a node that looked suspect, is a series of its own and never overwrites or averages into
it. Re-runs are labelled, not left out, because a re-run can be what failed the node: an alert on
``gpuaccept_check_status{status="fail"} == 1`` must see it, as ``gpuaccept_node_verdict`` does.

Labels beyond ``host,gpu,check,metric,unit`` come from a metric's tags:
``op`` and ``dtype`` whenever present, others (``size_bytes`` of a collective
sweep, ``rank``) only where needed to tell series apart. Every sample of a
family has the same label names. No timestamps: node_exporter's textfile
collector refuses them.

The equivalent check by hand: ``curl -s localhost:9100/metrics | grep ^gpuaccept_``.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaccept.errors import InputError
from gpuaccept.model import ClusterReport, Metric, NodeReport, NodeState, Status, Verdict
from gpuaccept.report.budget_view import budget_view
from gpuaccept.report.views import OutlierIndex, analysis_coverage, outliers

PREFIX = "gpuaccept_"
_LABEL_OK = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_BASE_METRIC_LABELS = ("host", "gpu", "check", "metric", "unit")
_ALWAYS_TAGS = ("rerun", "op", "dtype")
_RERUN = {"rerun": "1"}
"""The extra label of a re-run's samples (the module's docstring says why)."""
_FIRST_EXTRA_TAGS = ("size_bytes", "rank")


@dataclass
class Family:
    """One metric family: name, help text, and samples as (labels, value)."""

    name: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)
    type: str = "gauge"

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, float(value)))


def iso_epoch(text: str | None) -> float | None:
    """Epoch seconds of an ISO 8601 time (UTC when no zone), None when absent or unreadable."""
    if not text:
        return None
    from datetime import datetime, timezone

    try:
        t = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
        dt = datetime.fromisoformat(t)
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def label_name(key: str) -> str:
    """A tag key as a valid, non-reserved Prometheus label name that does not collide with the base labels."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key) or "tag"
    if not _LABEL_OK.match(name) or name.startswith("__"):
        name = "tag_" + name.lstrip("_")
    if name in (*_BASE_METRIC_LABELS, "bound", "status", "verdict", "rerun"):
        name = "tag_" + name
    return name


def gpu_label(device: str | None) -> str:
    """``cuda:3`` -> ``3``; other devices as they are; node-wide -> empty."""
    if device is None:
        return ""
    head, _, idx = device.partition(":")
    return idx if head == "cuda" and idx.isdigit() else device


def _tag_value(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _uniform(samples: list[tuple[dict[str, str], float, dict[str, str]]], base: Sequence[str],
             always: Sequence[str]) -> list[tuple[dict[str, str], float]]:
    """Give every sample the same label names.

    The names are ``base``, the ``always`` extras present in any sample, then
    further extras (``size_bytes``, ``rank``, other tags sorted) added one by
    one while samples still collide; an added extra is filled in only for the
    samples that collided (empty for the rest), so a series that never needed
    it (a memory copy's buffer size) keeps a stable identity. Samples that
    still collide keep the first one.
    """
    present = {k for _, _, extra in samples for k in extra}
    chosen = [k for k in always if k in present]
    rest = [k for k in _FIRST_EXTRA_TAGS if k in present and k not in chosen]
    rest += sorted(present - set(chosen) - set(rest))
    rows = [({k: labels.get(k, extra.get(k, "")) for k in (*base, *chosen)}, value, extra)
            for labels, value, extra in samples]
    names = [*base, *chosen]

    def key(row: dict[str, str]) -> tuple[str, ...]:
        return tuple(row.get(k, "") for k in names)

    def colliding() -> tuple[list[int], int]:
        """Samples sharing their label values with another, and the number of distinct label sets."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, (row, _, _) in enumerate(rows):
            groups.setdefault(key(row), []).append(i)
        return [i for members in groups.values() if len(members) > 1 for i in members], len(groups)

    clash, distinct = colliding()
    for extra_name in rest:
        if not clash:
            break
        names.append(extra_name)
        for i in clash:
            rows[i][0][extra_name] = rows[i][2].get(extra_name, "")
        now, now_distinct = colliding()
        if now_distinct > distinct:
            clash, distinct = now, now_distinct
            continue
        names.pop()  # this tag tells nothing apart (an element count that follows the size): leave it out
        for i in clash:
            rows[i][0].pop(extra_name, None)
    out: list[tuple[dict[str, str], float]] = []
    seen: set[tuple[str, ...]] = set()
    for row, value, _ in rows:
        k = key(row)
        if k in seen:
            continue
        seen.add(k)
        out.append(({n: row.get(n, "") for n in names}, float(value)))
    return out


def _metric_families(entries: Sequence[tuple[str, str, Metric, int | None, bool]],
                     idx: OutlierIndex) -> list[Family]:
    value_f = Family(PREFIX + "metric", "Measured value of a gpuaccept metric, in the unit of the 'unit' label.")
    expected_f = Family(PREFIX + "metric_expected", "Reference value (SKU spec or baseline) of a gpuaccept metric.")
    threshold_f = Family(PREFIX + "metric_threshold", "Bound a gpuaccept metric was judged against "
                                                       "(bound=min: value must be >=, max: <=).")
    z_f = Family(PREFIX + "metric_outlier_zscore", "Robust z-score of a value flagged as an outlier by the cluster "
                                                   "analysis.")
    raw: dict[str, list[tuple[dict[str, str], float, dict[str, str]]]] = {f.name: [] for f in
                                                                         (value_f, expected_f, threshold_f, z_f)}
    for host, check, m, rank, rerun in entries:
        labels = {"host": host, "gpu": gpu_label(m.device), "check": check, "metric": m.name, "unit": m.unit}
        extra = {label_name(k): _tag_value(v) for k, v in m.tags.items()}
        if rank is not None:
            extra["rank"] = str(rank)
        if rerun:
            extra.update(_RERUN)
        if math.isfinite(m.value) or math.isinf(m.value):
            raw[value_f.name].append((labels, m.value, extra))
        if m.expected is not None and not math.isnan(m.expected):
            raw[expected_f.name].append((labels, m.expected, extra))
        if m.threshold is not None and not math.isnan(m.threshold.value):
            bound = "min" if m.threshold.op == ">=" else "max"
            raw[threshold_f.name].append(({**labels, "bound": bound}, m.threshold.value, extra))
        hit = None if rerun else idx.find(host, check, m)  # the analysis judged the first pass
        if hit is not None and hit.z is not None:
            raw[z_f.name].append((labels, hit.z, extra))
    fams = []
    for fam in (value_f, expected_f, threshold_f, z_f):
        base = (*_BASE_METRIC_LABELS, "bound") if fam is threshold_f else _BASE_METRIC_LABELS
        fam.samples = _uniform(raw[fam.name], base, _ALWAYS_TAGS)
        fams.append(fam)
    return fams


def families(node_reports: Sequence[NodeReport], cluster: ClusterReport | None = None,
             analysis: dict[str, Any] | None = None) -> list[Family]:
    """Families for the given node reports (one per host; later duplicates ignored) and an optional cluster run.

    Nodes of ``cluster`` that sent no report, and have no report among
    ``node_reports``, are exported as not reported with a failure verdict.
    Outlier z-scores come from ``analysis`` (default: the cluster's own).
    """
    info = Family(PREFIX + "run_info", "The run a host's gpuaccept series come from (value is always 1).")
    ts = Family(PREFIX + "run_timestamp_seconds", "Start of the host's latest gpuaccept run, Unix time in seconds.")
    dur = Family(PREFIX + "run_duration_seconds", "Wall time of the host's latest gpuaccept run in seconds.")
    verdict_f = Family(PREFIX + "node_verdict", "1 for the verdict of the host's latest run, 0 for the others.")
    cpu_f = Family(PREFIX + "node_cpu_only", "1 when the host's latest run used no GPU (not a GPU acceptance), "
                                             "0 for a GPU run.")
    reported_f = Family(PREFIX + "node_reported", "1 when the host sent a report, 0 when a cluster run is missing it.")
    status_f = Family(PREFIX + "check_status", "1 for the check's status in the host's latest run, 0 for the others.")
    cdur = Family(PREFIX + "check_duration_seconds", "Time the check took on the host, in seconds.")
    fault_f = Family(PREFIX + "check_fault", "1 for each failed or errored check: its fault code, severity, origin "
                                             "and the remediation step to take now.")
    nj_f = Family(PREFIX + "check_not_judged", "Performance figures of the check measured with no threshold and no "
                                               "expectation (0: all judged).")
    nj_names = Family(PREFIX + "metric_not_judged", "1 for each performance figure measured with no threshold and "
                                                    "no expectation.")
    budget_f = Family(PREFIX + "budget_seconds", "The time budget of the host's latest run (run --budget), in "
                                                 "seconds.")
    left_out_f = Family(PREFIX + "budget_left_out", "1 for each check the time budget of the host's latest run "
                                                    "left out (it did not run).")
    if analysis is None:
        analysis = cluster.analysis if cluster is not None else {}
    idx = OutlierIndex(outliers(cluster or NodeReport("", "", "", ""), analysis))

    seen: set[str] = set()
    entries: list[tuple[str, str, Metric, int | None, bool]] = []
    check_rows: list[tuple[dict[str, str], float, dict[str, str]]] = []
    dur_rows: list[tuple[dict[str, str], float, dict[str, str]]] = []
    nj_rows: list[tuple[dict[str, str], float, dict[str, str]]] = []
    nj_name_rows: list[tuple[dict[str, str], float, dict[str, str]]] = []
    fault_rows: list[tuple[dict[str, str], float, dict[str, str]]] = []
    for rep in node_reports:
        if rep.host in seen:
            continue
        seen.add(rep.host)
        info.add(1, host=rep.host, run_id=rep.run_id, profile=rep.profile, version=rep.version)
        started, finished = iso_epoch(rep.started), iso_epoch(rep.finished)
        if started is not None:
            ts.add(started, host=rep.host)
            if finished is not None and finished >= started:
                dur.add(finished - started, host=rep.host)
        for v in Verdict:
            verdict_f.add(1 if rep.verdict is v else 0, host=rep.host, verdict=v.value)
        reported_f.add(1, host=rep.host)
        cpu_f.add(1 if rep.cpu_only else 0, host=rep.host)
        budget = budget_view(rep)
        if budget is not None:
            budget_f.add(budget.budget_s, host=rep.host)
            for row in budget.by_state("left out"):
                left_out_f.add(1, host=rep.host, check=row.name)
        for c in rep.checks:
            host = c.host or rep.host
            extra = {"rank": str(c.rank)} if c.rank is not None else {}
            if c.is_rerun:
                extra.update(_RERUN)
            for s in Status:
                check_rows.append(({"host": host, "check": c.name, "status": s.value}, 1 if c.status is s else 0,
                                   extra))
            if c.fault and c.status.is_failure:
                fault_rows.append(({"host": host, "check": c.name, "code": c.code,
                                    **{k: str(c.fault.get(k, "")) for k in ("severity", "origin", "action")}}, 1,
                                   extra))
            if math.isfinite(c.duration_s):
                dur_rows.append(({"host": host, "check": c.name}, c.duration_s, extra))
            if c.status is not Status.SKIP:
                nj_rows.append(({"host": host, "check": c.name}, len(c.not_judged), extra))
            nj_name_rows += [({"host": host, "check": c.name, "metric": n}, 1, extra) for n in c.not_judged]
            entries.extend((host, c.name, m, c.rank, c.is_rerun) for m in c.metrics)
    status_f.samples = _uniform(check_rows, ("host", "check", "status"), ("rerun",))
    cdur.samples = _uniform(dur_rows, ("host", "check"), ("rerun",))
    nj_f.samples = _uniform(nj_rows, ("host", "check"), ("rerun",))
    nj_names.samples = _uniform(nj_name_rows, ("host", "check", "metric"), ("rerun",))
    fault_f.samples = _uniform(fault_rows, ("host", "check", "code", "severity", "origin", "action"), ("rerun",))

    fams = [info, ts, dur, verdict_f, cpu_f, reported_f, status_f, fault_f, cdur, nj_f, nj_names, budget_f, left_out_f,
            *_metric_families(entries, idx)]
    cov = analysis_coverage(cluster or NodeReport("", "", "", ""), analysis)
    if cov is not None:
        groups_f = Family(PREFIX + "analysis_groups", "SKU/metric groups of the outlier analysis by coverage: all, "
                                                      "compared fully, partly (one way only), not compared.")
        partly = int(sum(cov["partly"].values()))
        rows = [("all", cov["groups"]), ("fully", cov["fully"]), ("partly", partly),
                ("not_compared", int(sum(cov["not_compared"].values())))]
        if cov.get("unknown"):  # stored before coverage existed: not compared across nodes, within unknown
            rows.append(("unknown", int(sum(cov["unknown"].values()))))
        for key, value in rows:
            groups_f.add(value, coverage=key)
        fams.append(groups_f)
    if cluster is not None:
        for entry in cluster.nodes:
            if entry.host in seen or (entry.state is NodeState.REPORTED and entry.report is not None):
                continue
            seen.add(entry.host)
            reported_f.add(0, host=entry.host)
            for v in Verdict:
                verdict_f.add(1 if v is Verdict.FAILURE else 0, host=entry.host, verdict=v.value)
        nodes_f = Family(PREFIX + "cluster_nodes", "Nodes of the latest cluster run by state (expected, reported, "
                                                   "missing, failed).")
        reported = sum(1 for n in cluster.nodes if n.report is not None)
        nodes_f.add(max(cluster.expected_nodes, len(cluster.nodes)), state="expected")
        nodes_f.add(reported, state="reported")
        nodes_f.add(max(cluster.expected_nodes, len(cluster.nodes)) - reported, state="missing")
        nodes_f.add(len(cluster.failed_nodes()), state="failed")
        cverdict = Family(PREFIX + "cluster_verdict", "1 for the verdict of the latest cluster run, 0 for the others.")
        for v in Verdict:
            cverdict.add(1 if cluster.verdict is v else 0, verdict=v.value)
        cts = Family(PREFIX + "cluster_run_timestamp_seconds", "Start of the latest cluster run, Unix time in seconds.")
        started = iso_epoch(cluster.started)
        if started is not None:
            cts.add(started)
        cinfo = Family(PREFIX + "cluster_run_info", "The latest cluster run (value is always 1).")
        cinfo.add(1, run_id=cluster.run_id, backend=cluster.backend, job_id=cluster.job_id or "")
        fams += [nodes_f, cverdict, cts, cinfo]
    return [f for f in fams if f.samples]


def report_families(report: NodeReport | ClusterReport, analysis: dict[str, Any] | None = None) -> list[Family]:
    """Families for one report (a cluster report exports each node's report and the cluster's state)."""
    if isinstance(report, NodeReport):
        return families([report], None, analysis)
    return families([n.report for n in report.nodes if n.report is not None], report, analysis)


def escape_label(value: str) -> str:
    """A label value for the text format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(value: float) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def render_text(fams: Iterable[Family]) -> str:
    """The families in the Prometheus text exposition format (version 0.0.4), as node_exporter reads it."""
    lines = []
    for fam in fams:
        help_text = fam.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {fam.name} {help_text}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples:
            body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{fam.name}{{{body}}} {_fmt(value)}" if labels else f"{fam.name} {_fmt(value)}")
    return "\n".join(lines) + "\n"


def render_prometheus(report: NodeReport | ClusterReport, analysis: dict[str, Any] | None = None) -> str:
    """The report as a node_exporter textfile (``*.prom``); outliers from ``analysis`` (default: the report's)."""
    return render_text(report_families(report, analysis))


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and a rename.

    node_exporter's textfile collector may read at any moment; it only reads
    ``*.prom`` files, so the temporary name does not end in ``.prom``. The file
    is made world-readable (``mode``) since the exporter often runs as another user.
    """
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
