"""The stress check's sustained GEMM FLOP/s against the compute check's peak on the same device, as a ratio.

Both run side by side in one process, alternating over ``--rounds`` so that drift
(clocks, other load) hits both alike: the compute check's
:func:`~gpuaccept.checks.compute.measure_gemm` (best window after its warm-up,
what it reports as the peak) and the stress check's
:func:`~gpuaccept.checks.stress.stress_device` (median window over
``--duration-s`` of load, each result compared with the first). The ratio
stress/compute says how much of its peak a device holds under sustained load
with the per-iteration comparison (a healthy GPU that keeps its clocks stays
near 1; one that throttles, or a comparison that costs too much, reads lower).
On a GPU the stress side also samples NVML, so the last line carries the
clock and temperature range over the run (for ``bench/RESULTS.md``).

    python bench/bench_stress.py --device cpu --size 256 --duration-s 10
    python bench/bench_stress.py --device cuda --size 8192 --dtype bf16 --duration-s 60

The last line is machine-readable: ``BENCH_STRESS {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

import torch

from gpuaccept.checks.compute import fp32_matmul_mode, measure_gemm
from gpuaccept.checks.stress import edge_rates, stress_device, throughput_drop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", type=int, default=None, help="N (default 256 on CPU, 8192 on GPU)")
    ap.add_argument("--dtype", default=None, help="default fp32 on CPU, bf16 on GPU")
    ap.add_argument("--duration-s", type=float, default=10.0, help="stress load per round")
    ap.add_argument("--window-s", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="CPU torch threads (0: default)")
    args = ap.parse_args()
    dev = torch.device(args.device if args.device != "cuda" else "cuda:0")
    gpu = dev.type == "cuda"
    n = args.size or (8192 if gpu else 256)
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    if args.threads:
        torch.set_num_threads(args.threads)
    sampler = None
    if gpu:
        from gpuaccept.hw.nvml_sampler import NvmlSampler

        sampler = NvmlSampler([dev.index or 0], os.environ.get("CUDA_VISIBLE_DEVICES"), 1.0)
        sampler.start()
    peaks: list[float] = []
    sustained: list[float] = []
    drops: list[float] = []
    with fp32_matmul_mode(dtype == "tf32"):
        for r in range(args.rounds):
            peak = measure_gemm(dev, dtype, n, warmup=5, iters=10, trials=5, buffers=4, warmup_s=3.0,
                                min_window_s=args.window_s, warmup_max_s=6.0, stable_within=0.1).best_tflops
            res = stress_device(dev, dtype, n, duration_s=args.duration_s, window_s=args.window_s, ref_sample=64)
            peaks.append(peak)
            sustained.append(res.median_tflops)
            drops.append(throughput_drop(*edge_rates(res.rates())))
            print(f"round {r}: compute peak {peak:.4g} TFLOP/s, stress sustained {res.median_tflops:.4g} TFLOP/s "
                  f"(ratio {res.median_tflops / peak:.3f}, drop {drops[-1]:.1%}, {len(res.mismatched)} mismatching "
                  f"of {res.iterations})", flush=True)
    out: dict[str, Any] = {
        "device": str(dev), "name": torch.cuda.get_device_name(dev) if gpu else "cpu", "size": n, "dtype": dtype,
        "duration_s": args.duration_s, "threads": torch.get_num_threads(),
        "peak_tflops_best": max(peaks), "sustained_tflops_median": statistics.median(sustained),
        "ratio_best": max(sustained) / max(peaks),
        "ratio_median_of_rounds": statistics.median(s / p for s, p in zip(sustained, peaks, strict=True)),
        "drop_max": max(drops),
    }
    if sampler is not None:
        from gpuaccept.hw.nvml_sampler import summarize

        samples = sampler.stop().get(str(dev), [])
        out["telemetry"] = summarize(samples).to_dict()
        out["timeline"] = [[s.t_s, s.sm_clock_mhz, s.temperature_c, s.power_w] for s in samples[::5]]
    print(f"ratio stress/compute: best {out['ratio_best']:.3f}, median of rounds {out['ratio_median_of_rounds']:.3f}")
    print("BENCH_STRESS " + json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
