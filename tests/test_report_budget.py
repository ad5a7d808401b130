"""Every report format on a real ``run --budget`` report (``tests/data/reports/node-cpu-budget.json``: ``stress``
left out, ``train`` warned and was run again deeper): the budget is shown, a check left out is visible (in JUnit
a skipped testcase with the reason), a re-run is marked, and its Prometheus series never collide with the first
pass's."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpuaccept.model import ClusterReport, Metric, NodeEntry, NodeReport, NodeState
from gpuaccept.report.budget_view import budget_view
from gpuaccept.report.grid import heatmap, sweeps
from gpuaccept.report.html import render_html
from gpuaccept.report.junit import render_junit
from gpuaccept.report.markdown import render_markdown
from gpuaccept.report.prometheus import render_prometheus
from gpuaccept.report.views import node_views
from tests.chromium import render
from tests.helpers import gpuaccept, validate_report
from tests.report_data import NODE_BUDGET, node_budget, node_cpu, write_json
from tests.test_report_formats import _cells, _check_junit_structure, _tables

NOT_RERUN = {"name": "train", "why": "it warned: train_loss_drop on cpu 0.757 < 2", "status": "warn",
             "not_rerun": "the next deeper level needs ~7s, 3s of the budget was left"}


def _without_rerun(rep: NodeReport) -> NodeReport:
    """The report as it would be had the second pass found no room: the re-run result gone, a note instead."""
    out = copy.deepcopy(rep)
    out.checks = [c for c in out.checks if not c.is_rerun]
    assert out.budget is not None
    out.budget["reruns"] = [NOT_RERUN]
    return out


def test_the_recorded_report_holds_a_left_out_check_and_a_rerun() -> None:
    data = validate_report(NODE_BUDGET)
    assert [c["name"] for c in data["checks"]] == ["env", "compute", "memory", "train", "collectives", "train"]
    assert "rerun" in data["checks"][-1]["details"] and "rerun" not in data["checks"][3].get("details", {})
    assert [c["name"] for c in data["budget"]["left_out"]] == ["stress"]
    rep = node_budget()
    assert [c.is_rerun for c in rep.checks] == [False] * 5 + [True]


def test_the_budget_view_reads_the_plan_and_skips_malformed_entries() -> None:
    view = budget_view(node_budget())
    assert view is not None and view.budget_s == 30.0 and view.estimate_s == 23.0
    assert view.summary() == "budget 30s: 5 of 6 checks kept (~23s estimated), 1 left out (stress), " \
                             "1 re-run deeper (train)"
    assert [(r.name, r.state) for r in view.rows] == [
        ("env", "kept"), ("compute", "kept"), ("memory", "kept"), ("train", "kept"), ("collectives", "kept"),
        ("stress", "left out"), ("train", "re-run")]
    train = view.rows[3]
    assert (train.level_text, train.estimate_text) == ("quick (planned standard)", "~2s")
    stress, rerun = view.rows[5], view.rows[6]
    assert stress.estimate_text == "needs ~16s" and stress.why.startswith("needs ~16s at its shallowest")
    assert rerun.level_text == "standard (first pass quick)" and rerun.why.startswith("standard level: it warned")
    assert budget_view(node_cpu()) is None

    odd = node_cpu()
    odd.budget = {"budget_s": 60, "kept": [{"name": 3}, "x", {"name": "env", "level": "quick", "estimate_s": "?"}],
                  "left_out": None, "reruns": [NOT_RERUN, {"why": "no name"}]}
    view = budget_view(odd)
    assert view is not None and [(r.name, r.state, r.estimate_s) for r in view.rows] == [
        ("env", "kept", None), ("train", "not re-run", None)]
    assert view.rows[1].why.endswith("; not re-run: the next deeper level needs ~7s, 3s of the budget was left")
    assert view.summary() == "budget 1m: 1 of 1 checks kept, 1 suspect, not re-run (train)"
    odd.budget = {"budget_s": float("nan")}
    assert budget_view(odd) is None


def test_markdown_shows_the_budget_the_left_out_check_and_the_rerun() -> None:
    text = render_markdown(node_budget())
    assert "Checks: 2 warn, 4 pass; 1 left out by the budget (`stress`)" in text
    assert text.index("### Failures and warnings") < text.index("### Time budget")
    budget = text.split("### Time budget", 1)[1]
    assert budget.lstrip().startswith("budget 30s: 5 of 6 checks kept (\\~23s estimated), 1 left out (stress)")
    tables = _tables(text)
    for table in tables:
        assert len({_cells(r) for r in table}) == 1, table
    plan = next(t for t in tables if t[0].startswith("| check | budget |"))
    rows = [[c.strip() for c in r.split(" | ")] for r in plan[2:]]
    stress = next(r for r in rows if r[0] == "| `stress`")
    assert stress[1:4] == ["**left out**", "", "needs \\~16s"] and "at its shallowest" in stress[4]
    rerun = next(r for r in rows if r[1] == "re-run")
    assert rerun[0] == "| `train`" and rerun[2] == "standard (first pass quick)"
    node = tables[-1]
    assert any(r.startswith("| `train` (re-run) | WARN |") and "deeper re-run at the standard level" in r
               for r in node)
    assert sum(r.startswith("| `train` | WARN |") for r in node) == 1
    assert "Time budget" not in render_markdown(node_cpu()) and "left out" not in render_markdown(node_cpu())


def test_markdown_says_why_a_suspect_result_was_not_rerun() -> None:
    text = render_markdown(_without_rerun(node_budget()))
    row = next(r for r in text.splitlines() if "**not re-run**" in r)
    assert row.startswith("| `train` | **not re-run** |") and "not re-run: the next deeper level needs" in row


def test_junit_lists_a_left_out_check_as_skipped_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "junit.xml"
    proc = gpuaccept("report", str(NODE_BUDGET), "--format", "junit", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(out).getroot()
    _check_junit_structure(root)
    (suite,) = list(root)
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["env", "compute", "memory", "train", "collectives", "train (re-run)",
                                              "stress"]
    stress = cases[-1]
    skipped = stress.find("skipped")
    assert skipped is not None and stress.get("time") == "0.000"
    assert skipped.get("message", "").startswith("left out by --budget 30s: needs ~16s at its shallowest")
    rerun_out = cases[5].find("system-out")
    assert rerun_out is not None and (rerun_out.text or "").startswith("WARN: deeper re-run at the standard level")
    assert "steps=200" in (rerun_out.text or "")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["budget"] == "budget 30s: 5 of 6 checks kept (~23s estimated), 1 left out (stress), " \
                              "1 re-run deeper (train)"
    assert (root.get("tests"), root.get("skipped"), root.get("failures"), root.get("errors")) == ("7", "1", "0", "0")


def test_junit_says_why_a_suspect_result_was_not_rerun() -> None:
    root = ET.fromstring(render_junit(_without_rerun(node_budget())).encode())
    _check_junit_structure(root)
    train = next(c for c in root.iter("testcase") if c.get("name") == "train")
    out = train.find("system-out")
    assert out is not None and "BUDGET: suspect: it warned: train_loss_drop on cpu 0.757 < 2; not re-run: the " \
                               "next deeper level needs ~7s" in (out.text or "")
    assert [c.get("name") for c in root.iter("testcase")].count("train (re-run)") == 0


def test_html_shows_the_budget_and_badges_the_rerun() -> None:
    html = render_html(node_budget(), generated="2026-11-24T12:00:00Z")
    section = re.search(r'<section id="budget">.*?</section>', html, re.S)
    assert section is not None and '<a href="#budget">time budget</a>' in html
    rows = re.findall(r'<tr class="([\w-]+)" data-budget="([\w -]+)"><td>(.*?)</td>', section.group(0))
    assert [(cls, state) for cls, state, _ in rows] == [("ok", "kept")] * 5 + [("left-out", "left out"),
                                                                                ("rerun", "re-run")]
    assert rows[5][2] == "stress" and rows[6][2] == '<a href="#check-train">train</a>'
    assert "needs ~16s at its shallowest (full level, duration_s 10)" in section.group(0)
    assert '<dt>time budget</dt><dd><a href="#budget">budget 30s: 5 of 6 checks kept' in html
    # the re-run: badged where it is listed as a problem, in the check's table and in its details
    problems = re.search(r'<section id="problems">.*?</section>', html, re.S)
    train = re.search(r'<section class="check bad" id="check-train".*?</section>', html, re.S)
    assert problems is not None and train is not None
    assert problems.group(0).count('<span class="badge rerun">re-run</span>') == 1
    assert train.group(0).count('<span class="badge rerun">re-run</span>') == 2
    assert 'id="budget"' not in render_html(node_cpu())


def test_html_escapes_the_budget_text() -> None:
    rep = node_budget()
    assert rep.budget is not None
    rep.budget["left_out"][0]["why"] = 'needs <script>console.error("x")</script> & more'
    rep.budget["left_out"][0]["name"] = "<b>stress</b>"
    html = render_html(rep)
    assert "<script>console.error" not in html and "&lt;script&gt;console.error(&quot;x&quot;)" in html
    assert "<b>stress</b>" not in html and "&lt;b&gt;stress&lt;/b&gt;" in html
    text = render_markdown(rep)
    assert "<script>" not in text and "&lt;script&gt;" in text


def test_budget_page_in_chromium(tmp_path: Path) -> None:
    src = write_json(tmp_path / "in.json", node_budget())
    page = tmp_path / "report.html"
    proc = gpuaccept("report", str(src), "--format", "html", "--output", str(page))
    assert proc.returncode == 0, proc.stderr
    run = render(page, {
        "ready": "document.documentElement.getAttribute('data-ready')",
        "rows": "Array.from(document.querySelectorAll('#budget tbody tr')).map(r => r.dataset.budget)",
        "left_out": "document.querySelector('#budget tr.left-out').textContent",
        "rerun_badges": "document.querySelectorAll('.badge.rerun').length",
        "sections": "Array.from(document.querySelectorAll('section.check')).map(s => s.dataset.check)",
        "filtered": "(() => { document.getElementById('only-problems').click(); return Array.from("
                    "document.querySelectorAll('#budget tbody tr')).filter(r => getComputedStyle(r).display"
                    " !== 'none').map(r => r.dataset.budget); })()",
    }, 1280, 1600)
    v = run.values
    assert run.errors() == [] and v["ready"] == "1"
    assert v["rows"] == ["kept"] * 5 + ["left out", "re-run"]
    assert v["left_out"].startswith("stressleft out") and "needs ~16s at its shallowest" in v["left_out"]
    assert v["rerun_badges"] == 4  # the budget table, needs attention, the check's table and its details
    assert v["sections"] == ["env", "compute", "memory", "train", "collectives"]
    assert v["filtered"] == ["left out", "re-run"]  # "only problems" keeps what the budget did not run as planned


def _parse(text: str) -> dict[str, list[Sample]]:
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def _series(samples: list[Sample]) -> set[tuple[tuple[str, str], ...]]:
    """Series identities as Prometheus sees them: a label with an empty value is no label."""
    return {tuple(sorted((k, v) for k, v in s.labels.items() if v)) for s in samples}


def test_prometheus_keeps_the_rerun_apart_from_the_first_pass() -> None:
    rep = node_budget()
    fams = _parse(render_prometheus(rep))
    for name, samples in fams.items():
        keys = [tuple(sorted(s.labels.items())) for s in samples]
        assert len(keys) == len(set(keys)), f"duplicate series in {name}"
        assert len({tuple(sorted(s.labels)) for s in samples}) == 1, f"mixed label names in {name}"
    status = {(s.labels["check"], s.labels["rerun"]): s.labels["status"] for s in fams["gpuaccept_check_status"]
              if s.value == 1}
    assert status[("train", "")] == "warn" and status[("train", "1")] == "warn" and len(status) == 6
    drop = {s.labels["rerun"]: s.value for s in fams["gpuaccept_metric"] if s.labels["metric"] == "train_loss_drop"}
    assert drop == {"": rep.checks[3].metrics[2].value, "1": rep.checks[5].metrics[2].value}
    assert drop[""] != drop["1"]
    assert {s.labels["rerun"] for s in fams["gpuaccept_metric"] if s.labels["check"] != "train"} == {""}
    assert {s.labels["rerun"] for s in fams["gpuaccept_check_duration_seconds"]} == {"", "1"}
    assert [(s.labels, s.value) for s in fams["gpuaccept_budget_seconds"]] == [({"host": "vm"}, 30.0)]
    assert [(s.labels, s.value) for s in fams["gpuaccept_budget_left_out"]] == [({"host": "vm", "check": "stress"},
                                                                                 1.0)]
    # the first pass's series are the ones the same run without a re-run exports: a re-run never moves them
    plain = _parse(render_prometheus(_without_rerun(rep)))
    for name in ("gpuaccept_metric", "gpuaccept_metric_threshold", "gpuaccept_check_status",
                 "gpuaccept_check_duration_seconds"):
        first = [s for s in fams[name] if s.labels["rerun"] == ""]
        assert _series(first) == _series(plain[name]), name
        assert "rerun" not in {k for s in plain[name] for k in s.labels}


def test_a_metric_tag_named_rerun_does_not_take_the_label() -> None:
    rep = node_budget()
    rep.checks[2].metrics += [Metric("odd", 1.0, "count", tags={"rerun": 7}), Metric("odd", 2.0, "count",
                                                                                    tags={"rerun": 8})]
    metric = _parse(render_prometheus(rep))["gpuaccept_metric"]
    odd = {(s.labels["rerun"], s.labels["tag_rerun"]): s.value for s in metric if s.labels["metric"] == "odd"}
    assert odd == {("", "7"): 1.0, ("", "8"): 2.0}  # told apart by the tag, renamed; neither is a re-run


def test_heatmap_and_curves_compare_each_nodes_first_pass() -> None:
    """A node's re-run is shown with its check, never in the node x metric heatmap or a bandwidth curve, where
    its values (another depth) would stand for the node or join its first-pass curve."""
    nodes = []
    for i in (1, 2):
        rep = _without_rerun(node_budget())
        rep.host = f"vm{i}"
        for c in rep.checks:
            c.host = None
            for m in c.metrics:
                m.value *= 1 + i / 100
        nodes.append(NodeEntry(rep.host, NodeState.REPORTED, rep, node_rank=i - 1))
    plain = ClusterReport("c", "local", "2026-11-24T11:29:29Z", expected_nodes=2, nodes=nodes)
    with_rerun = copy.deepcopy(plain)
    rep = with_rerun.nodes[0].report
    assert rep is not None
    again = copy.deepcopy(next(c for c in rep.checks if c.name == "collectives"))
    again.details = {"rerun": {"name": "collectives", "level": "standard", "why": "it warned"}}
    for m in again.metrics:
        m.value *= 0.1
    rep.checks.append(again)
    assert heatmap(node_views(with_rerun)) == heatmap(node_views(plain))
    assert sweeps(node_views(with_rerun)) == sweeps(node_views(plain)) != []
    html = render_html(with_rerun)
    assert html.count('<span class="badge rerun">re-run</span>') == 2  # the check's table and its details
