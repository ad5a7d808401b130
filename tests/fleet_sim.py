"""Simulated fleets for the baseline and analysis tests: seeded, with realistic run-to-run noise.

Each node report has an ``env`` check (GPU inventory as NVML names it, with
the SKU id) and compute/memory/nbody/train checks with one metric per GPU.
Noise: a per-node factor (1 % CV: cooling, clocks, host) times a per-GPU,
per-metric factor whose CV is the metric's own (1-2 %, :data:`METRICS`).
``slow`` multiplies chosen GPUs' speed (0.8: 80 % of its siblings); a slower
GPU takes proportionally longer per training step.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpuaccept.model import (
    CheckResult,
    ClusterReport,
    Metric,
    NodeEntry,
    NodeReport,
    NodeState,
    Status,
    Verdict,
)

GPU_NAMES = {"h100_sxm": "NVIDIA H100 80GB HBM3", "a100_sxm4_80gb": "NVIDIA A100-SXM4-80GB"}
SPEED = {"h100_sxm": 1.0, "a100_sxm4_80gb": 0.4}

# (check, metric, unit, H100 value, tags, CV)
METRICS: list[tuple[str, str, str, float, dict[str, str | int | float], float]] = [
    ("compute", "gemm_bf16_tflops", "TFLOP/s", 710.0, {"dtype": "bf16", "size": 8192, "stat": "median"}, 0.010),
    ("compute", "gemm_tf32_tflops", "TFLOP/s", 370.0, {"dtype": "tf32", "size": 8192, "stat": "median"}, 0.012),
    ("memory", "d2d_copy_gbs", "GB/s", 2900.0, {"size_bytes": 1 << 30}, 0.015),
    ("memory", "h2d_pinned_gbs", "GB/s", 53.0, {"size_bytes": 1 << 28}, 0.020),
    ("nbody", "nbody_gflops", "GFLOP/s", 21000.0, {"dtype": "fp32", "bodies": 65536, "stat": "mean"}, 0.020),
    ("train", "train_step_ms", "ms", 41.0, {}, 0.020),
]
THROUGHPUT = [m[1] for m in METRICS if m[2] != "ms"]


def node_report(host: str, rng: np.random.Generator, *, gpus: int = 8, sku: str = "h100_sxm",
                slow: Mapping[int, float] | None = None, node_cv: float = 0.01, run_id: str | None = None,
                node_factor: float = 1.0, extra: list[CheckResult] | None = None) -> NodeReport:
    """One simulated node; ``slow`` maps GPU index to a speed factor."""
    slow = slow or {}
    f_node = (1 + rng.normal(0, node_cv)) * node_factor * SPEED.get(sku, 1.0)
    by_check: dict[str, list[Metric]] = {}
    for g in range(gpus):
        speed = slow.get(g, 1.0)
        for check, name, unit, value, tags, cv in METRICS:
            f = f_node * (1 + rng.normal(0, cv)) * speed
            v = value / f if unit == "ms" else value * f
            by_check.setdefault(check, []).append(Metric(name, float(v), unit, device=f"cuda:{g}", tags=dict(tags)))
    inventory = [{"index": i, "name": GPU_NAMES.get(sku, sku), "sku": sku if sku in GPU_NAMES else None}
                 for i in range(gpus)]
    checks = [CheckResult("env", Status.PASS, "", metrics=[Metric("gpu_count", float(gpus), "count")],
                          details={"nvml": {"available": True, "gpus": inventory}})]
    checks += [CheckResult(name, Status.PASS, "measured", metrics=ms) for name, ms in by_check.items()]
    checks += extra or []
    return NodeReport(run_id or f"run-{host}", host, "standard", "2025-01-01T00:00:00Z", "2025-01-01T00:10:00Z",
                      Verdict.SUCCESS, checks)


def fleet(seed: int, *, nodes: int = 32, gpus: int = 8, sku: str = "h100_sxm",
          slow: Mapping[tuple[int, int], float] | None = None, slow_nodes: Mapping[int, float] | None = None,
          prefix: str = "node") -> ClusterReport:
    """A seeded cluster report; ``slow`` maps (node, gpu) and ``slow_nodes`` node index to a speed factor."""
    rng = np.random.default_rng(seed)
    slow = slow or {}
    slow_nodes = slow_nodes or {}
    entries = []
    for n in range(nodes):
        per_gpu = {g: f for (nn, g), f in slow.items() if nn == n}
        rep = node_report(f"{prefix}{n:03d}", rng, gpus=gpus, sku=sku, slow=per_gpu,
                          node_factor=slow_nodes.get(n, 1.0))
        entries.append(NodeEntry(rep.host, NodeState.REPORTED, rep, node_rank=n))
    return ClusterReport(f"cluster-{seed}", "slurm", "2025-01-01T00:00:00Z", expected_nodes=nodes, nodes=entries)
