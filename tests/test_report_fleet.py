"""The HTML report of a large cluster stays bounded (issue 27): summaries over every node, lists of the few."""

from __future__ import annotations

import re

import numpy as np

from gpuaccept.model import CheckResult, ClusterReport, Metric, NodeEntry, NodeState, Status
from gpuaccept.report.html import render_html
from gpuaccept.report.html_fleet import MAX_SWEEP_SERIES
from gpuaccept.results.analysis import analyze
from tests.fleet_sim import node_report

SIZES = [1 << k for k in range(16, 28, 2)]  # 6 message sizes


def _fleet(n: int, seed: int = 5) -> ClusterReport:
    """``n`` simulated 8-GPU nodes with an allreduce sweep; node 7 fails memtest, node 11 has a slow GPU,
    node 13 is missing."""
    rng = np.random.default_rng(seed)
    entries = []
    for i in range(n):
        host = f"node{i:04d}"
        if i == 13:
            entries.append(NodeEntry(host, NodeState.MISSING, None, i, "no report.json after the job ended"))
            continue
        sweep = CheckResult("collectives", Status.PASS, "", metrics=[
            Metric("allreduce_busbw_gbs", float(100 * s / SIZES[-1] * (1 + rng.normal(0, 0.01))), "GB/s",
                   tags={"op": "allreduce", "size_bytes": s}) for s in SIZES])
        memtest = CheckResult("memtest", Status.FAIL if i == 7 else Status.PASS, "bit errors" if i == 7 else "",
                              metrics=[Metric("memtest_errors", 3.0 if i == 7 else 0.0, "count")])
        rep = node_report(host, rng, slow={2: 0.7} if i == 11 else None, extra=[sweep, memtest])
        rep.verdict = rep.decide()
        entries.append(NodeEntry(host, NodeState.REPORTED, rep, i))
    cr = ClusterReport("fleet-run", "slurm", "2026-11-28T00:00:00Z", expected_nodes=n, nodes=entries)
    cr.analysis = analyze(cr)
    return cr


def _section(html: str, sid: str) -> str:
    start = html.index(f'id="{sid}"')
    return html[start:html.index("</section>", start)]


def test_a_1024_node_page_is_bounded_and_says_what_it_left_out() -> None:
    small, big = render_html(_fleet(256)), render_html(_fleet(1024))
    assert len(big) < 1_000_000
    assert len(big) < 1.1 * len(small)  # four times the nodes, about the same page
    look = {"node0007", "node0011", "node0013"}  # failed, outlier, missing
    heat = _section(big, "heatmap")
    assert set(re.findall(r"<tr[^>]*><th>(node\d+)</th>", heat)) <= look | set(re.findall(
        r'<tr class="outlier"><td>(node\d+)</td>', big))
    assert "node0500" not in heat
    assert re.search(r"[\d,]+ of 1,024 nodes' heatmap rows are not listed on this page", heat)
    dist = _section(big, "distributions")
    assert re.search(r"<td>h100_sxm</td><td>compute</td><td><code>gemm_bf16_tflops[^<]*</code></td><td>[^<]+</td>"
                     r'<td class="num">1,023</td>', dist)  # every reported node, not only the listed ones
    grid = _section(big, "grid")
    assert "<th>node0007</th>" in grid and 'class="st-fail">fail</td>' in grid and "missing: no report.json" in grid
    assert re.search(r"<th>([\d,]+) other nodes</th>", grid)
    memtest = _section(big, "check-memtest")
    assert memtest.count('<tr class="ok">') + memtest.count('<tr class="st-') <= 1 + len(look) + 8
    assert "results of this check are not listed on this page" in memtest
    for chart in re.findall(r'<svg class="curve".*?</svg>', big, flags=re.S):
        assert int(re.search(r'data-series="(\d+)"', chart).group(1)) <= MAX_SWEEP_SERIES  # type: ignore[union-attr]
    assert re.search(r"[\d,]+ of [\d,]+ curves are not drawn on this page \(drawn: every flagged node's and an "
                     r"even sample of the rest; every value is in the report JSON", big)


def test_a_64_node_page_lists_every_node_as_before() -> None:
    html = render_html(_fleet(64))
    assert 'id="distributions"' not in html and 'id="grid"' not in html and "not listed on this page" not in html
    heat = _section(html, "heatmap")
    assert len(set(re.findall(r"<tr[^>]*><th>(node\d+)</th>", heat))) == 64


def test_huge_raw_details_are_cut_and_the_page_says_so() -> None:
    rep = _fleet(4)
    node = rep.nodes[0].report
    assert node is not None
    node.checks[0].details = {"samples": list(range(200_000)), "tail_marker": "zz-last"}
    html = render_html(rep)
    assert "more characters of these details are in the report JSON" in html
    assert "zz-last" not in html  # sorted keys: the marker comes after the cut
    assert len(html) < 600_000
    small = _fleet(4)
    small_node = small.nodes[0].report
    assert small_node is not None
    small_node.checks[0].details = {"samples": list(range(100)), "tail_marker": "zz-last"}
    assert "zz-last" in render_html(small)
