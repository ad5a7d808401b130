"""What the outlier analysis compared, and what it could not: every rendering says so, and the heatmap colours
only what was compared."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuaccept.model import ClusterReport
from gpuaccept.report.grid import cross_node_coverage, heatmap
from gpuaccept.report.html import render_html
from gpuaccept.report.markdown import render_markdown
from gpuaccept.report.views import node_views
from gpuaccept.results.analysis import OutlierPolicy, analyze, with_analysis
from gpuaccept.results.coverage import coverage_line, coverage_of, outlier_line
from tests.fleet_sim import METRICS, fleet
from tests.helpers import gpuaccept, ok
from tests.report_data import node_cpu

_RED = "rgb(229,57,53)"


def test_two_nodes_are_compared_within_nodes_only_and_node_wide_metrics_not_at_all() -> None:
    result = analyze(fleet(5, nodes=2))
    gpu_groups = [g for g in result["stats"].values() if g["metric"] != "gpu_count"]
    assert len(gpu_groups) == len(METRICS)
    for g in gpu_groups:
        assert (g["compared"], g["not_compared"]) == (["node"], {"cluster": "fewer than 3 nodes"})
    count = next(g for g in result["stats"].values() if g["metric"] == "gpu_count")
    assert (count["compared"], count["not_compared"]) == ([], {"cluster": "fewer than 3 nodes"})
    assert result["coverage"] == {"groups": len(METRICS) + 1, "compared": len(METRICS), "fully": 0,
                                  "partly": {"within nodes only (fewer than 3 nodes)": len(METRICS)},
                                  "not_compared": {"fewer than 3 nodes": 1}}
    line = coverage_line(result)
    assert line == (f"{len(METRICS) + 1} SKU/metric group(s): {len(METRICS)} compared within nodes only "
                    "(fewer than 3 nodes), 1 not compared (fewer than 3 nodes)")
    assert outlier_line(result, 0, 5) == (f"0 outlier(s) at |z| >= 5 in the {len(METRICS)} compared group(s) of "
                                          f"{len(METRICS) + 1} (some compared one way only)")


def test_three_nodes_compare_everything() -> None:
    result = analyze(fleet(5, nodes=3))
    assert all(sorted(g["compared"]) == (["cluster", "node"] if g["metric"] != "gpu_count" else ["cluster"])
               and g["not_compared"] == {} for g in result["stats"].values())
    assert coverage_line(result) == f"{len(METRICS) + 1} SKU/metric group(s), all compared"
    assert outlier_line(result, 0, 5) == "0 outlier(s) at |z| >= 5"


def test_nothing_compared_never_reads_as_no_outliers() -> None:
    result = analyze(fleet(5, nodes=2, gpus=1))
    assert result["coverage"]["compared"] == 0
    assert result["coverage"]["not_compared"] == {
        "fewer than 3 nodes and fewer than 3 GPUs in any node": len(METRICS), "fewer than 3 nodes": 1}
    assert outlier_line(result, 0, 5) == "nothing was compared: no outlier can be found"
    # A stricter --min-nodes leaves out what 4 nodes would otherwise compare; the reason names it.
    strict = analyze(fleet(5, nodes=4), OutlierPolicy(min_nodes=5))
    assert set(strict["coverage"]["partly"]) == {"within nodes only (fewer than 5 nodes)"}


def test_an_analysis_stored_before_coverage_is_summed_up_from_its_node_counts() -> None:
    old = analyze(fleet(5, nodes=2))
    for g in old["stats"].values():
        del g["compared"], g["not_compared"]
    del old["coverage"]
    cov = coverage_of(old)
    assert (cov["compared"], cov["unknown"]) == (0, {"fewer than 3 nodes": len(METRICS) + 1})
    assert "not compared across nodes (fewer than 3 nodes; whether within nodes is not recorded)" in \
        coverage_line(old)
    assert outlier_line(old, 0) == "0 outlier(s): nothing was compared across nodes (within nodes: not recorded)"


def test_analyze_cli_on_two_nodes_says_what_was_not_compared(tmp_path: Path) -> None:
    path = tmp_path / "cluster-report.json"
    path.write_text(json.dumps(fleet(18, nodes=2).to_dict()))
    text = ok(gpuaccept("analyze", str(path)))
    assert f"{len(METRICS)} compared within nodes only (fewer than 3 nodes), 1 not compared (fewer than 3 nodes)" \
        in text
    assert re.search(r"^0 outlier\(s\) at \|z\| >= 5$", text, re.M) is None
    assert "0 outlier(s) at |z| >= 5 in the 6 compared group(s) of 7" in text
    data = json.loads(ok(gpuaccept("analyze", str(path), "--json")))
    assert data["coverage"]["not_compared"] == {"fewer than 3 nodes": 1}


def _two_node_cluster() -> ClusterReport:
    return with_analysis(fleet(7, nodes=2))


def test_html_of_two_nodes_claims_no_clean_result_and_colours_nothing() -> None:
    html = render_html(_two_node_cluster(), generated="t")
    assert "No GPU or node was flagged" not in html
    assert "1 not compared (fewer than 3 nodes)" in html and "compared within nodes only" in html
    heat = html[html.index('<section id="heatmap">'):]
    heat = heat[:heat.index("</section>")]
    cells = re.findall(r'<td class="(cell[^"]*)"[^>]*>', heat)
    assert cells and all("nc" in c.split() for c in cells)
    assert "style=\"background:rgb(" not in heat.split("</div>", 1)[1]   # no cell coloured after the legend
    assert "grey: not compared (fewer than 3 nodes)" in heat


def test_html_of_four_nodes_colours_the_compared_cells(tmp_path: Path) -> None:
    report = with_analysis(fleet(7, nodes=4, slow_nodes={1: 0.7}))
    html = render_html(report, generated="t")
    heat = html[html.index('<section id="heatmap">'):]
    heat = heat[:heat.index("</section>")]
    assert _RED in heat.split("</div>", 1)[1] and ' nc"' not in heat and "grey: not compared" not in heat


def test_heatmap_follows_the_analysis_per_metric() -> None:
    """With a per-SKU analysis that compared only some metrics across nodes, only those columns are coloured."""
    report = fleet(9, nodes=4)
    analysis = analyze(report, OutlierPolicy(min_nodes=5))
    min_nodes, why = cross_node_coverage(analysis)
    assert min_nodes == 5 and why[("compute", "gemm_bf16_tflops")] == "fewer than 5 nodes"
    hm = heatmap(node_views(report), min_nodes=min_nodes, not_compared=why)
    assert {c.not_compared for c in hm.columns} == {"fewer than 5 nodes"}
    assert all(cell is None or cell[1] is None for cells in hm.cells.values() for cell in cells)
    plain = heatmap(node_views(report))
    assert all(c.not_compared == "" for c in plain.columns)
    assert any(cell is not None and cell[1] is not None for cells in plain.cells.values() for cell in cells)


def test_markdown_says_what_was_not_compared() -> None:
    text = render_markdown(_two_node_cluster())
    assert "### Outliers" in text
    line = next(ln for ln in text.splitlines() if "not compared" in ln)
    assert line.startswith("0 outlier(s) in the 6 compared group(s) of 7")
    assert "1 not compared (fewer than 3 nodes)" in line
    full = render_markdown(with_analysis(fleet(7, nodes=3)))
    assert "7 SKU/metric group(s), all compared" in full
    node = node_cpu()   # one node: nothing to compare across nodes, and nothing claimed either way
    assert "### Outliers" not in render_markdown(node, analyze(node))


def test_launch_summary_says_what_was_not_compared(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuaccept.launch.collect import analysed

    analysed(fleet(5, nodes=2))
    out = capsys.readouterr().out
    assert out.startswith("[RESULT] outlier analysis: 0 outlier(s) in the 6 compared group(s) of 7")
    assert "1 not compared (fewer than 3 nodes)" in out
    analysed(fleet(5, nodes=3))
    assert capsys.readouterr().out == ""  # everything compared, nothing found: nothing to add


def test_fail_on_outliers_is_not_a_silent_pass_when_nothing_was_compared(tmp_path: Path) -> None:
    """A user asking to fail on outliers gets exit 1 and one line why when no group could be compared."""
    nothing, partly = tmp_path / "nothing.json", tmp_path / "partly.json"
    nothing.write_text(json.dumps(fleet(5, nodes=2, gpus=1).to_dict()))
    partly.write_text(json.dumps(fleet(18, nodes=2).to_dict()))
    r = gpuaccept("analyze", str(nothing), "--exit-code")
    ok(r, 1)
    (line,) = r.stderr.strip().splitlines()
    assert line == (f"gpuaccept analyze: --exit-code: nothing was compared, no outlier can be found "
                    f"({len(METRICS) + 1} SKU/metric group(s): {len(METRICS)} not compared (fewer than 3 nodes and "
                    "fewer than 3 GPUs in any node), 1 not compared (fewer than 3 nodes))")
    assert "Traceback" not in r.stderr
    ok(gpuaccept("analyze", str(nothing)))  # without the flag nothing is asked: the output says it, exit 0
    assert json.loads(ok(gpuaccept("analyze", str(nothing), "--json", "--exit-code"), 1))["outliers"] == []
    ok(gpuaccept("analyze", str(partly), "--exit-code"))  # compared within nodes, no outlier: 0


def test_junit_and_prometheus_carry_the_coverage_of_the_analysis() -> None:
    import xml.etree.ElementTree as ET

    from prometheus_client.parser import text_string_to_metric_families

    from gpuaccept.report.junit import render_junit
    from gpuaccept.report.prometheus import render_prometheus

    cluster = with_analysis(fleet(5, nodes=2, gpus=1))
    root = ET.fromstring(render_junit(cluster).encode())
    props = [p.get("value") for p in root.iter("property") if p.get("name") == "outlier_analysis"]
    assert len(props) == 2 and props[0] == (f"{len(METRICS) + 1} SKU/metric group(s): {len(METRICS)} not compared "
                                            "(fewer than 3 nodes and fewer than 3 GPUs in any node), 1 not "
                                            "compared (fewer than 3 nodes); nothing was compared: no outlier can "
                                            "be found")
    fams = {f.name: f for f in text_string_to_metric_families(render_prometheus(cluster))}
    groups = {s.labels["coverage"]: s.value for s in fams["gpuaccept_analysis_groups"].samples}
    assert groups == {"all": len(METRICS) + 1, "fully": 0, "partly": 0, "not_compared": len(METRICS) + 1}
    fams = {f.name: f for f in text_string_to_metric_families(render_prometheus(with_analysis(fleet(7, nodes=2))))}
    half = {s.labels["coverage"]: s.value for s in fams["gpuaccept_analysis_groups"].samples}
    assert half == {"all": len(METRICS) + 1, "fully": 0, "partly": len(METRICS), "not_compared": 1}
    bare = fleet(5, nodes=2)  # no analysis: neither says anything
    assert "outlier_analysis" not in render_junit(bare) and "analysis_groups" not in render_prometheus(bare)
