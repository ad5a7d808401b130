"""All-pairs gravitational n-body steps, timed and checked against an fp64 reference.

Like the CUDA sample ``nbody -benchmark -numbodies=N``: every body attracts
every other with softening, ``a_i = sum_j m_j r_ij / (|r_ij|^2 + eps^2)^(3/2)``,
then a leapfrog-style update ``v += a dt; x += v dt``. Throughput is reported
in the sample's convention, 20 flops per body-body interaction:
``N^2 * 20 * steps / seconds``, as ``nbody -benchmark -numbodies=N`` (``-fp64`` for fp64)
prints it (about 13,900 fp32 GFLOP/s for 2M bodies on one A100-SXM4-80GB).

The standard and full profiles time the fused kernel of
:mod:`gpuaccept.checks.nbody_kernel` (``torch.compile``: compute-bound, no
``N x N`` temporaries), compiled once per process before the timed steps; the
compile time is reported, never timed. Where no compiler is available, and in
the quick profile (compiling takes seconds to tens of seconds), the eager path
runs: about ten elementwise torch ops over row chunks, memory-bound, so far
below the sample. The reason always says which path ran.

``nbody_gflops`` is a performance figure. On a GPU of the SKU table, the fused kernel's rate is expected at
the CUDA-core peak of its dtype (FP32, or the FP64 vector figure) x 1000 GFLOP/s and must reach the ``nbody``
pass fraction of it (0.2: the sample above reaches about 0.7 of the A100's 19.5 TFLOP/s; an inductor kernel
is not hand-tuned); the eager path gets no SKU expectation (a baseline or a config rule judges it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
from gpuaccept.checks.compute import finite_or_none, time_windows
from gpuaccept.checks.nbody_kernel import KERNELS, Kernel, KernelUnavailable, choose_kernel, eager_kernel
from gpuaccept.checks.sku_expect import nbody_expectation
from gpuaccept.model import Metric, Status

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np
    import torch

    from gpuaccept.hw.sku import Sku

FLOPS_PER_INTERACTION = 20  # the CUDA sample's convention
SOFTENING = 0.05
DT = 1e-3
CHECK_BODIES = 256  # the small case compared in full with the fp64 reference
CHECK_STEPS = 4
SAMPLE_BODIES = 64  # bodies of the timed case whose accelerations are checked
# Largest allowed max|a - a_ref| / rms(a_ref) (accelerations) and max|x - x_ref| / rms(x_ref) (positions).
NBODY_TOLERANCE = {"fp32": 1e-4, "fp64": 1e-10}
SEED_BYTES = 11 * 8  # per body: directions, radii, positions, velocities and masses, seeded in fp64 on the host
# Bytes of (rows x N) temporaries per chunk: 4 live tensors of the chunk's size.
_CHUNK_BUDGET = {"cuda": 1 << 30, "cpu": 1 << 25}


def chunk_rows(n: int, itemsize: int, budget_bytes: int, live_tensors: int = 4) -> int:
    """Rows per chunk so that ``live_tensors`` (rows x n) temporaries fit in ``budget_bytes`` (>= 1, <= n)."""
    return max(1, min(n, budget_bytes // max(1, live_tensors * n * itemsize)))


def nbody_flops(n: int, steps: int = 1) -> float:
    """Flops of ``steps`` all-pairs steps of ``n`` bodies at 20 per interaction."""
    return float(n) * n * FLOPS_PER_INTERACTION * steps


def accelerations(pos: torch.Tensor, mass: torch.Tensor, softening2: float, rows: int,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Softened gravitational acceleration of every body, ``(3, N)`` from positions ``(3, N)`` and masses ``(N,)``.

    Works on ``rows`` bodies at a time so temporaries stay ``rows x N``. No
    matmul is used, so TF32 settings cannot change the result.
    """
    import torch

    n = pos.shape[1]
    acc = torch.empty_like(pos) if out is None else out
    x, y, z = pos[0], pos[1], pos[2]
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        dx = x[None, :] - x[lo:hi, None]  # r_ij = x_j - x_i
        dy = y[None, :] - y[lo:hi, None]
        dz = z[None, :] - z[lo:hi, None]
        w = dx * dx
        w.addcmul_(dy, dy).addcmul_(dz, dz).add_(softening2)
        w.pow_(-1.5).mul_(mass[None, :])  # m_j / (r^2 + eps^2)^(3/2)
        acc[0, lo:hi] = dx.mul_(w).sum(1)
        acc[1, lo:hi] = dy.mul_(w).sum(1)
        acc[2, lo:hi] = dz.mul_(w).sum(1)
    return acc


def reference_accelerations(pos: np.ndarray, mass: np.ndarray, softening2: float,
                            rows: np.ndarray | None = None) -> np.ndarray:
    """Independent fp64 numpy version of :func:`accelerations` for the bodies ``rows`` (all by default)."""
    import numpy as np

    p = np.asarray(pos, dtype=np.float64).T  # (N, 3)
    m = np.asarray(mass, dtype=np.float64)
    idx = np.arange(p.shape[0]) if rows is None else np.asarray(rows)
    out = np.empty((3, idx.size))
    step = max(1, min(64, (1 << 22) // p.shape[0]))  # keeps the (k, N, 3) temporaries near 100 MB
    for s in range(0, idx.size, step):
        sel = idx[s:s + step]
        r = p[None, :, :] - p[sel, None, :]  # (k, N, 3)
        inv = (np.einsum("knd,knd->kn", r, r) + softening2) ** -1.5 * m[None, :]
        out[:, s:s + sel.size] = np.einsum("knd,kn->dk", r, inv)
    return out


def reference_run(pos: np.ndarray, vel: np.ndarray, mass: np.ndarray, steps: int,
                  softening2: float = SOFTENING**2, dt: float = DT) -> np.ndarray:
    """fp64 numpy positions ``(3, N)`` after ``steps`` steps (the same integrator as :class:`NBodySystem`)."""
    import numpy as np

    p = np.array(pos, dtype=np.float64)
    v = np.array(vel, dtype=np.float64)
    for _ in range(steps):
        v += reference_accelerations(p, mass, softening2) * dt
        p += v * dt
    return p


def relative_error(got: Any, ref: Any) -> float:
    """max|got - ref| / rms(ref) in fp64; inf if ``got`` has NaN/inf or the shapes differ."""
    import numpy as np

    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape or not np.isfinite(g).all():
        return math.inf
    scale = float(np.sqrt(np.mean(r * r)))
    err = float(np.max(np.abs(g - r))) if g.size else 0.0
    if scale == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / scale


class NBodySystem:
    """Seeded bodies in the unit ball (masses summing to ~1) on one device, stepped in place."""

    def __init__(self, device: torch.device, n: int, dtype: str = "fp32", seed: int = 0,
                 softening: float = SOFTENING, dt: float = DT, kernel: Kernel | None = None) -> None:
        import torch

        tdtype = {"fp32": torch.float32, "fp64": torch.float64}[dtype]
        gen = torch.Generator().manual_seed(seed)
        direction = torch.randn(3, n, generator=gen, dtype=torch.float64)
        radius = torch.rand(n, generator=gen, dtype=torch.float64) ** (1 / 3)
        pos = direction / direction.norm(dim=0, keepdim=True) * radius
        vel = 0.1 * torch.randn(3, n, generator=gen, dtype=torch.float64)
        mass = (0.5 + torch.rand(n, generator=gen, dtype=torch.float64)) / n
        self.n, self.dt, self.softening2 = n, dt, softening * softening
        self.pos = pos.to(device=device, dtype=tdtype).contiguous()
        self.vel = vel.to(device=device, dtype=tdtype).contiguous()
        self.mass = mass.to(device=device, dtype=tdtype)
        self.acc = torch.empty_like(self.pos)
        self.rows = chunk_rows(n, self.pos.element_size(), _CHUNK_BUDGET.get(device.type, 1 << 25))
        self.fused = kernel.fn if kernel is not None else None  # None: the eager chunked path

    def state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions ``(3, N)``, velocities ``(3, N)``, masses ``(N,)`` as fp64 numpy arrays."""
        import torch

        def cpu(t: torch.Tensor) -> np.ndarray:
            return t.detach().to("cpu", torch.float64).numpy().copy()  # never a view of the live state

        return cpu(self.pos), cpu(self.vel), cpu(self.mass)

    def accelerations(self) -> torch.Tensor:
        """Accelerations into ``self.acc``: the fused kernel when the system has one, else the eager chunks."""
        if self.fused is not None:
            return self.acc.copy_(self.fused(self.pos, self.mass, self.softening2))
        return accelerations(self.pos, self.mass, self.softening2, self.rows, out=self.acc)

    def step(self) -> None:
        """``v += a dt; x += v dt`` (20 flops per interaction in the accelerations)."""
        self.accelerations()
        self.vel.add_(self.acc, alpha=self.dt)
        self.pos.add_(self.vel, alpha=self.dt)


@dataclass
class NBodyResult:
    device: str
    bodies: int
    steps: int
    seconds: float
    small_acc_error: float
    small_pos_error: float
    sample_acc_error: float
    tolerance: float
    kernel: str = "eager"  # the path timed: "compiled" or "eager"
    kernel_note: str = ""  # which kernel ran and why
    compile_s: float = 0.0  # untimed seconds spent compiling it

    @property
    def gflops(self) -> float:
        """GFLOP/s at 20 flops per interaction."""
        return nbody_flops(self.bodies, self.steps) / self.seconds / 1e9 if self.seconds > 0 else math.nan

    @property
    def ok(self) -> bool:
        errors = (self.small_acc_error, self.small_pos_error, self.sample_acc_error)
        return all(e <= self.tolerance for e in errors)

    def worst_error(self) -> float:
        return max(self.small_acc_error, self.small_pos_error, self.sample_acc_error)


def verify_small(device: torch.device, dtype: str, n: int = CHECK_BODIES, steps: int = CHECK_STEPS,
                 seed: int = 1, kernel: Kernel | None = None) -> tuple[float, float]:
    """Relative errors (accelerations, positions after ``steps``) of ``n`` bodies on ``device`` vs fp64 numpy,
    computed with ``kernel`` (default: the eager path)."""
    system = NBodySystem(device, n, dtype, seed, kernel=kernel)
    pos, vel, mass = system.state()
    acc_err = relative_error(system.accelerations().cpu(), reference_accelerations(pos, mass, system.softening2))
    for _ in range(steps):
        system.step()
    pos_err = relative_error(system.state()[0], reference_run(pos, vel, mass, steps, system.softening2, system.dt))
    return acc_err, pos_err


def measure_nbody(device: torch.device, bodies: int, *, steps: int, warmup: int, dtype: str = "fp32",
                  seed: int = 0, kernel: Kernel | None = None) -> NBodyResult:
    """Time ``steps`` steps of ``bodies`` bodies after ``warmup`` steps; verify a small case and a sample.

    A compiled ``kernel`` is compiled for both sizes first (untimed; an eager
    fallback replaces it if that fails and it is not strict); the small case,
    the sample and the timed steps all use the kernel that is timed.
    """
    import torch

    kernel = kernel or eager_kernel("eager kernel (asked for)")
    kernel = kernel.prepare(device, {"fp32": torch.float32, "fp64": torch.float64}[dtype], (CHECK_BODIES, bodies),
                            SOFTENING * SOFTENING)  # what NBodySystem passes
    small_acc, small_pos = verify_small(device, dtype, kernel=kernel)
    system = NBodySystem(device, bodies, dtype, seed, kernel=kernel)
    pos, _, mass = system.state()
    sample = torch.randperm(bodies, generator=torch.Generator().manual_seed(seed))[:SAMPLE_BODIES].numpy()
    got = system.accelerations().cpu().numpy()[:, sample]
    sample_err = relative_error(got, reference_accelerations(pos, mass, system.softening2, rows=sample))
    (seconds,) = time_windows(system.step, device, warmup=warmup, windows=1, iters=steps)
    if not bool(torch.isfinite(system.pos).all()):
        sample_err = math.inf
    return NBodyResult(str(device), bodies, steps, seconds, small_acc, small_pos, sample_err,
                       NBODY_TOLERANCE[dtype], kernel.path, kernel.note, round(kernel.compile_s, 3))


class NBodyCheck(Check):
    """All-pairs n-body throughput (GFLOP/s, 20 flops per interaction) per device, result verified in fp64."""

    name = "nbody"
    tag = "COMPUTE"
    summary = "all-pairs gravitational n-body GFLOP/s per device (like 'nbody -benchmark'), verified in fp64"
    key_metric = "nbody_gflops"
    metrics = ("nbody_gflops",)
    params = (
        Param("bodies", "int", 65536, "number of bodies on GPU", minimum=2, maximum=1 << 22),
        Param("cpu_bodies", "int", 2048, "number of bodies on CPU (each step is N^2 interactions)", minimum=2,
              maximum=1 << 20),
        Param("steps", "int", 10, "timed steps", minimum=1, maximum=100_000),
        Param("warmup", "int", 2, "untimed steps before timing", minimum=0, maximum=10_000),
        Param("dtype", "str", "fp32", "floating-point type of the bodies", choices=("fp32", "fp64")),
        Param("kernel", "str", "auto", "force kernel: 'compiled' (fused, torch.compile), 'eager' (memory-bound "
              "torch ops), 'auto' (compiled where a compiler is found, else eager)", choices=KERNELS),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        # quick: compiling costs 5-40 s (more than the whole check), so it times the eager path and says so
        "quick": {"bodies": 32768, "cpu_bodies": 1024, "steps": 5, "warmup": 1, "kernel": "eager"},
        "standard": {},
        "full": {"bodies": 131072, "cpu_bodies": 4096, "steps": 20, "warmup": 3},
    }
    timeout_s: ClassVar[dict[str, float]] = {"quick": 120.0, "standard": 600.0, "full": 1800.0}

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """The simulation rate on every device asked for."""
        return per_device(devices, "nbody_gflops")

    @classmethod
    def host_needs(cls, params: dict[str, Any]) -> list[MemoryNeed]:
        """The fp64 seeds of ``bodies`` and of ``cpu_bodies`` (MiB, rounded up): every system is seeded on the
        host, on any device (its state, the reference's copies and the row chunks are not counted)."""
        return [MemoryNeed((name,), -(-int(params[name]) * SEED_BYTES // (1 << 20)),
                           f"{int(params[name])} bodies seeded in fp64, {SEED_BYTES} bytes each")
                for name in ("bodies", "cpu_bodies")]

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.nbody(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        p = ctx.params
        dtype = str(p["dtype"])
        bodies = int(p["bodies"] if devices[0].type == "cuda" else p["cpu_bodies"])
        mode = str(p["kernel"])
        results: list[NBodyResult] = []
        try:
            for dev in devices:
                kernel = choose_kernel(dev, mode)
                if mode == "eager" and ctx.profile == "quick":
                    kernel.note = ("eager kernel, memory-bound (the quick profile leaves out torch.compile, "
                                   "which takes 5-40 s; standard and full time the fused kernel)")
                res = measure_nbody(dev, bodies, steps=int(p["steps"]), warmup=int(p["warmup"]), dtype=dtype,
                                    kernel=kernel)
                ctx.log(f"{dev} {dtype} N={bodies}: {res.gflops:.1f} GFLOP/s over {res.steps} steps, "
                        f"{res.kernel_note}, compiled in {res.compile_s:.1f} s, error {res.worst_error():.2g}")
                results.append(res)
        except KernelUnavailable as exc:
            return Outcome(Status.ERROR, f"{exc}; set kernel: auto or eager")
        skus = _skus_of(devices) if devices[0].type == "cuda" else {}
        metrics = nbody_metrics(results, dtype, skus)
        details: dict[str, Any] = {
            "flops_per_interaction": FLOPS_PER_INTERACTION, "softening": SOFTENING, "dt": DT,
            "results": [{"device": r.device, "gflops": r.gflops, "seconds": r.seconds, "steps": r.steps,
                         "kernel": r.kernel, "kernel_note": r.kernel_note, "compile_s": r.compile_s,
                         "small_acc_error": finite_or_none(r.small_acc_error),
                         "small_pos_error": finite_or_none(r.small_pos_error),
                         "sample_acc_error": finite_or_none(r.sample_acc_error), "tolerance": r.tolerance}
                        for r in results],
        }
        if skus:
            details["sku"] = {d: s.id if s else None for d, s in skus.items()}
        wrong = [r for r in results if not r.ok]
        if wrong:
            w = wrong[0]
            return Outcome.failed(f"wrong n-body result on {w.device}: error {w.worst_error():.3g} > tolerance "
                                  f"{w.tolerance:g} vs fp64 reference", metrics, **details)
        return Outcome.passed(_reason(results, dtype), metrics, **details)


def nbody_metrics(results: list[NBodyResult], dtype: str, skus: Mapping[str, Sku | None]) -> list[Metric]:
    """``nbody_gflops`` per device, a performance figure; expected from the device's SKU for the fused kernel
    (:func:`~gpuaccept.checks.sku_expect.nbody_expectation`: the dtype's CUDA-core peak x 1000), none for the
    memory-bound eager one or a GPU the table lacks."""
    out = []
    for r in results:
        m = Metric("nbody_gflops", r.gflops, "GFLOP/s", device=r.device, performance=True,
                   tags={"dtype": dtype, "bodies": r.bodies, "stat": "mean"})
        exp = nbody_expectation(skus.get(r.device), dtype, r.kernel)
        out.append(exp.apply(m) if exp is not None else m)
    return out


def _skus_of(devices: list[torch.device]) -> dict[str, Sku | None]:
    """SKU (or None) per ``cuda:i`` device, from the name torch reports."""
    import torch

    from gpuaccept.hw.sku import match_sku

    return {str(d): match_sku(torch.cuda.get_device_name(d)) for d in devices}


def _reason(results: list[NBodyResult], dtype: str) -> str:
    low = min(results, key=lambda r: r.gflops)
    text = f"{dtype} N={low.bodies}: {low.gflops:.1f} GFLOP/s"
    if len(results) > 1:
        text += f" (min over {len(results)} GPUs, {low.device})"
    worst = max(r.worst_error() for r in results)
    text += f", {low.kernel_note}"
    if low.kernel == "compiled":
        text += f" compiled in {max(r.compile_s for r in results):.1f} s, not timed"
    return f"{text}; matches fp64 reference (error {worst:.1g})"


CHECKS = (NBodyCheck,)
