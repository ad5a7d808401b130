"""The HTML report: rendered in real headless Chromium (console errors, DOM, screenshot) and checked as text."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuaccept.model import ClusterReport, NodeReport
from gpuaccept.report.html import render_html
from gpuaccept.report.html_assets import JS
from gpuaccept.results.load import load_file
from tests.chromium import decode_png, render, require_binary
from tests.helpers import cli_env, gpuaccept
from tests.report_data import (
    HOSTILE_HOST,
    HOSTILE_REASON,
    NODE_COLLECTIVES,
    NODE_CPU,
    big_cluster,
    cluster,
    hostile_cluster,
    node_cpu,
    write_json,
)

WIDTH, HEIGHT = 1280, 2000

DOM_QUERIES = {
    "ready": "document.documentElement.getAttribute('data-ready')",
    "verdict": "document.getElementById('verdict').textContent",
    "verdict_class": "document.getElementById('verdict').className",
    "scripts": "document.scripts.length",
    "images": "document.images.length",
    "problem_rows": "document.querySelectorAll('#problems tbody tr').length",
    "problems_text": "document.getElementById('problems').textContent",
    "missing_rows": "document.querySelectorAll('#problems tbody tr.missing').length",
    "outlier_rows": "document.querySelectorAll('#outliers tbody tr.outlier').length",
    "heatmap_rows": "document.querySelectorAll('#heatmap table.heatmap tbody tr').length",
    "heatmap_outlier_cells": "document.querySelectorAll('#heatmap td.cell.outlier').length",
    "curves": "document.querySelectorAll('#collectives svg.curve').length",
    "curve_series": "Array.from(document.querySelectorAll('svg.curve')).map(s => s.querySelectorAll('g.series.fg,"
                    " g.series.flagged').length)",
    "curve_ticks": "Array.from(document.querySelectorAll('svg.curve text.tick')).map(t => t.textContent)",
    "curve_box": "(() => { const s = document.querySelector('svg.curve'); if (!s) { return null; }"
                 " const r = s.getBoundingClientRect(); return [r.width, r.height]; })()",
    "bars": "document.querySelectorAll('svg.bars').length",
    "fail_bars": "document.querySelectorAll('svg.bars g.bar.fail').length",
    "outlier_bars": "Array.from(document.querySelectorAll('svg.bars g.bar.outlier text.lbl'))"
                    ".map(t => t.closest('details').dataset.host + ' ' + t.textContent)",
    "check_sections": "Array.from(document.querySelectorAll('section.check')).map(s => s.dataset.check)",
    "bar_width_ok": "(() => { const r = document.querySelector('svg.bars rect'); return r ?"
                    " r.getBoundingClientRect().width > 20 : null; })()",
}


def _write(tmp_path: Path, report: NodeReport | ClusterReport) -> Path:
    """The report rendered by the real CLI (``gpuaccept report FILE --format html --output FILE``)."""
    src = write_json(tmp_path / "in.json", report)
    out = tmp_path / "report.html"
    proc = gpuaccept("report", str(src), "--format", "html", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    return out


def _not_blank(png: bytes, tmp_path: Path, name: str) -> np.ndarray:
    (tmp_path / name).write_bytes(png)  # kept for a look when a test fails
    px = decode_png(png)
    assert px.shape[:2] == (HEIGHT, WIDTH)
    flat = px[:, :, :3].reshape(-1, 3)
    sample = flat[:: 37]
    colours = len({tuple(c) for c in sample.tolist()})
    assert colours > 40, f"screenshot has only {colours} distinct colours"
    assert (flat.min(axis=1) < 100).mean() > 0.005, "hardly any dark (text) pixels"
    assert (flat.min(axis=1) > 240).mean() > 0.3, "hardly any background"
    return px


def _red_banner(px: np.ndarray) -> int:
    """Pixels in the top-left 400x200 region close to the FAILURE banner colour (#c62828)."""
    region = px[:200, :400, :3].astype(int)
    return int((np.abs(region - np.array([198, 40, 40])).sum(axis=2) < 30).sum())


def test_cluster_page_in_chromium(tmp_path: Path) -> None:
    rep = hostile_cluster()
    page = _write(tmp_path, rep)
    run = render(page, DOM_QUERIES, WIDTH, HEIGHT)
    v = run.values

    assert run.errors() == []
    assert run.requests == [page.resolve().as_uri()], "the page fetched something besides itself"
    assert v["ready"] == "1", "the page script did not run to its end"
    assert v["verdict"] == "FAILURE" and "failure" in v["verdict_class"]
    # escaped markup stays text: no injected script or image elements, the text shows literally
    assert v["scripts"] == 1 and v["images"] == 0
    assert HOSTILE_REASON in v["problems_text"]
    assert HOSTILE_HOST in v["problems_text"]
    # needs attention: the missing node, the compute failure and the collectives warning
    assert v["missing_rows"] == 1 and v["problem_rows"] == 3
    assert v["outlier_rows"] == len(rep.analysis["outliers"]) > 0
    assert v["heatmap_rows"] == 5  # four nodes and the missing one
    assert v["heatmap_outlier_cells"] >= 3  # node-01 and node-03 bf16, node-02 collectives
    assert v["curves"] == 2 and v["curve_series"] == [4, 4]
    assert v["curve_ticks"][0] == "0" and "1 KiB" in v["curve_ticks"] and "2 GiB" in v["curve_ticks"]
    assert v["curve_box"][0] > 500 and v["curve_box"][1] > 300
    assert v["bars"] >= 4 * 6  # per node: 3 GEMM dtypes, 3 memory copies (health bars too)
    assert v["fail_bars"] == 1
    assert "gpu-node-03 cuda:5" in v["outlier_bars"] and "gpu-node-01 cuda:2" in v["outlier_bars"]
    assert v["check_sections"] == ["env", "health", "compute", "memory", "collectives", "memtest"]
    assert v["bar_width_ok"] is True

    px = _not_blank(run.screenshot, tmp_path, "cluster.png")
    assert _red_banner(px) > 2000, "no red FAILURE banner at the top left"


def test_node_page_in_chromium(tmp_path: Path) -> None:
    page = _write(tmp_path, node_cpu())
    run = render(page, DOM_QUERIES, WIDTH, HEIGHT)
    v = run.values
    assert run.errors() == []
    assert v["ready"] == "1"
    assert v["verdict"] == "SUCCESS"
    assert v["problem_rows"] == 0 and "Nothing failed" in v["problems_text"]
    assert v["heatmap_rows"] == 0 and v["curves"] == 0 and v["outlier_rows"] == 0
    assert v["check_sections"] == ["env", "compute", "memory"]
    px = _not_blank(run.screenshot, tmp_path, "node.png")
    green = (np.abs(px[:200, :400, :3].astype(int) - np.array([46, 125, 50])).sum(axis=2) < 30).sum()
    assert green > 2000, "no green SUCCESS banner at the top left"


def test_page_script_sorts_and_filters(tmp_path: Path) -> None:
    page = _write(tmp_path, hostile_cluster())
    actions = {
        "z_before": "Array.from(document.querySelectorAll('#outliers tbody tr')).map(r => Number(r.cells[7]"
                    ".dataset.v))",
        "sort": "(() => { const th = document.querySelectorAll('#outliers thead th')[7]; th.click();"
                " return th.getAttribute('data-dir'); })()",
        "z_after": "Array.from(document.querySelectorAll('#outliers tbody tr')).map(r => Number(r.cells[7]"
                   ".dataset.v))",
        "visible_ok_before": "Array.from(document.querySelectorAll('section.check tr.ok'))"
                             ".filter(r => getComputedStyle(r).display !== 'none').length",
        "toggle": "(() => { document.getElementById('only-problems').click();"
                  " return document.body.classList.contains('only-problems'); })()",
        "visible_ok_after": "Array.from(document.querySelectorAll('section.check tr.ok'))"
                            ".filter(r => getComputedStyle(r).display !== 'none').length",
        "visible_bad_after": "Array.from(document.querySelectorAll('section.check tr.st-fail, section.check"
                             " tr.st-warn')).filter(r => getComputedStyle(r).display !== 'none').length",
    }
    run = render(page, actions, WIDTH, 900)
    v = run.values
    assert run.errors() == []
    assert v["z_before"] == sorted(v["z_before"], key=abs, reverse=True)  # as the analysis ranks them
    assert v["sort"] == "asc" and v["z_after"] == sorted(v["z_before"])
    assert v["visible_ok_before"] > 10 and v["toggle"] is True
    assert v["visible_ok_after"] == 0 and v["visible_bad_after"] == 2


def test_report_strings_are_escaped() -> None:
    html = render_html(hostile_cluster(), generated="2026-11-20T04:00:00Z")
    assert "<script>console.error" not in html
    assert "&lt;script&gt;console.error(&quot;injected&quot;)&lt;/script&gt;" in html
    assert "<img" not in html and "&lt;img src=x onerror=&quot;console.error(1)&quot;&gt;" in html
    assert "<i>sbatch</i>" not in html and "<b>bold</b>" not in html
    assert html.count("<script>") == 1


def test_page_is_self_contained() -> None:
    html = render_html(cluster())
    assert not re.search(r"<link\b|@import|url\(|<iframe|<object|<embed", html)
    for attr in re.findall(r'\b(?:src|href)="([^"]*)"', html):
        assert attr.startswith("#"), attr
    external = set(re.findall(r"https?://[^\s\"'<>]+", html))
    assert external <= {"http://www.w3.org/2000/svg"}
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert csp is not None and "default-src &#x27;none&#x27;" in csp.group(1)
    digest = base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()
    assert f"sha256-{digest}" in csp.group(1)
    script = re.search(r"<script>(.*?)</script>", html, re.S)
    assert script is not None and script.group(1) == JS  # the hash in the policy is this script's


def test_outliers_of_a_node_report_come_from_the_analysis(tmp_path: Path) -> None:
    """A node report has no stored analysis: ``gpuaccept report`` runs gpuaccept.results.analysis on it."""
    node1 = cluster().nodes[0].report  # cuda:2 at 88% of its siblings in bf16 GEMM
    assert node1 is not None
    page = _write(tmp_path, node1)
    html = page.read_text()
    assert re.search(r'<g class="bar pass outlier"><title>cuda:2: 613', html)
    assert html.count('<tr class="outlier">') >= 2  # in the outliers table and the metrics table
    assert 'id="heatmap"' not in html


def test_large_cluster_keeps_the_page_small(tmp_path: Path) -> None:
    rep = big_cluster(80)
    html = render_html(rep)
    # curves: 80 series become grey lines, a median, and the nodes with a problem or an outlier in red
    assert html.count('class="series bg"') == 2 * 77
    assert html.count('class="series median"') == 2
    flagged = re.findall(r'<g class="series flagged" data-label="([^"]+)">', html)
    assert sorted(flagged) == sorted(["gpu-node-01", "gpu-node-02", "gpu-node-03"] * 2)
    # per-node metric details only for nodes with a problem or an outlier (node-01, -02, -03)
    hosts = set(re.findall(r'<details class="node [a-z]+"(?: open)? data-host="([^"]+)"', html))
    assert hosts == {"gpu-node-01", "gpu-node-02", "gpu-node-03"}
    assert "Metrics of 77 healthy nodes are left out" in html
    assert len(html) < 3_000_000


def test_cli_writes_html_beside_the_report_by_default(tmp_path: Path) -> None:
    src = tmp_path / "run" / "report.json"
    src.parent.mkdir()
    src.write_text(NODE_CPU.read_text())
    done = subprocess.run([sys.executable, "-m", "gpuaccept", "report", str(src)], capture_output=True,
                          text=True, timeout=60, env=cli_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    out = src.parent / "report.html"
    assert out.is_file() and f"wrote {out}" in done.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # nothing in the current directory


def test_html_to_stdout_with_dash() -> None:
    proc = gpuaccept("report", str(NODE_CPU), "--format", "html", "--output", "-")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("<!DOCTYPE html>") and proc.stdout.rstrip().endswith("</html>")


def test_missing_browser_skips_locally_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_binary("chromium", why="test")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="chromium not found"):
        require_binary("chromium", why="test")


def test_real_collectives_run_gives_one_curve_per_op_and_rank_series() -> None:
    """The collectives check as it really reports (2 gloo ranks, per-rank metrics with an element count tag)."""
    rep = load_file(NODE_COLLECTIVES)
    html = render_html(rep)
    titles = re.findall(r'<figure class="sweep" data-metric="([a-z]+)_busbw_gbs"><h3>collectives: [^<]*'
                        r'\(dtype=float32 inplace=(\d)\)</h3>', html)
    ops = {op for op, _ in titles}
    assert ops == {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv"}
    assert len(titles) == 8  # allgather and reducescatter both out of place and in place
    assert "_algbw_gbs\"><h3>" not in html and "_time_us\"><h3>" not in html  # busbw only, as nccl-tests plots
    assert html.count('<g class="series fg" data-label="vm cpu rank 0">') == 8
    assert html.count('<g class="series fg" data-label="vm cpu rank 1">') == 8
