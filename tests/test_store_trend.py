"""Trend regression rule and run comparison: pure functions on simulated values."""

from __future__ import annotations

import copy
import math
import random

import pytest

from gpuaccept.results.compare import compare_reports
from gpuaccept.results.store import MetricPoint
from gpuaccept.results.trend import (
    TrendRule,
    build_trends,
    higher_is_better,
    judge_point,
    judge_series,
    robust_center,
)
from tests.store_reports import T0, cluster_report, iso, node_report

RULE = TrendRule()


def test_robust_center() -> None:
    med, spread = robust_center([10.0, 11.0, 9.0, 10.0, 100.0])
    assert med == 10.0
    assert spread == pytest.approx(1.4826)


def test_a_real_drop_is_flagged_and_noise_is_not() -> None:
    rng = random.Random(7)
    hist = [600 + rng.gauss(0, 6) for _ in range(12)]
    dropped = judge_point(540.0, hist, True, RULE)  # -10 %, ~10 sigma
    assert dropped.regression and dropped.deviation is not None and dropped.deviation > 3
    assert dropped.change == pytest.approx(540 / dropped.reference - 1)
    assert not judge_point(592.0, hist, True, RULE).regression  # within the noise
    assert not judge_point(660.0, hist, True, RULE).regression  # faster is never a regression


def test_false_positive_rate_on_healthy_noise() -> None:
    """1 % Gaussian noise, 40 runs on each of 50 nodes: the newest run is never flagged."""
    rng = random.Random(1234)
    flagged = 0
    for _ in range(50):
        values = [600 * (1 + rng.gauss(0, 0.01)) for _ in range(40)]
        flagged += judge_point(values[-1], values[:-1], True, RULE).regression
    assert flagged == 0


def test_min_relative_drop_guards_a_flat_history() -> None:
    flat = [100.0] * 8  # MAD is 0: any change is "infinitely many" deviations
    small = judge_point(98.0, flat, True, RULE)
    assert small.deviation == math.inf and not small.regression  # 2 % < the 5 % floor
    assert judge_point(90.0, flat, True, RULE).regression
    assert judge_point(98.0, flat, True, TrendRule(min_drop_frac=0.01)).regression


def test_lower_is_better_and_history_rules() -> None:
    times = [20.0, 20.5, 19.8, 20.2, 20.1]
    assert judge_point(26.0, times, False, RULE).regression
    assert not judge_point(15.0, times, False, RULE).regression
    short = judge_point(1.0, [100.0, 100.0], True, RULE)
    assert short.reference is None and not short.regression and short.history == 2
    # Only the last `window` runs count: an old slow era does not hide a new drop.
    old_slow_then_fast = [50.0] * 30 + [100.0] * 10
    assert judge_point(80.0, old_slow_then_fast, True, TrendRule(window=10)).regression
    assert not judge_point(80.0, old_slow_then_fast, True, TrendRule(window=40)).regression


@pytest.mark.parametrize(("name", "unit", "op", "higher"), [
    ("gemm_bf16_tflops", "TFLOP/s", None, True),
    ("d2d_copy_gbs", "GB/s", None, True),
    ("train_step_ms", "ms", None, False),
    ("memtest_errors", "count", None, False),
    ("temperature_c", "C", None, False),
    ("allreduce_latency", "us", None, False),
    ("train_loss_drop", "fraction", ">=", True),
    ("custom", "x", "<=", False),
])
def test_direction(name: str, unit: str, op: str | None, higher: bool) -> None:
    assert higher_is_better(name, unit, op) is higher


def _point(run: int, value: float | None, device: str = "cuda:0", **tags: object) -> MetricPoint:
    return MetricPoint(run_id=f"r{run}", host="h", sku=None, started=iso(T0 + run), started_ts=T0 + run,
                       check="compute", name="gemm_bf16_tflops", device=device, value=value, unit="TFLOP/s",
                       expected=None, threshold_op=">=", threshold_value=500.0, dtype="bf16", size_bytes=None,
                       tags={"dtype": "bf16", **tags})


def test_one_low_outlier_is_not_a_regression_a_sustained_drop_is() -> None:
    rng = random.Random(3)
    steady = [600 * (1 + rng.gauss(0, 0.005)) for _ in range(10)]
    # one noisy run (the first measurement after a reboot, say), newest or in the middle: never flagged
    assert not any(p.regression for p in judge_series([*steady, 480.0], True, RULE))
    assert not any(p.regression for p in judge_series([*steady, 480.0, *steady[:4]], True, RULE))
    assert judge_series([*steady, 480.0], True, TrendRule(recent=1))[-1].regression  # judged alone, it would be
    # the same drop held for the last 3 runs is; flagged from the second low run on (the median of 3 turns)
    held = judge_series([*steady, 540.0, 539.0, 541.0], True, RULE)
    assert [p.regression for p in held] == [False] * 11 + [True, True]
    newest = held[-1]
    assert newest.recent == 540.0 and newest.value == 541.0 and newest.history == 10
    assert newest.reference == pytest.approx(sorted(steady)[4] / 2 + sorted(steady)[5] / 2)
    # too few runs to judge: recent + min_history of them
    assert [p.reference is None for p in judge_series([600.0] * 5 + [400.0], True, RULE)] == [True] * 5 + [False]
    assert all(p.reference is None for p in judge_series([600.0] * 5, True, RULE))


def test_build_trends_splits_series_and_flags_the_newest() -> None:
    pts = [_point(i, 600.0 + (i % 3)) for i in range(6)] + [_point(6, 500.0), _point(7, 502.0)]
    pts += [_point(i, 700.0, device="cuda:1") for i in range(7)] + [_point(7, 500.0, device="cuda:1")]
    pts += [_point(3, None, device="cuda:1")]  # NaN in one report: left out
    pts += [_point(i, 300.0, size=4096) for i in range(2)]  # a different size is a different series
    series = build_trends(pts, RULE)
    assert [(s.device, s.tags, len(s.points), s.regressed) for s in series] == [
        ("cuda:0", {"dtype": "bf16"}, 8, True),
        ("cuda:0", {"dtype": "bf16", "size": 4096}, 2, False),
        ("cuda:1", {"dtype": "bf16"}, 8, False),  # one low run after seven steady ones
    ]
    newest = series[0].points[-1]
    assert (newest.run_id, newest.value, newest.recent, newest.reference, newest.history) == (
        "r7", 502.0, 502.0, 601.0, 5)
    assert [p.regression for p in series[0].points] == [False] * 7 + [True]
    assert build_trends(pts, RULE, direction="lower")[0].regressed is False


def test_compare_two_node_runs_across_hosts() -> None:
    a = node_report("gpu01", "ra", T0, tflops=600.0, step_ms=20.0)
    b = node_report("gpu02", "rb", T0 + 10, tflops=540.0, step_ms=25.0, nan=True)
    b.checks = [c for c in b.checks if c.name != "env"]
    cmp = compare_reports(a, b)
    assert not cmp.by_host
    by = {(d.metric, d.device): d for d in cmp.deltas}
    g = by[("gemm_bf16_tflops", "cuda:0")]
    assert (g.a, g.b, g.delta, g.worse, g.host) == (600.0, 540.0, -60.0, True, "gpu01 -> gpu02")
    assert g.change == pytest.approx(-0.1)
    t = by[("train_step_ms", "cuda:1")]
    assert (t.delta, t.worse) == (5.0, True) and t.change == pytest.approx(0.25)
    d = by[("d2d_copy_gbs", "cuda:0")]
    assert (d.a, d.b, d.delta, d.change, d.worse) == (3000.0, None, None, None, False)
    # memtest's bytes_verified tag differs per run but does not split the match.
    assert ("memtest_errors", "cuda:1") in by
    assert cmp.only_a == [{"host": "gpu01", "check": "env", "metric": "gpu_count", "device": None, "tags": {},
                           "unit": "count"}]
    assert cmp.only_b == []
    only_compute = compare_reports(a, b, check="compute", metric="gemm_bf16_tflops")
    assert [d.device for d in only_compute.deltas] == ["cuda:0", "cuda:1"]


def test_compare_cluster_runs_by_host() -> None:
    a = cluster_report("ca", ["n1", "n2"])
    b = cluster_report("cb", ["n1", "n2", "n3"], missing=("n2",))
    cmp = compare_reports(a, b, metric="gemm_bf16_tflops")
    assert cmp.by_host
    assert [(d.host, d.device, d.delta) for d in cmp.deltas] == [("n1", "cuda:0", 0.0), ("n1", "cuda:1", 0.0)]
    assert sorted({x["host"] for x in cmp.only_a}) == ["n2"]
    assert sorted({x["host"] for x in cmp.only_b}) == ["n3"]
    assert [d.host for d in compare_reports(a, b, host="n1").deltas if d.metric == "gpu_count"] == ["n1"]


def test_compare_holds_each_runs_first_pass() -> None:
    """A ``run --budget`` re-run (another depth, on one side only) is not compared: the first passes are."""
    from tests.report_data import node_budget

    a = node_budget()
    b = copy.deepcopy(a)
    b.run_id += "-b"
    first = next(c for c in b.checks if c.name == "train")
    first.metrics[2].value = 0.5  # the first pass's train_loss_drop moved; the re-run's did not
    cmp = compare_reports(a, b, check="train")
    assert cmp.only_a == [] and cmp.only_b == []
    drop = next(d for d in cmp.deltas if d.metric == "train_loss_drop")
    assert (drop.a, drop.b) == (a.checks[3].metrics[2].value, 0.5) and drop.worse
    assert len(cmp.deltas) == len(first.metrics)  # one delta per metric, not one per result
    plain = copy.deepcopy(a)
    plain.checks = [c for c in plain.checks if not c.is_rerun]
    assert compare_reports(plain, a).only_b == []  # a re-run's own depth (steps=200) is not a metric of its own
