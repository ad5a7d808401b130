"""Compare the nbody check's GFLOP/s with a fused reference of the same math on the same device and N.

The check (:func:`gpuaccept.checks.nbody.measure_nbody` with the ``auto``
kernel: its compiled fused kernel, verification, leapfrog update) against a
bare loop of the all-pairs accelerations written here as one expression and
compiled with ``torch.compile`` (inductor), 20 flops per interaction as in
``nbody -benchmark -numbodies=N``. Rounds alternate check and reference so
drift hits both; the ratio check/reference of the best rounds is the figure of
merit, goal >= 0.9. The check's eager path is timed once too, for scale.

    python bench/bench_nbody.py --device cpu --bodies 4096
    python bench/bench_nbody.py --device cuda --bodies 262144

The last line is machine-readable: ``BENCH_NBODY {json}``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from gpuaccept.checks.nbody import measure_nbody
from gpuaccept.checks.nbody_kernel import choose_kernel


def reference_accel(pos: torch.Tensor, mass: torch.Tensor, eps2: float) -> torch.Tensor:
    """The same softened law, written independently of the check (one coordinate at a time, the form
    inductor fuses best; a ``(3, N, N)`` difference tensor compiles to a kernel about 2x slower on a CPU)."""
    px, py, pz = pos.unbind(0)
    x = px.unsqueeze(0) - px.unsqueeze(1)  # (i, j): x_j - x_i
    y = py.unsqueeze(0) - py.unsqueeze(1)
    z = pz.unsqueeze(0) - pz.unsqueeze(1)
    s = (x * x + y * y + z * z + eps2).rsqrt()
    f = mass.unsqueeze(0) * s * s * s
    return torch.stack([(x * f).sum(-1), (y * f).sum(-1), (z * f).sum(-1)])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reference_gflops(fn: object, device: torch.device, n: int, steps: int) -> float:
    pos = torch.rand(3, n, device=device)
    mass = torch.full((n,), 1.0 / n, device=device)
    fn(pos, mass, 0.0025)  # type: ignore[operator]
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn(pos, mass, 0.0025)  # type: ignore[operator]
    sync(device)
    return 20.0 * n * n * steps / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bodies", type=int, default=0, help="default: 4096 on CPU, 262144 on GPU")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    n = args.bodies or (262144 if device.type == "cuda" else 4096)
    kernel = choose_kernel(device, "auto")
    t0 = time.perf_counter()
    ref_fn = torch.compile(reference_accel, dynamic=False, fullgraph=True)
    reference_gflops(ref_fn, device, n, 1)  # compile outside the rounds
    ref_compile_s = time.perf_counter() - t0
    check: list[float] = []
    ref: list[float] = []
    first = measure_nbody(device, n, steps=1, warmup=0, kernel=kernel)  # compiles (untimed) and verifies
    for _ in range(args.rounds):
        res = measure_nbody(device, n, steps=args.steps, warmup=1, kernel=kernel)
        assert res.ok, res
        check.append(res.gflops)
        ref.append(reference_gflops(ref_fn, device, n, args.steps))
    eager = measure_nbody(device, n, steps=max(1, args.steps // 5), warmup=1)
    ratio = max(check) / max(ref)
    out = {"device": str(device), "bodies": n, "steps": args.steps, "rounds": args.rounds,
           "threads": torch.get_num_threads(), "kernel": first.kernel, "kernel_note": first.kernel_note,
           "check_compile_s": first.compile_s,
           "reference_compile_s": round(ref_compile_s, 2), "check_gflops_best": max(check),
           "reference_gflops_best": max(ref), "ratio_best": ratio,
           "ratio_median": sorted(c / r for c, r in zip(check, ref, strict=True))[len(ref) // 2],
           "eager_gflops": eager.gflops, "fused_over_eager": max(check) / eager.gflops}
    print(f"nbody N={n} on {device} ({first.kernel_note}, compiled in {first.compile_s:.1f} s): "
          f"check {max(check):.1f} GFLOP/s, fused reference "
          f"{max(ref):.1f} GFLOP/s, ratio {ratio:.3f} (goal >= 0.9); eager path {eager.gflops:.2f} GFLOP/s")
    print("BENCH_NBODY " + json.dumps(out))


if __name__ == "__main__":
    main()
