"""The HTML report of a large cluster: what stays bounded when a page would otherwise list every node.

Above :data:`FLEET_NODES` nodes the page keeps every summary but lists only the nodes that need a
look (failed, errored, warned, missing, or flagged by the outlier analysis), at most
:data:`MAX_LISTED` of them per table: a distribution table per SKU and metric (over every node) and a
nodes × checks verdict grid replace the full heatmap; the outlier table shows the :data:`MAX_OUTLIERS`
largest |z|; each check's node table and per-node details list only those nodes; collective sweeps
draw the flagged nodes' curves and an even sample of the rest. Each section says what it left out
and where the full data is (the report JSON; ``gpuaccept report RUN --host HOST`` for one node).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gpuaccept.model import Status
from gpuaccept.report.grid import Heatmap, Sweep
from gpuaccept.report.svg import e
from gpuaccept.report.units import display_unit
from gpuaccept.report.views import STATES, NodeView, OutlierIndex, check_names, fmt_number
from gpuaccept.results.rows import node_sku

FLEET_NODES = 64
"""Above this many nodes the page lists only the nodes that need a look (the rest are summarised)."""
MAX_LISTED = 200
"""At most this many nodes in any one table or grid of a large cluster's page."""
MAX_OUTLIERS = 200
"""At most this many rows in a large cluster's outlier table (largest |z| first)."""
MAX_SWEEP_SERIES = 128
"""At most this many curves per sweep chart of a large cluster (flagged series first)."""

WHERE_FULL = ("every value is in the report JSON; <code>gpuaccept report RUN --host HOST</code> renders one node "
              "in full")


def needs_look(nodes: Sequence[NodeView], idx: OutlierIndex) -> list[str]:
    """Hosts that are missing, did not succeed, have a failed, errored or warned check, or were flagged as
    outliers, in node order."""
    flagged = idx.hosts()
    out = []
    for n in nodes:
        bad = n.missing or n.host in flagged or n.verdict.value != "success" or \
            any(c.status in (Status.FAIL, Status.ERROR, Status.WARN) for c in n.checks)
        if bad:
            out.append(n.host)
    return out


def left_out_note(shown: int, total: int, what: str, verb: str = "listed", how: str = "") -> str:
    """``<p>`` saying how many of ``total`` were left out (``how``: which were kept), or '' when none."""
    if shown >= total:
        return ""
    return (f'<p class="muted left-out">{total - shown:,} of {total:,} {what} are not {verb} on this page '
            f'({how + "; " if how else ""}{WHERE_FULL}).</p>')


def _node_skus(nodes: Sequence[NodeView]) -> dict[str, str]:
    """Each node's GPU SKU (``skus.yaml`` id, ``mixed``, or ``unknown``) from its env check."""
    out = {}
    for n in nodes:
        checks = [{"name": c.name, "details": c.details} for c in n.report.checks] if n.report is not None else []
        out[n.host] = node_sku({"checks": checks}) or "unknown"
    return out


def distribution_section(hm: Heatmap, nodes: Sequence[NodeView], idx: OutlierIndex) -> str:
    """Per SKU and heatmap column (each node's weakest GPU): nodes, min, p5, median, p95, max, outlier nodes."""
    if not hm.columns:
        return ""
    skus = _node_skus(nodes)
    rows = []
    for i, col in enumerate(hm.columns):
        by_sku: dict[str, list[tuple[str, float]]] = {}
        for host in hm.hosts:
            cell = hm.cells[host][i]
            if cell is not None:
                by_sku.setdefault(skus.get(host, "unknown"), []).append((host, cell[0]))
        for sku in sorted(by_sku):
            pairs = by_sku[sku]
            values = np.array([v for _, v in pairs])
            factor, shown = display_unit(float(np.median(values)), col.unit)
            stats = np.percentile(values, [0, 5, 50, 95, 100]) * factor
            flagged = sum(1 for h, _ in pairs if idx.for_host_metric(h, col.check, col.name))
            cells = "".join(f'<td class="num">{e(fmt_number(float(x)))}</td>' for x in stats)
            rows.append(f'<tr><td>{e(sku)}</td><td>{e(col.check)}</td><td><code>{e(col.label)}</code></td>'
                        f'<td>{e(shown)}</td><td class="num">{len(pairs):,}</td>{cells}'
                        f'<td class="num">{flagged:,}</td></tr>')
    return ('<section id="distributions"><h2>Distributions per SKU and metric</h2>'
            f'<p class="muted">Over all {len(hm.hosts):,} nodes: each node\'s weakest GPU per metric (as in the '
            'heatmap), its percentiles per GPU SKU, and how many nodes the outlier analysis flagged.</p>'
            '<div class="scroll"><table class="sortable distributions"><thead><tr><th>SKU</th><th>check</th>'
            '<th>metric</th><th>unit</th><th>nodes</th><th>min</th><th>p5</th><th>median</th><th>p95</th>'
            f'<th>max</th><th>outlier nodes</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div></section>')


def verdict_grid_section(nodes: Sequence[NodeView], idx: OutlierIndex, listed: Sequence[str]) -> str:
    """Nodes × checks: one cell per check with its state, for the listed nodes; the others counted in one row."""
    names = check_names(nodes)
    by_host = {n.host: n for n in nodes}
    flagged = idx.hosts()
    head = "".join(f'<th class="col">{e(name)}</th>' for name in names)
    rows = []
    for host in listed:
        n = by_host[host]
        if n.missing:
            rows.append(f'<tr class="missing"><th>{e(host)}</th><td class="na" colspan="{len(names)}">'
                        f'missing: {e(n.reason or "no report")}</td></tr>')
            continue
        states = {c.name: c.state for c in n.checks}
        cells = "".join(f'<td class="st-{e(str(states[name]))}">{e(str(states[name]))}</td>' if name in states
                        else '<td class="na">&ndash;</td>' for name in names)
        mark = " outlier" if host in flagged else ""
        rows.append(f'<tr class="bad{mark}"><th>{e(host)}</th>{cells}</tr>')
    rest = len(nodes) - len(needs_look(nodes, idx))
    if rest:
        rows.append(f'<tr class="ok"><th>{rest:,} other nodes</th><td colspan="{len(names)}">every check passed '
                    'or was skipped, no outlier</td></tr>')
    counts = {s: 0 for s in STATES}
    for n in nodes:
        for c in n.checks:
            counts[c.state] = counts.get(c.state, 0) + 1
    total = ", ".join(f"{v:,} {k}" for k, v in counts.items() if v)
    return ('<section id="grid"><h2>Nodes × checks</h2>'
            f'<p class="muted">Check results over {len(nodes):,} nodes: {e(total)}. Listed: the nodes that need a '
            'look.</p><div class="scroll"><table class="sortable verdict-grid"><thead><tr><th>node</th>'
            f'{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
            f'{left_out_note(len(listed), len(needs_look(nodes, idx)), "nodes that need a look")}</section>')


def bounded_heatmap(hm: Heatmap, listed: Sequence[str]) -> Heatmap:
    """The heatmap with only the listed hosts' rows (columns and ratios as computed over every node)."""
    keep = set(listed)
    return replace(hm, hosts=[h for h in hm.hosts if h in keep], cells={h: hm.cells[h] for h in hm.cells
                                                                        if h in keep})


def bounded_sweeps(items: Sequence[Sweep], highlight: set[str]) -> tuple[list[Sweep], int, int]:
    """Each sweep with at most :data:`MAX_SWEEP_SERIES` series: highlighted hosts' first, then an even sample.

    Returns the sweeps, and the series drawn and present over all of them."""
    out, drawn, total = [], 0, 0
    for sw in items:
        labels = list(sw.series)
        total += len(labels)
        if len(labels) <= MAX_SWEEP_SERIES:
            out.append(sw)
            drawn += len(labels)
            continue
        hot = [lb for lb in labels if sw.hosts.get(lb, lb.split(" ")[0]) in highlight][:MAX_SWEEP_SERIES]
        cold = [lb for lb in labels if lb not in set(hot)]
        room = MAX_SWEEP_SERIES - len(hot)
        step = len(cold) / room if room > 0 else 0
        sample = [cold[int(i * step)] for i in range(room)] if room > 0 else []
        keep = set(hot) | set(sample)
        out.append(replace(sw, series={lb: pts for lb, pts in sw.series.items() if lb in keep},
                           hosts={lb: h for lb, h in sw.hosts.items() if lb in keep}))
        drawn += len(keep)
    return out, drawn, total
