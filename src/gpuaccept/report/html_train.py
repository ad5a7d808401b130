"""The HTML report's reference training run: its loss curves, one line per device (per run on a single
device), a device that departs from the others in red with its first departing step marked, the task's bound
and floor dashed; and its model TFLOP/s against the compute check's GEMM rate on each device
(:mod:`gpuaccept.trainspeed`, measured, not judged). Pure: reads a ``reference_train`` result and its node's."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from gpuaccept.model import CheckResult
from gpuaccept.report.svg import e
from gpuaccept.trainspeed import flops_text, train_vs_gemm

COLOURS = ("#1565c0", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#5d4037", "#37474f", "#ad1457")
DEPART = "#c62828"


def _series(check: CheckResult) -> dict[str, list[float]]:
    """``{label: losses}`` of every run in the details (``cpu#1`` for a single device's repeated runs)."""
    out: dict[str, list[float]] = {}
    devices = check.details.get("devices")
    if not isinstance(devices, dict):
        return out
    for runs in devices.values():
        for label, run in (runs.items() if isinstance(runs, dict) else ()):
            loss = run.get("loss") if isinstance(run, dict) else None
            if isinstance(loss, list) and loss and all(isinstance(x, (int, float)) for x in loss):
                out[str(label)] = [float(x) for x in loss]
    return out


def _departures(series: dict[str, Any], check: CheckResult) -> dict[str, int]:
    """``{label: step}`` of the runs whose digests depart from the majority's (every run when there is none),
    as the check votes (``gpuaccept.checks.reftrain_task.vote_curves``; the report does not import checks)."""
    curves = {lb: tuple(run["digests"]) for runs in check.details.get("devices", {}).values()
              if isinstance(runs, dict) for lb, run in runs.items()
              if isinstance(run, dict) and isinstance(run.get("digests"), list) and lb in series}
    if len(curves) < 2:
        return {}
    top, n = Counter(curves.values()).most_common(1)[0]
    refs = [top] if 2 * n > len(curves) else list(dict.fromkeys(curves.values()))
    out = {}
    for label, c in curves.items():
        others = [r for r in refs if r != c] if len(refs) > 1 else refs
        if c == top and len(refs) == 1:
            continue
        out[label] = min(next((i for i, (a, b) in enumerate(zip(c, r, strict=False)) if a != b), min(len(c), len(r)))
                         for r in others)
    return out


def loss_curves(check: CheckResult) -> str:
    """An inline SVG figure of the loss per step, or ``""`` when the result carries no curves."""
    series = _series(check)
    if check.name != "reference_train" or not series:
        return ""
    raw_task = check.details.get("task")
    task: dict[str, Any] = raw_task if isinstance(raw_task, dict) else {}
    refs = {k: float(task[k]) for k in ("bound_nats", "floor_nats") if isinstance(task.get(k), (int, float))}
    departed = _departures(series, check)
    values = [v for s in series.values() for v in s if math.isfinite(v)] + list(refs.values())
    lo, hi = min([*values, 0.0]), max([*values, 1.0]) * 1.05
    steps = max(len(s) for s in series.values())
    width, height, ml, mr, mt, mb = 590, 300, 56, 150, 14, 44
    pw, ph = width - ml - mr, height - mt - mb

    def px(i: float) -> float:
        return ml + i / max(steps - 1, 1) * pw

    def py(v: float) -> float:
        return mt + ph - (min(max(v, lo), hi) - lo) / ((hi - lo) or 1.0) * ph

    out = [f'<svg class="curve losscurve" role="img" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" data-series="{len(series)}">'
           '<title>loss per step</title>',
           f'<line class="axis" x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}"/>'
           f'<line class="axis" x1="{ml}" x2="{ml}" y1="{mt}" y2="{mt + ph}"/>'
           f'<text class="axlbl" x="{ml + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">step</text>'
           f'<text class="axlbl" transform="translate(14 {mt + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
           'loss (nats/token)</text>']
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        out.append(f'<text class="tick" x="{ml - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    out.append(f'<text class="tick" x="{px(steps - 1):.1f}" y="{mt + ph + 16}" text-anchor="middle">'
               f'{steps - 1}</text>')
    for name, v in refs.items():
        what = "bound" if name == "bound_nats" else "floor"
        out.append(f'<g class="series expected" data-label="{what}"><title>{what} {v:.4f}</title>'
                   f'<polyline points="{ml},{py(v):.1f} {ml + pw},{py(v):.1f}"/></g>')
    legend = []
    for k, (label, losses) in enumerate(sorted(series.items())):
        bad = label in departed
        colour = DEPART if bad else COLOURS[k % len(COLOURS)]
        pts = " ".join(f"{px(i):.1f},{py(v):.1f}" for i, v in enumerate(losses) if math.isfinite(v))
        note = f", departs at step {departed[label]}" if bad else ""
        out.append(f'<g class="series{" flagged" if bad else ""}" data-label="{e(label)}"><title>{e(label)}{note}'
                   f'</title><polyline points="{pts}" style="stroke:{colour}"/>')
        if bad and departed[label] < len(losses):
            s = departed[label]
            out.append(f'<circle cx="{px(s):.1f}" cy="{py(losses[s]):.1f}" r="4" style="fill:{colour}">'
                       f'<title>{e(label)} departs at step {s}</title></circle>')
        out.append("</g>")
        legend.append((f"{label}{' departs @' + str(departed[label]) if bad else ''}", colour))
    for j, (text, colour) in enumerate(legend[:12]):
        y = mt + 8 + 16 * j
        out.append(f'<g class="legend"><line x1="{ml + pw + 10}" x2="{ml + pw + 28}" y1="{y}" y2="{y}" '
                   f'style="stroke:{colour}"/><text x="{ml + pw + 32}" y="{y + 4}">{e(text)}</text></g>')
    out.append("</svg>")
    return (f'<figure class="sweep" data-metric="loss"><h4>loss per step, one line per '
            f'{"run" if len(check.details.get("devices", {})) == 1 else "GPU"}</h4>{"".join(out)}</figure>')


def gemm_ratio(check: CheckResult, checks: Iterable[CheckResult]) -> str:
    """A table of the model TFLOP/s over the GEMM rate per device (``checks``: the node's results), or ``""``."""
    rows = train_vs_gemm(check, checks)
    if not rows:
        return ""
    body = "".join(f'<tr data-device="{e(r.device)}"><td>{e(r.device)}</td><td class="num">'
                   f'{e(flops_text(r.model_tflops))}</td><td class="num">{e(flops_text(r.gemm_tflops))}</td>'
                   f'<td><code>{e(r.gemm_metric)}</code></td><td class="num">{r.ratio:.2f}</td>'
                   '<td class="muted">not judged</td></tr>' for r in rows)
    return ('<figure class="trainspeed"><h4>model TFLOP/s against the GEMM rate of the same GPU '
            '(compute check)</h4><table class="sortable metrics"><thead><tr><th>device</th><th>model rate</th>'
            '<th>GEMM rate</th><th>GEMM metric</th><th>ratio</th><th>judged</th></tr></thead>'
            f'<tbody>{body}</tbody></table></figure>')
