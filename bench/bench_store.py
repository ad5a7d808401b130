"""How fast the history store takes a fleet's reports and answers queries.

Stores one cluster report of ``--nodes`` nodes with ``--gpus`` GPUs and
``--metrics`` metrics per GPU (a 256-node launch), then ``--runs`` node
reports of one host (a long history), and times: the cluster write, the node
writes, ``list_runs``, ``metric_series`` over the long history and ``get_run``
of the cluster. The reference is the same metric rows inserted with a bare
``sqlite3`` ``executemany`` in one transaction (a floor no store can beat);
the ratio store / reference says what the schema, JSON copy and indexes cost.

Prints one line per measurement and a last line ``BENCH {json}``.

Usage: ``python bench/bench_store.py [--db URL] [--nodes 256] [--gpus 8] [--metrics 20] [--runs 200]``
(default: a SQLite file in a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

from gpuaccept.model import CheckResult, ClusterReport, Metric, NodeEntry, NodeReport, NodeState, Status, Verdict
from gpuaccept.results.history import open_store
from gpuaccept.results.rows import METRIC_COLUMNS, flatten_cluster


def node(host: str, run_id: str, started: str, gpus: int, metrics: int) -> NodeReport:
    checks = []
    for c in range(max(1, metrics // 4)):
        checks.append(CheckResult(f"check{c}", Status.PASS, "ok", 1.0, metrics=[
            Metric(f"metric{c}_{k}", 100.0 + g + k, "GB/s", device=f"cuda:{g}", tags={"dtype": "bf16"})
            for g in range(gpus) for k in range(4)]))
    return NodeReport(run_id=run_id, host=host, profile="standard", started=started, finished=started,
                      verdict=Verdict.SUCCESS, checks=checks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--metrics", type=int, default=20, help="metrics per GPU")
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    url = args.db or f"sqlite:///{tmp / 'history.db'}"

    cluster = ClusterReport(run_id="bench-cluster", backend="slurm", started="2026-11-01T00:00:00Z",
                            expected_nodes=args.nodes,
                            nodes=[NodeEntry(f"n{i:04d}", NodeState.REPORTED,
                                             node(f"n{i:04d}", f"bench-n{i:04d}", "2026-11-01T00:00:00Z",
                                                  args.gpus, args.metrics)) for i in range(args.nodes)])
    rows = sum(len(c.metrics) for e in cluster.nodes if e.report for c in e.report.checks)
    out: dict[str, float] = {"metric_rows": rows}
    with open_store(url) as store:
        t, c = time.perf_counter(), time.process_time()
        store.add_cluster_report(cluster)
        out["cluster_write_s"] = time.perf_counter() - t
        out["cluster_write_cpu_s"] = time.process_time() - c
        if hasattr(store, "file_size"):
            out["db_bytes_per_metric_row"] = store.file_size() / rows
        t = time.perf_counter()
        for i in range(args.runs):
            store.add_node_report(node("long", f"long-{i:05d}", f"2026-10-{1 + i % 28:02d}T{i % 24:02d}:00:00Z",
                                       args.gpus, args.metrics))
        out["node_write_ms"] = (time.perf_counter() - t) / args.runs * 1000
        t = time.perf_counter()
        store.list_runs(limit=50)
        out["list_runs_ms"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        series = store.metric_series("long", "metric0_0")
        out["metric_series_ms"] = (time.perf_counter() - t) * 1000
        out["series_points"] = len(series)
        t = time.perf_counter()
        store.get_run("bench-cluster")
        out["get_cluster_s"] = time.perf_counter() - t

    # Reference: the cluster's metric rows with a bare executemany into one table.
    _cluster_row, nodes = flatten_cluster(cluster, "2026-11-01T00:00:00Z")
    conn = sqlite3.connect(tmp / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"CREATE TABLE m ({', '.join(METRIC_COLUMNS)})")
    t = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany(f"INSERT INTO m VALUES ({', '.join('?' * len(METRIC_COLUMNS))})",
                     [m for n in nodes for c in n.checks for m in c.metrics])
    conn.execute("COMMIT")
    out["reference_write_s"] = time.perf_counter() - t
    conn.close()
    out["ratio_cluster_write"] = out["cluster_write_s"] / out["reference_write_s"]
    for k, v in out.items():
        print(f"{k:>22}: {v:.4g}")
    print("BENCH " + json.dumps({"db": url.split(":", 1)[0], **{k: round(v, 5) for k, v in out.items()}}))


if __name__ == "__main__":
    main()
