"""Issue 25, items 3 and 5: "measured, not judged" is a state of its own in every rendering, a GPU figure
without expectation is a WARN, and a missed bound is shown in one unit, the way it was written."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuaccept.checks.base import Outcome, ThresholdRule
from gpuaccept.cli import main
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold, Verdict, miss_text
from gpuaccept.node.judge import judge
from gpuaccept.node.suite import PlannedCheck
from gpuaccept.report.console import PlainConsole, describe_key, result_line, result_notes
from gpuaccept.report.html import render_html
from gpuaccept.report.junit import render_junit
from gpuaccept.report.markdown import render_markdown
from gpuaccept.report.prometheus import render_prometheus
from gpuaccept.report.views import headline_metric
from tests.helpers import SCHEMA
from tests.test_nccl_tests import DATA as NCCL_DATA


def _perf(name: str, value: float, unit: str = "GB/s", device: str | None = "cpu", **kw: object) -> Metric:
    return Metric(name, value, unit, device=device, performance=True, **kw)  # type: ignore[arg-type]


def _cpu_report() -> NodeReport:
    """A CPU run: compute and memory measured, no expectation for either; health judged; a skip."""
    compute = CheckResult("compute", Status.PASS, "cpu N=256: fp32 12.7 GFLOP/s", 7.0, metrics=[
        _perf("gemm_fp32_tflops", 0.0127, "TFLOP/s"), _perf("gemm_bf16_tflops", 0.0003, "TFLOP/s")])
    memory = CheckResult("memory", Status.PASS, "STREAM copy 23.4 GB/s", 1.7, metrics=[
        _perf("stream_copy_gbs", 23.4), _perf("stream_triad_gbs", 4.2)])
    health = CheckResult("health", Status.PASS, "ok", 0.1, metrics=[
        Metric("temperature_c", 40.0, "C", threshold=Threshold("<=", 85.0))])
    memtest = CheckResult("memtest", Status.SKIP, "no GPU", 0.0)
    return NodeReport(run_id="r-cpu", host="n1", profile="quick", started="2026-01-01T00:00:00Z",
                      finished="2026-01-01T00:01:00Z", verdict=Verdict.SUCCESS, device="cpu",
                      checks=[compute, memory, health, memtest])


def test_not_judged_is_derived_from_the_data_and_round_trips() -> None:
    rep = _cpu_report()
    compute = rep.checks[0]
    assert compute.not_judged == ["gemm_fp32_tflops", "gemm_bf16_tflops"]
    assert [c.state for c in rep.checks] == ["not_judged", "not_judged", "pass", "skip"]
    assert rep.state_counts() == {"error": 0, "fail": 0, "warn": 0, "pass": 1, "not_judged": 2, "skip": 1}
    # an expectation (or a bound) makes the figure judged; a metric that is not a performance figure never counts
    compute.metrics[0].expected = 67.0
    compute.metrics[1].threshold = Threshold(">=", 0.0001)
    assert compute.not_judged == [] and compute.state == "pass"
    doc = rep.to_dict()
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert doc["not_judged"] == {"checks": 1, "figures": ["memory: stream_copy_gbs", "memory: stream_triad_gbs"]}
    assert doc["checks"][1]["not_judged"] == ["stream_copy_gbs", "stream_triad_gbs"]
    assert doc["checks"][1]["metrics"][0]["performance"] is True and "performance" not in doc["checks"][2]["metrics"][0]
    back = NodeReport.from_dict(json.loads(json.dumps(doc)))
    assert back.not_judged() == [("memory", "stream_copy_gbs"), ("memory", "stream_triad_gbs")]
    old = json.loads(json.dumps(doc))  # a report from before the flag: nothing is "not judged", no new field
    for c in old["checks"]:
        for m in c["metrics"]:
            m.pop("performance", None)
    assert "not_judged" not in NodeReport.from_dict(old).to_dict()


def test_final_line_names_the_figures_not_judged_and_notes_compose() -> None:
    rep = _cpu_report()
    assert result_line(rep) == ("[RESULT] SUCCESS (4 performance figures not judged: compute gemm_fp32_tflops, "
                                "compute gemm_bf16_tflops, memory stream_copy_gbs, memory stream_triad_gbs)")
    assert result_notes(rep) == [result_line(rep)[len("[RESULT] SUCCESS ("):-1]]
    rep.checks.append(CheckResult("collectives", Status.PASS, "", metrics=[_perf("allreduce_busbw_large_gbs", 0.1)]))
    assert result_line(rep).endswith("memory stream_triad_gbs and 1 more)")
    rep.checks[0].status, rep.verdict = Status.FAIL, Verdict.FAILURE
    assert result_line(rep).startswith("[RESULT] FAILURE: compute (5 performance figures not judged: ")
    for c in rep.checks:
        for m in c.metrics:
            m.expected = 1.0
    rep.verdict = Verdict.SUCCESS
    assert result_line(rep) == "[RESULT] SUCCESS"


def test_plain_console_shows_not_judged_as_a_state() -> None:
    out = io.StringIO()
    PlainConsole(out, {"compute": "gemm_fp32_tflops*", "memory": "*_copy_gbs"}).summary(_cpu_report(), {})
    lines = out.getvalue().splitlines()
    assert lines[0] == "[RESULT] compute      NOT JUDGED gemm_fp32_tflops=12.7 GFLOP/s (not judged: no expectation)"
    assert lines[2].startswith("[RESULT] health       PASS ")
    assert "not judged" in lines[-1]


def test_every_rendering_counts_and_names_the_checks_not_judged() -> None:
    rep = _cpu_report()
    md = render_markdown(rep)
    assert "Checks: 1 pass, 2 not judged, 1 skip" in md
    assert "`compute` `gemm_fp32_tflops`" in md and "| NOT JUDGED |" in md
    html = render_html(rep)
    assert '<span class="badge not_judged">2 not judged</span>' in html
    assert re.search(r'<span id="not-judged">4 performance figures [^<]*gemm_bf16_tflops', html)
    assert '<span class="st not_judged">NOT JUDGED</span>' in html
    root = ET.fromstring(render_junit(rep).encode())
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["not_judged"] == ("4: compute gemm_fp32_tflops, compute gemm_bf16_tflops, memory stream_copy_gbs, "
                                   "memory stream_triad_gbs")
    outs = {c.get("name"): c.findtext("system-out") or "" for c in root.iter("testcase")}
    assert "NOT JUDGED: stream_copy_gbs, stream_triad_gbs" in outs["memory"] and "NOT JUDGED" not in outs["health"]
    fams = {f.name: f for f in text_string_to_metric_families(render_prometheus(rep))}
    counts = {s.labels["check"]: s.value for s in fams["gpuaccept_check_not_judged"].samples}
    assert counts == {"compute": 2, "memory": 2, "health": 0}  # a skip measured nothing: no sample
    names = {(s.labels["check"], s.labels["metric"]) for s in fams["gpuaccept_metric_not_judged"].samples}
    assert names == {("compute", "gemm_fp32_tflops"), ("compute", "gemm_bf16_tflops"),
                     ("memory", "stream_copy_gbs"), ("memory", "stream_triad_gbs")}


def _outcome(*metrics: Metric, status: Status = Status.PASS) -> Outcome:
    return Outcome(status, "measured", list(metrics))


def test_a_gpu_figure_without_expectation_is_a_warn_naming_it() -> None:
    busbw = _perf("allreduce_busbw_large_gbs", 350.0, device="cuda:0")
    d2d = _perf("d2d_copy_gbs", 2900.0, device="cuda:0", expected=3350.0, threshold=Threshold(">=", 2500.0))
    j = judge(_outcome(busbw, d2d), device="cuda")
    assert j.status is Status.WARN
    assert j.reason.startswith("no expectation for allreduce_busbw_large_gbs on cuda:0 (no SKU entry, fabric or "
                               "baseline): not judged")
    assert judge(_outcome(_perf("allreduce_busbw_large_gbs", 350.0, device="cuda:0")), device="cpu").status \
        is Status.PASS  # on a CPU run it stays "measured, not judged"
    assert judge(_outcome(d2d), device="cuda").status is Status.PASS
    rule = ThresholdRule("allreduce_busbw_large_gbs", min=300.0, source="config")  # a rule is an expectation too
    assert judge(_outcome(_perf("allreduce_busbw_large_gbs", 350.0, device="cuda:0")), overrides=[rule],
                 device="cuda").status is Status.PASS
    failed = judge(_outcome(_perf("x_gbs", 1.0, device="cuda:1"), status=Status.FAIL), device="cuda")
    assert failed.status is Status.FAIL and "no expectation for x_gbs on cuda:1" in failed.reason


def test_the_issue_line_fp32_gemm_on_cpu_against_100000_tflops() -> None:
    """Was: ``gemm_fp32_tflops=5.57 GFLOP/s >= 100,000,000 GFLOP/s - gemm_fp32_tflops on cpu 0.005567 < 1e+05
    TFLOP/s``: three forms of two numbers, and a ``>=`` that reads as a false claim."""
    m = _perf("gemm_fp32_tflops", 0.005567, "TFLOP/s", tags={"dtype": "fp32"})
    rule = ThresholdRule("gemm_fp32_tflops", min=100000.0, source="config")
    j = judge(_outcome(m), overrides=[rule], device="cpu")
    res = CheckResult("compute", j.status, j.reason, 5.0, metrics=j.metrics)
    assert j.status is Status.FAIL
    assert j.reason == "gemm_fp32_tflops on cpu 0.005567 < 100,000 TFLOP/s (measured)"
    value, expect = describe_key(res, "gemm_fp32_tflops*")
    assert (value, expect) == ("gemm_fp32_tflops=0.005567 TFLOP/s", "misses >= 100,000 TFLOP/s")
    out = io.StringIO()
    check = PlannedCheck("compute", "", "COMPUTE", {}, [], [rule], 60.0, "gemm_fp32_tflops*")
    PlainConsole(out, {}).on_end(check, res)
    line = out.getvalue().strip()
    assert line == ("[COMPUTE] compute: FAIL 5.0s gemm_fp32_tflops=0.005567 TFLOP/s misses >= 100,000 TFLOP/s - "
                    "gemm_fp32_tflops on cpu 0.005567 < 100,000 TFLOP/s (measured)")
    assert "GFLOP/s" not in line and "e+" not in line
    shown = re.search(r"([\d.,]+) < ([\d.,]+) TFLOP/s", line)
    assert shown is not None and float(shown[1].replace(",", "")) < float(shown[2].replace(",", ""))


@pytest.mark.parametrize(("value", "op", "bound", "text"), [
    (593.59999, ">=", 593.6, "593.59999 < 593.6 GB/s"),  # digits added until the comparison shown is true
    (593.6123, ">=", 593.61234567, "593.6 < 593.612 GB/s"),  # a bound shown with 6 digits
    (85.2, "<=", 85.0, "85.2 > 85 GB/s"),
    (float("nan"), ">=", 10.0, "n/a (bound >= 10 GB/s)"),
    (12.0, ">=", 10.0, ""),  # met: nothing to say
])
def test_miss_text_states_a_true_comparison_in_the_bound_unit(value: float, op: str, bound: float, text: str) -> None:
    assert miss_text(Metric("x", value, "GB/s", threshold=Threshold(op, bound))) == text


def test_headline_is_the_same_metric_from_run_to_run() -> None:
    """Collectives showed reducescatter in one run and allgather in the next: the weakest op changed."""
    def run(allgather: float, reducescatter: float) -> str:
        res = CheckResult("collectives", Status.PASS, "", metrics=[
            _perf("allreduce_busbw_large_gbs", 300.0, device="cuda:0"),
            _perf("allgather_busbw_large_gbs", allgather, device="cuda:0"),
            _perf("reducescatter_busbw_large_gbs", reducescatter, device="cuda:0"),
            _perf("allreduce_busbw_large_gbs", 290.0, device="cuda:1")])
        m = headline_metric(res, "*_busbw_large_gbs")
        assert m is not None
        return f"{m.name} {m.device}"
    assert run(100.0, 200.0) == run(200.0, 100.0) == "allreduce_busbw_large_gbs cuda:1"


def test_nccl_tests_parse_of_a_two_host_log_says_not_judged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nccl-tests", "parse", str(NCCL_DATA / "current_2hosts_h100.txt")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("NOT JUDGED: all_reduce_perf, 16 ranks on 2 hosts")
    assert main(["nccl-tests", "parse", str(NCCL_DATA / "current_2hosts_h100.txt"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "pass" and doc["not_judged"] == ["allreduce_busbw_large_gbs"]


def test_cluster_summary_counts_not_judged_per_node_and_on_the_final_line() -> None:
    from gpuaccept.launch.gather import summary_lines
    from gpuaccept.model import ClusterReport, NodeEntry, NodeState

    a, b = _cpu_report(), _cpu_report()
    b.host = "n2"
    cluster = ClusterReport("c1", "local", "2026-01-01T00:00:00Z", expected_nodes=2,
                            nodes=[NodeEntry(r.host, NodeState.REPORTED, r, i) for i, r in enumerate((a, b))])
    lines = summary_lines(cluster)
    assert "[NODE] n1: SUCCESS - 4 check(s), 2 not judged" in lines
    assert lines[-1] == ("[RESULT] SUCCESS (4 performance figures not judged: compute gemm_fp32_tflops, "
                         "compute gemm_bf16_tflops, memory stream_copy_gbs, memory stream_triad_gbs)")
