"""Report builders for the history store tests: node and cluster reports shaped like the real checks' output."""

from __future__ import annotations

import math
from datetime import datetime, timezone

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

T0 = 1_790_000_000.0  # 2026-09-21T... UTC, a fixed epoch for reproducible times


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def node_report(host: str, run_id: str, started: float = T0, *, tflops: float = 600.0, gbs: float = 3000.0,
                step_ms: float = 20.0, gpus: int = 2, sku: str = "h100-sxm5-80gb", nan: bool = False,
                fail: bool = False, profile: str = "standard") -> NodeReport:
    """A finished node report: env, compute, memory, train and memtest checks with per-GPU metrics.

    ``cuda:i`` gets ``tflops + i`` (so devices differ); ``nan`` makes the d2d
    bandwidth of cuda:0 NaN; ``fail`` makes memtest fail.
    """
    devs = [f"cuda:{i}" for i in range(gpus)]
    env = CheckResult("env", Status.PASS, f"{gpus} GPUs", 0.4,
                      metrics=[Metric("gpu_count", float(gpus), "count")],
                      details={"nvml": {"available": True,
                                        "gpus": [{"index": i, "name": "NVIDIA H100", "sku": sku}
                                                 for i in range(gpus)]}})
    compute = CheckResult("compute", Status.PASS, "ok", 12.5, metrics=[
        Metric("gemm_bf16_tflops", tflops + i, "TFLOP/s", device=d, expected=989.0,
               threshold=Threshold(">=", 500.0, Status.FAIL, "sku:h100"),
               tags={"dtype": "bf16", "size": 8192, "mode": "single", "stat": "median"})
        for i, d in enumerate(devs)])
    memory = CheckResult("memory", Status.PASS, "ok", 3.0, metrics=[
        Metric("d2d_copy_gbs", math.nan if (nan and i == 0) else gbs + 10 * i, "GB/s", device=d,
               tags={"size_bytes": 1 << 30}) for i, d in enumerate(devs)])
    train = CheckResult("train", Status.PASS, "loss fell", 8.0, metrics=[
        Metric("train_step_ms", step_ms, "ms", device=d, tags={"dtype": "bf16"}) for d in devs])
    memtest = CheckResult("memtest", Status.FAIL if fail else Status.PASS, "3 errors" if fail else "clean", 30.0,
                          metrics=[Metric("memtest_errors", 3.0 if fail else 0.0, "count", device=d,
                                          tags={"bytes_verified": 123456 + i}) for i, d in enumerate(devs)])
    rep = NodeReport(run_id=run_id, host=host, profile=profile, started=iso(started), finished=iso(started + 60),
                     checks=[env, compute, memory, train, memtest], device="cuda", argv=["run"], version="0.1.0")
    rep.verdict = rep.decide()
    return rep


def metrics_per_node(gpus: int = 2) -> int:
    """How many metrics :func:`node_report` holds."""
    return 1 + 4 * gpus


def cluster_report(run_id: str, hosts: list[str], started: float = T0, missing: tuple[str, ...] = (),
                   failing: tuple[str, ...] = (), **kw: float) -> ClusterReport:
    """A cluster report with one node report per host (``missing`` hosts have none)."""
    entries = []
    for rank, h in enumerate(hosts):
        if h in missing:
            entries.append(NodeEntry(h, NodeState.MISSING, None, rank, "no report.json after the job ended"))
        else:
            entries.append(NodeEntry(h, NodeState.REPORTED,
                                     node_report(h, f"{run_id}-{h}", started + rank, fail=h in failing, **kw), rank))
    cr = ClusterReport(run_id=run_id, backend="slurm", started=iso(started), finished=iso(started + 300),
                       expected_nodes=len(hosts), nodes=entries, job_id="4242")
    return cr


__all__ = ["T0", "Verdict", "cluster_report", "iso", "metrics_per_node", "node_report"]
