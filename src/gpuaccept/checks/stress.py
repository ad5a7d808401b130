"""Sustained GEMM load on every device at once for a set time, watching for silent data corruption.

Each device multiplies the same seeded A and B over and over for ``duration_s``
seconds (one thread per GPU, all loaded together; on CPU the same loop with a
CPU GEMM). Every iteration's C is compared bitwise with the first one (a GEMM
of the same inputs on the same device and stream is deterministic, so any
difference is a wrong value), and the first one is checked against an fp64
reference on a ``ref_sample`` x ``ref_sample`` corner. Before the timed part the
loop warms the device up to a sustained rate, the rule of
:func:`~gpuaccept.checks.timing.warm_up_done`: at least ``warmup_s`` seconds, then
until two chunks' rates agree within ``stable_within``, at most ``warmup_max_s``
(its GEMMs are compared too). Only then do the timed windows of about ``window_s``
start: the throughput of the first windows is the device's own sustained start,
that of the last windows its end (without the warm-up the start would be the first
moments at boost clock, the end minutes later at the power cap, and a healthy GPU
would show a drop).

On GPUs a thread samples NVML every ``sample_s`` while the load runs, the
equivalent of ``nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw,
clocks_throttle_reasons.active --format=csv -lms 1000`` (see
:mod:`gpuaccept.hw.nvml_sampler`); on CPU those readings are unsupported and
the details say so. The closest reference commands are ``gpu-burn -d 300``
and ``dcgmi diag -r targeted_stress``.

Metrics per device: ``stress_tflops`` (median window, TFLOP/s; the performance figure: on a GPU of the SKU
table expected at the dtype's dense GEMM peak, bound ``stress`` pass fraction x peak, see
:func:`~gpuaccept.checks.sku_expect.stress_expectation`), ``stress_tflops_start`` and ``stress_tflops_end``
(parts of the drop, not judged on their own), ``stress_throughput_drop``
(fraction ``1 - end/start``, threshold ``<= max_drop``), ``stress_mismatches``
(iterations whose C differs from the first, default threshold ``max 0``),
``stress_ref_error`` (max relative error of the first C against fp64),
``stress_iterations``; on GPU also ``stress_throttle_fraction`` (fraction of
NVML samples with a throttle reason of
:data:`~gpuaccept.hw.nvml_sampler.THROTTLE_MASK` set, threshold ``<=
throttle_fraction``), ``stress_sm_clock_mhz`` (median), ``stress_temperature_c_max``
and ``stress_power_w_mean``.

Tests only: ``GPUACCEPT_TEST_STRESS_FAULT=DEVICE:ITER[,...]`` adds 1 to one
element of C on DEVICE (``cpu``, ``cuda:1``) at iteration ITER (0 is the first,
the one checked against fp64); ``DEVICE:slow`` makes DEVICE sleep four GEMM
times after each GEMM of the second half of the run (a throughput drop);
``DEVICE:boost`` makes DEVICE run at full speed for its first :data:`BOOST_S` seconds
of load and sleep nine times its mean loop iteration of that time after every GEMM
from then on, a tenth of the rate (a boost clock that falls to a lower sustained one).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import (
    Check,
    CheckContext,
    Outcome,
    Param,
    RequiredMetric,
    ThresholdRule,
    per_device,
    torch_devices_or_skip,
)
from gpuaccept.checks.compute import GEMM_TOLERANCE, fp32_matmul_mode, gemm_error, gemm_flops, torch_dtype
from gpuaccept.checks.sku_expect import stress_expectation
from gpuaccept.checks.timing import burst_note, synchronize, warm_up
from gpuaccept.errors import GpuacceptError
from gpuaccept.model import Metric, Status, Threshold

if TYPE_CHECKING:
    from gpuaccept.hw.sku import Sku

FAULT_ENV = "GPUACCEPT_TEST_STRESS_FAULT"
STRESS_DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16")
EDGE_WINDOWS = 3
"""Windows (at most; fewer in a short run) whose median is the start, and the end, throughput."""
MAX_TIMELINE = 120
"""NVML samples kept per GPU in the details (evenly thinned)."""
BOOST_S = 0.5
"""Tests only: seconds of load at full speed under the ``boost`` fault."""


@dataclass(frozen=True)
class Fault:
    """An injected fault for one device (tests): corrupt iteration ``iteration``, slow the second half, or
    fall from a boost after :data:`BOOST_S` seconds."""

    iteration: int | None = None
    slow: bool = False
    boost: bool = False


def parse_faults(env: Mapping[str, str]) -> dict[str, Fault]:
    """``GPUACCEPT_TEST_STRESS_FAULT=cpu:3,cuda:1:slow`` -> ``{"cpu": Fault(3), "cuda:1": Fault(slow=True)}``."""
    out: dict[str, Fault] = {}
    for item in env.get(FAULT_ENV, "").split(","):
        dev, _, what = item.strip().rpartition(":")
        if not dev:
            continue
        old = out.get(dev, Fault())
        if what == "slow":
            out[dev] = replace(old, slow=True)
        elif what == "boost":
            out[dev] = replace(old, boost=True)
        elif what.isdigit():
            out[dev] = replace(old, iteration=int(what))
    return out


def edge_rates(rates: list[float], edge: int = EDGE_WINDOWS) -> tuple[float, float]:
    """(start, end) throughput: the median of the first and of the last ``edge`` windows (fewer when
    there are fewer than ``2 * edge`` windows, at least one each), the very first window left out as a
    warm-up when there are at least three. NaN for no window. Pure."""
    if len(rates) >= 3:
        rates = rates[1:]
    if not rates:
        return math.nan, math.nan
    k = max(1, min(edge, len(rates) // 2))
    return statistics.median(rates[:k]), statistics.median(rates[-k:])


def throughput_drop(start: float, end: float) -> float:
    """``1 - end/start``, at least 0 (a device that speeds up has not dropped); NaN when unknown."""
    if not (math.isfinite(start) and math.isfinite(end)) or start <= 0:
        return math.nan
    return max(0.0, 1.0 - end / start)


@dataclass
class StressResult:
    """One device's run: window (seconds, GEMMs), mismatching iterations, the first C's fp64 error, and the
    warm-up before the windows (seconds, GEMMs, whether its rate settled)."""

    device: str
    dtype: str
    size: int
    windows: list[tuple[float, int]] = field(default_factory=list)
    warmup_s: float = 0.0
    warmup_calls: int = 0
    warmup_settled: bool = True
    mismatched: list[int] = field(default_factory=list)
    worst_elements: int = 0
    ref_error: float = math.nan
    iterations: int = 0

    def rates(self) -> list[float]:
        """TFLOP/s of each window."""
        f = gemm_flops(self.size)
        return [n * f / s / 1e12 for s, n in self.windows if s > 0]

    @property
    def median_tflops(self) -> float:
        r = self.rates()
        return statistics.median(r) if r else math.nan


def stress_device(device: Any, dtype: str, n: int, *, duration_s: float, window_s: float, ref_sample: int,
                  seed: int = 0, fault: Fault | None = None, warmup_s: float = 0.0, warmup_max_s: float = 0.0,
                  stable_within: float = 0.0, log: Callable[[str], None] | None = None) -> StressResult:
    """Warm ``device`` up to a sustained rate, then run the timed GEMM loop for ``duration_s`` (see the
    module doc) and return what it saw."""
    import torch

    fault = fault or Fault()
    res = StressResult(str(device), dtype, n)
    cuda = device.type == "cuda"
    dev_ctx: contextlib.AbstractContextManager[Any] = torch.cuda.device(device) if cuda else contextlib.nullcontext()
    stream_ctx: contextlib.AbstractContextManager[Any] = (torch.cuda.stream(torch.cuda.Stream(device)) if cuda
                                                           else contextlib.nullcontext())
    with dev_ctx, stream_ctx:
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(n, n, generator=gen).to(device, torch_dtype(dtype))
        b = torch.randn(n, n, generator=gen).to(device, torch_dtype(dtype))
        c = torch.empty_like(a)

        load_start = time.perf_counter()
        boost_starts: list[float] = []  # the boost fault's GEMM start times at full speed

        def gemm(it: int) -> None:
            t0 = time.perf_counter()
            torch.matmul(a, b, out=c)
            if fault.iteration == it:
                c.view(-1)[0] += 1
            if fault.boost:
                synchronize(device)
                if t0 - load_start <= BOOST_S or len(boost_starts) < 2:
                    boost_starts.append(t0)
                else:  # nine times the mean loop iteration at full speed: a tenth of the rate
                    time.sleep(9 * (boost_starts[-1] - boost_starts[0]) / (len(boost_starts) - 1))

        gemm(0)
        first = c.clone()
        synchronize(device)
        k = min(ref_sample, n)
        ref = a[:k].to("cpu", torch.float64) @ b[:, :k].to("cpu", torch.float64)
        res.ref_error = gemm_error(first[:k, :k], ref)
        it = 1
        warm_counts: list[Any] = []

        def warm_step() -> None:
            nonlocal it
            gemm(it)
            warm_counts.append(torch.ne(c, first).sum())
            it += 1

        warm = warm_up(warm_step, device, seconds=warmup_s, min_calls=1, max_seconds=warmup_max_s,
                       stable_within=stable_within)
        res.warmup_s, res.warmup_calls, res.warmup_settled = warm.seconds, warm.calls, warm.settled
        for j, bad in enumerate(torch.stack(warm_counts).tolist(), 1):
            if bad:
                res.mismatched.append(j)
                res.worst_elements = max(res.worst_elements, int(bad))
        per_gemm = warm.per_call_s
        start = time.perf_counter()
        deadline = start + duration_s
        half = start + duration_s / 2
        per_window = max(1, int(window_s / max(per_gemm, 1e-6)))
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0 or (res.windows and remaining < window_s / 2):
                break  # no stub window at the end: it would weigh on the end throughput
            counts = []
            w0 = time.perf_counter()
            for _ in range(per_window):
                gemm(it)
                counts.append(torch.ne(c, first).sum())
                it += 1
                now = time.perf_counter()
                if fault.slow and now > half:
                    synchronize(device)
                    time.sleep(4 * per_gemm)
                if not cuda and (now > deadline or now - w0 > 2 * window_s):
                    break  # a CPU slowed by other load: end the window (GPU launches are queued, so not there)
            synchronize(device)
            w1 = time.perf_counter()
            res.windows.append((w1 - w0, len(counts)))
            for j, bad in enumerate(torch.stack(counts).tolist()):
                if bad:
                    res.mismatched.append(it - len(counts) + j)
                    res.worst_elements = max(res.worst_elements, int(bad))
            # aim the next window at window_s from the rate just measured (clocks change under load), growing
            # at most 2x a window (one lucky fast window must not plan a long one), not far past the deadline
            rate = len(counts) / max(w1 - w0, 1e-9)
            if w1 <= half:
                per_gemm = 1 / rate  # the injected slow-down (tests) sleeps 4 GEMM times of the first half
            want = int(rate * min(window_s, max(deadline - w1, window_s / 2)))
            per_window = max(1, min(want, 2 * len(counts)))
        res.iterations = it
        if log:
            log(f"{device} {dtype} N={n}: warm-up {res.warmup_calls} GEMMs in {res.warmup_s:.3g} s"
                f"{'' if res.warmup_settled else ' (rate not settled)'}, {it} GEMMs in all, "
                f"{len(res.windows)} windows, "
                f"{res.median_tflops:.3g} TFLOP/s median, {len(res.mismatched)} mismatching, "
                f"fp64 error {res.ref_error:.2g}")
    return res


def _thin(values: list[Any], points: int) -> list[Any]:
    step = max(1, math.ceil(len(values) / points))
    return values[::step]


class StressCheck(Check):
    """Sustained GEMM on every device at once; fails on a wrong or changing result, throttling or a drop."""

    name = "stress"
    tag = "STRESS"
    summary = ("Sustained GEMM on every device for duration_s: each result compared with the first and fp64, "
               "NVML clocks/temperature/power/throttling sampled, throughput drop judged")
    key_metric = "stress_tflops"
    metrics = ("stress_tflops", "stress_tflops_start", "stress_tflops_end", "stress_throughput_drop",
               "stress_mismatches", "stress_ref_error", "stress_iterations", "stress_throttle_fraction",
               "stress_sm_clock_mhz", "stress_temperature_c_max", "stress_power_w_mean")
    profiles: ClassVar[tuple[str, ...]] = ("full", "burnin")
    params = (
        Param("duration_s", "float", 300.0, "seconds of load on each device", minimum=5.0, maximum=86400.0),
        Param("dtype", "str", "bf16", "GEMM dtype on GPU", choices=STRESS_DTYPES),
        Param("cpu_dtype", "str", "fp32", "GEMM dtype on CPU", choices=("fp64", "fp32", "bf16")),
        Param("size", "int", 8192, "matrix dimension N on GPU", minimum=16, maximum=65536),
        Param("cpu_size", "int", 256, "matrix dimension N on CPU", minimum=16, maximum=8192),
        Param("warmup_s", "float", 10.0, "untimed load before the timed windows, seconds at least (clocks leave "
              "boost and settle where power and heat hold them)", minimum=0.0, maximum=3600.0),
        Param("warmup_max_s", "float", 30.0, "longest warm-up while waiting for a stable rate, seconds",
              minimum=0.0, maximum=3600.0),
        Param("stable_within", "float", 0.05, "warm-up ends once two chunks' rates agree within this fraction "
              "(0: after warmup_s, whatever the rate)", minimum=0.0, maximum=1.0),
        Param("window_s", "float", 1.0, "length of a timed window in seconds", minimum=0.05, maximum=600.0),
        Param("max_drop", "float", 0.1, "fail when the end throughput is more than this fraction below the start",
              minimum=0.0, maximum=1.0),
        Param("throttle_fraction", "float", 0.5, "fail when more than this fraction of the NVML samples show a "
              "throttle reason (HW slowdown, SW/HW thermal, HW power brake)", minimum=0.0, maximum=1.0),
        Param("sample_s", "float", 1.0, "seconds between NVML samples", minimum=0.05, maximum=60.0),
        Param("ref_sample", "int", 64, "rows and columns of the first result checked against fp64", minimum=1,
              maximum=1024),
        Param("seed", "int", 0, "seed of A and B", minimum=0, maximum=(1 << 32) - 1),
        Param("cpu_threads", "int", 0, "CPU only: torch threads for the GEMMs (0: torch's default, every core)",
              minimum=0, maximum=4096),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"duration_s": 30.0, "warmup_s": 5.0, "warmup_max_s": 15.0},
        "burnin": {"duration_s": 300.0},
    }
    thresholds = (ThresholdRule("stress_mismatches", max=0),)
    timeout_s: ClassVar[dict[str, float]] = {"full": 600.0, "burnin": 1800.0}

    @classmethod
    def timeout_for(cls, profile: str, params: dict[str, Any]) -> float:
        """The profile's timeout, or the longest warm-up and ``duration_s`` plus 50 % and 5 minutes of set-up
        when that is longer."""
        load = float(params["duration_s"]) + max(float(params.get("warmup_s", 0.0)),
                                                 float(params.get("warmup_max_s", 0.0)))
        return max(super().timeout_for(profile, params), 1.5 * load + 300.0)

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """Throughput, its drop, the mismatch count and the fp64 error on every device; the throttle fraction
        is optional (NVML may be missing)."""
        return per_device(devices, "stress_tflops", "stress_throughput_drop", "stress_mismatches",
                          "stress_ref_error")

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.stress(params, device, gpus)

    @classmethod
    def budget_stretch(cls, params: dict[str, Any]) -> tuple[str, float] | None:
        return "duration_s", max(10.0, 2 * float(params["window_s"]))

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        import torch

        p = ctx.params
        on_gpu = devices[0].type == "cuda"
        dtype = str(p["dtype"] if on_gpu else p["cpu_dtype"])
        n = int(p["size"] if on_gpu else p["cpu_size"])
        duration_s, window_s = float(p["duration_s"]), float(p["window_s"])
        if 2 * window_s > duration_s:
            return Outcome(Status.ERROR, f"window_s={window_s:g} needs duration_s >= {2 * window_s:g} "
                                         f"(a start and an end window), got {duration_s:g}")
        faults = parse_faults(os.environ)
        warmup_s, warmup_max_s = float(p["warmup_s"]), float(p["warmup_max_s"])
        details: dict[str, Any] = {"dtype": dtype, "size": n, "duration_s": duration_s, "window_s": window_s,
                                   "warmup_s": warmup_s, "warmup_max_s": warmup_max_s,
                                   "stable_within": float(p["stable_within"]),
                                   "compare": "every iteration bitwise against the first; the first against "
                                              f"fp64 on a {min(int(p['ref_sample']), n)}-square corner"}
        burst = burst_note(warmup_s, window_s)
        if burst is not None:  # the start windows may be a boost clock: the drop is against a burst
            details["warmup_note"] = burst
        sampler = None
        if on_gpu:
            from gpuaccept.hw.nvml_sampler import NvmlSampler

            sampler = NvmlSampler(ctx.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), float(p["sample_s"]))
            try:
                sampler.start()
            except GpuacceptError as exc:
                details["telemetry"] = f"unsupported: {exc}"
                sampler = None
        else:
            details["telemetry"] = "unsupported on CPU: no NVML clocks, temperature, power or throttle reasons"

        def one(dev: Any) -> StressResult:
            return stress_device(dev, dtype, n, duration_s=duration_s, window_s=window_s,
                                 ref_sample=int(p["ref_sample"]), seed=int(p["seed"]),
                                 fault=faults.get(str(dev)), warmup_s=warmup_s, warmup_max_s=warmup_max_s,
                                 stable_within=float(p["stable_within"]), log=ctx.log)

        old_threads = torch.get_num_threads()
        if not on_gpu and int(p["cpu_threads"]) > 0:
            torch.set_num_threads(int(p["cpu_threads"]))
            details["cpu_threads"] = int(p["cpu_threads"])
        try:
            with fp32_matmul_mode(dtype == "tf32"):
                with ThreadPoolExecutor(max_workers=len(devices)) as pool:
                    results = list(pool.map(one, devices))
        except torch.cuda.OutOfMemoryError as exc:
            return Outcome(Status.ERROR, f"out of memory at size {n}; lower 'size' ({str(exc).splitlines()[0]})")
        finally:
            samples = sampler.stop() if sampler is not None else {}
            torch.set_num_threads(old_threads)
        skus = _skus_of(devices) if on_gpu else {}
        if skus:
            details["sku"] = {d: s.id if s else None for d, s in skus.items()}
        return self._outcome(results, samples, p, details, skus)

    @staticmethod
    def _outcome(results: list[StressResult], samples: Mapping[str, list[Any]], p: Mapping[str, Any],
                 details: dict[str, Any], skus: Mapping[str, Sku | None] | None = None) -> Outcome:
        """The outcome of ``results``; ``skus`` (by device, GPUs only) give ``stress_tflops`` its expectation
        (:func:`~gpuaccept.checks.sku_expect.stress_expectation`)."""
        from gpuaccept.hw.nvml_sampler import summarize

        max_drop, max_throttle = float(p["max_drop"]), float(p["throttle_fraction"])
        metrics: list[Metric] = []
        problems: list[str] = []
        per: dict[str, Any] = {}
        for r in results:
            tags: dict[str, str | int | float] = {"dtype": r.dtype, "size": r.size}
            start, end = edge_rates(r.rates())
            drop = throughput_drop(start, end)
            tol = GEMM_TOLERANCE[r.dtype]
            metrics += [
                _rate(r, (skus or {}).get(r.device), tags),
                Metric("stress_tflops_start", start, "TFLOP/s", r.device, tags=dict(tags)),
                Metric("stress_tflops_end", end, "TFLOP/s", r.device, tags=dict(tags)),
                Metric("stress_throughput_drop", drop, "fraction", r.device, tags=dict(tags),
                       threshold=Threshold("<=", max_drop, Status.FAIL, "param:max_drop")),
                Metric("stress_mismatches", float(len(r.mismatched)), "count", r.device, tags=dict(tags)),
                Metric("stress_ref_error", r.ref_error, "fraction", r.device, tags=dict(tags),
                       threshold=Threshold("<=", tol, Status.FAIL, f"tolerance:{r.dtype}")),
                Metric("stress_iterations", float(r.iterations), "count", r.device, tags=dict(tags)),
            ]
            info: dict[str, Any] = {"windows": len(r.windows), "iterations": r.iterations,
                                    "warmup": {"seconds": round(r.warmup_s, 3), "gemms": r.warmup_calls,
                                               "settled": r.warmup_settled},
                                    "window_tflops": [round(x, 4) for x in _thin(r.rates(), MAX_TIMELINE)]}
            if not (r.ref_error <= tol):
                problems.append(f"{r.device}: the first result differs from the fp64 reference "
                                f"(error {r.ref_error:.3g} > {tol:g})")
            if r.mismatched:
                info["mismatched_iterations"] = r.mismatched[:20]
                problems.append(f"{r.device}: {len(r.mismatched)} of {r.iterations} iterations differ from the "
                                f"first result (first at iteration {r.mismatched[0]}, up to {r.worst_elements} "
                                "elements): silent data corruption")
            if drop > max_drop:
                unsettled = ("" if r.warmup_settled else
                             f", its rate still moving after the {r.warmup_s:.3g} s warm-up")
                problems.append(f"{r.device}: throughput fell {drop:.0%} from its sustained start ({start:.3g} -> "
                                f"{end:.3g} TFLOP/s; max_drop {max_drop:g}{unsettled})")
            gpu_samples = samples.get(r.device)
            if gpu_samples:
                s = summarize(gpu_samples)
                info["telemetry"] = s.to_dict()
                info["timeline"] = [vars(x) for x in _thin(gpu_samples, MAX_TIMELINE)]
                if s.throttle_fraction is not None:
                    metrics.append(Metric("stress_throttle_fraction", s.throttle_fraction, "fraction", r.device,
                                          tags=dict(tags), threshold=Threshold("<=", max_throttle, Status.FAIL,
                                                                               "param:throttle_fraction")))
                    if s.throttle_fraction > max_throttle:
                        problems.append(f"{r.device}: throttled in {s.throttle_fraction:.0%} of the samples "
                                        f"({', '.join(s.throttle_reasons)}; throttle_fraction {max_throttle:g})")
                for name, value, unit in (("stress_sm_clock_mhz", s.sm_clock_mhz_median, "MHz"),
                                          ("stress_temperature_c_max", s.temperature_c_max, "C"),
                                          ("stress_power_w_mean", s.power_w_mean, "W")):
                    if value is not None:
                        metrics.append(Metric(name, float(value), unit, r.device, tags=dict(tags)))
            elif r.device.startswith("cuda"):
                info["telemetry"] = details.get("telemetry", "no NVML sample for this GPU")
            per[r.device] = info
        details["devices"] = per
        if problems:
            shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
            return Outcome.failed(shown, metrics, **details)
        low = min(results, key=lambda r: r.median_tflops)
        worst = max(throughput_drop(*edge_rates(r.rates())) for r in results)
        return Outcome.passed(
            f"{len(results)} device(s), {details['duration_s']:g} s {low.dtype} N={low.size}: "
            f"{sum(r.iterations for r in results)} GEMMs, all equal to the first and to fp64; "
            f"min {low.median_tflops:.3g} TFLOP/s ({low.device}), largest drop {worst:.0%}", metrics, **details)


def _rate(r: StressResult, sku: Sku | None, tags: dict[str, str | int | float]) -> Metric:
    """``stress_tflops``, the performance figure (start and end are parts of the judged drop), with the SKU's
    expectation where the table has the dtype's peak."""
    m = Metric("stress_tflops", r.median_tflops, "TFLOP/s", r.device, tags=dict(tags), performance=True)
    exp = stress_expectation(sku, r.dtype)
    return exp.apply(m) if exp is not None else m


def _skus_of(devices: list[Any]) -> dict[str, Sku | None]:
    """SKU (or None) per ``cuda:i`` device, from the name torch reports."""
    import torch

    from gpuaccept.hw.sku import match_sku

    return {str(d): match_sku(torch.cuda.get_device_name(d)) for d in devices}


CHECKS = (StressCheck,)
