"""Fleet-scale I/O benchmark (issue #27): synthetic node reports on disk, every step through the real CLI.

For each ``--nodes`` count it writes a launched run directory as a launch leaves it
(``<run>/launch/job.json`` and ``<run>/<host>/report.json`` per node, indented like
``gpuaccept run`` writes them), with ``--gpus`` GPUs per node: the per-GPU checks of
``tests/fleet_sim.py`` and the collectives check of the standard profile (2 dtypes,
1 KiB-1 GiB by 4x, every op and placement) built by the check's own
``rows_to_outcome``/``rank_table`` and ``merge_rank_outcomes`` for every rank, so
the report holds what the check really emits. Then it runs, each as a child process::

    gpuaccept gather RUN --local --no-history
    gpuaccept analyze RUN/cluster-report.json --json -o analysis.json
    gpuaccept report RUN/cluster-report.json -f md -o report.md
    gpuaccept report RUN/cluster-report.json -f html -o report.html
    gpuaccept history --import RUN/cluster-report.json --db sqlite:///WORK/history.db
    gpuaccept baseline create --from RUN/cluster-report.json -o baseline.yaml

and measures each step's wall time and peak RSS (``ru_maxrss`` of the child from
``os.wait4``). A step over ``--max-rss-gib`` (polled) or ``--timeout`` is killed.
Prints a table, then one machine-readable line ``BENCH_FLEET {json}``.

    .venv/bin/python bench/bench_fleet.py --nodes 64,256
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/fleet_sim.py

from tests.fleet_sim import node_report  # noqa: E402

from gpuaccept.checks.collectives import (  # noqa: E402
    OPS,
    Row,
    alg_bandwidth_gbs,
    bus_bandwidth_gbs,
    planned_rows,
    rank_table,
    rows_to_outcome,
    sweep_sizes,
)
from gpuaccept.distributed.gather import merge_rank_outcomes  # noqa: E402
from gpuaccept.distributed.group import RankContext  # noqa: E402
from gpuaccept.model import CheckResult  # noqa: E402

VARIANTS = 8
"""Distinct collectives results reused across nodes (building each takes a while)."""
PLACEHOLDER = "@@HOST@@"
STEPS = ("gather", "analyze", "report-md", "report-html", "history-import", "baseline-create")


def _collectives(host: str, gpus: int, rng: np.random.Generator) -> CheckResult:
    """The collectives result of one node (every rank), as the check reports it on ``gpus`` GPUs."""
    sizes = sweep_sizes(1024, 1 << 30, 4)
    plan = planned_rows(list(OPS), ["float32", "bfloat16"], ["out", "in"], sizes, gpus)
    times = [[5.0 + size / 3e5 * (1 + rng.normal(0, 0.02)) for (_, _, _, size) in plan] for _ in range(gpus)]
    ctxs = [RankContext(rank=r, world_size=gpus, local_rank=r, local_world_size=gpus, node_rank=0, num_nodes=1,
                        hosts=(host,) * gpus, store_host="127.0.0.1", store_port=0, prefix="", timeout_s=60.0,
                        device_index=r) for r in range(gpus)]
    outcomes = {}
    for r, rc in enumerate(ctxs):
        rows = [Row(op, dt, inp, size, size // 4, times[r][i], alg_bandwidth_gbs(size, times[r][i] / 1e6),
                    bus_bandwidth_gbs(op, size, times[r][i] / 1e6, gpus), 0)
                for i, (op, dt, inp, size) in enumerate(plan)]
        details: dict[str, Any] = {"world_size": gpus, "rank": r, "host": host, "launcher": "local",
                                   "backend": "nccl", "max_bytes": 1 << 30}
        if r == 0:
            details.update(rank_table(rows, times, [[0.0] * len(plan)] * gpus, gpus, rc.hosts))
        outcomes[r] = rows_to_outcome(rows, rc, backend="nccl", details=details, planned=plan)
    o = merge_rank_outcomes(outcomes)
    return CheckResult("collectives", o.status, o.reason, metrics=o.metrics, details=o.details, duration_s=312.0,
                       host=host)


def _variants(gpus: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [json.dumps(_collectives(PLACEHOLDER, gpus, rng).to_dict(), indent=2, allow_nan=False)
            for _ in range(VARIANTS)]


def write_fleet(run_dir: Path, nodes: int, gpus: int, seed: int = 7) -> int:
    """Write ``nodes`` node reports and ``launch/job.json`` under ``run_dir``; the bytes written."""
    rng = np.random.default_rng(seed)
    variants = _variants(gpus, seed)
    run_id = run_dir.name
    hosts = [f"gpu{i:05d}" for i in range(nodes)]
    (run_dir / "launch").mkdir(parents=True, exist_ok=True)
    (run_dir / "launch" / "job.json").write_text(json.dumps(
        {"run_id": run_id, "backend": "slurm", "nodes": nodes, "expected_hosts": hosts,
         "started": "2026-11-28T00:00:00Z"}))
    total = 0
    for i, host in enumerate(hosts):
        rep = node_report(host, rng, gpus=gpus, run_id=f"{run_id}-{host}")
        data = rep.to_dict()
        data["checks"].append("@@COLL@@")
        text = json.dumps(data, indent=2, allow_nan=False)
        text = text.replace('"@@COLL@@"', variants[i % VARIANTS].replace(PLACEHOLDER, host))
        (run_dir / host).mkdir(exist_ok=True)
        (run_dir / host / "report.json").write_text(text + "\n")
        total += len(text) + 1
    return total


def _commands(exe: list[str], run_dir: Path, work: Path) -> dict[str, list[str]]:
    cluster = str(run_dir / "cluster-report.json")
    return {
        "gather": [*exe, "gather", str(run_dir), "--local", "--no-history"],
        "analyze": [*exe, "analyze", cluster, "--json", "-o", str(work / "analysis.json")],
        "report-md": [*exe, "report", cluster, "-f", "md", "-o", str(work / "report.md")],
        "report-html": [*exe, "report", cluster, "-f", "html", "-o", str(work / "report.html")],
        "history-import": [*exe, "history", "--import", cluster, "--db", f"sqlite:///{work / 'history.db'}"],
        "baseline-create": [*exe, "baseline", "create", "--from", cluster, "-o", str(work / "baseline.yaml")],
    }


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def run_step(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float, max_rss_kib: int) -> dict[str, Any]:
    """Run one CLI step; wall seconds, CPU seconds (user + system, its worker processes included), peak RSS in
    MiB (``ru_maxrss``: the largest of the step and its workers), exit status, and why it was killed."""
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        killed = ""
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout_s:
                killed = f"over {timeout_s:.0f} s"
            elif _rss_kib(proc.pid) > max_rss_kib:
                killed = f"over {max_rss_kib / 1048576:.1f} GiB RSS"
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(time.monotonic() - t0, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "exit": proc.returncode, "killed": killed}


def bench(nodes: int, gpus: int, work: Path, exe: list[str], timeout_s: float, max_rss_gib: float,
          steps: tuple[str, ...] = STEPS) -> dict[str, Any]:
    """Generate a fleet of ``nodes`` nodes under ``work`` and run ``steps``; a dict of figures."""
    run_dir = work / f"20261128T000000Z-fleet{nodes}"
    t0 = time.monotonic()
    node_bytes = write_fleet(run_dir, nodes, gpus)
    result: dict[str, Any] = {"nodes": nodes, "gpus": gpus, "node_reports_mb": round(node_bytes / 1e6, 1),
                              "generate_s": round(time.monotonic() - t0, 1), "steps": {}}
    env = {**os.environ, "HOME": str(work), "GPUACCEPT_DB": f"sqlite:///{work / 'history.db'}"}
    cmds = _commands(exe, run_dir, work)
    for step in steps:
        fig = run_step(cmds[step], env, work / f"{step}.log", timeout_s, int(max_rss_gib * 1048576))
        if step == "gather":
            cluster = run_dir / "cluster-report.json"
            fig["output_mb"] = round(cluster.stat().st_size / 1e6, 1) if cluster.exists() else None
        if fig["exit"] not in (0, 1):
            tail = (work / f"{step}.log").read_text(errors="replace").strip().splitlines()[-1:]
            fig["error"] = tail[0][:200] if tail else ""
        result["steps"][step] = fig
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'nodes':>6} {'step':<16} {'wall s':>8} {'CPU s':>8} {'peak MiB':>9} {'exit':>4}  note"]
    for r in results:
        lines.append(f"{r['nodes']:>6} {'(node reports)':<16} {r['generate_s']:>8} {'':>8} {'':>9} {'':>4}  "
                     f"{r['node_reports_mb']} MB on disk")
        for step, f in r["steps"].items():
            note = f.get("killed") or f.get("error") or ""
            if f.get("output_mb") is not None:
                note = f"cluster report {f['output_mb']} MB " + note
            lines.append(f"{r['nodes']:>6} {step:<16} {f['wall_s']:>8} {f.get('cpu_s', ''):>8} {f['peak_rss_mib']:>9} "
                         f"{f['exit']:>4}  {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="64,256", help="comma-separated node counts (default 64,256)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs (ranks) per node (default 8)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"steps to run (default all: {','.join(STEPS)})")
    p.add_argument("--work", default=None, help="work directory (default: a new temporary one, removed after)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per step before it is killed")
    p.add_argument("--max-rss-gib", type=float, default=12.0, help="kill a step whose RSS passes this")
    args = p.parse_args(argv)
    steps = tuple(s for s in args.steps.split(",") if s)
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"unknown step(s) {', '.join(unknown)}; known: {', '.join(STEPS)}")
    exe = [sys.executable, "-m", "gpuaccept"]
    base = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    results = []
    try:
        for n in (int(x) for x in args.nodes.split(",")):
            work = base / f"n{n}"
            work.mkdir(parents=True, exist_ok=True)
            results.append(bench(n, args.gpus, work, exe, args.timeout, args.max_rss_gib, steps))
            print(table(results[-1:]), flush=True)
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(base, ignore_errors=True)
    print(table(results))
    print("BENCH_FLEET " + json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
