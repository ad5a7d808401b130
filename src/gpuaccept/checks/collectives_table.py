"""nccl-tests' bandwidth arithmetic and rank 0's table of a collective sweep (pure).

Split from :mod:`gpuaccept.checks.collectives`, which re-exports these names.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuaccept.checks.collectives import Row


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw factor for ``op`` with ``n`` ranks."""
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if op in ("broadcast", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def alg_bandwidth_gbs(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 B/s): bytes of the nccl-tests size per second."""
    return size_bytes / time_s / 1e9 if time_s > 0 else float("inf")


def bus_bandwidth_gbs(op: str, size_bytes: int, time_s: float, n: int) -> float:
    """Bus bandwidth in GB/s: algbw times :func:`bus_factor`, comparable across ops and world sizes."""
    return alg_bandwidth_gbs(size_bytes, time_s) * bus_factor(op, n)


def rank_table(rows: list[Row], times: list[list[float]], wrongs: list[list[float]], n: int,
               hosts: Sequence[str]) -> dict[str, Any]:
    """Rank 0's view: every rank's time per row, nccl-tests' averaged row, and the slowest rank per op."""
    per_rank = {r.key: [round(times[k][i], 3) for k in range(n)] for i, r in enumerate(rows)}
    table = []
    for i, r in enumerate(rows):
        avg_us = statistics.fmean(times[k][i] for k in range(n))
        wrong = None if r.wrong is None else int(sum(wrongs[k][i] for k in range(n)))
        table.append([r.op, r.dtype, "in" if r.inplace else "out", r.size_bytes, round(avg_us, 3),
                      round(alg_bandwidth_gbs(r.size_bytes, avg_us / 1e6), 4),
                      round(bus_bandwidth_gbs(r.op, r.size_bytes, avg_us / 1e6, n), 4), wrong])
    slowest: dict[str, Any] = {}
    for op in dict.fromkeys(r.op for r in rows):
        i = max((j for j, r in enumerate(rows) if r.op == op), key=lambda j: rows[j].size_bytes)
        ts = [times[k][i] for k in range(n)]
        k = max(range(n), key=lambda j: ts[j])
        med = statistics.median(ts)
        slowest[op] = {"rank": k, "host": hosts[k] if k < len(hosts) else "", "time_us": round(ts[k], 3),
                       "vs_median": round(ts[k] / med, 3) if med > 0 else None, "size_bytes": rows[i].size_bytes}
    return {"rank_time_us": per_rank, "table": table,
            "table_columns": ["op", "dtype", "placement", "size_bytes", "avg_time_us", "algbw_gbs", "busbw_gbs",
                              "wrong_total"],
            "slowest_rank": slowest}
