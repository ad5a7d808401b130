"""The compute (GEMM) check: timing helpers, verification, the check on CPU, and on GPU where present."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

import pytest

from gpuaccept.checks import compute
from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.compute import (
    GEMM_TOLERANCE,
    ComputeCheck,
    GemmResult,
    GemmWorkload,
    fp8_unsupported,
    fp32_matmul_mode,
    gemm_error,
    gemm_flops,
    gemm_ok,
    measure_concurrent,
    measure_gemm,
    median,
    time_windows,
)
from gpuaccept.hw.sku import load_skus
from gpuaccept.model import Status

torch = pytest.importorskip("torch")
CPU = torch.device("cpu")


def _ctx(profile: str = "quick", device: str = "cpu", **params: Any) -> CheckContext:
    values = ComputeCheck.defaults(profile)
    values.update(params)
    return CheckContext(device=device, params=values, profile=profile)


# --------------------------------------------------------------------------- helpers


def test_time_windows_counts_calls_and_returns_positive_times() -> None:
    calls = []
    before = []
    times = time_windows(lambda: calls.append(1), CPU, warmup=3, windows=4, iters=5,
                         before_window=lambda: before.append(len(calls)))
    assert len(calls) == 3 + 4 * 5
    assert before == [3, 8, 13, 18]  # each window starts after the previous one's calls
    assert len(times) == 4 and all(t > 0 for t in times)
    with pytest.raises(ValueError):
        time_windows(lambda: None, CPU, warmup=0, windows=0, iters=1)


def test_time_windows_measures_elapsed_time() -> None:
    (t,) = time_windows(lambda: time.sleep(0.01), CPU, warmup=0, windows=1, iters=3)
    assert 0.03 <= t < 0.5


def test_median_and_flops() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert math.isnan(median([]))
    assert gemm_flops(1024) == 2 * 1024**3
    r = GemmResult("cpu", "fp32", 1000, iters=10, window_s=[2.0, 1.0, 4.0], error=0.0, ok=True)
    assert r.median_tflops == pytest.approx(2e9 * 10 / 2.0 / 1e12)
    assert r.best_tflops == pytest.approx(2e9 * 10 / 1.0 / 1e12)


def test_gemm_error_detects_corruption() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 256, generator=gen), torch.randn(256, 64, generator=gen)
    ref = a.double() @ b.double()
    good = a @ b
    assert gemm_ok(gemm_error(good, ref), "fp32")
    corrupt = good.clone()
    corrupt[5, 7] += 0.5 * float(ref.abs().mean())  # one wrong entry, a fraction of the typical size
    assert not gemm_ok(gemm_error(corrupt, ref), "fp32")
    assert not gemm_ok(gemm_error(corrupt, ref), "bf16")
    assert not gemm_ok(gemm_error(torch.zeros_like(good), ref), "bf16")
    nan = good.clone()
    nan[0, 0] = float("nan")
    assert gemm_error(nan, ref) == math.inf
    assert gemm_error(good[:10], ref) == math.inf  # wrong shape
    # TF32-like input rounding (10 mantissa bits) must not pass as fp32
    rounded = (a.view(torch.int32) & ~0x1FFF).view(torch.float32) @ (b.view(torch.int32) & ~0x1FFF).view(torch.float32)
    assert not gemm_ok(gemm_error(rounded, ref), "fp32")
    assert gemm_ok(gemm_error(rounded, ref), "tf32")


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp64", "fp8"])
def test_workload_result_verifies_and_corruption_is_caught(dtype: str) -> None:
    work = GemmWorkload(CPU, dtype, 64, buffers=3, seed=1)
    for _ in range(5):
        work.step()
    assert work.last_pair == 1
    assert work.verify() <= GEMM_TOLERANCE[dtype]
    # the reference is of the last pair: the result of another pair does not verify
    work.c = torch.matmul(work.a[0].float(), work.b[0].float()).to(work.c.dtype) if dtype != "fp8" else work.c * 2
    assert work.verify() > GEMM_TOLERANCE[dtype]


def test_workload_inputs_are_random_distinct_and_nonzero() -> None:
    work = GemmWorkload(CPU, "fp32", 32, buffers=2, seed=3)
    assert not torch.equal(work.a[0], work.a[1]) and not torch.equal(work.a[0], work.b[0])
    assert float((work.a[0] != 0).float().mean()) > 0.99
    assert 0.8 < float(work.a[0].std()) < 1.2  # standard normal, not a constant
    again = GemmWorkload(CPU, "fp32", 32, buffers=2, seed=3)
    assert torch.equal(work.b[1], again.b[1])  # seeded


def test_fp8_operands_are_scaled_into_range_and_column_major() -> None:
    work = GemmWorkload(CPU, "fp8", 32, buffers=1)
    assert work.a[0].dtype == torch.float8_e4m3fn
    assert work.b[0].stride() == (1, 32)  # column-major (K, N)
    assert float(work.a[0].float().abs().max()) == pytest.approx(448.0)
    assert float(work.scale_a[0]) > 0


def test_fp8_unsupported_reasons() -> None:
    assert fp8_unsupported(CPU, 64) is None
    assert "divisible by 16" in (fp8_unsupported(CPU, 100) or "")


def test_fp32_matmul_mode_sets_and_restores() -> None:
    mm = torch.backends.cuda.matmul
    before = mm.fp32_precision
    with fp32_matmul_mode(True):
        assert mm.fp32_precision == "tf32"
        with fp32_matmul_mode(False):
            assert mm.fp32_precision == "ieee"
        assert mm.fp32_precision == "tf32"
    assert mm.fp32_precision == before
    with pytest.raises(RuntimeError), fp32_matmul_mode(True):
        raise RuntimeError("boom")
    assert mm.fp32_precision == before


def test_measure_gemm_on_cpu() -> None:
    res = measure_gemm(CPU, "fp32", 128, warmup=1, iters=3, trials=3, buffers=2)
    assert res.ok and res.error < 1e-5
    assert len(res.window_s) == 3 and res.median_tflops > 0 and res.best_tflops >= res.median_tflops
    assert res.device == "cpu" and res.mode == "single"


def test_measure_concurrent_runs_every_device_in_step() -> None:
    results = measure_concurrent([CPU, CPU], "fp32", 64, warmup=1, iters=2, trials=2, buffers=2)
    assert [r.mode for r in results] == ["concurrent", "concurrent"]
    assert all(r.ok and len(r.window_s) == 2 for r in results)


def test_measure_concurrent_reports_the_real_error_without_hanging() -> None:
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as info:  # meta tensors cannot be sampled on the CPU: that thread fails
        measure_concurrent([CPU, torch.device("meta")], "fp32", 64, warmup=1, iters=2, trials=2, buffers=1)
    assert not isinstance(info.value, threading.BrokenBarrierError)
    assert time.perf_counter() - start < 30


# --------------------------------------------------------------------------- the check on CPU


def test_declared_defaults_are_valid_for_every_profile() -> None:
    for profile in ("quick", "standard", "full"):
        values = ComputeCheck.defaults(profile)
        for param in ComputeCheck.params:
            assert param.coerce(values[param.name], "test", param.name) == values[param.name]
        assert profile in ComputeCheck.timeout_s


def test_check_quick_on_cpu_passes_with_metrics() -> None:
    start = time.perf_counter()
    out = ComputeCheck().run(_ctx("quick"))
    elapsed = time.perf_counter() - start
    assert out.status is Status.PASS, out.reason
    names = [m.name for m in out.metrics]
    assert names == ["gemm_fp32_tflops", "gemm_bf16_tflops"]
    for m in out.metrics:
        assert m.unit == "TFLOP/s" and m.device == "cpu" and 0 < m.value < 100
        assert m.expected is None and m.threshold is None
        assert m.tags["size"] == ComputeCheck.defaults("quick")["cpu_size"] and m.tags["mode"] == "single"
    assert "no spec peak" in out.reason and "fp32" in out.reason
    assert "burst throughput" in out.reason and "standard and full" in out.reason  # quick says it is short
    assert out.details["key_metric"] == "gemm_fp32_tflops*"  # no bf16 headline on a CPU
    assert out.reason.startswith(f"cpu N={ComputeCheck.defaults('quick')['cpu_size']}: fp32 ")
    assert out.details["warmup_s"] == ComputeCheck.defaults("quick")["warmup_s"]
    assert all(r["iters"] >= 10 and r["warmup_s"] >= 0.2 for r in out.details["results"])
    assert set(out.details["skipped"]) == {"tf32", "fp16", "fp8"}
    assert all(r["error"] <= r["tolerance"] for r in out.details["results"])
    assert elapsed < 30  # about 1 s on a 2-core machine; generous for loaded CI runners


def test_headline_dtype_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = [torch.device("cpu")]
    assert compute.headline_dtype(["bf16", "fp32"], cpu) == "fp32"
    assert compute.headline_dtype(["bf16"], cpu) == "bf16"  # only what ran
    gpus = [torch.device("cuda", 0), torch.device("cuda", 1)]
    caps = {0: (9, 0), 1: (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: caps[torch.device(d).index])
    assert compute.headline_dtype(["fp32", "tf32", "fp16", "bf16", "fp8"], gpus) == "bf16"
    caps[1] = (7, 0)  # a V100 among them: no bf16 units
    assert compute.headline_dtype(["fp32", "tf32", "fp16", "bf16"], gpus) == "fp16"
    assert compute.headline_dtype(["tf32", "bf16"], gpus) == "tf32"


def test_check_on_cpu_with_only_gpu_dtypes_skips_as_needing_gpu() -> None:
    out = ComputeCheck().run(_ctx("quick", dtypes=["tf32", "fp8"]))
    assert out.status is Status.SKIP and out.needs_gpu
    assert "tf32" in out.reason and "fp8" in out.reason


def test_check_rejects_nothing_to_measure() -> None:
    out = ComputeCheck().run(_ctx("quick", per_gpu=False, concurrent=False))
    assert out.status is Status.ERROR


def test_fast_wrong_answer_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong_step(self: GemmWorkload) -> None:
        self._calls += 1
        self.c.fill_(float("nan"))  # fast and wrong

    monkeypatch.setattr(GemmWorkload, "step", wrong_step)
    out = ComputeCheck().run(_ctx("quick", dtypes=["fp32"]))
    assert out.status is Status.FAIL
    assert "wrong GEMM result" in out.reason and "cpu fp32" in out.reason
    assert out.metrics and out.metrics[0].name == "gemm_fp32_tflops"  # still reported
    assert out.details["results"][0]["error"] is None  # inf is not JSON
    json.dumps(out.details, allow_nan=False)


def test_cuda_requested_without_cuda_skips_with_reason() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = ComputeCheck().run(_ctx("quick", device="cuda"))
    assert out.status is Status.SKIP and out.needs_gpu and "CUDA" in out.reason


# --------------------------------------------------------------------------- SKU expectations (pure)


def test_metric_carries_sku_peak_and_threshold() -> None:
    sku = load_skus()["h100_sxm"]
    res = GemmResult("cuda:0", "bf16", 8192, iters=1, window_s=[gemm_flops(8192) / 700e12], error=0.0, ok=True)
    m = ComputeCheck._metric(res, {"cuda:0": sku})
    assert m.name == "gemm_bf16_tflops" and m.value == pytest.approx(700.0)
    assert m.expected == pytest.approx(989.4)
    assert m.threshold is not None and m.threshold.op == ">=" and m.threshold.source == "sku:h100_sxm"
    assert m.threshold.value == pytest.approx(989.4 * 0.6, rel=1e-4)
    assert m.threshold.met_by(m.value) and not m.threshold.met_by(500.0)
    conc = GemmResult("cuda:1", "fp8", 8192, iters=1, window_s=[1.0], error=0.0, ok=True, mode="concurrent")
    mc = ComputeCheck._metric(conc, {"cuda:1": sku})
    assert mc.name == "gemm_fp8_tflops_concurrent" and mc.tags["mode"] == "concurrent"
    assert mc.threshold is not None and mc.threshold.value == pytest.approx(1978.9 * 0.5, rel=1e-4)
    unknown = ComputeCheck._metric(res, {"cuda:0": None})
    assert unknown.expected is None and unknown.threshold is None


def test_reason_names_the_slowest_gpu_and_fraction_of_peak() -> None:
    sku = load_skus()["h100_sxm"]
    devices = [torch.device("cuda", i) for i in range(2)]
    t = gemm_flops(8192)
    single = [GemmResult("cuda:0", "bf16", 8192, 1, [t / 700e12], 0.0, True),
              GemmResult("cuda:1", "bf16", 8192, 1, [t / 612e12], 0.0, True)]
    conc = [GemmResult(f"cuda:{i}", "bf16", 8192, 1, [t / 600e12], 0.0, True, "concurrent") for i in range(2)]
    plan = compute._Plan(run=["bf16"], skipped={"fp8": "no"})
    reason = compute._reason(single, conc, {"cuda:0": sku, "cuda:1": sku}, plan, devices, "bf16")
    assert reason.startswith("bf16 612 TFLOP/s (62% of 989.4 peak) on 2 GPUs; min cuda:1")
    assert "concurrent bf16 min 600 TFLOP/s" in reason and "skipped fp8" in reason


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_check_quick_on_gpu() -> None:
    mm = torch.backends.cuda.matmul
    before = mm.fp32_precision
    out = ComputeCheck().run(_ctx("quick", device="cuda", size=4096))
    assert mm.fp32_precision == before
    assert out.status is Status.PASS, out.reason
    n = torch.cuda.device_count()
    single = [m for m in out.metrics if m.tags["mode"] == "single"]
    assert {m.device for m in single} == {f"cuda:{i}" for i in range(n)}
    by_dtype = {m.name: m for m in single}
    assert {"gemm_fp32_tflops", "gemm_tf32_tflops", "gemm_fp16_tflops", "gemm_bf16_tflops"} <= set(by_dtype)
    assert by_dtype["gemm_bf16_tflops"].value > by_dtype["gemm_fp32_tflops"].value  # tensor cores engaged
    if torch.cuda.get_device_capability(0) >= (8, 9):
        assert "gemm_fp8_tflops" in by_dtype
    else:
        assert "fp8" in out.details["skipped"]
    assert any(m.name.endswith("_concurrent") for m in out.metrics) == (n > 1)
    if out.details.get("sku", {}).get("cuda:0"):
        assert by_dtype["gemm_bf16_tflops"].expected and by_dtype["gemm_bf16_tflops"].threshold


@pytest.mark.gpu
def test_standard_profile_measures_sustained_windows_on_gpu() -> None:
    """Standard: seconds of warm-up and windows >= 0.5 s (N=8192 bf16 was ~30 ms windows before)."""
    p = ComputeCheck.defaults("standard")
    out = ComputeCheck().run(_ctx("standard", device="cuda", dtypes=["bf16"], concurrent=False))
    assert out.status is Status.PASS, out.reason
    assert "burst" not in out.reason
    for r in out.details["results"]:
        assert r["warmup_s"] >= p["warmup_s"], r
        assert r["median_window_s"] >= 0.9 * p["min_window_s"], r
        assert r["iters"] > p["iters"], r  # the probe, not the minimum, set the window


@pytest.mark.gpu
def test_fp8_and_tf32_gemm_verify_on_gpu() -> None:
    dev = torch.device("cuda", 0)
    with fp32_matmul_mode(True):
        tf32 = measure_gemm(dev, "tf32", 2048, warmup=1, iters=3, trials=2, buffers=2)
    with fp32_matmul_mode(False):
        fp32 = measure_gemm(dev, "fp32", 2048, warmup=1, iters=3, trials=2, buffers=2)
    assert tf32.ok and fp32.ok
    assert fp32.error < tf32.error  # TF32 really was used for the tf32 run and not for fp32
    if fp8_unsupported(dev, 2048) is None:
        fp8 = measure_gemm(dev, "fp8", 2048, warmup=1, iters=3, trials=2, buffers=2)
        assert fp8.ok, fp8.error
