"""Shared display units (report/units.py) and the one headline-metric definition used by every rendering."""

from __future__ import annotations

import math

import pytest

from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold, Verdict
from gpuaccept.report.console import describe_key, metric_line
from gpuaccept.report.html import render_html
from gpuaccept.report.markdown import render_markdown
from gpuaccept.report.units import display_unit, fmt_value
from gpuaccept.report.views import headline_metric


@pytest.mark.parametrize(("value", "unit", "text"), [
    (0.001263, "TFLOP/s", "1.26 GFLOP/s"),  # CPU bf16 GEMM: was 0.001263 TFLOP/s
    (0.175, "TFLOP/s", "175.0 GFLOP/s"),
    (612.0, "TFLOP/s", "612.0 TFLOP/s"),
    (1263.0, "TFLOP/s", "1,263 TFLOP/s"),  # four digits stay
    (13900.0, "GFLOP/s", "13.9 TFLOP/s"),  # five do not: nbody -benchmark on an A100
    (0.3, "GB/s", "300.0 MB/s"),
    (3200.0, "GB/s", "3,200 GB/s"),
    (0.05, "ms", "50 µs"),
    (0.0004, "ms", "400.0 ns"),
    (2.5, "us", "2.5 µs"),
    (25000.0, "ms", "25 s"),
    (3e9, "bytes", "2.79 GiB"),
    (12.0, "count", "12"),
    (0.5, "fraction", "0.5"),
    (700.0, "W", "700.0 W"),
    (0.0, "ms", "0 ms"),
    (math.nan, "GB/s", "n/a"),
    (1e-30, "TFLOP/s", "1e-18 FLOP/s"),  # the smallest member at the end of the family
])
def test_fmt_value_gives_one_to_four_integer_digits(value: float, unit: str, text: str) -> None:
    assert fmt_value(value, unit) == text


def test_threshold_is_shown_in_the_unit_of_the_value() -> None:
    assert fmt_value(1.2, "TFLOP/s", like=0.9) == "1,200 GFLOP/s"
    assert display_unit(0.9, "TFLOP/s") == (1000.0, "GFLOP/s")
    assert display_unit(5.0, "furlongs") == (1.0, "furlongs")


def _result(name: str, metrics: list[Metric], **details: object) -> CheckResult:
    return CheckResult(name=name, status=Status.PASS, reason="", duration_s=1.0, metrics=metrics,
                       details=dict(details))


def test_passing_check_headline_is_its_key_metric_not_a_met_threshold() -> None:
    """Issue 15: a met bound (allreduce_wrong <= 0) must not replace the declared key in any rendering."""
    wrong = Metric("allreduce_wrong", 0.0, "count", threshold=Threshold("<=", 0.0, Status.FAIL, "default"))
    busbw = [Metric("reducescatter_busbw_large_gbs", v, "GB/s", device=f"cuda:{i}") for i, v in enumerate((90, 80))]
    res = _result("collectives", [wrong, *busbw])
    m = headline_metric(res, "*_busbw_large_gbs")
    assert m is busbw[1]  # the weakest device
    assert describe_key(res, "*_busbw_large_gbs")[0] == "reducescatter_busbw_large_gbs=80 GB/s [cuda:1]"
    report = NodeReport(run_id="r1", host="n1", profile="quick", started="2026-01-01T00:00:00Z",
                        verdict=Verdict.SUCCESS, checks=[res])
    assert "`reducescatter_busbw_large_gbs` on cuda:1 = 80 GB/s" in render_markdown(report)
    assert "allreduce_wrong" not in render_markdown(report)
    assert "reducescatter_busbw_large_gbs [cuda:1] = 80 GB/s" in render_html(report)


def test_failing_metric_heads_a_failed_check() -> None:
    wrong = Metric("allreduce_wrong", 2.0, "count", threshold=Threshold("<=", 0.0, Status.FAIL, "default"))
    busbw = Metric("allreduce_busbw_large_gbs", 90.0, "GB/s")
    res = _result("collectives", [busbw, wrong])
    assert headline_metric(res, "*_busbw_large_gbs") is wrong
    assert describe_key(res, "*_busbw_large_gbs")[0] == "allreduce_wrong=2"


def test_check_chosen_key_beats_the_class_key_and_lower_is_better_picks_the_highest() -> None:
    fp32 = Metric("gemm_fp32_tflops", 0.175, "TFLOP/s", device="cpu")
    bf16 = Metric("gemm_bf16_tflops", 0.00126, "TFLOP/s", device="cpu")
    res = _result("compute", [fp32, bf16], key_metric="gemm_fp32_tflops*")
    assert headline_metric(res, "gemm_bf16_tflops*") is fp32
    assert describe_key(res, "gemm_bf16_tflops*") == ("gemm_fp32_tflops=175.0 GFLOP/s", "")
    lat = [Metric("latency_ms", v, "ms", device=f"cuda:{i}") for i, v in enumerate((0.02, 0.05))]
    assert headline_metric(_result("x", lat), "latency_ms") is lat[1]


def test_metric_line_scales_value_threshold_and_spec_together() -> None:
    m = Metric("gemm_bf16_tflops", 0.9, "TFLOP/s", device="cuda:0", expected=2.0,
               threshold=Threshold(">=", 0.5, Status.FAIL, "sku:x"))
    assert metric_line(m) == ("gemm_bf16_tflops [cuda:0] = 900.0 GFLOP/s (threshold >= 500.0 GFLOP/s, "
                              "spec 2,000 GFLOP/s)")


def test_metric_line_of_a_missed_bound_keeps_the_unit_the_bound_is_written_in() -> None:
    m = Metric("gemm_bf16_tflops", 0.9, "TFLOP/s", device="cuda:0", expected=2.0,
               threshold=Threshold(">=", 1.2, Status.FAIL, "sku:x"))
    assert metric_line(m) == "gemm_bf16_tflops [cuda:0] = 0.9 TFLOP/s (threshold >= 1.2 TFLOP/s, spec 2 TFLOP/s)"
