"""The HTML report: one self-contained file (inline CSS, script and SVG) that opens offline.

Sections: the verdict and run facts; what needs attention (failed, errored
and warned checks, missing nodes); outliers from the cluster analysis; a node
× metric heatmap (cluster reports); the time budget of a ``run --budget``
(each check kept at which level, those left out and why, the deeper re-runs);
value-vs-message-size curves for swept metrics such as collectives' bus
bandwidth; and a section per check with a table of nodes (a deeper re-run
badged ``re-run``), per-GPU bars against the expectation and threshold, and the
metrics. Every string from a report is HTML-escaped, and a
Content-Security-Policy allows no network access and no script but the
page's own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from gpuaccept import __version__
from gpuaccept.model import (
    NOT_JUDGED,
    CheckResult,
    ClusterReport,
    Metric,
    NodeReport,
    Status,
    count_states,
    fmt_plain,
    is_not_judged,
    state_label,
)
from gpuaccept.report import html_fleet as fleet
from gpuaccept.report import html_rdma, svg
from gpuaccept.report.budget_view import BudgetView, budget_view, budget_views
from gpuaccept.report.grid import Column, GridBuilder, Heatmap, Sweep, cross_node_coverage, size_of, swept_names
from gpuaccept.report.html_assets import CSS, JS
from gpuaccept.report.html_matrix import p2p_matrix_html
from gpuaccept.report.html_train import gemm_ratio, loss_curves
from gpuaccept.report.svg import e
from gpuaccept.report.units import display_unit
from gpuaccept.report.views import (
    STATES,
    NodeView,
    Outlier,
    OutlierIndex,
    analysis_of,
    bound_text,
    check_host,
    check_names,
    cpu_only_text,
    device_sort_key,
    fmt_duration,
    fmt_number,
    fmt_tags,
    fmt_value,
    headline_metric,
    metric_status,
    next_steps_of,
    node_views,
    not_judged,
    outliers,
    problems,
    reference_label,
    reference_text,
    state_counts,
    tags_key,
    value_text,
)
from gpuaccept.results.conformance_fleet import configs_of_reports, drift_lines, drift_summary, fleet_drift
from gpuaccept.results.coverage import coverage_line, coverage_of, outlier_line

DETAIL_ALL_NODES_UP_TO = 64
"""Above this many nodes, per-node metric details are kept only for nodes with a problem or an outlier."""


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()
    return (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'")


def _badge(status: Status | str, text: str | None = None) -> str:
    value = status.value if isinstance(status, Status) else status
    return f'<span class="badge {e(value)}">{e(text if text is not None else value.upper())}</span>'


def _st(status: Status | str) -> str:
    """A status, or a check's shown state (``not_judged``), as coloured text."""
    value = status.value if isinstance(status, Status) else status
    return f'<span class="st {e(value)}">{e(state_label(value))}</span>'


def _num_td(x: float | None, text: str | None = None) -> str:
    v = "" if x is None or not math.isfinite(x) else repr(float(x))
    return f'<td class="num" data-v="{v}">{e(text if text is not None else fmt_number(x))}</td>'


def _iso_seconds(text: str | None) -> float | None:
    if not text:
        return None
    try:
        t = text[:-1] + "+00:00" if text.endswith("Z") else text
        dt = datetime.fromisoformat(t)
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    except ValueError:
        return None


def _describe_metric(m: Metric) -> str:
    where = f" [{m.device}]" if m.device else ""
    text = f"{m.name}{where} = {value_text(m)}"
    parts = [f"threshold {bound_text(m)}" if m.threshold is not None else "",
             reference_text(m) if m.expected_source or m.threshold is None else ""]
    shown = ", ".join(p for p in parts if p)
    if shown:
        text += f" ({shown})"
    return text


def _header(report: NodeReport | ClusterReport, nodes: Sequence[NodeView], gpus: int) -> str:
    verdict = report.verdict.value
    counts = state_counts(nodes)
    facts: list[tuple[str, str]] = [("run", f"<code>{e(report.run_id)}</code>")]
    if isinstance(report, ClusterReport):
        reported = sum(1 for n in nodes if not n.missing)
        failed = sum(1 for n in nodes if n.verdict.value != "success")
        expected = max(report.expected_nodes, len(nodes))
        facts.append(("nodes", f"{reported} reported of {expected} expected"
                               + (f", <b>{failed} not successful</b>" if failed else "")))
        job = f" job {e(report.job_id)}" if report.job_id else ""
        facts.append(("launched by", f"{e(report.backend)}{job}"))
    else:
        facts.append(("host", e(report.host)))
        facts.append(("profile", e(report.profile)))
        if report.device:
            facts.append(("device", e(report.device)))
    facts.append(("started", e(report.started)))
    if report.finished:
        t0, t1 = _iso_seconds(report.started), _iso_seconds(report.finished)
        took = f" ({fmt_duration(t1 - t0)})" if t0 is not None and t1 is not None and t1 >= t0 else ""
        facts.append(("finished", e(report.finished) + took))
    if gpus:  # (host, cuda device) pairs with a metric (GridBuilder.gpus)
        facts.append(("GPUs measured", str(gpus)))
    facts.append(("checks", " ".join(_badge(s, f"{counts[s]} {state_label(s).lower()}") for s in STATES
                                     if counts[s]) or "none"))
    figures = not_judged(nodes)
    if figures:
        cluster = isinstance(report, ClusterReport)
        names = ", ".join((f"{h} " if cluster else "") + f"{c} {m}" for h, c, m in figures)
        facts.append(("not judged", f'<span id="not-judged">{len(figures)} performance figures measured with no '
                                    f'threshold and no expectation: {e(names)}</span>'))
    budget = budget_view(report) if isinstance(report, NodeReport) else None
    if budget is not None:
        facts.append(("time budget", f'<a href="#budget">{e(budget.summary())}</a>'))
    version = report.version if isinstance(report, NodeReport) else ""
    if version:
        facts.append(("gpuaccept", e(version)))
    kind = "cluster" if isinstance(report, ClusterReport) else "node"
    cpu_only = cpu_only_text(report)
    if cpu_only:
        facts.insert(1, ("GPUs", f"<b>{e(cpu_only)}</b>: the verdict is the CPU pipeline's, not a GPU acceptance"))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    cpu = f'<div id="cpu-only" class="cpu-only">{e(cpu_only)}</div>' if cpu_only else ""
    mark = ' data-cpu-only="1"' if cpu_only else ""
    return (f'<header><h1>gpuaccept {kind} report</h1>'
            f'<div id="verdict" class="verdict {e(verdict)}" data-verdict="{e(verdict)}"'
            f'{mark}>{e(verdict.upper())}</div>{cpu}'
            f'<dl class="facts">{dl}</dl></header>')


def _rerun_mark(c: CheckResult) -> str:
    """A ``re-run`` badge for a deeper re-run of ``run --budget``'s second pass (empty for others)."""
    return f' {_badge("rerun", "re-run")}' if c.is_rerun else ""


_BUDGET_CLASS = {"kept": "ok", "re-run": "rerun", "left out": "left-out", "not re-run": "not-rerun"}


def _budget_section(views: Sequence[BudgetView], cluster: bool) -> str:
    rows = []
    for v in views:
        for r in v.rows:
            state = _badge(_BUDGET_CLASS[r.state], r.state) if r.state != "kept" else "kept"
            host = f"<td>{e(v.host)}</td>" if cluster else ""
            link = f'<a href="#check-{e(r.name)}">{e(r.name)}</a>' if r.state != "left out" else e(r.name)
            rows.append(f'<tr class="{_BUDGET_CLASS[r.state]}" data-budget="{e(r.state)}">{host}<td>{link}</td>'
                        f'<td>{state}</td><td>{e(r.level_text)}</td>{_num_td(r.estimate_s, r.estimate_text)}'
                        f'<td class="reason">{e(r.why)}</td></tr>')
    summary = "".join(f"<p>{e((v.host + ': ') if cluster else '')}{e(v.summary())}</p>" for v in views)
    return ('<section id="budget"><h2>Time budget</h2>'
            f'{summary}<p class="muted">Each check at the level the budget chose (a profile\'s values), the checks '
            'it left out and why, and the deeper re-runs of suspect results (a re-run adds a result; the first '
            'pass\'s stays).</p>'
            f'<table class="sortable budget"><thead><tr>{"<th>host</th>" if cluster else ""}<th>check</th>'
            '<th>budget</th><th>level</th><th>estimate</th><th>why</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></section>')


def _problems_section(nodes: Sequence[NodeView]) -> str:
    rows = []
    for n in nodes:
        if n.missing:
            rows.append(f'<tr class="missing"><td>{e(n.host)}</td><td>{_badge("missing")}</td><td>(node)</td>'
                        f'<td class="reason">{e(n.reason or "no report")}</td><td></td></tr>')
    for n, c in problems(nodes):
        hm = headline_metric(c)
        rows.append(f'<tr class="st-{c.status.value}"><td>{e(check_host(c, n))}</td><td>{_st(c.status)}</td>'
                    f'<td><a href="#check-{e(c.name)}">{e(c.name)}</a>{_rerun_mark(c)}</td>'
                    f'<td class="reason">{e(c.reason)}</td>'
                    f'<td>{e(_describe_metric(hm)) if hm is not None else ""}</td></tr>')
    if not rows:
        body = '<p class="ok-note">Nothing failed, errored or warned.</p>'
    else:
        body = ('<table class="sortable problems"><thead><tr><th>host</th><th>status</th><th>check</th>'
                f'<th>reason</th><th>key metric</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')
    return f'<section id="problems"><h2>Needs attention</h2>{body}{_next_steps(nodes)}</section>'


def _next_steps(nodes: Sequence[NodeView]) -> str:
    """Under the table: each failed check's likely causes and the commands to run next."""
    items = []
    for host, c, steps in next_steps_of(nodes):
        causes = "".join(f"<li>likely: {e(x)}</li>" for x in steps["causes"])
        commands = "".join(f"<li>run: <code>{e(x)}</code></li>" for x in steps["commands"])
        items.append(f'<div class="next-steps" data-check="{e(c.name)}"><h3>{e(c.name)} on {e(host)}: next steps'
                     f'</h3><ul>{causes}{commands}</ul></div>')
    return "".join(items)


def _coverage_note(analysis: dict[str, Any], items: Sequence[Outlier]) -> str:
    """One paragraph: what the analysis compared and what it left out (and why); '' when it has no stats."""
    cov = coverage_of(analysis)
    if not cov["groups"]:
        return ""
    line = coverage_line(analysis)
    if cov["fully"] == cov["groups"]:
        return (f'<p>No GPU or node was flagged as an outlier across {cov["groups"]} SKU/metric groups, '
                'all compared.</p>' if not items else "")
    verdict = outlier_line(analysis, len(items))
    head = f"{e(verdict[:1].upper() + verdict[1:])}. " if not items else ""
    return f'<p class="not-compared">{head}{e(line)}.</p>'


def _outlier_section(items: Sequence[Outlier], analysis: dict[str, Any]) -> str:
    note = _coverage_note(analysis, items)
    if not items:
        body = note or '<p>No outlier analysis in this report.</p>'
        return f'<section id="outliers"><h2>Outliers</h2>{body}</section>'
    rows = []
    for o in items:
        dev = o.device or "(node)"
        tags = fmt_tags(o.tags, skip=("stat", "mode", "size"))
        rows.append(f'<tr class="outlier"><td>{e(o.host)}</td><td>{e(dev)}</td><td>{e(o.check)}</td>'
                    f'<td><code>{e(o.metric)}</code> <span class="muted">{e(tags)}</span></td>'
                    f'{_num_td(o.value)}{_num_td(o.median)}{_num_td(o.mad)}{_num_td(o.z)}'
                    f'<td>{e(o.direction)}</td><td>{e(o.scope)}</td></tr>')
    return (f'<section id="outliers"><h2>Outliers {_badge("outlier", str(len(items)))}</h2>'
            '<p class="muted">Robust z-score against the group median (z = 0.6745 (value - median) / MAD), '
            f'from the cluster analysis.</p>{note}'
            '<table class="sortable outliers"><thead><tr><th>host</th><th>GPU</th><th>check</th><th>metric</th>'
            '<th>value</th><th>median</th><th>MAD</th><th>z</th><th>direction</th><th>scope</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></section>')


def _cell_style(ratio: float | None, dirn: int) -> str:
    if ratio is None:
        return ""
    bad = (1.0 - ratio) * dirn if dirn else abs(1.0 - ratio)
    t = min(abs(bad) / 0.15, 1.0)
    if bad > 0:
        r, g, b = (255 + (229 - 255) * t, 255 + (57 - 255) * t, 255 + (53 - 255) * t)
    else:
        r, g, b = (255 + (200 - 255) * t, 255 + (230 - 255) * t, 255 + (201 - 255) * t)
    fg = "#fff" if bad > 0 and t > 0.6 else "#1d1d1f"
    return f' style="background:rgb({r:.0f},{g:.0f},{b:.0f});color:{fg}"'


def _column_scale(hm: Heatmap, i: int, unit: str) -> tuple[float, str]:
    """One display unit per heatmap column, chosen for the column's median value (cells share it)."""
    values = sorted(cell[0] for cells in hm.cells.values() if (cell := cells[i]) is not None)
    return display_unit(values[len(values) // 2] if values else None, unit)


def _nc_tip(col: Column) -> str:
    return f"; not compared across nodes: {col.not_compared}" if col.not_compared else ""


def _heatmap_section(hm: Heatmap, nodes: Sequence[NodeView], idx: OutlierIndex) -> str:
    if not hm.columns:
        return ('<section id="heatmap"><h2>Nodes × metrics</h2><p>No metric differs between nodes.</p>'
                '</section>')
    scales = [_column_scale(hm, i, c.unit) for i, c in enumerate(hm.columns)]
    head = "".join(f'<th class="col{" nc" if c.not_compared else ""}" title="{e(c.check)}: {e(c.label)} '
                   f'({e(shown)}){e(_nc_tip(c))}">{e(c.label)}<br><span class="muted">{e(shown)}'
                   f'{"; not compared" if c.not_compared else ""}</span></th>'
                   for c, (_, shown) in zip(hm.columns, scales, strict=True))
    by_host = {n.host: n for n in nodes}
    rows = []
    for host in hm.hosts:
        node = by_host[host]
        if node.missing:
            rows.append(f'<tr class="missing"><th>{e(host)}</th><td class="na" colspan="{len(hm.columns)}">'
                        f'missing: {e(node.reason or "no report")}</td></tr>')
            continue
        cells = []
        for col, (factor, _), cell in zip(hm.columns, scales, hm.cells[host], strict=True):
            if cell is None:
                cells.append('<td class="na">&ndash;</td>')
                continue
            value, ratio = cell
            flagged = idx.for_host_metric(host, col.check, col.name)
            tip = f"{host} {col.label}: {fmt_value(value, col.unit)}"
            if ratio is not None:
                tip += f" ({ratio:.1%} of the median over nodes)"
            tip += _nc_tip(col)
            for o in flagged:
                tip += f"; outlier {o.device or ''} z={fmt_number(o.z)}"
            cls = ("cell outlier" if flagged else "cell") + (" nc" if col.not_compared else "")
            cells.append(f'<td class="{cls}" data-v="{value!r}" title="{e(tip)}"'
                         f'{_cell_style(ratio, col.direction)}>{e(fmt_number(value * factor))}</td>')
        status_cls = "ok" if node.verdict.value == "success" and host not in idx.hosts() else "bad"
        rows.append(f'<tr class="{status_cls}"><th>{e(host)}</th>{"".join(cells)}</tr>')
    hidden = (f" {hm.hidden_constant} metrics with the same value on every node are not shown."
              if hm.hidden_constant else "")
    skipped = [c for c in hm.columns if c.not_compared]
    whys = sorted({c.not_compared for c in skipped})
    grey = (f'; <span class="sw nc"></span> grey: not compared ({e("; ".join(whys))}), {len(skipped)} of '
            f'{len(hm.columns)} columns' if skipped else "")
    legend = ('<div class="legendbar">worse than the median over nodes <span class="sw" '
              'style="background:rgb(229,57,53)"></span><span class="sw" style="background:rgb(242,156,154)"></span>'
              '<span class="sw" style="background:#fff"></span><span class="sw" style="background:rgb(200,230,201)">'
              f'</span> better; outlined: outlier GPU on that node{grey}</div>')
    return (f'<section id="heatmap"><h2>Nodes × metrics</h2><p class="muted">Each cell is the node\'s weakest GPU '
            f'(median for metrics without a direction), coloured by its distance from the median over nodes '
            f'(full colour at 15%) where the nodes were compared.{hidden}</p>{legend}<div class="scroll">'
            f'<table class="heatmap sortable"><thead>'
            f'<tr><th>node</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div></section>')


def _sweep_section(items: Sequence[Sweep], highlight: set[str]) -> str:
    if not items:
        return ""
    charts = []
    for sw in items:
        label = f"bus bandwidth ({sw.unit})" if "busbw" in sw.name else f"{sw.name} ({sw.unit})"
        charts.append(f'<figure class="sweep" data-metric="{e(sw.name)}"><h3>{e(sw.check)}: {e(sw.title)}</h3>'
                      f'{svg.curves(sw, highlight, label)}</figure>')
    return ('<section id="collectives"><h2>Bandwidth vs message size</h2>'
            '<p class="muted">As nccl-tests plots it: bus bandwidth against message size on a log scale. '
            'Hover a point for its value.</p>'
            f'<div class="charts">{"".join(charts)}</div></section>')


def _bar_groups(check: CheckResult, host: str, idx: OutlierIndex, skip_names: set[str]) -> str:
    """Per-device bar charts, one per metric (and tag set) measured on devices, with a reference or siblings.

    Metrics measured over several message sizes are left to the curves.
    """
    sizes: dict[str, set[float]] = {}
    for m in check.metrics:
        s = size_of(m)
        if s is not None:
            sizes.setdefault(m.name, set()).add(s)
    skip = skip_names | {name for name, ss in sizes.items() if len(ss) > 1}
    groups: dict[tuple[str, str], list[Metric]] = {}
    for m in check.metrics:
        if m.device is None or m.name in skip:
            continue
        key_tags = {k: v for k, v in m.tags.items() if k not in ("rank", "count")}
        groups.setdefault((m.name, tags_key(key_tags)), []).append(m)
    charts = []
    for (name, _), ms in groups.items():
        has_ref = any(m.expected is not None or m.threshold is not None for m in ms)
        if not has_ref and len(ms) < 2:
            continue
        ms = sorted(ms, key=lambda m: device_sort_key(m.device))
        items = []
        for m in ms:
            rank = m.tags.get("rank", check.rank)
            label = (m.device or "") + (f" r{rank}" if rank is not None and len(ms) > 1 and
                                         len({x.device for x in ms}) < len(ms) else "")
            o = idx.find(host, check.name, m)
            state = "plain" if m.threshold is None else metric_status(m).value
            note = f"outlier: z={fmt_number(o.z)} vs median {fmt_number(o.median)}" if o else ""
            items.append(svg.Bar(label=label, value=m.value, expected=m.expected,
                                 threshold=m.threshold.value if m.threshold else None,
                                 threshold_op=m.threshold.op if m.threshold else ">=", state=state,
                                 outlier=o is not None, note=note))
        tags = fmt_tags(ms[0].tags, skip=("stat",))
        title = f"{name} ({ms[0].unit})"
        whole = "".join(_badge("outlier", f"node median outlier z={fmt_number(o.z)}")
                        for o in idx.node_level(host, check.name, name))
        charts.append(f'<figure class="bars" data-metric="{e(name)}"><h4>{e(title)} '
                      f'<span class="muted">{e(tags)}</span> {whole}</h4>{svg.bars(items, ms[0].unit, title)}</figure>')
    return f'<div class="charts">{"".join(charts)}</div>' if charts else ""


def _metrics_table(check: CheckResult, host: str, idx: OutlierIndex) -> str:
    if not check.metrics:
        return ""
    rows = []
    for m in sorted(check.metrics, key=lambda m: (m.name, device_sort_key(m.device))):
        st = metric_status(m) if m.threshold is not None else None
        o = idx.find(host, check.name, m)
        cls = "outlier" if o else (f"st-{st.value}" if st and st is not Status.PASS else "ok")
        pct = m.value / m.expected if m.expected and math.isfinite(m.value) else None
        pct_text = f"{pct:.0%}" if pct is not None else ""
        missed = st is not None and st is not Status.PASS
        # value, expected and threshold in one shown unit; beside a missed bound, the unit it is written in
        factor, unit = (1.0, m.unit) if missed else display_unit(m.value, m.unit)
        expected_td = _num_td(m.expected, "" if m.expected is None else fmt_number(m.expected * factor))
        if m.expected is not None and m.expected_source:  # how it was derived, on hover
            expected_td = expected_td.replace("<td ", f'<td title="{e(m.expected_source)}" ', 1)
        thr = f"{m.threshold.op} {fmt_number(m.threshold.value * factor)}" if m.threshold else ""
        if missed and m.threshold is not None:
            thr = f"{m.threshold.op} {fmt_plain(m.threshold.value)}"
        if m.threshold is not None and m.threshold.clamped:
            thr += " (clamped: spread too wide to bound)"
        src = f" ({m.threshold.source})" if m.threshold and m.threshold.source != "default" else ""
        shown = value_text(m).split(" ")[0] if missed else fmt_number(m.value * factor)
        verdict = _st(st) if st is not None else _st(NOT_JUDGED) if is_not_judged(m) else ""
        if o:
            verdict += f' {_badge("outlier", f"outlier z={fmt_number(o.z)}")}'
        rows.append(f'<tr class="{cls}"><td><code>{e(m.name)}</code></td><td>{e(m.device or "")}</td>'
                    f'<td class="muted">{e(fmt_tags(m.tags))}</td>{_num_td(m.value, shown)}'
                    f'<td>{e(unit)}</td>'
                    f'{expected_td}{_num_td(pct, pct_text)}'
                    f'<td>{e(thr)}<span class="muted">{e(src)}</span></td><td>{verdict}</td></tr>')
    labels = {reference_label(m) for m in check.metrics if m.expected is not None}
    ref = labels.pop() if len(labels) == 1 else "expected"
    return ('<table class="sortable metrics"><thead><tr><th>metric</th><th>device</th><th>tags</th><th>value</th>'
            f'<th>unit</th><th>{ref}</th><th>% of {ref}</th><th>threshold</th><th>judged</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


RAW_DETAILS_MAX_CHARS = 64 * 1024
"""A check's raw details are cut after this many characters of JSON (the rest stays in the report file)."""


def _raw_details(check: CheckResult) -> str:
    if not check.details:
        return ""
    text = json.dumps(check.details, indent=2, sort_keys=True, default=str)
    cut = ""
    if len(text) > RAW_DETAILS_MAX_CHARS:
        cut = (f'<p class="muted left-out">{len(text) - RAW_DETAILS_MAX_CHARS:,} more characters of these details '
               'are in the report JSON.</p>')
        text = text[:RAW_DETAILS_MAX_CHARS] + "\n..."
    return f'<details class="raw"><summary>details</summary><pre>{e(text)}</pre>{cut}</details>'


_NO_OUTLIERS = OutlierIndex([])


def _check_section(name: str, nodes: Sequence[NodeView], idx: OutlierIndex, swept: set[str],
                   detail_hosts: set[str] | None, cluster: bool) -> str:
    entries = [(n, c) for n in nodes for c in n.checks if c.name == name]
    counts = count_states([c for _, c in entries])
    badges = "".join(_badge(s, f"{counts[s]} {state_label(s).lower()}") for s in STATES if counts[s])
    ok = not any(c.status in (Status.FAIL, Status.ERROR, Status.WARN) for _, c in entries)
    rows = []
    listed = entries if detail_hosts is None else [(n, c) for n, c in entries if check_host(c, n) in detail_hosts]
    for n, c in listed:
        host = check_host(c, n)
        hm = headline_metric(c)
        cls = "ok" if c.status in (Status.PASS, Status.SKIP) else f"st-{c.status.value}"
        rank = f" rank {c.rank}" if c.rank is not None else ""
        rows.append(f'<tr class="{cls}"><td>{e(host)}{e(rank)}{_rerun_mark(c)}</td><td>{_st(c.state)}</td>'
                    f'{_num_td(c.duration_s, fmt_duration(c.duration_s))}'
                    f'<td>{e(_describe_metric(hm)) if hm is not None else ""}</td>'
                    f'<td class="reason">{e(c.reason)}</td></tr>')
    table = ('<table class="sortable check-nodes"><thead><tr><th>host</th><th>status</th><th>time</th>'
             f'<th>key metric</th><th>reason</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
             f'{fleet.left_out_note(len(listed), len(entries), "results of this check")}')
    parts = []
    left_out = 0
    for n, c in entries:
        host = check_host(c, n)
        if detail_hosts is not None and host not in detail_hosts:
            left_out += 1
            continue
        own = idx if not c.is_rerun else _NO_OUTLIERS  # the analysis judged the first pass, not a re-run
        inner = _bar_groups(c, host, own, swept if not c.is_rerun else set()) + p2p_matrix_html(c) + \
            loss_curves(c) + gemm_ratio(c, n.checks) + _metrics_table(c, host, own) + _raw_details(c)
        if not inner:
            continue
        flagged = any(own.for_host_metric(host, c.name, m.name) for m in c.metrics)
        node_ok = c.status in (Status.PASS, Status.SKIP) and not flagged
        opened = " open" if not cluster or not node_ok else ""
        mark = f' {_badge("outlier")}' if flagged else ""
        parts.append(f'<details class="node {"ok" if node_ok else "bad"}"{opened} data-host="{e(host)}">'
                     f'<summary><b>{e(host)}</b>{_rerun_mark(c)} {_st(c.state)}{mark} '
                     f'<span class="muted">{e(c.reason)}</span>'
                     f'</summary>{inner}</details>')
    note = (f'<p class="muted">Metrics of {left_out} healthy nodes are left out of this page; render one with '
            '<code>gpuaccept report RUN --host HOST</code>.</p>' if left_out else "")
    return (f'<section class="check {"ok" if ok else "bad"}" id="check-{e(name)}" data-check="{e(name)}">'
            f'<h2>{e(name)} {badges}</h2>{table}{"".join(parts)}{note}</section>')


def _conformance_section(drift: dict[str, Any]) -> str:
    """The nodes that differ from the majority configuration of their model
    (:func:`gpuaccept.results.conformance_fleet.fleet_drift`), one row per differing item."""
    rows = [f'<tr class="outlier"><td>{e(n["host"])}</td><td>{e(n["model"])}</td><td>{e(i["item"])}</td>'
            f'<td>{e(str(i["value"]))}</td><td>{e(str(i["majority"]))} ({i["count"]} of {i["of"]})</td></tr>'
            for n in drift["odd"] for i in n["items"]]
    table = ('<table class="sortable"><thead><tr><th>host</th><th>model</th><th>item</th><th>value</th>'
             f'<th>majority</th></tr></thead><tbody>{"".join(rows)}</tbody></table>' if rows else "")
    split = "".join(f"<p>{e(line)}</p>" for line in drift_lines({"odd": [], "split": drift["split"]}))
    return (f'<section id="conformance"><h2>Configuration drift</h2><p>{e(drift_summary(drift))}</p>'
            f'{table}{split}</section>')


def render_html(report: NodeReport | ClusterReport, *, analysis: dict[str, Any] | None = None,
                generated: str | None = None, grid: GridBuilder | None = None) -> str:
    """The report as one self-contained HTML page (UTF-8 text).

    Outliers come from ``analysis`` (gpuaccept.results.analysis's dict), by
    default the cluster report's own; ``generated`` is the time in the footer; ``grid``: the sweeps, heatmap and
    GPU count already gathered from the full nodes (:mod:`gpuaccept.report.slim`), else gathered here.
    """
    nodes = node_views(report)
    analysis = analysis_of(report, analysis)
    outs = outliers(report, analysis)
    idx = OutlierIndex(outs)
    grid = grid or GridBuilder.of(nodes)
    sweep_list = grid.sweeps()
    swept = {name for _, name in swept_names(sweep_list)}
    cluster = isinstance(report, ClusterReport)
    highlight = {n.host for n in nodes if n.verdict.value != "success"} | idx.hosts()
    detail_hosts = None
    large = len(nodes) > DETAIL_ALL_NODES_UP_TO
    listed: list[str] = []
    if large:  # a fleet: list only the nodes that need a look, at most MAX_LISTED (html_fleet)
        look = fleet.needs_look(nodes, idx)
        listed = look[:fleet.MAX_LISTED]
        detail_hosts = set(listed)
    sections = [_header(report, nodes, len(grid.gpus)), _problems_section(nodes)]
    nav = ['<a href="#problems">needs attention</a>']
    drift = fleet_drift(configs_of_reports([report])) if cluster else None
    if drift and drift["groups"]:  # the configuration first: a drifted node explains the outliers it causes
        sections.append(_conformance_section(drift))
        nav.append('<a href="#conformance">configuration drift</a>')
    if cluster or outs:
        shown_outs = outs[:fleet.MAX_OUTLIERS] if large else outs
        sections.append(_outlier_section(shown_outs, analysis).removesuffix("</section>")
                        + fleet.left_out_note(len(shown_outs), len(outs), "outliers (smallest |z|)") + "</section>")
        nav.append('<a href="#outliers">outliers</a>')
    if cluster:
        min_nodes, not_compared = cross_node_coverage(analysis)
        hm = grid.heatmap(min_nodes=min_nodes, not_compared=not_compared, sweep_list=sweep_list)
        if large:
            sections.append(fleet.distribution_section(hm, nodes, idx))
            sections.append(fleet.verdict_grid_section(nodes, idx, listed))
            nav += ['<a href="#distributions">distributions</a>', '<a href="#grid">nodes × checks</a>']
            sections.append(_heatmap_section(fleet.bounded_heatmap(hm, listed), nodes, idx).removesuffix("</section>")
                            + fleet.left_out_note(len(listed), len(nodes), "nodes' heatmap rows") + "</section>")
        else:
            sections.append(_heatmap_section(hm, nodes, idx))
        nav.append('<a href="#heatmap">heatmap</a>')
        if nic_table := html_rdma.section(nodes):  # the rdma check's NIC x node table
            sections.append(nic_table)
            nav.append('<a href="#rdma-nics">NIC × node</a>')
    budgets = budget_views(nodes)
    if budgets:
        sections.append(_budget_section(budgets, cluster))
        nav.append('<a href="#budget">time budget</a>')
    if sweep_list:
        drawn, n_drawn, n_all = fleet.bounded_sweeps(sweep_list, highlight) if large else (list(sweep_list), 0, 0)
        kept = "drawn: every flagged node's and an even sample of the rest"
        sections.append(_sweep_section(drawn, highlight).removesuffix("</section>")
                        + fleet.left_out_note(n_drawn, n_all, "curves", "drawn", kept) + "</section>")
        nav.append('<a href="#collectives">bandwidth vs size</a>')
    for name in check_names(nodes):
        sections.append(_check_section(name, nodes, idx, swept, detail_hosts, cluster))
        nav.append(f'<a href="#check-{e(name)}">{e(name)}</a>')
    toolbar = (f'<div class="toolbar"><nav>{"".join(nav)}</nav><label><input type="checkbox" id="only-problems"> '
               'show only problems</label></div>')
    sections.insert(1, toolbar)
    when = generated or datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    title = f"gpuaccept {report.verdict.value.upper()} {report.run_id}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{e(_csp())}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="generator" content="gpuaccept {e(__version__)}">'
            f'<title>{e(title)}</title><style>{CSS}</style></head>\n<body>\n'
            + "\n".join(sections)
            + f'\n<footer>Generated by gpuaccept {e(__version__)} at {e(when)}. This file is self-contained and '
              f'opens offline.</footer>\n<script>{JS}</script>\n</body></html>\n')
