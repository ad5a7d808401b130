"""The Markdown report, for tickets and pull requests (GitHub-flavoured tables).

Order: the verdict and run facts, then what failed (failed and errored
checks first, then warnings, then missing nodes), outliers, reference training against the GEMM rate
(measured, not judged), the time budget of
a ``run --budget`` (each check kept at which level, those left out and why, the
deeper re-runs), a node summary for cluster runs, and a table per node (nodes
with problems first; a re-run marked ``(re-run)``). Text from reports is
escaped so that a reason cannot break a table or inject markup.
"""

from __future__ import annotations

import re
from typing import Any

from gpuaccept.inputs import one_line
from gpuaccept.model import CheckResult, ClusterReport, Metric, NodeReport, Status, Verdict, state_label
from gpuaccept.report.budget_view import BudgetRow, BudgetView, budget_views
from gpuaccept.report.views import (
    STATES,
    NodeView,
    analysis_of,
    bound_text,
    check_host,
    cpu_only_text,
    fmt_duration,
    fmt_number,
    fmt_tags,
    fmt_value,
    headline_metric,
    next_steps_of,
    node_views,
    not_judged,
    outliers,
    problems,
    reference_text,
    state_counts,
    value_text,
)
from gpuaccept.results.coverage import coverage_line, coverage_of, outlier_line
from gpuaccept.trainspeed import flops_text, train_vs_gemm

ALL_NODE_TABLES_UP_TO = 16
"""Above this many nodes, per-node tables are written only for nodes that did not succeed."""
TRAIN_ROWS = 32
"""Above this many devices, the training-against-GEMM table keeps the lowest ratios."""
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
_ICON = {Verdict.SUCCESS: "✅", Verdict.FAILURE: "❌", Verdict.RUNNING: "⏳", Verdict.INTERRUPTED: "⚠️",
         Verdict.NOTHING_MEASURED: "⚠️"}


def md(text: object) -> str:
    """Escape text for a Markdown table cell: one line, markup characters and HTML neutralized."""
    s = " ".join(str(text).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", s)


def code(text: object) -> str:
    """An inline code span that holds any text (backticks in it are replaced)."""
    s = " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")
    return f"`{s}`" if s else ""


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def _key(m: Metric | None) -> str:
    if m is None:
        return ""
    where = f" on {md(m.device)}" if m.device else ""
    text = f"{code(m.name)}{where} = {md(value_text(m))}"
    parts = [bound_text(m), reference_text(m) if m.expected_source or m.threshold is None else ""]
    shown = ", ".join(p for p in parts if p)
    if shown:
        text += f" ({md(shown)})"
    return text


def _counts_line(nodes: list[NodeView]) -> str:
    counts = state_counts(nodes)
    return ", ".join(f"{counts[s]} {state_label(s).lower()}" for s in STATES if counts[s]) or "none"


def _state_cell(c: CheckResult) -> str:
    label = state_label(c.state)
    return f"**{label}**" if c.status.is_failure else label


def _not_judged_line(nodes: list[NodeView], cluster: bool) -> list[str]:
    """``Not judged (measured, no threshold or expectation): ...``, or nothing when every figure was judged."""
    figures = not_judged(nodes)
    if not figures:
        return []
    names = ", ".join((f"{code(h)} " if cluster else "") + f"{code(c)} {code(m)}" for h, c, m in figures)
    return [f"Not judged (performance figures measured with no threshold and no expectation): {names}", ""]


def _name(c: CheckResult) -> str:
    """The check's name as code, with its rank and a ``(re-run)`` mark."""
    return code(c.name) + (f" rank {c.rank}" if c.rank is not None else "") + (" (re-run)" if c.is_rerun else "")


def _budget_cells(r: BudgetRow) -> list[str]:
    state = f"**{r.state}**" if r.state in ("left out", "not re-run") else r.state
    return [code(r.name), state, md(r.level_text), md(r.estimate_text), md(r.why)]


def _budget_section(views: list[BudgetView], cluster: bool) -> list[str]:
    lines = ["### Time budget", ""]
    if not cluster:
        lines += [md(views[0].summary()), ""]
    head = ["check", "budget", "level", "estimate", "why"]
    rows = [([code(v.host)] if cluster else []) + _budget_cells(r) for v in views for r in v.rows]
    return lines + _table((["host"] if cluster else []) + head, rows)


def _reason(c: CheckResult) -> str:
    """The reason cell: a FAIL's or ERROR's fault code first (``GA-MEM-001``, the docs' fault-codes page names it)."""
    return f"{code(c.code)} {md(c.reason)}" if c.code else md(c.reason)


def _node_table(node: NodeView) -> list[str]:
    if node.missing:
        return [f"No report: {md(node.reason or 'missing')}", ""]
    order = sorted(node.checks, key=lambda c: -c.status.severity if c.status is not Status.SKIP else 0)
    rows = [[_name(c), _state_cell(c), _key(headline_metric(c)),
             md(fmt_duration(c.duration_s)), _reason(c)] for c in order]
    return _table(["check", "status", "key metric", "time", "reason"], rows)


def _next_steps(nodes: list[NodeView], cluster: bool) -> list[str]:
    """``### Next steps``: under each failed check, its likely causes and the commands to run next."""
    found = next_steps_of(nodes)
    if not found:
        return []
    lines = ["### Next steps", ""]
    for host, c, steps in found:
        lines.append(f"**{_name(c)}**" + (f" on {code(host)}" if cluster else "") + ":")
        lines += [f"- likely: {md(cause)}" for cause in steps["causes"]]
        lines += [f"- run: {code(cmd)}" for cmd in steps["commands"]]
        lines.append("")
    return lines


def _train_vs_gemm(nodes: list[NodeView], cluster: bool) -> list[str]:
    """``### Reference training against the GEMM rate``: per device, the model TFLOP/s over the compute check's
    GEMM TFLOP/s (:mod:`gpuaccept.trainspeed`); none when no node ran both."""
    found = [(n.host, r) for n in nodes if n.report is not None for c in n.report.checks
             for r in train_vs_gemm(c, n.report.checks)]
    if not found:
        return []
    lines = ["### Reference training against the GEMM rate", "",
             "Model TFLOP/s of `reference_train` over the `compute` check's GEMM rate of the same dtype on the "
             "same device: measured, not judged.", ""]
    if len(found) > TRAIN_ROWS:  # a fleet: the lowest ratios, where training lags its GEMM most
        lines += [f"The {TRAIN_ROWS} lowest ratios of {len(found)} devices.", ""]
        found = sorted(found, key=lambda hr: hr[1].ratio)[:TRAIN_ROWS]
    rows = [([code(host)] if cluster else []) + [md(r.device), md(flops_text(r.model_tflops)),
                                                 md(flops_text(r.gemm_tflops)), code(r.gemm_metric), f"{r.ratio:.2f}"]
            for host, r in found]
    return lines + _table((["host"] if cluster else []) + ["device", "model rate", "GEMM rate", "GEMM metric",
                                                          "ratio"], rows)


def render_markdown(report: NodeReport | ClusterReport, analysis: dict[str, Any] | None = None) -> str:
    """The report as Markdown text; outliers from ``analysis`` (default: the cluster report's own)."""
    nodes = node_views(report)
    verdict = report.verdict
    cluster = isinstance(report, ClusterReport)
    cpu_only = cpu_only_text(report)
    lines = [f"## {_ICON.get(verdict, '')} gpuaccept: **{verdict.value.upper()}**"
             + (f" ({md(cpu_only)})" if cpu_only else ""), ""]
    facts = [f"run {code(report.run_id)}"]
    if isinstance(report, ClusterReport):
        reported = sum(1 for n in nodes if not n.missing)
        facts.append(f"{reported}/{max(report.expected_nodes, len(nodes))} nodes reported")
        facts.append(f"backend {md(report.backend)}" + (f" job {code(report.job_id)}" if report.job_id else ""))
    else:
        facts.append(f"host {code(report.host)}")
        facts.append(f"profile {md(report.profile)}")
    facts.append(f"started {md(report.started)}")
    if report.finished:
        facts.append(f"finished {md(report.finished)}")
    budgets = budget_views(nodes)
    dropped = [r for v in budgets for r in v.by_state("left out")]
    note = f"; {len(dropped)} left out by the budget ({', '.join(code(r.name) for r in dropped)})" if dropped else ""
    lines += [" · ".join(facts), "", f"Checks: {_counts_line(nodes)}{note}", ""]
    lines += _not_judged_line(nodes, cluster)

    bad = problems(nodes)
    missing = [n for n in nodes if n.missing]
    if bad or missing:
        lines += ["### Failures and warnings", ""]
        rows = [[code(n.host), "**MISSING**", "", md(n.reason or "no report"), ""] for n in missing]
        rows += [[code(check_host(c, n)), f"**{c.status.value.upper()}**" if c.status.is_failure
                  else c.status.value.upper(), _name(c), _reason(c), _key(headline_metric(c))]
                 for n, c in bad]
        lines += _table(["host", "status", "check", "reason", "key metric"], rows)
        lines += _next_steps(nodes, cluster)
    else:
        lines += ["No check failed, errored or warned.", ""]

    outs = outliers(report, analysis)
    analysed = analysis_of(report, analysis)
    cov = coverage_of(analysed)
    if not outs and cov["groups"] and cluster:
        said = outlier_line(analysed, 0)
        lines += ["### Outliers", "", f"{md(said[:1].upper() + said[1:])}: {md(coverage_line(analysed))}.", ""]
    if outs:
        lines += ["### Outliers", "", "Robust z-score against the group median (from the cluster analysis).", ""]
        if cov["fully"] < cov["groups"]:
            lines += [f"{md(outlier_line(analysed, len(outs)))}: {md(coverage_line(analysed))}.", ""]
        rows = [[code(o.host), md(o.device or "node"), code(o.check),
                 code(o.metric) + (" " + md(fmt_tags(o.tags, skip=("stat", "mode", "size"))) if o.tags else ""),
                 md(fmt_value(o.value, o.unit)), md(fmt_value(o.median, o.unit, like=o.value)),
                 md(fmt_number(o.z)), md(o.direction)]
                for o in outs]
        lines += _table(["host", "GPU", "check", "metric", "value", "median", "z", "direction"], rows)

    lines += _train_vs_gemm(nodes, cluster)
    if budgets:
        lines += _budget_section(budgets, cluster)

    if cluster:
        lines += ["### Nodes", ""]
        rows = []
        for n in sorted(nodes, key=lambda n: (n.verdict is Verdict.SUCCESS, n.host)):
            failed = [c.name for c in n.checks if c.status.is_failure]
            rows.append([code(n.host), "missing" if n.missing else n.verdict.value,
                         ", ".join(code(f) for f in failed) or ("" if not n.missing else md(n.reason)),
                         md(_counts_line([n]) if not n.missing else "")])
        lines += _table(["host", "verdict", "failed checks", "checks"], rows)

    ordered = sorted(nodes, key=lambda n: (n.verdict is Verdict.SUCCESS, n.host)) if cluster else nodes
    if cluster and len(nodes) > ALL_NODE_TABLES_UP_TO:
        left_out = [n for n in ordered if n.verdict is Verdict.SUCCESS]
        ordered = [n for n in ordered if n.verdict is not Verdict.SUCCESS]
        if left_out:
            lines += [f"Tables of the {len(left_out)} successful nodes are left out "
                      f"(see `gpuaccept report {report.run_id} --host HOST --format md`).", ""]
    for n in ordered:
        if cluster:
            lines += [f"#### {md(n.host)}: {n.verdict.value if not n.missing else 'missing'}", ""]
        lines += _node_table(n)
    text = "\n".join(lines).rstrip()
    return "\n".join(one_line(line) for line in text.split("\n")) + "\n"  # no ESC or bidi control reaches a tty
