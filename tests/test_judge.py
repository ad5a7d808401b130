from __future__ import annotations

import math

from gpuaccept.checks.base import Outcome, ThresholdRule
from gpuaccept.model import Metric, Status, Threshold
from gpuaccept.node.judge import judge


def _metric(value: float, expected: float | None = None, name: str = "gemm_bf16_tflops") -> Metric:
    return Metric(name, value, "TFLOP/s", "cuda:0", expected=expected)


def test_absolute_min_fails_below_and_names_metric_device_and_values() -> None:
    j = judge(Outcome(Status.PASS, "measured", [_metric(400.0)]), [ThresholdRule("gemm_*_tflops", min=500.0)])
    assert j.status is Status.FAIL
    assert "gemm_bf16_tflops on cuda:0 400 < 500 TFLOP/s" in j.reason
    assert j.metrics[0].threshold == Threshold(">=", 500.0)


def test_fraction_uses_expected_and_is_not_applied_without_it() -> None:
    rule = ThresholdRule("gemm_*", min_fraction=0.5)
    assert judge(Outcome(Status.PASS, "", [_metric(600.0, expected=1000.0)]), [rule]).status is Status.PASS
    assert judge(Outcome(Status.PASS, "", [_metric(400.0, expected=1000.0)]), [rule]).status is Status.FAIL
    no_expectation = judge(Outcome(Status.PASS, "", [_metric(1.0)]), [rule])
    assert no_expectation.status is Status.PASS and no_expectation.metrics[0].threshold is None


def test_user_rule_beats_check_threshold_which_beats_default() -> None:
    m = _metric(700.0, expected=989.0)
    m.threshold = Threshold(">=", 800.0, source="sku:h100-sxm")
    default = ThresholdRule("gemm_*", min=100.0)
    assert judge(Outcome(Status.PASS, "", [m]), [default]).status is Status.FAIL  # the SKU bound applies
    m.threshold = Threshold(">=", 800.0, source="sku:h100-sxm")
    user = ThresholdRule("gemm_bf16_tflops", min_fraction=0.6, source="cfg.yaml")
    j = judge(Outcome(Status.PASS, "", [m]), [default], [user])
    assert j.status is Status.PASS and j.metrics[0].threshold is not None
    assert math.isclose(j.metrics[0].threshold.value, 0.6 * 989.0)


def test_warn_severity_and_worst_status_win() -> None:
    warn = ThresholdRule("x", max=1.0, severity=Status.WARN)
    j = judge(Outcome(Status.PASS, "ok", [Metric("x", 2.0, "C")]), [warn])
    assert j.status is Status.WARN and j.reason.endswith("(ok)")
    # a threshold never improves a failing check
    assert judge(Outcome(Status.FAIL, "wrong answer", [Metric("x", 0.5, "C")]), [warn]).status is Status.FAIL


def test_nan_never_meets_a_bound() -> None:
    assert judge(Outcome(Status.PASS, "", [Metric("x", math.nan, "s")]), [ThresholdRule("x", max=1.0)]).status \
        is Status.FAIL


def test_skip_stays_skip_unless_gpu_required() -> None:
    skip = Outcome.skip("no GPU", needs_gpu=True)
    assert judge(skip).status is Status.SKIP
    required = judge(skip, require_gpu=True)
    assert required.status is Status.FAIL and "--require-gpu" in required.reason
    # a skip for another reason (e.g. unsupported feature) stays a skip under --require-gpu
    assert judge(Outcome.skip("fp8 unsupported"), require_gpu=True).status is Status.SKIP


def test_many_violations_are_summarised() -> None:
    metrics = [Metric("x", float(i), "C", f"cuda:{i}") for i in range(6)]
    j = judge(Outcome(Status.PASS, "", metrics), [ThresholdRule("x", min=100.0)])
    assert "and 3 more" in j.reason
