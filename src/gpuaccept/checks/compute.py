"""GEMM throughput per dtype on each GPU alone and on all GPUs at once.

Reference commands: the CUDA sample ``matrixMulCUBLAS``, or
``dcgmproftester12 --no-dcgm-validation -t 1004 -d 30`` (tensor-core GEMM load).
The throughput is ``2*N^3`` flops per GEMM over the median of timed windows
(CUDA events on GPU, ``time.perf_counter`` on CPU), each window running GEMMs
cycled over ``buffers`` seeded random A/B pairs. Each dtype first runs untimed
for ``warmup_s`` seconds and then until its rate is stable (the last two warm-up
chunks within ``stable_within``, 10 %, of each other; at most ``warmup_max_s``
in all, after which ``warmup_settled`` is false in the details: the rule is
:func:`~gpuaccept.checks.timing.warm_up_done`); a timed probe at its end sets the GEMMs per window so
that each window lasts at least ``min_window_s`` (and ``iters`` GEMMs). The
standard and full profiles measure sustained throughput (seconds of warm-up,
windows >= 0.5 s), so a GPU that throttles under load reads low; quick
measures a burst and says so. Every measured GEMM result is checked against an
fp64 CPU reference on a sample of its entries, so a fast wrong answer fails.

The device-agnostic timing helpers live in :mod:`gpuaccept.checks.timing`
(re-exported here). torch is imported inside functions only.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import (
    Check,
    CheckContext,
    MemoryNeed,
    Outcome,
    Param,
    RequiredMetric,
    per_device,
    torch_devices_or_skip,
)
from gpuaccept.checks.timing import (
    burst_note,
    finite_or_none,
    median,
    synchronize,
    time_windows,
    warm_up,
    window_iters,
)
from gpuaccept.model import Metric, Status, Threshold

if TYPE_CHECKING:
    import torch

    from gpuaccept.hw.sku import Sku

GEMM_DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")
GEMM_BYTES = {"fp64": (8, 8), "fp32": (4, 4), "tf32": (4, 4), "fp16": (2, 2), "bf16": (2, 2), "fp8": (1, 2)}
"""Bytes per element of A/B and of C for each GEMM dtype (fp8 writes bf16)."""
CPU_DTYPES = ("fp64", "fp32", "bf16")  # tf32 and fp8 are GPU modes; CPU fp16 GEMM is not a meaningful test
FP8_MIN_CAPABILITY = (8, 9)
FP8_E4M3_MAX = 448.0
VERIFY_SAMPLE = 64  # rows and columns of each checked result compared with the fp64 reference

# Largest allowed max|C - ref| / rms(ref) over the verified sample, per dtype. The output's rounding
# dominates (bf16 ~2^-8 relative, times ~4 for the largest of 4096 normal entries); fp32 is kept far
# below what a TF32 computation gives (~1e-3) so TF32 passed off as fp32 is caught.
GEMM_TOLERANCE = {"fp64": 1e-10, "fp32": 2e-4, "tf32": 2e-2, "fp16": 1e-2, "bf16": 5e-2, "fp8": 5e-2}

__all__ = ["finite_or_none", "median", "synchronize", "time_windows"]  # timing helpers, re-exported for callers


@contextlib.contextmanager
def fp32_matmul_mode(tf32: bool) -> Iterator[None]:
    """Allow (or forbid) TF32 for CUDA fp32 matmuls inside the block, then restore the setting.

    Uses ``torch.backends.cuda.matmul.fp32_precision`` where torch has it (2.9+;
    mixing it with the legacy flag raises there), else ``allow_tf32``.
    """
    import torch

    mm = torch.backends.cuda.matmul
    if hasattr(mm, "fp32_precision"):
        old_precision = mm.fp32_precision
        mm.fp32_precision = "tf32" if tf32 else "ieee"
        try:
            yield
        finally:
            mm.fp32_precision = old_precision
    else:  # pragma: no cover - torch < 2.9
        old_allow = mm.allow_tf32
        mm.allow_tf32 = tf32
        try:
            yield
        finally:
            mm.allow_tf32 = old_allow


# --------------------------------------------------------------------------- GEMM


def gemm_flops(n: int) -> float:
    """Floating-point operations of one N x N x N GEMM: 2*N^3 (multiply and add)."""
    return 2.0 * float(n) ** 3


def gemm_error(result: torch.Tensor, reference: torch.Tensor) -> float:
    """max|result - reference| / rms(reference), in fp64; inf when the result has NaN/inf or shapes differ."""
    import torch

    if result.shape != reference.shape:
        return math.inf
    res = result.detach().to("cpu", torch.float64)
    ref = reference.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(res).all()):
        return math.inf
    scale = float(ref.square().mean().sqrt())
    err = float((res - ref).abs().max())
    if scale == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / scale


def gemm_ok(error: float, dtype: str) -> bool:
    """Whether a :func:`gemm_error` value is within the tolerance for ``dtype``."""
    return error <= GEMM_TOLERANCE[dtype]


def torch_dtype(name: str) -> torch.dtype:
    """The storage dtype of the GEMM inputs for a dtype name (tf32 is stored as fp32)."""
    import torch

    table = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
             "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
    return table[name]


def fp8_unsupported(device: torch.device, size: int) -> str | None:
    """Why fp8 GEMM cannot run on ``device`` at ``size`` (None when it can)."""
    import torch

    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8 / _scaled_mm"
    if size % 16:
        return f"fp8 GEMM needs a size divisible by 16, got {size}"
    if device.type == "cuda":
        cc = torch.cuda.get_device_capability(device)
        if cc < FP8_MIN_CAPABILITY:
            return f"fp8 needs compute capability >= 8.9, {device} is {cc[0]}.{cc[1]}"
    return None


class GemmWorkload:
    """``buffers`` seeded random A/B pairs of one dtype on one device, and one output C.

    :meth:`step` runs the next GEMM (cycling the pairs); :meth:`verify` checks
    the latest C against an fp64 CPU reference on sampled rows and columns.
    fp8 uses ``torch._scaled_mm`` with per-tensor scales, bf16 output and fast
    accumulation; tf32 is fp32 storage computed under :func:`fp32_matmul_mode`.
    """

    def __init__(self, device: torch.device, dtype: str, n: int, buffers: int, seed: int = 0) -> None:
        import torch

        self.device, self.dtype, self.n = device, dtype, n
        self._calls = 0
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        self.a: list[torch.Tensor] = []
        self.b: list[torch.Tensor] = []  # fp8: column-major views, as _scaled_mm wants
        self.scale_a: list[torch.Tensor] = []
        self.scale_b: list[torch.Tensor] = []
        for _ in range(max(1, buffers)):
            a = torch.randn(n, n, device=device, generator=gen, dtype=torch.float32)
            b = torch.randn(n, n, device=device, generator=gen, dtype=torch.float32)
            if dtype == "fp8":
                sa, sb = a.abs().max() / FP8_E4M3_MAX, b.abs().max() / FP8_E4M3_MAX
                self.a.append((a / sa).to(torch.float8_e4m3fn))
                self.b.append((b / sb).to(torch.float8_e4m3fn).t())  # (K, N) column-major, as _scaled_mm wants
                self.scale_a.append(sa.float().reshape(()))
                self.scale_b.append(sb.float().reshape(()))
            else:
                self.a.append(a.to(torch_dtype(dtype)))
                self.b.append(b.to(torch_dtype(dtype)))
            del a, b
        out_dtype = torch.bfloat16 if dtype == "fp8" else torch_dtype(dtype)
        self.c = torch.empty(n, n, device=device, dtype=out_dtype)
        self._verify_gen = torch.Generator().manual_seed(seed + 7919)

    @property
    def last_pair(self) -> int:
        """Index of the A/B pair behind the current C."""
        return (self._calls - 1) % len(self.a)

    def step(self) -> None:
        """One GEMM into C on the next A/B pair."""
        import torch

        i = self._calls % len(self.a)
        self._calls += 1
        if self.dtype == "fp8":
            out = torch._scaled_mm(self.a[i], self.b[i], self.scale_a[i], self.scale_b[i],
                                   out_dtype=torch.bfloat16, use_fast_accum=True)
            self.c = out[0] if isinstance(out, tuple) else out  # torch < 2.5 returned (out, amax)
        else:
            torch.matmul(self.a[i], self.b[i], out=self.c)

    def reference_sample(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """fp64 CPU value of C[rows][:, cols] for the last pair, from the exact (rounded) inputs."""
        import torch

        i = self.last_pair
        rows, cols = rows.to(self.device), cols.to(self.device)
        if self.dtype == "fp8":  # gather the raw bytes: indexing kernels need not support float8
            fp8 = self.a[i].dtype
            a = self.a[i].view(torch.uint8)[rows].cpu().view(fp8).to(torch.float64) * float(self.scale_a[i])
            b = self.b[i].view(torch.uint8)[:, cols].cpu().view(fp8).to(torch.float64) * float(self.scale_b[i])
        else:
            a = self.a[i][rows].to("cpu", torch.float64)
            b = self.b[i][:, cols].to("cpu", torch.float64)
        return a @ b

    def verify(self, sample: int = VERIFY_SAMPLE) -> float:
        """:func:`gemm_error` of C against the fp64 reference on ``sample`` random rows x columns."""
        import torch

        if self._calls == 0:
            self.step()
        k = min(sample, self.n)
        rows = torch.randperm(self.n, generator=self._verify_gen)[:k]
        cols = torch.randperm(self.n, generator=self._verify_gen)[:k]
        got = self.c[rows.to(self.device)][:, cols.to(self.device)]
        return gemm_error(got, self.reference_sample(rows, cols))


@dataclass
class GemmResult:
    """One device's GEMM measurement: window times (s), and the verification error."""

    device: str
    dtype: str
    size: int
    iters: int
    window_s: list[float]
    error: float
    ok: bool
    mode: str = "single"
    warmup_s: float = 0.0
    warmup_settled: bool = True

    def tflops(self, seconds: float) -> float:
        return gemm_flops(self.size) * self.iters / seconds / 1e12 if seconds > 0 else math.nan

    @property
    def median_tflops(self) -> float:
        """Throughput of the median window, in TFLOP/s (what the metric reports)."""
        return self.tflops(median(self.window_s))

    @property
    def best_tflops(self) -> float:
        """Throughput of the fastest window, in TFLOP/s."""
        return self.tflops(min(self.window_s))


def measure_gemm(device: torch.device, dtype: str, size: int, *, warmup: int, iters: int, trials: int,
                 buffers: int, seed: int = 0, before_window: Callable[[], None] | None = None,
                 mode: str = "single", warmup_s: float = 0.0, min_window_s: float = 0.0,
                 warmup_max_s: float = 0.0, stable_within: float = 0.0) -> GemmResult:
    """Time ``trials`` windows of GEMMs of ``dtype`` on ``device``, then verify the last result.

    First at least ``warmup`` GEMMs and ``warmup_s`` seconds run untimed
    (:func:`~gpuaccept.checks.timing.warm_up`), then, with ``stable_within``,
    more until the rate is stable or ``warmup_max_s`` have passed; each window then runs
    ``max(iters, min_window_s / probed seconds per GEMM)`` GEMMs. With the
    defaults (no time asked for) that is ``warmup`` GEMMs and ``iters`` per window.
    The caller sets the TF32 mode (:func:`fp32_matmul_mode`). On CUDA the work
    runs on a dedicated stream of ``device``.
    """
    import torch

    stream_ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    device_ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if device.type == "cuda":
        device_ctx = torch.cuda.device(device)
        stream_ctx = torch.cuda.stream(torch.cuda.Stream(device))
    with device_ctx, stream_ctx:
        work = GemmWorkload(device, dtype, size, buffers, seed)
        warm = warm_up(work.step, device, seconds=warmup_s, min_calls=max(1, warmup), max_seconds=warmup_max_s,
                       stable_within=stable_within)
        n_iter = window_iters(warm.per_call_s, min_window_s, iters)
        times = time_windows(work.step, device, warmup=0, windows=trials, iters=n_iter,
                             before_window=before_window)
        error = work.verify()
        del work
    return GemmResult(str(device), dtype, size, n_iter, times, error, gemm_ok(error, dtype), mode,
                      round(warm.seconds, 3), warm.settled)


def measure_concurrent(devices: Sequence[torch.device], dtype: str, size: int, *, warmup: int, iters: int,
                       trials: int, buffers: int, seed: int = 0, warmup_s: float = 0.0,
                       min_window_s: float = 0.0, warmup_max_s: float = 0.0,
                       stable_within: float = 0.0) -> list[GemmResult]:
    """:func:`measure_gemm` on every device at once, one thread per device.

    Each device warms up on its own; a barrier then lines up the start of each
    timed window on all devices, so each window is measured while the others
    are loaded too.
    """
    barrier = threading.Barrier(len(devices))

    def wait() -> None:
        barrier.wait(timeout=600)

    def one(idx: int) -> GemmResult:
        try:
            return measure_gemm(devices[idx], dtype, size, warmup=warmup, iters=iters, trials=trials,
                                buffers=buffers, seed=seed + idx, before_window=wait, mode="concurrent",
                                warmup_s=warmup_s, min_window_s=min_window_s, warmup_max_s=warmup_max_s,
                                stable_within=stable_within)
        except BaseException:
            barrier.abort()
            raise

    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        futures = [pool.submit(one, i) for i in range(len(devices))]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:  # the first error that is not just another thread's broken barrier
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return [f.result() for f in futures]


# --------------------------------------------------------------------------- the check


@dataclass
class _Plan:
    """Which dtypes run where, and why others do not."""

    run: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _fmt_flops(tflops: float) -> str:
    if math.isnan(tflops):
        return "nan"
    return f"{tflops:.0f} TFLOP/s" if tflops >= 10 else (f"{tflops:.1f} TFLOP/s" if tflops >= 1
                                                          else f"{tflops * 1e3:.1f} GFLOP/s")


def gemm_needs(dtypes: Sequence[str], n: int, pairs: int, size_param: str) -> list[MemoryNeed]:
    """Memory of ``pairs`` A/B pairs and C of ``n`` x ``n`` in the widest of ``dtypes`` (MiB, rounded up; the
    fp32 temporaries that seed them are not counted); none without a dtype. ``size_param`` names ``n``."""
    known = [d for d in dtypes if d in GEMM_BYTES]
    if not known:
        return []
    widest = max(known, key=lambda d: GEMM_BYTES[d])
    ab, c = GEMM_BYTES[widest]
    mib = -(-(2 * pairs * ab + c) * n * n // (1 << 20))
    return [MemoryNeed((size_param, "buffers"), mib, f"{pairs} A/B pairs and C of {n} x {n} {widest}")]


class ComputeCheck(Check):
    """GEMM throughput (TFLOP/s) per dtype, against the SKU's dense spec peak."""

    name = "compute"
    tag = "COMPUTE"
    summary = "GEMM TFLOP/s per dtype on each GPU alone and all at once, result verified in fp64"
    key_metric = "gemm_bf16_tflops*"  # reports from before details.key_metric; runs choose per device
    metrics = tuple(f"gemm_{d}_tflops{mode}" for d in GEMM_DTYPES for mode in ("", "_concurrent"))
    params = (
        Param("dtypes", "list", ["fp32", "tf32", "fp16", "bf16", "fp8"], "GEMM dtypes to measure",
              item="str", choices=GEMM_DTYPES),
        Param("size", "int", 8192, "matrix dimension N on GPU, elements (N x N x N GEMM)", minimum=16,
              maximum=65536),
        Param("cpu_size", "int", 384, "matrix dimension N on CPU, elements", minimum=16, maximum=32768),
        Param("warmup", "int", 5, "untimed GEMMs before timing, at least", minimum=0, maximum=100_000),
        Param("warmup_s", "float", 5.0, "untimed GEMM load per dtype before timing, in seconds (clocks settle)",
              minimum=0, maximum=3600.0),
        Param("warmup_max_s", "float", 8.0, "longest warm-up per dtype while waiting for a stable rate, seconds",
              minimum=0, maximum=3600.0),
        Param("stable_within", "float", 0.1, "warm-up ends once two chunks' rates agree within this fraction "
              "(0: after warmup_s, whatever the rate)", minimum=0, maximum=1),
        Param("iters", "int", 20, "GEMMs per timed window, at least", minimum=1, maximum=100_000),
        Param("min_window_s", "float", 0.5, "shortest timed window in seconds (GEMMs per window from a timed probe)",
              minimum=0, maximum=600.0),
        Param("trials", "int", 5, "timed windows; the median window is reported", minimum=1, maximum=1000),
        Param("buffers", "int", 4, "A/B pairs cycled so caches do not flatter", minimum=1, maximum=1024),
        Param("per_gpu", "bool", True, "measure each GPU alone"),
        Param("concurrent", "bool", True, "measure all GPUs at once (when there are several)"),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        # quick: a burst (boost clocks), kept short; its reason says so
        "quick": {"warmup": 2, "warmup_s": 0.2, "warmup_max_s": 1.0,
                  "iters": 10, "min_window_s": 0.02, "trials": 3, "cpu_size": 256},
        "standard": {},
        "full": {"warmup": 10, "warmup_s": 10.0, "warmup_max_s": 20.0,
                 "iters": 50, "min_window_s": 1.0, "trials": 10, "cpu_size": 512},
    }
    # standard, 8 GPUs, 5 dtypes: (8 alone + 1 concurrent) x 5 x (5 s + 5 x 0.5 s) ~ 340 s plus set-up
    timeout_s: ClassVar[dict[str, float]] = {"quick": 120.0, "standard": 900.0, "full": 3600.0}

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """A GEMM figure (some dtype, alone or concurrent) on every device asked for."""
        return per_device(devices, "gemm_*_tflops*")

    @classmethod
    def gpu_needs(cls, params: dict[str, Any]) -> list[MemoryNeed]:
        """``buffers`` A/B pairs and C of N x N (``size``) in the widest dtype asked for, on each GPU."""
        return gemm_needs(params["dtypes"], int(params["size"]), int(params["buffers"]), "size")

    @classmethod
    def host_needs(cls, params: dict[str, Any]) -> list[MemoryNeed]:
        """The same on a CPU run: N x N is ``cpu_size``, the dtypes those that run on CPU."""
        dtypes = [d for d in params["dtypes"] if d in CPU_DTYPES]
        return gemm_needs(dtypes, int(params["cpu_size"]), int(params["buffers"]), "cpu_size")

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.compute(params, device, gpus, CPU_DTYPES)

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        import torch

        p = ctx.params
        if not p["per_gpu"] and not p["concurrent"]:
            return Outcome(Status.ERROR, "per_gpu and concurrent are both false: nothing to measure")
        on_gpu = devices[0].type == "cuda"
        size = int(p["size"] if on_gpu else p["cpu_size"])
        plan = self._plan(list(p["dtypes"]), devices, size, on_gpu)
        if not plan.run:
            why = "; ".join(f"{d}: {r}" for d, r in plan.skipped.items()) or "no dtypes requested"
            return Outcome.skip(f"no GEMM dtype can run here ({why})", needs_gpu=not on_gpu, skipped=plan.skipped)

        skus: dict[str, Sku | None] = _skus_of(devices) if on_gpu else {}
        warmup, iters, trials, buffers = (int(p[k]) for k in ("warmup", "iters", "trials", "buffers"))
        warmup_s, min_window_s = float(p["warmup_s"]), float(p["min_window_s"])
        warmup_max_s, stable_within = float(p["warmup_max_s"]), float(p["stable_within"])
        knobs = {"warmup": warmup, "iters": iters, "trials": trials, "buffers": buffers, "warmup_s": warmup_s,
                 "min_window_s": min_window_s, "warmup_max_s": warmup_max_s, "stable_within": stable_within}
        burst = burst_note(warmup_s, min_window_s)
        if burst:
            plan.notes.append(burst)
        single: list[GemmResult] = []
        concurrent: list[GemmResult] = []
        try:
            for dtype in plan.run:
                with fp32_matmul_mode(dtype == "tf32"):
                    if p["per_gpu"] or len(devices) == 1:
                        for dev in devices:
                            res = measure_gemm(dev, dtype, size, warmup=warmup, iters=iters, trials=trials,
                                               buffers=buffers, warmup_s=warmup_s,
                                               min_window_s=min_window_s, warmup_max_s=warmup_max_s,
                                               stable_within=stable_within)
                            ctx.log(f"{dev} {dtype} N={size}: {_fmt_flops(res.median_tflops)} median "
                                    f"(best {_fmt_flops(res.best_tflops)}), {res.iters} GEMMs x "
                                    f"{median(res.window_s):.3f} s windows after {res.warmup_s:g} s warm-up, "
                                    f"error {res.error:.2g}")
                            single.append(res)
                    if p["concurrent"] and len(devices) > 1:
                        results = measure_concurrent(devices, dtype, size, warmup=warmup, iters=iters,
                                                     trials=trials, buffers=buffers, warmup_s=warmup_s,
                                                     min_window_s=min_window_s, warmup_max_s=warmup_max_s,
                                               stable_within=stable_within)
                        for res in results:
                            ctx.log(f"{res.device} {dtype} N={size} concurrent: {_fmt_flops(res.median_tflops)}")
                        concurrent.extend(results)
        except torch.cuda.OutOfMemoryError as exc:
            return Outcome(Status.ERROR, f"out of memory at size {size} with {buffers} buffers; "
                                         f"lower 'size' or 'buffers' ({str(exc).splitlines()[0]})")

        metrics = [self._metric(r, skus) for r in single + concurrent]
        key = headline_dtype(plan.run, devices)
        details: dict[str, Any] = {
            "key_metric": f"gemm_{key}_tflops*",  # the headline for this device (reports show it)
            "stat": "median window",
            "size": size,
            **knobs,
            "results": [{"device": r.device, "dtype": r.dtype, "mode": r.mode, "median_tflops": r.median_tflops,
                         "best_tflops": r.best_tflops, "error": finite_or_none(r.error), "iters": r.iters,
                         "median_window_s": round(median(r.window_s), 4), "warmup_s": r.warmup_s,
                         "warmup_settled": r.warmup_settled, "tolerance": GEMM_TOLERANCE[r.dtype]}
                        for r in single + concurrent],
        }
        if plan.skipped:
            details["skipped"] = plan.skipped
        if plan.notes:
            details["notes"] = plan.notes
        if skus:
            details["sku"] = {d: s.id if s else None for d, s in skus.items()}
        wrong = [r for r in single + concurrent if not r.ok]
        if wrong:
            w = wrong[0]
            hint = ""
            if w.dtype == "fp32" and os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1":
                hint = " (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 forces TF32 for fp32 GEMM)"
            return Outcome.failed(f"wrong GEMM result on {w.device} {w.dtype} ({w.mode}): error {w.error:.3g} > "
                                  f"tolerance {GEMM_TOLERANCE[w.dtype]:g} vs fp64 reference{hint}; "
                                  f"{len(wrong)} wrong result(s) in all", metrics, **details)
        reason = _reason(single, concurrent, skus, plan, devices, key)
        return Outcome.passed(reason, metrics, **details)

    @staticmethod
    def _plan(dtypes: list[str], devices: Sequence[torch.device], size: int, on_gpu: bool) -> _Plan:
        plan = _Plan()
        for dt in dict.fromkeys(dtypes):
            if not on_gpu and dt not in CPU_DTYPES:
                plan.skipped[dt] = "GPU only"
            elif dt == "fp8" and on_gpu:
                why = next((w for w in (fp8_unsupported(d, size) for d in devices) if w), None)
                if why:
                    plan.skipped[dt] = why
                else:
                    plan.run.append(dt)
            else:
                plan.run.append(dt)
        if on_gpu and "tf32" in plan.run and os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
            plan.notes.append("NVIDIA_TF32_OVERRIDE=0 makes cuBLAS run tf32 GEMMs in full fp32")
        return plan

    @staticmethod
    def _metric(r: GemmResult, skus: dict[str, Sku | None]) -> Metric:
        suffix = "_concurrent" if r.mode == "concurrent" else ""
        metric = Metric(f"gemm_{r.dtype}_tflops{suffix}", r.median_tflops, "TFLOP/s", device=r.device,
                        tags={"dtype": r.dtype, "size": r.size, "mode": r.mode, "stat": "median"}, performance=True)
        sku = skus.get(r.device)
        peak = sku.peak_tflops(r.dtype) if sku else None
        if sku and peak:
            metric.expected = peak
            frac = sku.pass_fraction(f"gemm_{r.dtype}")
            metric.threshold = Threshold(">=", round(peak * frac, 3), Status.FAIL, source=f"sku:{sku.id}")
        return metric


def _skus_of(devices: Sequence[torch.device]) -> dict[str, Sku | None]:
    """SKU (or None) per ``cuda:i`` device, from the name torch reports."""
    import torch

    from gpuaccept.hw.sku import match_sku

    return {str(d): match_sku(torch.cuda.get_device_name(d)) for d in devices}


def headline_dtype(ran: Sequence[str], devices: Sequence[torch.device]) -> str:
    """The dtype whose GEMM figure heads the check: fp32 on a CPU (most have no bf16 units, so bf16 runs at
    about 1/100 of fp32 there), bf16 on GPUs that all have it (compute capability >= 8.0), else fp16,
    fp32 or tf32, else the first dtype that ran."""
    if devices and devices[0].type == "cuda":
        import torch

        bf16 = all(torch.cuda.get_device_capability(d) >= (8, 0) for d in devices)
        order: tuple[str, ...] = ("bf16", "fp16", "fp32", "tf32") if bf16 else ("fp16", "fp32", "tf32")
    else:
        order = ("fp32", "fp64")
    return next((d for d in order if d in ran), ran[0])


def _reason(single: list[GemmResult], concurrent: list[GemmResult], skus: dict[str, Sku | None], plan: _Plan,
            devices: Sequence[torch.device], key: str) -> str:
    """E.g. ``bf16 612 TFLOP/s (62% of 989 peak), fp32 51 TFLOP/s (76% of 67 peak) on 8 GPUs; min cuda:3``
    (the headline dtype ``key`` first)."""
    parts: list[str] = []
    slowest = ""
    for dtype in sorted(plan.run, key=lambda d: d != key):
        rows = [r for r in single if r.dtype == dtype] or [r for r in concurrent if r.dtype == dtype]
        if not rows:
            continue
        low = min(rows, key=lambda r: r.median_tflops)
        sku = skus.get(low.device)
        peak = sku.peak_tflops(dtype) if sku else None
        text = f"{dtype} {_fmt_flops(low.median_tflops)}"
        if peak:
            text += f" ({100 * low.median_tflops / peak:.0f}% of {peak:g} peak)"
        parts.append(text)
        if dtype == key:
            slowest = low.device
    reason = ", ".join(parts)
    if len(devices) > 1:
        reason += f" on {len(devices)} GPUs; min {slowest}"
        conc = [r for r in concurrent if r.dtype == key]
        if conc:
            reason += f"; concurrent {key} min {_fmt_flops(min(r.median_tflops for r in conc))}"
    elif devices[0].type == "cpu":
        reason = f"cpu N={single[0].size}: {reason} (no spec peak on CPU: not judged against one)"
    if plan.skipped:
        reason += f"; skipped {', '.join(plan.skipped)} ({next(iter(plan.skipped.values()))})"
    for note in plan.notes:
        reason += f"; {note}"
    return reason


CHECKS = (ComputeCheck,)
