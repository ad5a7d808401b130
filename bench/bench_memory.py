"""Cross-check the memory check's bandwidth against an independently written copy loop.

GPU: ``measure_d2d`` (CUDA events, read+write bytes) against a plain
``dst.copy_(src)`` loop timed with ``torch.cuda.synchronize`` and the wall clock.
CPU: ``measure_stream``'s copy rate (best of N, 2 x 8 bytes per element) against
a plain torch ``copy_`` loop on the same number of threads (the reference for
the ratio), and for information NumPy ``np.copyto`` on the same threads and on one.

Rounds alternate check and reference so that drift on a shared machine hits
both. Prints one line per round, the ratio check / reference (goal >= 0.95)
and a machine-readable last line ``BENCH {json}``.

Usage: ``python bench/bench_memory.py [--device auto|cpu|cuda] [--mib N] [--iterations N] [--rounds N] [--threads N]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MIB = 1 << 20


def numpy_copy_gbs(nbytes: int, iterations: int, threads: int = 1) -> float:
    """Best-of-``iterations`` copy rate of ``np.copyto`` in GB/s, counting 2 x bytes (read + write).

    With ``threads`` > 1 each thread copies one contiguous slice (numpy releases the GIL while copying).
    """
    import numpy as np

    n = nbytes // 8
    src = np.arange(n, dtype=np.float64)
    dst = np.zeros(n, dtype=np.float64)
    step = -(-n // threads)
    slices = [slice(i, min(i + step, n)) for i in range(0, n, step)]
    with ThreadPoolExecutor(max_workers=threads) as pool:

        def copy() -> None:
            if threads == 1:
                np.copyto(dst, src)
            else:
                for fut in [pool.submit(np.copyto, dst[s], src[s]) for s in slices]:
                    fut.result()

        copy()  # fault the pages in
        best = float("inf")
        for _ in range(iterations):
            t0 = time.perf_counter()
            copy()
            best = min(best, time.perf_counter() - t0)
    if not np.array_equal(dst, src):
        raise RuntimeError("numpy reference copy produced wrong data")
    return 2 * 8 * n / best / 1e9


def torch_cpu_copy_gbs(nbytes: int, iterations: int, threads: int) -> float:
    """Best-of-``iterations`` copy rate of torch ``copy_`` on CPU with ``threads`` threads, in GB/s (2 x bytes)."""
    import torch

    torch.set_num_threads(threads)
    n = nbytes // 8
    src = torch.arange(n, dtype=torch.float64)
    dst = torch.zeros(n, dtype=torch.float64)
    dst.copy_(src)
    best = float("inf")
    for _ in range(iterations):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * 8 * n / best / 1e9


def torch_gpu_copy_gbs(nbytes: int, iterations: int, device: Any) -> float:
    """Mean copy rate of a plain ``dst.copy_(src)`` loop on one GPU in GB/s (2 x bytes), wall clock + synchronize."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iterations):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    return 2 * (nbytes // 4) * 4 * iterations / dt / 1e9


def _rounds(rounds: int, check: Callable[[], float], refs: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"check": [], **{k: [] for k in refs}}
    for r in range(rounds):
        out["check"].append(check())
        for name, fn in refs.items():
            out[name].append(fn())
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f} GB/s" for k, v in out.items()), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--mib", type=int, default=None, help="buffer/array size in MiB (default 64 CPU, 1024 GPU)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch.get_num_threads())")
    args = ap.parse_args(argv)

    import torch

    from gpuaccept.checks.memory import measure_d2d, measure_stream

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        dev = torch.device("cuda", 0)
        nbytes = (args.mib or 1024) * MIB
        res = _rounds(args.rounds, lambda: measure_d2d(dev, nbytes, args.iterations).gbs,
                      {"torch_copy_loop": lambda: torch_gpu_copy_gbs(nbytes, args.iterations, dev)})
        reference = "torch_copy_loop"
        what = f"d2d copy on {torch.cuda.get_device_name(dev)}"
    else:
        nbytes = (args.mib or 64) * MIB
        threads = args.threads or torch.get_num_threads()
        res = _rounds(args.rounds, lambda: measure_stream(nbytes, args.iterations, threads=threads).copy_gbs,
                      {"numpy_copyto": lambda: numpy_copy_gbs(nbytes, args.iterations, threads),
                       "numpy_copyto_1thread": lambda: numpy_copy_gbs(nbytes, args.iterations, 1),
                       "torch_copy_loop": lambda: torch_cpu_copy_gbs(nbytes, args.iterations, threads)})
        reference = "torch_copy_loop"
        what = f"STREAM copy on CPU, {threads} thread(s) (check, torch_copy_loop and numpy_copyto)"

    best = {k: max(v) for k, v in res.items()}
    ratios = {k: best["check"] / best[k] for k in res if k != "check"}
    median_ratio = statistics.median(c / r for c, r in zip(res["check"], res[reference], strict=True))
    print(f"{what}, {nbytes // MIB} MiB, {args.iterations} iterations x {args.rounds} rounds")
    for k, v in best.items():
        print(f"  {k:21s} best {v:9.2f} GB/s  median {statistics.median(res[k]):9.2f} GB/s")
    for k, r in ratios.items():
        print(f"  ratio check / {k}: {r:.3f}" + (" (goal >= 0.95)" if k == reference else ""))
    ok = ratios[reference] >= 0.95
    summary = {"bench": "memory", "device": device, "size_mib": nbytes // MIB, "iterations": args.iterations,
               "rounds": args.rounds, "best_gbs": {k: round(v, 3) for k, v in best.items()},
               "ratio": round(ratios[reference], 4), "reference": reference,
               "ratios": {k: round(v, 4) for k, v in ratios.items()},
               "median_round_ratio": round(median_ratio, 4), "goal": 0.95, "ok": ok}
    print("BENCH " + json.dumps(summary, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
