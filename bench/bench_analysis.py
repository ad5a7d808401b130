"""Time and memory of the outlier analysis on a synthetic 1,000-node x 8-GPU x 50-metric cluster report.

Goal (issue 5): :func:`gpuaccept.results.analysis.analyze` over 1,000 nodes x 8
GPUs x 50 metrics (400,000 values) in <= 2 s and <= 500 MB. The report is
built in memory first (not timed): realistic metric names and units (GEMM per
dtype, copy bandwidths, a 15-size P2P sweep, health counters, ...), 1 % node
and 1.5 % GPU noise, plus an env check per node with its GPU inventory.
Three slow GPUs and one slow node are planted; the bench checks they are found.

Measured: the best of ``--repeat`` timed runs of ``analyze`` (wall clock),
the peak of Python/numpy allocations during one run (tracemalloc, run
separately because tracing slows Python down), and the process's peak RSS
(which includes the synthetic report itself). CPU time is printed too: on a
shared machine it is the steadier figure. ``learn_baseline`` over the
same report and a JSON round trip are timed for reference.

    python bench/bench_analysis.py                  # 1000 x 8 x 50
    python bench/bench_analysis.py --nodes 100      # smaller

The last line is machine-readable: ``BENCH_ANALYSIS {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from gpuaccept.model import CheckResult, ClusterReport, Metric, NodeEntry, NodeReport, NodeState, Status, Verdict
from gpuaccept.results.analysis import analyze
from gpuaccept.results.baseline_learn import learn_baseline

# (check, metric, unit, typical value, tags); 35 named metrics + a 15-size sweep = 50 per GPU.
_NAMED: list[tuple[str, str, str, float, dict[str, Any]]] = [
    *[("compute", f"gemm_{dt}_tflops", "TFLOP/s", v, {"dtype": dt, "size": 8192, "mode": "single"})
      for dt, v in (("fp64", 52.0), ("fp32", 48.0), ("tf32", 360.0), ("fp16", 700.0), ("bf16", 710.0),
                    ("fp8", 1250.0))],
    *[("compute", f"gemm_{dt}_tflops_concurrent", "TFLOP/s", v, {"dtype": dt, "size": 8192, "mode": "concurrent"})
      for dt, v in (("fp64", 50.0), ("fp32", 46.0), ("tf32", 350.0), ("fp16", 680.0), ("bf16", 690.0),
                    ("fp8", 1200.0))],
    ("nbody", "nbody_gflops", "GFLOP/s", 21000.0, {"dtype": "fp32", "bodies": 65536}),
    ("memory", "d2d_copy_gbs", "GB/s", 2900.0, {"size_bytes": 1 << 30}),
    ("memory", "h2d_pinned_gbs", "GB/s", 53.0, {"size_bytes": 1 << 28}),
    ("memory", "d2h_pinned_gbs", "GB/s", 52.0, {"size_bytes": 1 << 28}),
    ("memtest", "memtest_gbs", "GB/s", 1800.0, {}),
    ("memtest", "memtest_errors", "count", 0.0, {}),
    ("train", "train_step_ms", "ms", 41.0, {"model": "mlp"}),
    ("train", "train_loss_last", "loss", 0.12, {"model": "mlp"}),
    ("train", "train_loss_drop", "fraction", 0.93, {"model": "mlp"}),
    ("health", "temperature_c", "C", 38.0, {}),
    ("health", "power_limit_w", "W", 700.0, {}),
    ("health", "pcie_link_width", "count", 16.0, {}),
    ("health", "pcie_link_gen", "count", 5.0, {}),
    ("health", "ecc_volatile_uncorrectable", "count", 0.0, {}),
    ("health", "ecc_volatile_correctable", "count", 0.0, {}),
    ("health", "ecc_aggregate_uncorrectable", "count", 0.0, {}),
    ("health", "ecc_aggregate_correctable", "count", 0.0, {}),
    ("health", "nvlink_links_active", "count", 18.0, {}),
    ("health", "nvlink_links_down", "count", 0.0, {}),
    ("health", "retired_pages_sbe", "count", 0.0, {}),
    ("health", "retired_pages_dbe", "count", 0.0, {}),
    ("health", "remapped_rows_correctable", "count", 0.0, {}),
    ("health", "remapped_rows_uncorrectable", "count", 0.0, {}),
]
_SWEEP = [("p2p", "p2p_read_gbs", "GB/s", 300.0 * (1 - 0.5 ** (k / 3)), {"size_bytes": 1 << (10 + k)})
          for k in range(1, 16)]
METRICS = _NAMED + _SWEEP
_CONTINUOUS = {"TFLOP/s", "GFLOP/s", "GB/s", "ms", "loss", "fraction", "C"}

SLOW_GPUS = ((17, 3), (400, 0), (999, 7))   # (node, gpu) at 80 % on every throughput metric
SLOW_NODE = 512                              # every GPU at 85 %


def build_cluster(nodes: int, gpus: int, seed: int = 0) -> ClusterReport:
    """The synthetic cluster report (see the module docstring)."""
    assert len(METRICS) == 50
    rng = np.random.default_rng(seed)
    node_f = 1 + rng.normal(0, 0.01, nodes)
    gpu_f = 1 + rng.normal(0, 0.015, (nodes, gpus, len(METRICS)))
    entries = []
    inventory = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "sku": "h100_sxm"} for i in range(gpus)]
    for n in range(nodes):
        by_check: dict[str, list[Metric]] = {}
        for g in range(gpus):
            slow = 0.8 if (n, g) in SLOW_GPUS else (0.85 if n == SLOW_NODE else 1.0)
            for j, (check, name, unit, typical, tags) in enumerate(METRICS):
                f = node_f[n] * gpu_f[n, g, j]
                if unit in _CONTINUOUS:
                    value = typical * (f * slow if unit not in ("ms", "C") else f / slow)
                else:
                    value = typical
                by_check.setdefault(check, []).append(Metric(name, float(value), unit, device=f"cuda:{g}",
                                                             tags=dict(tags)))
        checks = [CheckResult("env", Status.PASS, "", metrics=[
            Metric("gpu_count", float(gpus), "count"), Metric("cpu_count", 224.0, "count"),
            Metric("host_memory_gib", 2015.6, "GiB")], details={"nvml": {"gpus": inventory}})]
        checks += [CheckResult(c, Status.PASS, "", metrics=ms) for c, ms in by_check.items()]
        report = NodeReport(f"run-{n:04d}", f"node{n:04d}", "standard", "2025-01-01T00:00:00Z",
                            "2025-01-01T00:10:00Z", Verdict.SUCCESS, checks)
        entries.append(NodeEntry(report.host, NodeState.REPORTED, report, node_rank=n))
    return ClusterReport("bench", "slurm", "2025-01-01T00:00:00Z", expected_nodes=nodes, nodes=entries)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-json-roundtrip", action="store_true", help="skip timing to_dict/from_dict")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    cluster = build_cluster(args.nodes, args.gpus)
    build_s = time.perf_counter() - t0
    values = sum(len(c.metrics) for e in cluster.nodes if e.report for c in e.report.checks)

    times, cpu_times = [], []
    result: dict[str, Any] = {}
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = analyze(cluster)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    tracemalloc.start()
    analyze(cluster)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    t0 = time.perf_counter()
    baseline = learn_baseline([cluster])
    learn_s = time.perf_counter() - t0

    roundtrip_s = None
    if not args.no_json_roundtrip:
        t0 = time.perf_counter()
        ClusterReport.from_dict(json.loads(json.dumps(cluster.to_dict())))
        roundtrip_s = time.perf_counter() - t0

    found = {(o["host"], o["device"]) for o in result["outliers"]}
    expected = {(f"node{n:04d}", f"cuda:{g}") for n, g in SLOW_GPUS if n < args.nodes}
    if SLOW_NODE < args.nodes:
        expected.add((f"node{SLOW_NODE:04d}", None))
    missed = sorted(expected - found, key=str)
    extra = sorted({h for h, _ in found} - {h for h, _ in expected})
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "nodes": args.nodes, "gpus": args.gpus, "metrics_per_gpu": len(METRICS), "values": values,
        "analyze_s_best": round(min(times), 3), "analyze_s_all": [round(t, 3) for t in times],
        "analyze_cpu_s_best": round(min(cpu_times), 3), "load_avg_1m": round(os.getloadavg()[0], 2),
        "analyze_peak_mb": round(peak / 2**20, 1), "process_max_rss_mb": round(rss_mb, 1),
        "build_s": round(build_s, 2), "learn_baseline_s": round(learn_s, 3), "baseline_entries": len(baseline),
        "json_roundtrip_s": round(roundtrip_s, 2) if roundtrip_s is not None else None,
        "outliers": len(result["outliers"]), "planted_missed": missed, "unexpected_hosts": extra,
        "goal": {"analyze_s": 2.0, "peak_mb": 500},
    }
    print(f"{values} values ({args.nodes} nodes x {args.gpus} GPUs x {len(METRICS)} metrics + env)")
    print(f"analyze: best {min(times):.3f} s wall, {min(cpu_times):.3f} s CPU of {args.repeat} (goal <= 2 s; "
          f"load average {os.getloadavg()[0]:.1f}); peak allocations "
          f"{peak / 2**20:.1f} MB (goal <= 500 MB); process max RSS {rss_mb:.0f} MB incl. the report")
    print(f"learn_baseline: {learn_s:.3f} s ({len(baseline)} entries)"
          + (f"; JSON round trip of the report: {roundtrip_s:.2f} s" if roundtrip_s is not None else ""))
    print(f"outliers: {len(result['outliers'])}; planted missed: {missed or 'none'}; "
          f"hosts flagged but not planted: {extra or 'none'}")
    print("BENCH_ANALYSIS " + json.dumps(out))
    ok = min(times) <= 2.0 and peak <= 500 * 2**20 and not missed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
