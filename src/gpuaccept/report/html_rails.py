"""The rails ``gpuaccept isolate`` named, as an HTML page: a NIC x node table (from its JSON ``rail_table`` rows,
:func:`gpuaccept.isolate.rails.rail_rows`; no isolate or node imports).

Rows are the rails (rail index and NIC port, as ``mlx5_3:1``), columns the nodes whose rails were tested; a cell
is the rail's figure (perftest's ``BW average`` in Gb/s, or a rail test's busbw in GB/s) and a bad rail's cell is
marked: under its bound (``< 380``), or failed. Below it, each bad rail with its evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuaccept.report.svg import e

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table.nic-node{border-collapse:collapse;margin:1em 0}
.nic-node th,.nic-node td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
.nic-node th{background:#f4f4f4}.nic-node td.bad{background:#fdd;color:#900;font-weight:bold}
.nic-node td.na{color:#999}.nic-node td.unjudged{color:#666;font-style:italic}
"""


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _cell(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return '<td class="na">&ndash;</td>'
    fig, bound, unit = _num(row.get("figure")), _num(row.get("bound")), str(row.get("unit") or "")
    text = "no figure" if fig is None else f"{fig:.4g} {unit}"
    if row.get("verdict") == "bad":
        why = (f" &lt; {bound:g}" if fig is not None and bound is not None and fig < bound
               else f" {e(str(row.get('status') or 'fail').upper())}")
        tip = "; ".join(str(x) for x in row.get("evidence") or [])
        return f'<td class="bad" title="{e(tip)}">{e(text)}{why}</td>'
    if row.get("verdict") == "not judged":
        return f'<td class="unjudged" title="measured, not judged">{e(text)}</td>'
    return f"<td>{e(text)}</td>"


def nic_node_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The NIC x node table of ``rail_table`` rows ("" when there are none)."""
    if not rows:
        return ""
    nodes = list(dict.fromkeys(str(r.get("node")) for r in rows))
    rails = sorted({(int(r.get("rail") or 0), str(r.get("port") or f"GPU {r.get('gpu')}")) for r in rows})
    at = {(str(r.get("node")), int(r.get("rail") or 0)): r for r in rows}
    head = "".join(f"<th>{e(n)}</th>" for n in nodes)
    body = "".join(f"<tr><th>rail {i} &middot; {e(port)}</th>{''.join(_cell(at.get((n, i))) for n in nodes)}</tr>"
                   for i, port in rails)
    return (f'<table class="nic-node"><caption>rail (NIC port) &times; node: the figure of each rail, bad cells '
            f'marked</caption><thead><tr><th>rail \\ node</th>{head}</tr></thead><tbody>{body}</tbody></table>')


def rows_of(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every ``rail_table`` row of an isolate result: ``--rails-of`` (top level) or ``--per-rail`` (by node)."""
    found = list(data.get("rail_table") or [])
    rails = data.get("rails")
    if isinstance(rails, Mapping):
        for one in rails.values():
            if isinstance(one, Mapping):
                found += list(one.get("rail_table") or [])
    return [r for r in found if isinstance(r, dict)]


def render_rails_html(data: Mapping[str, Any], title: str = "gpuaccept isolate: rails") -> str:
    """A whole HTML page of an isolate result's rails: the NIC x node table, then each bad rail's evidence."""
    rows = rows_of(data)
    bad = [r for r in rows if r.get("verdict") == "bad"]
    items = "".join(f"<li><b>{e(str(r['node']))} rail {e(str(r['rail']))} ({e(str(r.get('port') or '-'))}, GPU "
                    f"{e(str(r.get('gpu')))})</b>: {e('; '.join(str(x) for x in r.get('evidence') or []))}</li>"
                    for r in bad)
    partners = sorted({str(r.get("partner")) for r in rows if r.get("partner")})
    summary = (f"<p>{len(bad)} bad rail(s) of {len(rows)}; partner(s): {e(', '.join(partners) or '-')}.</p>"
               if rows else "<p>No rail was tested.</p>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>{summary}{nic_node_table(rows)}"
            + (f"<h2>Bad rails</h2><ul>{items}</ul>" if items else "") + "</body></html>\n")
