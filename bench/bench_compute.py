"""Compare the compute check's GEMM throughput with a plain best-of-N ``torch.matmul`` loop.

The check's own measurement (:func:`gpuaccept.checks.compute.measure_gemm`:
rotating buffers, CUDA-event windows) should report what a bare loop on one
A/B pair reaches: the ratio check/direct (best window vs best window) is the
figure of merit, goal >= 0.97. Rounds alternate check and direct runs so that
drift (clocks, other load) hits both alike.

    python bench/bench_compute.py --device cpu --size 512
    python bench/bench_compute.py --device cuda --size 8192 --dtypes fp32,tf32,fp16,bf16,fp8

With ``--warmup-s``/``--min-window-s`` (the standard profile: 5 s, 0.5 s) the check
measures sustained throughput while the direct loop stays a burst, so the ratio
becomes sustained/burst: how far the GPU falls from boost under load (a healthy
GPU that holds its clocks stays near 1; one that throttles reads well below).

    python bench/bench_compute.py --device cuda --dtypes bf16 --warmup-s 5 --min-window-s 0.5

The last line is machine-readable: ``BENCH_COMPUTE {json}``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from gpuaccept.checks.compute import fp32_matmul_mode, measure_gemm

TORCH_DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                "bf16": torch.bfloat16}


def direct_best_tflops(device: torch.device, dtype: str, n: int, warmup: int, iters: int, trials: int) -> float:
    """Best-of-``trials`` TFLOP/s of ``iters`` back-to-back matmuls on one A/B pair, timed independently."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    if dtype == "fp8":
        sa = (a.abs().max() / 448).float()
        sb = (b.abs().max() / 448).float()
        a8 = (a / sa).to(torch.float8_e4m3fn)
        b8 = (b / sb).to(torch.float8_e4m3fn).t()

        def mm() -> Any:
            return torch._scaled_mm(a8, b8, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    else:
        a, b = a.to(TORCH_DTYPES[dtype]), b.to(TORCH_DTYPES[dtype])
        c = torch.empty_like(a)

        def mm() -> Any:
            return torch.matmul(a, b, out=c)

    for _ in range(warmup):
        mm()
    best = float("inf")
    for _ in range(trials):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                mm()
            torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                mm()
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 * iters / best / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", type=int, default=None, help="N (default 8192 on cuda, 512 on cpu)")
    ap.add_argument("--dtypes", default=None, help="comma-separated (default fp32,tf32,fp16,bf16,fp8 on cuda; "
                                                   "fp32,bf16 on cpu)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--warmup-s", type=float, default=0.0, help="the check's time-based warm-up (s)")
    ap.add_argument("--min-window-s", type=float, default=0.0, help="the check's shortest timed window (s)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating check/direct rounds; best of each kept")
    ap.add_argument("--buffers", type=int, default=4, help="A/B pairs the check cycles (its default: 4)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    size = args.size or (8192 if cuda else 512)
    dtypes = (args.dtypes or ("fp32,tf32,fp16,bf16,fp8" if cuda else "fp32,bf16")).split(",")
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    iters = args.iters or (20 if cuda else 3)
    trials = args.trials or (5 if cuda else 3)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"device {device} ({name}), N={size}, warmup {warmup}, {trials} windows x {iters} GEMMs, "
          f"{args.rounds} rounds, check cycling {args.buffers} A/B pairs; TFLOP/s of the best window")
    print(f"{'dtype':6} {'check':>10} {'check_med':>10} {'direct':>10} {'ratio':>7}")
    summary: dict[str, Any] = {"device": args.device, "name": name, "size": size, "buffers": args.buffers,
                               "cpu_threads": torch.get_num_threads(), "warmup_s": args.warmup_s,
                               "min_window_s": args.min_window_s,
                               "ratios": {}, "check": {}, "direct": {}}
    for dtype in dtypes:
        check_best = check_med = direct = 0.0
        with fp32_matmul_mode(dtype == "tf32"):
            for _ in range(args.rounds):
                res = measure_gemm(device, dtype, size, warmup=warmup, iters=iters, trials=trials,
                                   buffers=args.buffers, warmup_s=args.warmup_s, min_window_s=args.min_window_s)
                print(f"  check {dtype}: {res.iters} GEMMs per window, median window "
                      f"{sorted(res.window_s)[len(res.window_s) // 2]:.3f} s, warm-up {res.warmup_s:g} s")
                if not res.ok:
                    raise SystemExit(f"{dtype}: the check's GEMM result is wrong (error {res.error:.3g})")
                check_best = max(check_best, res.best_tflops)
                check_med = max(check_med, res.median_tflops)
                direct = max(direct, direct_best_tflops(device, dtype, size, warmup, iters, trials))
        ratio = check_best / direct
        print(f"{dtype:6} {check_best:10.4g} {check_med:10.4g} {direct:10.4g} {ratio:7.3f}")
        summary["ratios"][dtype] = round(ratio, 4)
        summary["check"][dtype] = round(check_best, 6)
        summary["direct"][dtype] = round(direct, 6)
    summary["min_ratio"] = min(summary["ratios"].values())
    print("BENCH_COMPUTE " + json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
