"""Start-up time of `gpuaccept --help`, wall time of `gpuaccept run --profile quick` and of
`gpuaccept healthcheck`.

Goals: `--help` <= 0.5 s (best of N, fresh interpreter each time; compared with a bare
`python -c pass` in the same run), the quick profile <= 30 s on a 2-core CPU machine, the
healthcheck < 10 s on a healthy 8-GPU node (best and median of `--hc-runs`; Slurm kills
HealthCheckProgram after 60 s).

    python bench/bench_startup.py [--runs 5] [--skip-suite] [--skip-healthcheck] [--hc-runs 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time


def best_of(argv: list[str], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


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
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--skip-suite", action="store_true")
    ap.add_argument("--skip-healthcheck", action="store_true")
    ap.add_argument("--hc-runs", type=int, default=3)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    bare = best_of([sys.executable, "-c", "pass"], args.runs)
    help_s = best_of([sys.executable, "-m", "gpuaccept", "--help"], args.runs)
    print(f"python -c pass: {bare:.3f} s; gpuaccept --help: {help_s:.3f} s (goal <= 0.5 s); "
          f"ratio to bare interpreter {help_s / bare:.2f}")
    summary: dict[str, float] = {"help_s": round(help_s, 3), "bare_python_s": round(bare, 3)}
    if not args.skip_suite:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "gpuaccept", "run", "--profile", "quick",
                                "--device", args.device, "--report-dir", tmp], capture_output=True, text=True)
            quick = time.perf_counter() - t0
        print(f"gpuaccept run --profile quick: {quick:.1f} s wall (goal <= 30 s), exit {r.returncode}")
        if r.returncode not in (0, 1):
            print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
        summary["quick_suite_s"] = round(quick, 1)
    if not args.skip_healthcheck:
        summary.update(healthcheck(args.device, args.hc_runs))
    print("SUMMARY " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
