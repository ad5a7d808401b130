"""Issue 25 item 3: on a GPU node every performance figure finds an expectation (the SKU table, a baseline, a
rule) or is a WARN naming it and saying how to give it one; a CPU run stays "measured, not judged"."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks.base import Outcome, ThresholdRule
from gpuaccept.checks.disk import DiskCheck
from gpuaccept.checks.disk_io import figures_from_fio, parse_fio_json
from gpuaccept.checks.nbody import NBodyResult, nbody_metrics
from gpuaccept.checks.sku_expect import nbody_expectation, stress_expectation
from gpuaccept.checks.stress import StressCheck, StressResult
from gpuaccept.hw.sku import Sku, load_skus
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold
from gpuaccept.node.judge import judge

DATA = Path(__file__).parent / "data"
SKUS = load_skus()


def test_the_table_holds_the_fp64_vector_peak_and_the_new_pass_fractions() -> None:
    h100 = SKUS["h100_sxm"]
    assert h100.fp64_vector_tflops == 34.0 and h100.peak_tflops("fp64") == 67.0  # CUDA cores vs tensor cores
    assert SKUS["a100_sxm4_80gb"].fp64_vector_tflops == 9.7 and SKUS["l4"].fp64_vector_tflops is None
    for sku in SKUS.values():
        if sku.fp64_vector_tflops is not None:  # never above the tensor-core figure
            assert sku.fp64_vector_tflops <= (sku.peak_tflops("fp64") or 0), sku.id
    assert h100.pass_fraction("stress_bf16") == 0.5 and h100.pass_fraction("nbody_fp32") == 0.2
    assert SKUS["l4"].pass_fraction("stress_bf16") == 0.35  # a power-limited board's own floor


def test_stress_is_expected_at_the_dense_gemm_peak_of_its_dtype() -> None:
    exp = stress_expectation(SKUS["h100_sxm"], "bf16")
    assert exp is not None and exp.expected == 989.4
    assert exp.threshold == Threshold(">=", 494.7, Status.FAIL, "sku:h100_sxm")
    tf32 = stress_expectation(SKUS["a100_pcie_40gb"], "tf32")
    assert tf32 is not None and tf32.expected == 156.0 and tf32.threshold.value == 78.0
    assert stress_expectation(SKUS["l4"], "fp64") is None  # the datasheet has no fp64 figure
    assert stress_expectation(None, "bf16") is None


def test_nbody_is_expected_at_the_cuda_core_peak_for_the_fused_kernel_only() -> None:
    a100 = SKUS["a100_sxm4_80gb"]
    exp = nbody_expectation(a100, "fp32", "compiled")
    assert exp is not None and exp.expected == 19500.0 and exp.threshold.value == 3900.0
    fp64 = nbody_expectation(SKUS["h100_sxm"], "fp64", "compiled")
    assert fp64 is not None and fp64.expected == 34000.0  # the CUDA-core figure, not the tensor-core 67
    assert nbody_expectation(a100, "fp32", "eager") is None  # memory-bound: the FP32 peak says nothing
    assert nbody_expectation(SKUS["l40s"], "fp64", "compiled") is None


def _stress_result(device: str, tflops: float, dtype: str = "bf16", size: int = 8192) -> StressResult:
    """Ten one-second windows at ``tflops`` (GEMMs of ``2 size^3`` flops), identical results."""
    gemms = max(1, round(tflops * 1e12 / (2 * size ** 3)))
    return StressResult(device, dtype, size, windows=[(1.0, gemms)] * 10, ref_error=0.0, iterations=10 * gemms)


def _stress(results: list[StressResult], skus: dict[str, Sku | None]) -> CheckResult:
    p = {**StressCheck.defaults("full")}
    out = StressCheck._outcome(results, {}, p, {"duration_s": 30.0}, skus)
    j = judge(out, StressCheck.thresholds, device="cuda", check="stress")
    return CheckResult("stress", j.status, j.reason, metrics=j.metrics)


def test_stress_on_a_known_gpu_passes_or_fails_against_its_sku() -> None:
    h100 = SKUS["h100_sxm"]
    ok = _stress([_stress_result("cuda:0", 700.0)], {"cuda:0": h100})
    (rate,) = [m for m in ok.metrics if m.name == "stress_tflops"]
    assert rate.performance and rate.expected == 989.4 and rate.threshold is not None
    assert ok.status is Status.PASS and ok.state == "pass", ok.reason
    slow = _stress([_stress_result("cuda:0", 700.0), _stress_result("cuda:1", 300.0)], {"cuda:0": h100, "cuda:1": h100})
    assert slow.status is Status.FAIL
    assert slow.reason.startswith("stress_tflops on cuda:1 ") and "< 494.7 TFLOP/s" in slow.reason
    others = {m.name for m in slow.metrics if m.performance}
    assert others == {"stress_tflops"}  # start and end are parts of the judged drop


def test_stress_on_a_gpu_the_table_lacks_is_a_warn_saying_how_to_judge_it() -> None:
    res = _stress([_stress_result("cuda:0", 150.0)], {"cuda:0": None})
    assert res.status is Status.WARN
    assert res.reason.startswith("no expectation for stress_tflops on cuda:0 (no SKU entry, fabric or baseline): "
                                 "not judged; give it one with run --baseline FILE or a rule in "
                                 "checks.stress.thresholds of --config")
    rule = ThresholdRule("stress_tflops", min=100.0, source="config")  # a config rule is an expectation
    out = StressCheck._outcome([_stress_result("cuda:0", 150.0)], {}, StressCheck.defaults("full"),
                               {"duration_s": 30.0}, {})
    assert judge(out, overrides=[rule], device="cuda", check="stress").status is Status.PASS


def _nbody(device: str, gflops: float, kernel: str) -> NBodyResult:
    bodies, steps = 65536, 10
    seconds = bodies * bodies * 20 * steps / (gflops * 1e9)
    return NBodyResult(device, bodies, steps, seconds, 0.0, 0.0, 0.0, 1e-4, kernel=kernel)


def test_nbody_fused_kernel_is_judged_against_the_sku_and_the_eager_one_warns() -> None:
    a100 = SKUS["a100_sxm4_80gb"]
    fast, slow = _nbody("cuda:0", 12000.0, "compiled"), _nbody("cuda:1", 2000.0, "compiled")
    metrics = nbody_metrics([fast, slow], "fp32", {"cuda:0": a100, "cuda:1": a100})
    assert [m.expected for m in metrics] == [19500.0, 19500.0] and all(m.performance for m in metrics)
    j = judge(Outcome(Status.PASS, "ok", metrics), device="cuda", check="nbody")
    assert j.status is Status.FAIL and j.reason.startswith("nbody_gflops on cuda:1 2,000 < 3,900 GFLOP/s")
    eager = nbody_metrics([_nbody("cuda:0", 900.0, "eager")], "fp32", {"cuda:0": a100})
    j = judge(Outcome(Status.PASS, "ok", eager), device="cuda", check="nbody")
    assert j.status is Status.WARN and "no expectation for nbody_gflops on cuda:0" in j.reason
    assert "checks.nbody.thresholds" in j.reason


def _disk_outcome() -> Outcome:
    """The disk check's outcome from a recorded fio report."""
    fig = figures_from_fio(parse_fio_json((DATA / "fio" / "direct.json").read_text()), True, 32)
    free = Metric("disk_free_gib", 100.0, "GiB", threshold=Threshold(">=", 1.0))
    return DiskCheck._outcome(fig, free, {"path": "/scratch"}, "/scratch", 16, 1.0)


def test_disk_figures_on_a_gpu_node_warn_without_a_baseline_and_stay_not_judged_on_cpu() -> None:
    out = _disk_outcome()
    flagged = [m.name for m in out.metrics if m.performance]
    assert flagged == ["disk_seq_write_mbs", "disk_seq_read_mbs", "disk_rand_write_iops", "disk_rand_read_iops"]
    j = judge(out, device="cuda", check="disk")
    assert j.status is Status.WARN
    assert j.reason.startswith("no expectation for disk_seq_write_mbs, disk_seq_read_mbs, disk_rand_write_iops "
                               "and 1 more (no SKU entry")
    assert "checks.disk.thresholds" in j.reason
    cpu = judge(_disk_outcome(), device="cpu", check="disk")  # a CPU run stays as it was: not judged, no WARN
    res = CheckResult("disk", cpu.status, cpu.reason, metrics=cpu.metrics)
    assert cpu.status is Status.PASS and res.state == "not_judged" and len(res.not_judged) == 4


def test_disk_figures_with_a_baseline_are_judged() -> None:
    from gpuaccept.results.baseline import Baseline, BaselineEntry
    from gpuaccept.results.baseline_judge import overlay_baseline

    out = _disk_outcome()
    values = {m.name: m for m in out.metrics}
    entries = tuple(BaselineEntry(n, values[n].value * k, values[n].unit, values[n].value * 0.01, 20)
                    for n, k in (("disk_seq_write_mbs", 1.0), ("disk_seq_read_mbs", 1.0),
                                 ("disk_rand_write_iops", 1.0), ("disk_rand_read_iops", 3.0)))
    env = CheckResult("env", Status.PASS, "", details={"nvml": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}})
    node = NodeReport(run_id="r", host="h", profile="full", started="2026-01-01T00:00:00Z", checks=[env])
    check = CheckResult("disk", out.status, out.reason, metrics=out.metrics)
    sku = _node_sku(node, check)
    changed = overlay_baseline(check, node, Baseline(skus={sku: entries}, path="fleet.yaml"))
    assert len(changed) == 4
    j = judge(out, device="cuda", check="disk")
    assert "no expectation" not in j.reason
    assert j.status is Status.FAIL and j.reason.startswith("disk_rand_read_iops ")  # 3x the baseline: too slow


def _node_sku(node: NodeReport, check: CheckResult) -> str:
    from gpuaccept.results.samples import SkuResolver

    return SkuResolver(node).for_device(check, None)


@pytest.mark.parametrize("name, unit", [("train_step_ms", "ms"), ("ddp_samples_per_s", "samples/s"),
                                        ("throughput_cnn_samples_s", "samples/s")])
def test_time_and_rate_figures_of_the_training_checks_warn_on_a_gpu(name: str, unit: str) -> None:
    m = Metric(name, 12.0, unit, device="cuda:0", performance=True)
    j = judge(Outcome(Status.PASS, "loss fell", [m]), device="cuda", check=name.split("_")[0])
    assert j.status is Status.WARN and f"no expectation for {name} on cuda:0" in j.reason


def test_a_report_from_before_keeps_its_verdict_when_read_back() -> None:
    """Flags live in the report: an old report (no flag on its figures) reads back unchanged."""
    doc = {"name": "train", "status": "pass", "reason": "", "metrics": [
        {"name": "train_step_ms", "value": 3.2, "unit": "ms", "device": "cuda:0"}]}
    res = CheckResult.from_dict(json.loads(json.dumps(doc)))
    assert res.state == "pass" and not math.isnan(res.metrics[0].value)


GPU_SKU_CHECKS: dict[str, dict[str, Any]] = {
    "stress": {"duration_s": 20.0, "window_s": 1.0, "warmup_s": 5.0},
    "nbody": {"kernel": "compiled"},
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_SKU_CHECKS))
def test_a_healthy_gpu_of_the_table_meets_the_derived_floors(name: str) -> None:
    """Calibration of the stress and nbody pass fractions on a lent GPU: a healthy one must meet them."""
    from gpuaccept.checks import registry
    from gpuaccept.checks.base import CheckContext

    cls = registry()[name]
    params = {**cls.defaults("standard" if name == "nbody" else "full"), **GPU_SKU_CHECKS[name]}
    out = cls().run(CheckContext(device="cuda", params=params, profile="standard"))
    if not any(out.details.get("sku", {}).values()):
        pytest.skip(f"this GPU is not in the SKU table ({out.details.get('sku')}): nothing to calibrate")
    figures = [m for m in out.metrics if m.performance]
    assert figures and all(m.threshold is not None and m.expected for m in figures), (out.status, out.reason)
    assert all(m.threshold is not None and m.threshold.met_by(m.value) for m in figures), \
        [(m.device, m.value, m.expected) for m in figures]


def test_a_warn_only_for_missing_expectations_does_not_make_a_budget_rerun() -> None:
    """``run --budget`` re-runs a WARN deeper; a deeper run cannot give a figure an expectation."""
    from gpuaccept.node.budget import suspect
    from gpuaccept.node.judge import NO_EXPECTATION, WARNED_FOR

    m = Metric("train_step_ms", 12.0, "ms", device="cuda:0", performance=True)
    j = judge(Outcome(Status.PASS, "loss fell", [m]), device="cuda", check="train")
    assert j.status is Status.WARN and j.only_unjudged
    res = CheckResult("train", j.status, j.reason, metrics=j.metrics, details={WARNED_FOR: NO_EXPECTATION})
    assert suspect(res) is None
    assert suspect(CheckResult("train", Status.WARN, "loss barely fell")) is not None
    own = judge(Outcome(Status.WARN, "loss barely fell", [m]), device="cuda", check="train")
    assert own.status is Status.WARN and not own.only_unjudged  # its own WARN stays suspect
    near = Metric("train_step_ms", 9.9, "ms", device="cuda:0", performance=True, threshold=Threshold("<=", 10.0))
    assert suspect(CheckResult("train", Status.WARN, "", metrics=[near], details={WARNED_FOR: NO_EXPECTATION}))
