"""Writes cluster-h100.json: a synthetic 4-node x 8-GPU H100 SXM cluster report for rendering tests.

Run from the repository root: ``.venv/bin/python tests/data/reports/make_cluster_report.py``.
The output is deterministic (fixed seed). Numbers are shaped like real H100 SXM
runs (spec values from ``src/gpuaccept/data/skus.yaml``); the faults are planted:

- gpu-node-01 cuda:2: bf16 GEMM at ~88% of its siblings (passes the threshold, an outlier);
- gpu-node-02: NVLink collectives ~15% slow (allreduce busbw below the warn bound at 8 GiB);
- gpu-node-03 cuda:5: bf16 GEMM below the spec threshold (compute fails), and an outlier;
- gpu-node-04: healthy.

``analysis`` is what ``gpuaccept.results.analysis.analyze`` found in it when the file
was made (outliers and per-SKU statistics by median and MAD).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

from gpuaccept.model import (
    CheckResult,
    ClusterReport,
    Metric,
    NodeEntry,
    NodeReport,
    NodeState,
    Status,
    Threshold,
    Verdict,
)
from gpuaccept.results.analysis import analyze

OUT = Path(__file__).with_name("cluster-h100.json")
SKU = "h100_sxm"
GPU_NAME = "NVIDIA H100 80GB HBM3"
PEAK = {"bf16": 989.4, "fp8": 1978.9, "tf32": 494.7}
FRACTION = {"bf16": 0.6, "fp8": 0.5, "tf32": 0.6}
HBM_GBS, PCIE_GBS = 3350.0, 63.0
HOSTS = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
SIZES = [2**k for k in range(10, 34)]  # 1 KiB .. 8 GiB, as nccl-tests -b 1K -e 8G -f 2
RUN_ID = "20261120T031500Z-slurm-4812"


def busbw(size: int, peak: float, latency_us: float, nranks: int = 8) -> float:
    """nccl-tests-like bus bandwidth (GB/s) for a ring allreduce of ``size`` bytes."""
    t = latency_us * 1e-6 + size / (peak * 1e9 * nranks / (2 * (nranks - 1)))
    return size / t / 1e9 * 2 * (nranks - 1) / nranks


def node(host: str, i: int, rng: random.Random) -> NodeReport:
    started = f"2026-11-20T03:15:{10 + i:02d}Z"
    gpus = [f"cuda:{g}" for g in range(8)]
    checks: list[CheckResult] = []

    nvml = {"available": True, "driver_version": "560.35.03", "cuda_driver_version": "12.6", "gpu_count": 8,
            "gpus": [{"index": g, "name": GPU_NAME, "sku": SKU, "uuid": f"GPU-{i:02d}{g:02d}a1b2-0000"}
                     for g in range(8)]}
    checks.append(CheckResult("env", Status.PASS, f"8x {GPU_NAME}, driver 560.35.03 (CUDA 12.6), torch 2.5.1 "
                              "(CUDA 12.4)", 3.1, [
                                  Metric("gpu_count", 8.0, "count", expected=8.0),
                                  Metric("cpu_count", 224.0, "count"),
                                  Metric("host_memory_gib", 2015.56, "GiB")],
                              {"nvml": nvml, "os": "Ubuntu 22.04.4 LTS"}, host=host))

    health = []
    for d in gpus:
        health.append(Metric("temperature_c", float(rng.randint(31, 44)), "C", device=d,
                             threshold=Threshold("<=", 85.0, Status.FAIL, "default")))
        health.append(Metric("power_w", round(rng.uniform(68, 121), 1), "W", device=d,
                             threshold=Threshold("<=", 700.0, Status.FAIL, "default")))
    checks.append(CheckResult("health", Status.PASS, "8 GPUs: no XID, no retired pages, clocks not throttled",
                              1.4, health, host=host))

    compute: list[Metric] = []
    for dtype in ("bf16", "fp8", "tf32"):
        centre = {"bf16": 697.0, "fp8": 1290.0, "tf32": 381.0}[dtype]
        for g, d in enumerate(gpus):
            v = centre * rng.uniform(0.985, 1.015)
            if dtype == "bf16" and host == "gpu-node-01" and g == 2:
                v = centre * 0.88
            if dtype == "bf16" and host == "gpu-node-03" and g == 5:
                v = 548.2
            thr = Threshold(">=", round(PEAK[dtype] * FRACTION[dtype], 3), Status.FAIL, f"sku:{SKU}")
            compute.append(Metric(f"gemm_{dtype}_tflops", round(v, 2), "TFLOP/s", device=d, expected=PEAK[dtype],
                                  threshold=thr, tags={"dtype": dtype, "size": 8192, "mode": "single",
                                                       "stat": "median"}))
    bad = [m for m in compute if m.threshold and not m.threshold.met_by(m.value)]
    if bad:
        m = bad[0]
        reason = (f"{m.name} on {m.device}: {m.value:.1f} TFLOP/s < {m.threshold.value:g} "  # type: ignore[union-attr]
                  f"(0.6 x spec {m.expected:g})")
        checks.append(CheckResult("compute", Status.FAIL, reason, 41.7, compute, host=host))
    else:
        low = min(m.value for m in compute if m.name == "gemm_bf16_tflops")
        checks.append(CheckResult("compute", Status.PASS, f"8 GPUs: bf16 GEMM >= {low:.0f} TFLOP/s", 40.9, compute,
                                  host=host))

    memory: list[Metric] = []
    for d in gpus:
        memory.append(Metric("d2d_copy_gbs", round(2905 * rng.uniform(0.99, 1.01), 1), "GB/s", device=d,
                             expected=HBM_GBS, threshold=Threshold(">=", 2345.0, Status.FAIL, f"sku:{SKU}"),
                             tags={"size_bytes": 4 * 2**30}))
        for name in ("h2d_pinned_gbs", "d2h_pinned_gbs"):
            memory.append(Metric(name, round(53.4 * rng.uniform(0.99, 1.01), 2), "GB/s", device=d,
                                 expected=PCIE_GBS, threshold=Threshold(">=", 44.1, Status.WARN, f"sku:{SKU}"),
                                 tags={"size_bytes": 2**30}))
    checks.append(CheckResult("memory", Status.PASS, "8 GPU(s): device copy 2876-2934 GB/s, data verified", 12.2,
                              memory, host=host))

    peak = 468.0 * (0.85 if host == "gpu-node-02" else 1.0)
    coll: list[Metric] = []
    for op, factor, lat in (("allreduce", 1.0, 14.0), ("allgather", 0.93, 9.0)):
        for size in SIZES:
            v = busbw(size, peak * factor, lat) * rng.uniform(0.98, 1.02)
            thr = Threshold(">=", 420.0, Status.WARN, "baseline:h100_sxm") \
                if op == "allreduce" and size == SIZES[-1] else None
            coll.append(Metric(f"{op}_busbw_gbs", round(v, 2), "GB/s", threshold=thr,
                               tags={"op": op, "size_bytes": size, "dtype": "bf16"}))
    top = next(m for m in reversed(coll) if m.name == "allreduce_busbw_gbs")
    if top.threshold and not top.threshold.met_by(top.value):
        checks.append(CheckResult("collectives", Status.WARN, f"allreduce busbw {top.value:.0f} GB/s at 8 GiB "
                                  f"< {top.threshold.value:g} (baseline)", 28.3, coll, host=host))
    else:
        checks.append(CheckResult("collectives", Status.PASS, f"allreduce busbw {top.value:.0f} GB/s at 8 GiB "
                                  "(8 ranks, NVLink)", 27.9, coll, host=host))
    checks.append(CheckResult("memtest", Status.SKIP, "not in profile quick", 0.0, host=host))

    rep = NodeReport(run_id=RUN_ID, host=host, profile="standard", started=started,
                     finished=f"2026-11-20T03:17:{2 + i:02d}Z", checks=checks, device="cuda",
                     argv=["run", "--profile", "standard"], version="0.1.0")
    rep.verdict = rep.decide()
    return rep


def main() -> None:
    rng = random.Random(20261120)
    reports = [node(h, i, rng) for i, h in enumerate(HOSTS, 1)]
    cluster = ClusterReport(run_id=RUN_ID, backend="slurm", started="2026-11-20T03:15:00Z",
                            finished="2026-11-20T03:17:30Z", expected_nodes=len(HOSTS), job_id="4812",
                            nodes=[NodeEntry(h, NodeState.REPORTED, r, node_rank=i)
                                   for i, (h, r) in enumerate(zip(HOSTS, reports, strict=True))])
    cluster.analysis = analyze(cluster)
    assert cluster.verdict is Verdict.FAILURE
    OUT.write_text(json.dumps(cluster.to_dict(), indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(cluster.analysis['outliers'])} outliers)")


if __name__ == "__main__":
    main()
