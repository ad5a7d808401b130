"""The stress check on CPU for real (short durations), its injected faults, the NVML sampler on a fake NVML,
and the burnin profile."""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuaccept.checks import registry
from gpuaccept.checks.base import PROFILES, SUITE_PROFILES, CheckContext, Outcome
from gpuaccept.checks.stress import (
    BOOST_S,
    FAULT_ENV,
    Fault,
    StressCheck,
    edge_rates,
    parse_faults,
    throughput_drop,
)
from gpuaccept.hw.nvml_sampler import THROTTLE_MASK, NvmlSampler, Sample, read_sample, summarize
from gpuaccept.model import Status
from gpuaccept.node.config import Config
from gpuaccept.node.judge import judge
from gpuaccept.node.suite import RunOptions, plan_suite
from tests.conftest import cuda_available
from tests.helpers import gpuaccept

LONG = ("stress", "agreement", "throughput", "disk")


def params(**over: Any) -> dict[str, Any]:
    # one thread: the CPU GEMM loop is steadier on a shared machine; drop judged loosely (other load)
    return {**StressCheck.defaults("full"), "duration_s": 1.5, "window_s": 0.15, "cpu_threads": 1,
            "max_drop": 0.95, "warmup_s": 0.2, "warmup_max_s": 0.4, "stable_within": 0.1, **over}


def run(monkeypatch: pytest.MonkeyPatch, fault: str = "", **over: Any) -> Outcome:
    if fault:
        monkeypatch.setenv(FAULT_ENV, fault)
    else:
        monkeypatch.delenv(FAULT_ENV, raising=False)
    return StressCheck().run(CheckContext(device="cpu", params=params(**over)))


def test_cpu_run_passes_with_every_declared_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(monkeypatch)
    assert out.status is Status.PASS, out.reason
    m = {x.name: x for x in out.metrics}
    assert {r.metric for r in StressCheck.required_metrics(params(), ["cpu"])} <= set(m)
    assert m["stress_tflops"].unit == "TFLOP/s" and m["stress_tflops"].value > 0
    assert m["stress_mismatches"].value == 0 and m["stress_iterations"].value > 10
    assert m["stress_ref_error"].value <= 2e-4
    assert m["stress_throughput_drop"].unit == "fraction"
    assert "stress_throttle_fraction" not in m  # no NVML on CPU: unsupported, said in the details
    assert "unsupported on CPU" in out.details["telemetry"]
    assert judge(out, StressCheck.thresholds).status is Status.PASS


def test_one_corrupted_iteration_fails_and_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(monkeypatch, "cpu:7")
    assert out.status is Status.FAIL
    assert "1 of" in out.reason and "iteration 7" in out.reason and "silent data corruption" in out.reason
    assert out.details["devices"]["cpu"]["mismatched_iterations"] == [7]
    m = {x.name: x for x in out.metrics}
    assert m["stress_mismatches"].value == 1
    assert "stress_mismatches on cpu 1 > 0" in judge(out, StressCheck.thresholds).reason


def test_a_wrong_first_result_fails_against_fp64(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(monkeypatch, "cpu:0")
    assert out.status is Status.FAIL
    assert "differs from the fp64 reference" in out.reason
    m = {x.name: x for x in out.metrics}
    assert m["stress_ref_error"].value > 2e-4  # and every later (correct) iteration differs from it
    assert m["stress_mismatches"].value == m["stress_iterations"].value - 1


def test_a_throughput_drop_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(monkeypatch, "cpu:slow", duration_s=2.0, max_drop=0.3)
    assert out.status is Status.FAIL, out.reason
    drop = next(x for x in out.metrics if x.name == "stress_throughput_drop")
    assert drop.value > 0.3 and "throughput fell" in out.reason
    assert drop.threshold is not None and drop.threshold.value == 0.3


def test_a_fall_from_boost_is_a_drop_without_warm_up_and_none_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device runs fast for its first BOOST_S seconds, then at a tenth of that (a boost clock, then the power
    cap). Timed from the first GEMM, that is a drop; warmed up past it, start and end are both the sustained rate."""
    cold = run(monkeypatch, "cpu:boost", duration_s=2.0, window_s=0.05, max_drop=0.5, warmup_s=0.0,
               warmup_max_s=0.0, stable_within=0.0)
    assert cold.status is Status.FAIL and "throughput fell" in cold.reason, cold.reason
    assert "burst throughput" in cold.details["warmup_note"]
    warm = run(monkeypatch, "cpu:boost", duration_s=2.0, window_s=0.05, max_drop=0.5, warmup_s=BOOST_S + 0.3,
               warmup_max_s=2.0)
    assert warm.status is Status.PASS, warm.reason
    info = warm.details["devices"]["cpu"]["warmup"]
    assert info["seconds"] >= BOOST_S + 0.3 and info["gemms"] > 1
    start = {m.name: m.value for m in cold.metrics}["stress_tflops_start"]
    sustained = {m.name: m.value for m in warm.metrics}["stress_tflops_start"]
    assert sustained < start / 3, "after the warm-up the start windows run at the sustained rate"


def test_a_warm_up_whose_rate_never_settles_stops_at_its_limit_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(monkeypatch, warmup_s=0.1, warmup_max_s=0.3, stable_within=1e-9)
    info = out.details["devices"]["cpu"]["warmup"]
    assert info["settled"] is False and 0.3 <= info["seconds"] < 1.5
    assert out.status is Status.PASS and out.details["stable_within"] == 1e-9


def test_window_longer_than_half_the_run_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(monkeypatch, duration_s=1.0, window_s=0.8)
    assert out.status is Status.ERROR and "window_s" in out.reason


def test_pure_helpers() -> None:
    assert parse_faults({FAULT_ENV: "cpu:3, cuda:1:slow,cuda:1:9,junk,cpu:boost"}) == {
        "cpu": Fault(3, boost=True), "cuda:1": Fault(9, True)}
    assert parse_faults({}) == {}
    assert edge_rates([1.0, 10.0, 10.0, 10.0, 10.0, 10.0, 5.0, 5.0, 5.0]) == (10.0, 5.0)  # first is warm-up
    assert edge_rates([4.0, 2.0]) == (4.0, 2.0)
    assert all(math.isnan(x) for x in edge_rates([]))
    assert throughput_drop(10.0, 7.0) == pytest.approx(0.3)
    assert throughput_drop(10.0, 12.0) == 0.0
    assert math.isnan(throughput_drop(0.0, 1.0))


def test_timeout_follows_the_duration() -> None:
    assert StressCheck.timeout_for("burnin", {"duration_s": 300.0}) == 1800.0
    assert StressCheck.timeout_for("burnin", {"duration_s": 7200.0}) == 1.5 * 7200 + 300
    assert StressCheck.timeout_for("burnin", {"duration_s": 7200.0, "warmup_s": 10.0, "warmup_max_s": 60.0}) == \
        1.5 * 7260 + 300


# ----------------------------------------------------------------- NVML sampler on a fake NVML


def fake_nvml(reasons: list[int]) -> types.ModuleType:
    m = types.ModuleType("fake_pynvml")
    m.NVMLError = pynvml.NVMLError  # type: ignore[attr-defined]
    m.NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU  # type: ignore[attr-defined]
    calls = {"n": 0, "shutdown": 0}

    def reason(handle: int) -> int:
        calls["n"] += 1
        return reasons[min(calls["n"] - 1, len(reasons) - 1)]

    def unsupported(*_: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByUUID = lambda u: int(u[-1])  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: f"GPU-0000000{h}"  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:1{h}:00.0".encode())  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = lambda h, which: 1980 - 100 * h  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda h, which: 60 + h  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = unsupported  # type: ignore[attr-defined]
    m.nvmlDeviceGetCurrentClocksEventReasons = reason  # type: ignore[attr-defined]
    m.calls = calls  # type: ignore[attr-defined]
    return m


def test_read_sample_keeps_unsupported_readings_as_none() -> None:
    s = read_sample(fake_nvml([0x4]), 1, 0.5)
    assert s == Sample(0.5, 1880, 61, None, 0x4)


def test_sampler_thread_samples_the_selected_gpus() -> None:
    nvml = fake_nvml([0x0, 0x0, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40])
    sampler = NvmlSampler([1], None, interval_s=0.01, nvml=nvml)
    sampler.start()
    import time

    time.sleep(0.15)
    samples = sampler.stop()
    assert list(samples) == ["cuda:1"] and len(samples["cuda:1"]) >= 3
    assert samples["cuda:1"][0].sm_clock_mhz == 1880 and samples["cuda:1"][0].power_w is None
    assert nvml.calls["shutdown"] == 1  # type: ignore[attr-defined]


def test_summary_counts_only_throttling_reasons() -> None:
    samples = [Sample(float(i), 1900 - i, 70 + i, 600.0, r) for i, r in
               enumerate([0x4, 0x4, 0x4 | 0x40, 0x8, 0x1, None])]  # power cap alone is not throttling
    s = summarize(samples)
    assert s.samples == 6 and s.throttle_fraction == pytest.approx(2 / 5)
    assert s.throttle_reasons == ["hw_slowdown", "hw_thermal"]
    assert s.sm_clock_mhz_min == 1895 and s.sm_clock_mhz_max == 1900 and s.temperature_c_max == 75
    assert s.power_w_mean == 600.0
    assert summarize([]).throttle_fraction is None
    assert THROTTLE_MASK & 0x4 == 0


def test_sustained_throttling_fails_in_the_outcome() -> None:
    from gpuaccept.checks.stress import StressResult

    r = StressResult("cuda:0", "bf16", 1024, windows=[(1.0, 100)] * 6, ref_error=0.0, iterations=600)
    throttled = [Sample(float(i), 1400, 88, 690.0, 0x40) for i in range(8)] + [Sample(8.0, 1900, 80, 700.0, 0)]
    out = StressCheck._outcome([r], {"cuda:0": throttled}, params(), {"duration_s": 6.0})
    assert out.status is Status.FAIL and "throttled in 89% of the samples (hw_thermal" in out.reason
    m = {x.name: x for x in out.metrics}
    assert m["stress_throttle_fraction"].value == pytest.approx(8 / 9)
    assert m["stress_sm_clock_mhz"].unit == "MHz" and m["stress_temperature_c_max"].value == 88
    assert len(out.details["devices"]["cuda:0"]["timeline"]) == 9
    calm = [Sample(float(i), 1900, 70, 650.0, 0x4) for i in range(9)]
    assert StressCheck._outcome([r], {"cuda:0": calm}, params(), {"duration_s": 6.0}).status is Status.PASS


# ----------------------------------------------------------------- profiles


def test_burnin_profile_holds_the_long_checks_and_quick_standard_do_not() -> None:
    reg = registry()
    assert "burnin" in PROFILES and "burnin" not in SUITE_PROFILES
    for name in LONG:
        assert reg[name].profiles == ("full", "burnin"), name
    burnin = [c.name for c in plan_suite(RunOptions(profile="burnin"), Config(), reg, "cpu").checks]
    # reference_train is in burnin too, and its short form in standard (issue 31); so is the rdma check (issue 30)
    assert burnin == ["env", "conformance", "health", "stress", "agreement", "reference_train", "throughput", "disk",
                      "rdma", "reference_train_ddp"]
    assert reg["rdma"].profiles == ("standard", "full", "burnin")
    assert reg["reference_train"].profiles == ("standard", "full", "burnin")
    for profile in ("quick", "standard"):
        names = {c.name for c in plan_suite(RunOptions(profile=profile), Config(), reg, "cpu").checks}
        assert not names & set(LONG), profile
    full = plan_suite(RunOptions(profile="full"), Config(), reg, "cpu")
    by_name = {c.name: c for c in full.checks}
    assert set(LONG) <= set(by_name)
    assert by_name["stress"].params["duration_s"] == 30.0
    assert StressCheck.defaults("burnin")["duration_s"] == 300.0


def test_every_long_check_declares_valid_defaults_and_required_metrics() -> None:
    reg = registry()
    for name in LONG:
        cls = reg[name]
        for profile in cls.profiles:
            values = cls.defaults(profile)
            for p in cls.params:
                assert p.coerce(values[p.name], "test", p.name) == values[p.name], (name, p.name)
            assert cls.timeout_for(profile, values) > 0
            assert cls.required_metrics(values, ["cpu"]), name


def test_duration_below_the_minimum_is_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  stress:\n    params: {duration_s: 1}\n")
    r = gpuaccept("run", "--profile", "burnin", "--device", "cpu", "--config", str(cfg), "--plan")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"gpuaccept: error: {cfg}: checks.stress.params.duration_s: 1.0 is below the "
                                "minimum 5")


def test_burnin_is_a_profile_choice_of_the_cli() -> None:
    r = gpuaccept("run", "--profile", "burnin", "--device", "cpu", "--plan")
    assert r.returncode == 0, r.stderr
    assert '"profile": "burnin"' in r.stdout and '"name": "stress"' in r.stdout
    assert gpuaccept("run", "--profile", "nope", "--plan").returncode == 2


@pytest.mark.gpu
def test_gpu_stress_samples_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cuda_available()
    monkeypatch.delenv(FAULT_ENV, raising=False)
    p = {**StressCheck.defaults("full"), "duration_s": 6.0, "size": 2048, "window_s": 0.5}
    out = StressCheck().run(CheckContext(device="cuda", params=p))
    assert out.status is Status.PASS, out.reason
    m = {(x.name, x.device) for x in out.metrics}
    assert ("stress_tflops", "cuda:0") in m
    assert ("stress_throttle_fraction", "cuda:0") in m or "unsupported" in str(out.details)


@pytest.mark.gpu
def test_gpu_stress_corruption_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "cuda:0:5")
    p = {**StressCheck.defaults("full"), "duration_s": 5.0, "size": 2048, "window_s": 0.5}
    out = StressCheck().run(CheckContext(device="cuda", params=p))
    assert out.status is Status.FAIL and "cuda:0: 1 of" in out.reason


@pytest.mark.gpu
def test_gpu_sustained_start_shows_no_drop_on_a_healthy_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the default size and dtype a healthy GPU falls from boost to its power cap during the warm-up, so the
    timed windows start and end at the same sustained rate: within the default max_drop of 10 %."""
    assert cuda_available()
    monkeypatch.delenv(FAULT_ENV, raising=False)
    p = {**StressCheck.defaults("full"), "duration_s": 20.0}
    out = StressCheck().run(CheckContext(device="cuda", params=p))
    drops = {x.device: x.value for x in out.metrics if x.name == "stress_throughput_drop"}
    assert drops and all(d <= 0.1 for d in drops.values()), (drops, out.reason)
    assert all(d["warmup"]["seconds"] >= 5.0 for d in out.details["devices"].values())
