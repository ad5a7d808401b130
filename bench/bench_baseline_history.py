"""Time and peak memory of ``gpuaccept baseline create --history`` over a history of many node runs.

Stores ``--nodes`` node runs (``--gpus`` GPUs x ``--metrics`` metrics per GPU, as bench_store.py makes them)
in a fresh SQLite history, then runs the command in a child process and reports its wall time and peak
RSS (``getrusage(RUSAGE_CHILDREN)``). Goal (issue 27): <= 30 s and <= 2 GB at 4,096 nodes.

Each check carries ``--details`` raw samples in its details, as real checks do.

Usage: ``python bench/bench_baseline_history.py [--nodes 1024] [--gpus 8] [--metrics 20] [--details 2000]``;
last line ``BENCH {json}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuaccept.model import ClusterReport, NodeEntry, NodeState
from gpuaccept.results.history import open_store

sys.path.insert(0, str(Path(__file__).parent))
from bench_store import node


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--metrics", type=int, default=20)
    ap.add_argument("--details", type=int, default=2000, help="raw samples per check in its details (float list)")
    ap.add_argument("--store-only", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.store_only is None:  # the history is made in a child: a fork of a big parent would count its memory
        tmp = Path(tempfile.mkdtemp(prefix="bench-bhist-"))
        url = f"sqlite:///{tmp / 'history.db'}"
        subprocess.run([sys.executable, __file__, "--nodes", str(args.nodes), "--gpus", str(args.gpus), "--metrics",
                        str(args.metrics), "--details", str(args.details), "--store-only", url], check=True)
        measure(url, tmp, args.nodes)
        return
    url = args.store_only
    started = "2026-11-01T00:00:00Z"
    cluster = ClusterReport(run_id="bench", backend="slurm", started=started, expected_nodes=args.nodes, nodes=[
        NodeEntry(f"n{i:04d}", NodeState.REPORTED, node(f"n{i:04d}", f"bench-n{i:04d}", started, args.gpus,
                                                        args.metrics)) for i in range(args.nodes)])
    for entry in cluster.nodes:  # real checks keep raw samples in their details: most of a stored report
        assert entry.report is not None
        for c in entry.report.checks:
            c.details = {"samples": [100.0 + (k % 97) / 7 for k in range(args.details)]}
    with open_store(url) as store:
        store.add_cluster_report(cluster)


def measure(url: str, tmp: Path, nodes: int) -> None:
    t = time.perf_counter()
    # the child prints its own peak RSS last (RUSAGE_CHILDREN here would count the child that made the history)
    code = ("import resource, sys; from gpuaccept.cli import main; rc = main(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, "baseline", "create", "--history", "--db", url,
                        "--output", str(tmp / "baseline.yaml")], capture_output=True, text=True)
    wall = time.perf_counter() - t
    lines = p.stdout.strip().splitlines()
    rss_mb = int(lines.pop()) / 1024 if lines and lines[-1].isdigit() else float("nan")
    p.stdout = "\n".join(lines)
    print(p.stdout.strip() or p.stderr.strip()[-500:])
    print(f"baseline create --history over {nodes} node runs: {wall:.1f} s wall, peak RSS {rss_mb:.0f} MB")
    print("BENCH " + json.dumps({"nodes": nodes, "rc": p.returncode, "wall_s": round(wall, 2),
                                 "peak_rss_mb": round(rss_mb)}))


if __name__ == "__main__":
    main()
