"""Wall time of `gpuaccept healthcheck` (env, health, disk_space, compute), best and median of N runs.

Goal: < 10 s on a healthy 8-GPU node (Slurm kills HealthCheckProgram after 60 s).

    python bench/bench_healthcheck.py [--device cuda] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time


def healthcheck(device: str, runs: int) -> dict[str, float]:
    """Wall time of `gpuaccept healthcheck --device DEVICE` (all four checks), best and median of ``runs``."""
    times: list[float] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "gpuaccept", "healthcheck", "--device", device,
                                "--report-dir", tmp, "--verbose"], capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
    times.sort()
    median = times[len(times) // 2]
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "(no output)"
    print(f"gpuaccept healthcheck --device {device}: best {times[0]:.1f} s, median {median:.1f} s wall of {runs} "
          f"(goal < 10 s on a GPU node), last exit {r.returncode}: {last}")
    for line in r.stdout.splitlines()[:-1]:
        if ": PASS " in line or ": SKIP " in line or ": FAIL " in line:
            print(f"    {line}")
    return {"healthcheck_best_s": round(times[0], 1), "healthcheck_median_s": round(median, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print("BENCH_HEALTHCHECK " + json.dumps(healthcheck(args.device, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
