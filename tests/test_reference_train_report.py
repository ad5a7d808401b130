"""reference_train in the reports: the HTML's loss curves (the departing run highlighted) and per-GPU
TFLOP/s bars; Markdown, JUnit and Prometheus carry its metrics. The CPU report is a real run's
(GPUACCEPT_TEST_REFTRAIN_FAULT=cpu#1@7: two runs on one CPU that part at step 7)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold, Verdict
from gpuaccept.report.html import render_html
from gpuaccept.report.junit import render_junit
from gpuaccept.report.markdown import render_markdown
from gpuaccept.report.prometheus import render_prometheus
from gpuaccept.results.load import load_file

DATA = Path(__file__).parent / "data" / "reports" / "reference_train_cpu_fault.json"


def recorded() -> NodeReport:
    report = load_file(DATA)
    assert isinstance(report, NodeReport)
    return report


def test_recorded_fault_run_draws_both_runs_departing_at_step_7():
    html = render_html(recorded())
    (svg,) = re.findall(r'<svg class="curve losscurve".*?</svg>', html, re.S)
    assert svg.count('<g class="series flagged"') == 2  # two runs that differ: no majority, both marked
    assert "cpu#0 departs at step 7" in svg and "cpu#1 departs at step 7" in svg
    assert 'data-label="bound"' in svg and 'data-label="floor"' in svg


def gpu_report(bad: int | None) -> NodeReport:
    base = recorded()
    check = next(c for c in base.checks if c.name == "reference_train")
    run = next(iter(check.details["devices"]["cpu"].values()))
    devices, metrics = {}, []
    for i in range(4):
        dev = f"cuda:{i}"
        r = copy.deepcopy(run)
        if i == bad:
            r["digests"] = r["digests"][:12] + ["0" * 16] * (len(r["digests"]) - 12)
        devices[dev] = {dev: r}
        metrics.append(Metric("reftrain_tflops", 400.0 + 10 * i, "TFLOP/s", dev, expected=989.0, performance=True))
        metrics.append(Metric("reftrain_match", 0.0 if i == bad else 1.0, "bool", dev,
                              threshold=Threshold(">=", 1.0, Status.FAIL, "default")))
    result = CheckResult("reference_train", Status.FAIL if bad is not None else Status.PASS, "x", metrics=metrics,
                         details={**check.details, "devices": devices})
    return NodeReport("r1", "gpu-node", "full", base.started, base.finished, Verdict.SUCCESS, [result],
                      device="cuda")


def test_four_gpus_one_departing_is_the_one_red_line_and_tflops_are_bars():
    html = render_html(gpu_report(bad=2))
    (svg,) = re.findall(r'<svg class="curve losscurve".*?</svg>', html, re.S)
    assert svg.count('<g class="series') - svg.count('series expected') == 4
    assert svg.count('<g class="series flagged"') == 1 and "cuda:2 departs at step 12" in svg
    assert 'data-metric="reftrain_tflops"' in html and html.count('<svg class="bars"') >= 1
    clean = render_html(gpu_report(bad=None))
    assert 'series flagged' not in re.findall(r'<svg class="curve losscurve".*?</svg>', clean, re.S)[0]


def test_other_formats_carry_the_metrics():
    report = recorded()
    assert "reftrain_match" in render_markdown(report)
    assert "reference_train" in render_junit(report) and "departs from the other runs' curve at step 7" in \
        render_junit(report)
    prom = render_prometheus(report)
    assert re.search(r'reftrain_loss_final\b|metric="reftrain_loss_final"', prom), prom[:2000]
