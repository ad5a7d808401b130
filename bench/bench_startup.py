"""Start-up cost of gpuaccept, as ratios to one bare ``import torch`` measured in the same run.

Printed side by side, each ``--rounds`` times (alternating, so drift hits both ways of starting):

- ``gpuaccept --help`` against a bare ``python -c pass`` (goal <= 0.5 s);
- one bare ``import torch`` in a fresh interpreter (best of ``--runs``, taken right before each suite
  run): the unit of the ratios, each run divided by the import next to it;
- ``gpuaccept run --profile quick`` wall time with check processes forked from the warm process
  (the default) and started as fresh interpreters (``GPUACCEPT_ZYGOTE=0``, the old way), each
  divided by one import (goal: the forked suite <= 3.5 imports);
- one distributed check (``collectives``) on 2 local ranks, the same two ways (goal <= 2 imports);
- the time from the start of the run to the first measurement logged on each device (a check log
  line that starts with ``cpu`` or ``cuda:N``), and the compute check's fp32 figure both ways (the
  fork must not change what is measured);
- the warm process's resident memory (RSS) and its proportional share (PSS, the pages it shares
  with the check processes counted once), read while the suite runs.

``--overlap`` adds the figure behind the choice of the warm process over starting the next check's
interpreter while the current one runs: the compute check's fp32 rate alone and with an
``import torch`` loop running beside it.

    python bench/bench_startup.py [--device cpu] [--rounds 2] [--runs 5] [--overlap] [--skip-suite]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIRST = re.compile(r"^(cpu|cuda:\d+)\b")


def best_of(argv: list[str], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _warm_memory(pid: int) -> tuple[int, int] | None:
    """(RSS, PSS) in KiB of the warm process under ``pid``, or None when there is none."""
    for p in _descendants(pid):
        try:
            if b"gpuaccept.node.zygote" not in Path(f"/proc/{p}/cmdline").read_bytes():
                continue
            if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1] != str(pid):
                continue  # a check process forked from it has the same command line
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines()[1:])
            return int(fields["Rss"].split()[0]), int(fields["Pss"].split()[0])
        except (OSError, KeyError, ValueError):
            continue
    return None


def run_suite(args: list[str], device: str, warm: bool) -> dict[str, Any]:
    """One ``gpuaccept run`` watched from outside: wall time, first measurement per device, warm memory."""
    env = dict(os.environ)
    env["GPUACCEPT_ZYGOTE"] = "1" if warm else "0"
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "gpuaccept", "run", "--device", device, "--no-history",
                                 "--report-dir", tmp, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env)
        first: dict[str, float] = {}
        memory: tuple[int, int] | None = None
        seen: dict[Path, int] = {}
        while proc.poll() is None:
            for log in Path(tmp).glob("*/logs/*.log"):
                try:
                    text = log.read_text(errors="replace")
                except OSError:
                    continue
                if len(text) == seen.get(log):
                    continue
                seen[log] = len(text)
                for line in text.splitlines():
                    m = FIRST.match(line)
                    if m and m.group(1) not in first:
                        first[m.group(1)] = time.perf_counter() - t0
            if warm:
                now = _warm_memory(proc.pid)
                if now is not None and (memory is None or now[0] > memory[0]):
                    memory = now
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        report = json.loads(next(Path(tmp).glob("*/report.json")).read_text())
    fp32 = [m["value"] for c in report["checks"] if c["name"] == "compute" for m in c["metrics"]
            if m["name"] == "gemm_fp32_tflops"]
    return {"wall_s": wall, "rc": proc.returncode, "first": first, "warm_kib": memory,
            "fp32_tflops": max(fp32) if fp32 else None, "tail": out[-1500:]}


def compute_fp32(device: str, beside: list[str] | None) -> float:
    """The compute check's fp32 figure in a run of it alone; ``beside``: a command looping next to it."""
    loop = subprocess.Popen(["sh", "-c", f"while true; do {' '.join(beside)}; done"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True) if beside else None
    try:
        res = run_suite(["--profile", "quick", "--checks", "compute"], device, warm=True)
    finally:
        if loop is not None:
            os.killpg(loop.pid, 9)
            loop.wait()
    return float(res["fp32_tflops"] or 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="best of N for --help and the bare import")
    ap.add_argument("--rounds", type=int, default=1, help="suite runs per way of starting checks")
    ap.add_argument("--skip-suite", action="store_true")
    ap.add_argument("--overlap", action="store_true", help="also measure compute beside an import loop")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    bare = best_of([sys.executable, "-c", "pass"], args.runs)
    help_s = best_of([sys.executable, "-m", "gpuaccept", "--help"], args.runs)
    print(f"python -c pass: {bare:.3f} s; gpuaccept --help: {help_s:.3f} s (goal <= 0.5 s); "
          f"ratio to bare interpreter {help_s / bare:.2f}")
    summary: dict[str, Any] = {"help_s": round(help_s, 3), "bare_python_s": round(bare, 3)}
    if args.skip_suite:
        print("SUMMARY " + json.dumps(summary))
        return 0
    imports: list[float] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    suites = {"quick": ["--profile", "quick"],
              "dist2": ["--profile", "quick", "--checks", "collectives", "--nproc", "2"]}
    for _ in range(args.rounds):
        for name, suite_args in suites.items():
            for warm in (True, False):
                imp = best_of([sys.executable, "-c", "import torch"], args.runs)  # next to the run it divides
                imports.append(imp)
                res = run_suite(suite_args, args.device, warm)
                res["import_s"] = imp
                if res["rc"] not in (0, 1):
                    print(res["tail"], file=sys.stderr)
                rows.setdefault(f"{name}/{'fork' if warm else 'spawn'}", []).append(res)
    imp = statistics.median(imports)
    print(f"import torch (fresh interpreter, best of {args.runs} before each suite run): median {imp:.2f} s, "
          f"range {min(imports):.2f}-{max(imports):.2f} s")
    summary["import_torch_s"] = round(imp, 3)
    goals = {"quick/fork": 3.5, "dist2/fork": 2.0}
    for key, results in rows.items():
        wall = statistics.median(r["wall_s"] for r in results)
        ratio = statistics.median(r["wall_s"] / r["import_s"] for r in results)
        goal = f" (goal <= {goals[key]:g})" if key in goals else ""
        firsts = {d: round(statistics.median(r["first"][d] for r in results if d in r["first"]), 2)
                  for d in sorted({d for r in results for d in r["first"]})}
        fp32 = [r["fp32_tflops"] for r in results if r["fp32_tflops"]]
        line = f"{key:12s} wall {wall:6.2f} s = {ratio:5.2f} imports{goal}"
        if firsts:
            line += f"; first measurement at {firsts} s"
        if fp32:
            line += f"; compute fp32 {statistics.median(fp32) * 1e3:.1f} GFLOP/s"
        mem = [r["warm_kib"] for r in results if r["warm_kib"]]
        if mem:
            rss, pss = max(m[0] for m in mem) / 1024, max(m[1] for m in mem) / 1024
            line += f"; warm process RSS {rss:.0f} MiB, PSS {pss:.0f} MiB"
        print(line)
        summary[key] = {"wall_s": round(wall, 2), "imports": round(ratio, 2), "first_s": firsts,
                        "walls": [round(r["wall_s"], 2) for r in results],
                        "ratios": [round(r["wall_s"] / r["import_s"], 2) for r in results]}
    for name in suites:
        fork, spawn = summary[f"{name}/fork"]["wall_s"], summary[f"{name}/spawn"]["wall_s"]
        print(f"{name}: spawn / fork = {spawn / fork:.2f}")
    if args.overlap:
        alone = compute_fp32(args.device, None)
        beside = compute_fp32(args.device, [sys.executable, "-c", "'import torch'"])
        print(f"compute fp32 alone {alone * 1e3:.1f} GFLOP/s, beside an import-torch loop {beside * 1e3:.1f} GFLOP/s "
              f"(ratio {beside / alone if alone else float('nan'):.2f}): what starting the next check's interpreter "
              "during a measurement would cost it")
        summary["overlap_ratio"] = round(beside / alone, 3) if alone else None
    print("SUMMARY " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
