"""The GPU x GPU matrix of the p2p check in the HTML report (from ``details.p2p_matrix``; no node imports).

Rows are the source GPU, columns the destination, as ``nvbandwidth`` prints its matrices. A cell under its
pair's bound (``min_unidir_gbs``; twice that for both ways) is marked, and the slowest pair is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuaccept.model import CheckResult
from gpuaccept.report.svg import e

_TABLES = (("unidir_gbs", "one way, GB/s", 1.0), ("bidir_gbs", "both ways at once, GB/s", 2.0),
           ("latency_us", "latency, us (not judged)", None))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _cell(v: Any, bound: Any, scale: float | None) -> str:
    x = _num(v)
    if x is None:
        return '<td class="na">&ndash;</td>'
    low = _num(bound)
    if scale is not None and low is not None and x < low * scale:
        return f'<td class="cell st-fail" title="below {low * scale:g}">{x:g}</td>'
    return f'<td class="cell">{x:g}</td>'


def _table(devices: Sequence[str], m: Sequence[Sequence[Any]], bounds: Sequence[Sequence[Any]] | None,
           title: str, scale: float | None) -> str:
    head = "".join(f"<th>{e(d)}</th>" for d in devices)
    rows = []
    for i, (dev, row) in enumerate(zip(devices, m, strict=False)):
        cells = "".join(_cell(v, bounds[i][j] if bounds and i < len(bounds) and j < len(bounds[i]) else None,
                              scale) for j, v in enumerate(row))
        rows.append(f"<tr><th>{e(dev)}</th>{cells}</tr>")
    return (f'<table class="p2p-matrix"><caption>{e(title)}</caption><thead><tr><th>src \\ dst</th>{head}</tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>')


def p2p_matrix_html(check: CheckResult) -> str:
    """The matrices of one p2p result, or "" when its details hold none (another check, an older report)."""
    data = check.details.get("p2p_matrix") if isinstance(check.details, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        return ""
    devices = [str(d) for d in data["devices"]]
    if data.get("skipped"):
        return f'<p class="muted">GPU x GPU matrix: {e(str(data["skipped"]))}</p>'
    bounds = data.get("min_unidir_gbs") if isinstance(data.get("min_unidir_gbs"), list) else None
    parts = [_table(devices, data[key], bounds, title, scale) for key, title, scale in _TABLES
             if isinstance(data.get(key), list) and any(_num(v) is not None for row in data[key] for v in row)]
    slow = data.get("slowest")
    note = (f'<p>Slowest pair: <b>{e(str(slow.get("src")))} &rarr; {e(str(slow.get("dst")))}</b> '
            f'{e(str(slow.get("gbs")))} GB/s one way.</p>' if isinstance(slow, dict) else "")
    return f'<div class="p2p">{note}{"".join(parts)}</div>' if parts else ""
