"""Inline SVG charts for the HTML report: per-GPU bars against a reference, and value-vs-size curves.

Pure functions returning SVG text; every string taken from a report is
escaped. Charts carry ``<title>`` tooltips and CSS classes the page styles.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from gpuaccept.report.grid import Sweep
from gpuaccept.report.views import fmt_bytes, fmt_number, fmt_value

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f", "#d62728")
MAX_COLOURED_SERIES = len(PALETTE)
LEGEND_CHARS = 22


def e(text: object) -> str:
    """Escape for element text and double-quoted attributes."""
    return escape(str(text), quote=True)


@dataclass
class Bar:
    """One bar: ``label`` (a device), ``value``, optional ``expected`` (100% mark) and threshold.

    ``state`` is ``pass``, ``warn``, ``fail`` or ``plain`` (no bound); ``note``
    is extra tooltip text (an outlier's evidence); ``outlier`` highlights it.
    """

    label: str
    value: float
    expected: float | None = None
    threshold: float | None = None
    threshold_op: str = ">="
    state: str = "plain"
    outlier: bool = False
    note: str = ""


def bars(items: Sequence[Bar], unit: str, title: str) -> str:
    """A horizontal bar chart, one bar per device, with the reference (solid) and threshold (dashed) marked."""
    finite = [b for b in items if math.isfinite(b.value)]
    refs = [x for b in items for x in (b.expected, b.threshold) if x is not None and math.isfinite(x)]
    top = max([b.value for b in finite] + refs + [0.0]) * 1.05 or 1.0
    label_w, area_w, text_w, row_h, pad_t = 80, 420, 190, 22, 18
    width, height = label_w + area_w + text_w, pad_t + row_h * len(items) + 8

    def x(v: float) -> float:
        return label_w + max(0.0, min(v, top)) / top * area_w

    out = [f'<svg class="bars" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{e(title)}</title>']
    for i, b in enumerate(items):
        y = pad_t + i * row_h
        ok = math.isfinite(b.value)
        pct = f"{b.value / b.expected:.0%} of expected" if ok and b.expected else ""
        tip = f"{b.label}: {fmt_value(b.value, unit)}" + (f", {pct} {fmt_value(b.expected, unit)}" if pct else "")
        if b.threshold is not None:
            tip += f", threshold {b.threshold_op} {fmt_value(b.threshold, unit)}"
        if b.note:
            tip += f"; {b.note}"
        cls = f"bar {b.state}" + (" outlier" if b.outlier else "")
        out.append(f'<g class="{cls}"><title>{e(tip)}</title>'
                   f'<text class="lbl" x="{label_w - 6}" y="{y + 15}" text-anchor="end">{e(b.label)}</text>')
        if ok:
            w = x(b.value) - label_w
            out.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" rx="2"/>')
            short = fmt_number(b.value) + (f" ({b.value / b.expected:.0%})" if b.expected else "")
            if b.outlier:
                short += " \u25c0 outlier"
            out.append(f'<text class="val" x="{x(b.value) + 4:.1f}" y="{y + 15}">{e(short)}</text>')
        else:
            out.append(f'<text class="val" x="{label_w + 4}" y="{y + 15}">n/a</text>')
        out.append("</g>")
    ref_marks = []
    exp = next((b.expected for b in items if b.expected is not None), None)
    thr = next((b.threshold for b in items if b.threshold is not None), None)
    if exp is not None and math.isfinite(exp):
        ref_marks.append(f'<line class="ref expected" x1="{x(exp):.1f}" x2="{x(exp):.1f}" y1="{pad_t - 4}" '
                         f'y2="{height - 6}"><title>expected {e(fmt_value(exp, unit))}</title></line>'
                         f'<text class="reflbl" x="{x(exp):.1f}" y="{pad_t - 6}" text-anchor="middle">expected</text>')
    if thr is not None and math.isfinite(thr):
        anchor = "end" if exp is not None and abs(x(thr) - x(exp or 0)) < 60 and thr < (exp or 0) else "middle"
        ref_marks.append(f'<line class="ref threshold" x1="{x(thr):.1f}" x2="{x(thr):.1f}" y1="{pad_t - 4}" '
                         f'y2="{height - 6}"><title>threshold {e(fmt_value(thr, unit))}</title></line>'
                         f'<text class="reflbl thr" x="{x(thr):.1f}" y="{pad_t - 6}" text-anchor="{anchor}">'
                         f'threshold</text>')
    out.extend(ref_marks)
    out.append("</svg>")
    return "".join(out)


def _nice_max(v: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``v``."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    k = math.floor(math.log10(v))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * 10**k >= v:
            return m * 10**k
    return 10.0 ** (k + 1)


def curves(sweep: Sweep, highlight: set[str], label: str) -> str:
    """Value vs message size on a log2 x-axis, one line per series (nccl-tests style busbw plot).

    With more series than colours, every series is a thin grey line, the
    median over series is drawn bold, and the ``highlight`` hosts (failed or
    flagged) are drawn in red with their names.
    """
    width, height, ml, mr, mt, mb = 590, 330, 60, 170, 16, 52
    pw, ph = width - ml - mr, height - mt - mb
    sizes = sorted({p[0] for pts in sweep.series.values() for p in pts})
    values = [p[1] for pts in sweep.series.values() for p in pts if math.isfinite(p[1])]
    expected = [p[2] for pts in sweep.series.values() for p in pts if p[2] is not None]
    lo, hi = math.log2(sizes[0]), math.log2(sizes[-1])
    span = hi - lo or 1.0
    ymax = _nice_max(max(values + expected + [0.0]))

    def px(size: float) -> float:
        return ml + (math.log2(size) - lo) / span * pw

    def py(v: float) -> float:
        return mt + ph - max(0.0, min(v, ymax)) / ymax * ph

    out = [f'<svg class="curve" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'xmlns="http://www.w3.org/2000/svg" data-series="{len(sweep.series)}"><title>{e(sweep.title)}</title>']
    # grid and axes
    for i in range(6):
        v = ymax * i / 5
        y = py(v)
        out.append(f'<line class="grid" x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{e(fmt_number(v))}</text>')
    step = max(1, math.ceil(span / 8))
    k = math.ceil(lo)
    while k <= hi + 1e-9:
        xx = px(2.0**k)
        out.append(f'<line class="grid v" x1="{xx:.1f}" x2="{xx:.1f}" y1="{mt}" y2="{mt + ph}"/>'
                   f'<text class="tick" x="{xx:.1f}" y="{mt + ph + 16}" text-anchor="middle">'
                   f'{e(fmt_bytes(2.0**k))}</text>')
        k += step
    out.append(f'<line class="axis" x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}"/>'
               f'<line class="axis" x1="{ml}" x2="{ml}" y1="{mt}" y2="{mt + ph}"/>'
               f'<text class="axlbl" x="{ml + pw / 2:.1f}" y="{height - 10}" text-anchor="middle">'
               f'message size (log scale)</text>'
               f'<text class="axlbl" transform="translate(14 {mt + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f'{e(label)}</text>')

    def polyline(pts: Sequence[tuple[float, float, float | None]], cls: str, colour: str | None,
                 name: str, dots: bool) -> str:
        good = [(s, v) for s, v, _ in pts if math.isfinite(v)]
        coords = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in good)
        style = f' style="stroke:{colour}"' if colour else ""
        text = [f'<g class="series {cls}" data-label="{e(name)}"><title>{e(name)}</title>'
                f'<polyline points="{coords}"{style}/>']
        if dots:
            fill = f' style="fill:{colour}"' if colour else ""
            for s, v in good:
                text.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="2.5"{fill}>'
                            f'<title>{e(name)}: {e(fmt_bytes(s))} \u2192 {e(fmt_value(v, sweep.unit))}</title>'
                            f'</circle>')
        text.append("</g>")
        return "".join(text)

    legend: list[tuple[str, str, str]] = []  # (name, colour, css class)
    labels = sorted(sweep.series)
    many = len(labels) > MAX_COLOURED_SERIES
    if expected:
        exp_pts = sorted({(s, x) for pts in sweep.series.values() for s, _, x in pts if x is not None})
        out.append(polyline([(s, x, None) for s, x in exp_pts], "expected", None, "expected", False))
        legend.append(("expected", "#555", "expected"))
    if many:
        for name in labels:
            if sweep.hosts.get(name) not in highlight:
                out.append(polyline(sweep.series[name], "bg", None, name, False))
        med = []
        for s in sizes:
            vals = [v for pts in sweep.series.values() for ps, v, _ in pts if ps == s and math.isfinite(v)]
            if vals:
                med.append((s, statistics.median(vals), None))
        out.append(polyline(med, "median", "#1f77b4", f"median of {len(labels)}", True))
        legend.append((f"median of {len(labels)}", "#1f77b4", "median"))
        for name in labels:
            if sweep.hosts.get(name) in highlight:
                out.append(polyline(sweep.series[name], "flagged", "#d62728", name, True))
                legend.append((name, "#d62728", "flagged"))
    else:
        for i, name in enumerate(labels):
            colour = PALETTE[i % len(PALETTE)]
            flagged = sweep.hosts.get(name) in highlight
            out.append(polyline(sweep.series[name], "flagged" if flagged else "fg", colour, name, True))
            legend.append((name, colour, "flagged" if flagged else "fg"))
    lx = ml + pw + 14
    for i, (name, colour, cls) in enumerate(legend[:16]):
        y = mt + 8 + i * 18
        short = name if len(name) <= LEGEND_CHARS else name[:LEGEND_CHARS - 1] + "\u2026"
        out.append(f'<g class="legend {cls}"><title>{e(name)}</title><line x1="{lx}" x2="{lx + 18}" y1="{y}" '
                   f'y2="{y}" style="stroke:{colour}"/><text x="{lx + 24}" y="{y + 4}">{e(short)}</text></g>')
    if len(legend) > 16:
        out.append(f'<text class="legend" x="{lx}" y="{mt + 8 + 16 * 18 + 4}">+{len(legend) - 16} more</text>')
    out.append("</svg>")
    return "".join(out)
