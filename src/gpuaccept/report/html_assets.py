"""The stylesheet and script inlined into every HTML report (no external resources).

The script only adds conveniences (sortable tables, a "problems only"
filter); the page is complete without it. The page's Content-Security-Policy
allows exactly this script, by its SHA-256 hash.
"""

from __future__ import annotations

CSS = """
:root { --pass:#2e7d32; --warn:#b26a00; --fail:#c62828; --error:#8e0000; --skip:#757575;
  --bg:#fff; --fg:#1d1d1f; --muted:#666; --line:#ddd; --soft:#f5f6f8; --outlier:#6a1b9a; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg);
  background: var(--bg); margin: 0; padding: 0 24px 48px; max-width: 1400px; }
header { padding: 20px 0 8px; border-bottom: 1px solid var(--line); margin-bottom: 8px; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 18px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
h4 { font-size: 13px; margin: 12px 0 4px; color: #333; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12.5px; }
.muted { color: var(--muted); }
.verdict { display: inline-block; font-weight: 700; font-size: 20px; padding: 6px 16px; border-radius: 6px;
  color: #fff; letter-spacing: .04em; margin: 6px 0; }
.verdict.success { background: var(--pass); } .verdict.failure { background: var(--fail); }
.verdict.running, .verdict.interrupted { background: var(--warn); }
.verdict[data-cpu-only] { background: var(--warn); }
.cpu-only { display: inline-block; font-weight: 700; margin-left: 10px; padding: 6px 10px;
  border: 2px solid var(--warn); border-radius: 6px; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; margin: 8px 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 600;
  color: #fff; margin-right: 4px; vertical-align: middle; }
.badge.pass { background: var(--pass); } .badge.warn { background: var(--warn); }
.badge.fail { background: var(--fail); } .badge.error { background: var(--error); }
.badge.skip { background: var(--skip); } .badge.missing { background: #37474f; }
.badge.outlier { background: var(--outlier); } .badge.not_judged { background: #00838f; }
.badge.rerun { background: #1565c0; } .badge.left-out, .badge.not-rerun { background: #37474f; }
tr.left-out td, tr.not-rerun td { background: #eceff1; }
nav { margin: 8px 0; } nav a { margin-right: 14px; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; white-space: nowrap; }
table.sortable th { cursor: pointer; } table.sortable th:hover { background: #e8eaee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.st-fail td, tr.st-error td, tr.missing td { background: #fdecea; }
tr.st-warn td { background: #fff8e1; }
tr.outlier td { background: #f3e5f5; } tr.outlier td:first-child { box-shadow: inset 4px 0 var(--outlier); }
td.reason { max-width: 640px; word-break: break-word; }
.st { font-weight: 700; } .st.pass { color: var(--pass); } .st.warn { color: var(--warn); }
.st.fail { color: var(--fail); } .st.error { color: var(--error); } .st.skip { color: var(--skip); }
.st.not_judged { color: #00838f; }
details.node { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; padding: 2px 10px; }
details.node > summary { cursor: pointer; padding: 4px 0; }
details.raw pre { background: var(--soft); padding: 8px; overflow: auto; max-height: 320px; font-size: 12px; }
.scroll { overflow-x: auto; max-width: 100%; }
.toolbar { position: sticky; top: 0; background: rgba(255,255,255,.95); padding: 6px 0; z-index: 2;
  border-bottom: 1px solid var(--line); }
body.only-problems tr.ok, body.only-problems details.node.ok, body.only-problems section.check.ok { display: none; }
table.heatmap { font-size: 12px; }
table.heatmap th.col { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap;
  padding: 6px 2px; font-weight: 500; }
table.heatmap td { text-align: right; min-width: 54px; font-variant-numeric: tabular-nums; }
table.heatmap td.cell.outlier { outline: 3px solid var(--outlier); outline-offset: -3px; font-weight: 700; }
table.heatmap td.na { color: #aaa; text-align: center; }
table.p2p-matrix { font-size: 12px; margin: 6px 0; }
table.p2p-matrix caption { text-align: left; font-weight: 600; }
table.p2p-matrix td { text-align: right; min-width: 54px; font-variant-numeric: tabular-nums; }
table.p2p-matrix td.na { color: #aaa; text-align: center; }
table.p2p-matrix td.st-fail { background: #fdecea; font-weight: 700; }
table.heatmap td.cell.nc { background: #e6e6e6; color: #555; }
table.heatmap th.col.nc { color: var(--muted); }
.legendbar span.sw.nc { background: #e6e6e6; }
p.not-compared { border-left: 4px solid #999; padding-left: 8px; }
.legendbar { display: flex; gap: 8px; align-items: center; font-size: 12px; color: var(--muted); }
.legendbar span.sw { display: inline-block; width: 28px; height: 12px; border: 1px solid var(--line); }
svg { font: 11px system-ui, "DejaVu Sans", sans-serif; overflow: visible; }
svg.bars .bar rect { fill: #1565c0; } svg.bars .bar.pass rect { fill: var(--pass); }
svg.bars .bar.warn rect { fill: #f9a825; } svg.bars .bar.fail rect { fill: var(--fail); }
svg.bars .bar.outlier rect { stroke: var(--outlier); stroke-width: 3; }
svg.bars .bar.outlier .val { fill: var(--outlier); font-weight: 700; }
svg.bars .ref { stroke: #222; stroke-width: 1.5; }
svg.bars .ref.threshold { stroke: var(--fail); stroke-dasharray: 4 3; }
svg.bars .reflbl { fill: #222; font-size: 10px; } svg.bars .reflbl.thr { fill: var(--fail); }
svg.curve .grid { stroke: #e6e6e6; } svg.curve .axis { stroke: #444; }
svg.curve .tick { fill: #444; } svg.curve .axlbl { fill: #222; font-size: 12px; }
svg.curve polyline { fill: none; stroke-width: 2; }
svg.curve .series.bg polyline { stroke: #c8c8c8; stroke-width: 1; }
svg.curve .series.median polyline { stroke-width: 3; }
svg.curve .series.flagged polyline { stroke-width: 2.5; }
svg.curve .series.expected polyline { stroke: #555; stroke-dasharray: 6 4; stroke-width: 1.5; }
svg.curve .legend line { stroke-width: 3; } svg.curve .legend.expected line { stroke-dasharray: 6 4; }
svg.curve .legend text { fill: #222; }
figure { margin: 6px 0 10px; }
.charts { display: flex; flex-wrap: wrap; gap: 4px 28px; }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; border-top: 1px solid var(--line); padding-top: 8px; }
@media print { .toolbar { display: none; } details.node { break-inside: avoid; } }
"""

JS = """
(function () {
  "use strict";
  function cellValue(td) {
    var v = td.getAttribute("data-v");
    if (v !== null && v !== "" && !isNaN(Number(v))) { return Number(v); }
    return td.textContent.trim().toLowerCase();
  }
  function sortBy(table, col, th) {
    var body = table.tBodies[0];
    if (!body) { return; }
    var asc = th.getAttribute("data-dir") !== "asc";
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col] ? cellValue(a.cells[col]) : "", y = b.cells[col] ? cellValue(b.cells[col]) : "";
      if (typeof x === "number" && typeof y === "number") { return asc ? x - y : y - x; }
      x = String(x); y = String(y);
      return asc ? x.localeCompare(y) : y.localeCompare(x);
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.removeAttribute("data-dir"); });
    th.setAttribute("data-dir", asc ? "asc" : "desc");
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var head = table.tHead;
    if (!head || !head.rows.length) { return; }
    Array.prototype.forEach.call(head.rows[0].cells, function (th, i) {
      th.title = "click to sort";
      th.addEventListener("click", function () { sortBy(table, i, th); });
    });
  });
  var box = document.getElementById("only-problems");
  if (box) {
    box.addEventListener("change", function () {
      document.body.classList.toggle("only-problems", box.checked);
    });
  }
  document.documentElement.setAttribute("data-ready", "1");
})();
"""
