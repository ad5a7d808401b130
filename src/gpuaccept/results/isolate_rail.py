"""Name the part, not only the node: per-rail tests of a bad node and the fabric counters around them (pure).

Once ``gpuaccept isolate`` has a bad node and a good partner, :func:`rail_plan` makes one test per rail
(GPU ``i`` with its NIC port): ``all_reduce_perf -g 1`` with one rank per node, restricted to that rail by
``CUDA_VISIBLE_DEVICES=i`` and ``NCCL_IB_HCA==mlx5_i:1`` (the leading ``=`` makes NCCL use exactly that
port), each as a ``gpuaccept launch mpi`` command. :func:`split_plan` is the one-job alternative: all
ranks with ``NCCL_TESTS_SPLIT="MOD G"``, which splits the world into G communicators, one per local GPU
index (one rail each in a rail-optimised fabric); nccl-tests prints rank 0's group only, so that job
says whether some rail is bad, and the per-rail tests say which.

:func:`judge_rails` names the rails at fault from each rail test's run and the RDMA port counters read
before and after (:func:`gpuaccept.hw.rdma.diff`): a rail is bad when its test failed, when its busbw is
below ``slow_fraction`` of the median rail, or when an error counter of its port rose. Rails are GPU ``i``
with the ``i``-th port when there are as many ports as GPUs (the usual 8 GPU / 8 NIC node); else each
GPU takes the ports local to its NUMA node in turn (:func:`gpuaccept.hw.rdma.locality`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.errors import UsageError
from gpuaccept.results.isolate import Run


@dataclass(frozen=True)
class Rail:
    """GPU ``gpu`` (CUDA ordinal on the node) with the NIC port ``port`` (``mlx5_3:1``)."""

    gpu: int
    port: str

    @property
    def name(self) -> str:
        return f"GPU {self.gpu} / {self.port}"


def rails(gpus: int, ports: Sequence[str], locality: Sequence[Mapping[str, Any]] | None = None) -> list[Rail]:
    """The node's rails: GPU i with port i when the counts match, else with the ports local to its NUMA node."""
    if gpus < 1 or not ports:
        raise UsageError(f"per-rail tests need GPUs and RDMA ports; got {gpus} GPU(s), {len(ports)} port(s)")
    ports = sorted(ports)
    if len(ports) == gpus:
        return [Rail(i, p) for i, p in enumerate(ports)]
    out: list[Rail] = []
    used: dict[tuple[str, ...], int] = {}
    for i in range(gpus):
        local = tuple(locality[i].get("local_nics") or ()) if locality and i < len(locality) else ()
        choices = [p for p in ports if p.split(":")[0] in local] or ports
        k = used.get(tuple(choices), 0)
        used[tuple(choices)] = k + 1
        out.append(Rail(i, choices[k % len(choices)]))
    return out


def rail_plan(node: str, partner: str, node_rails: Sequence[Rail], args: Sequence[str] = ("-b", "8M", "-e", "1G",
              "-f", "2"), binary: str = "all_reduce_perf") -> list[list[str]]:
    """One ``gpuaccept launch mpi`` argv per rail: ``node`` and its good ``partner``, one rank each (pure)."""
    out = []
    for r in node_rails:
        out.append(["gpuaccept", "launch", "mpi", "--nodes", "2", "--hosts", f"{node},{partner}", "--procs-per-node",
                    "1", "--gpus-per-node", "1", "--run-id", f"rail-{node}-gpu{r.gpu}",
                    "--env", f"CUDA_VISIBLE_DEVICES={r.gpu}", "--env", f"NCCL_IB_HCA=={r.port}",
                    "--", binary, *args, "-g", "1"])
    return out


def split_plan(node: str, partner: str, gpus: int, args: Sequence[str] = ("-b", "8M", "-e", "1G", "-f", "2"),
               binary: str = "all_reduce_perf") -> list[str]:
    """The one-job alternative: every GPU of both nodes, the world split by local GPU index (pure)."""
    return ["gpuaccept", "launch", "mpi", "--nodes", "2", "--hosts", f"{node},{partner}", "--procs-per-node",
            str(gpus), "--gpus-per-node", str(gpus), "--run-id", f"rail-{node}-split",
            "--env", f"NCCL_TESTS_SPLIT=MOD {gpus}", "--", binary, *args, "-g", "1"]


@dataclass
class RailVerdict:
    rail: Rail
    bad: bool
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.rail.gpu, "port": self.rail.port, "bad": self.bad, "evidence": list(self.evidence)}


def judge_rails(node_rails: Sequence[Rail], runs: Mapping[int, Run], counters: Mapping[str, Any] | None = None,
                slow_fraction: float = 0.8) -> list[RailVerdict]:
    """Each rail's verdict from its run (by GPU) and the port deltas of :func:`gpuaccept.hw.rdma.diff`."""
    speeds = [r.busbw for r in runs.values() if r.ok and r.busbw is not None]
    median = statistics.median(speeds) if speeds else None
    out = []
    for rail in node_rails:
        v = RailVerdict(rail, False)
        run = runs.get(rail.gpu)
        if run is None:
            v.evidence.append("not tested")
        elif not run.ok:
            v.bad = True
            v.evidence.append(f"all_reduce failed: {run.reason or 'no reason given'}")
        elif run.busbw is not None and median and run.busbw < slow_fraction * median:
            v.bad = True
            v.evidence.append(f"busbw {run.busbw:.4g} GB/s, below {slow_fraction:g} x the median rail "
                              f"({median:.4g} GB/s)")
        delta = (counters or {}).get(rail.port)
        if delta is not None:
            if delta.vanished:
                v.bad = True
                v.evidence.append(f"{rail.port} vanished during the tests")
            rose = delta.rising()
            if rose:
                v.bad = True
                v.evidence.append(f"{rail.port} error counters rose: "
                                  + ", ".join(f"{k} +{n}" for k, n in sorted(rose.items())))
        out.append(v)
    return out


def rail_summary(node: str, verdicts: Sequence[RailVerdict]) -> str:
    """``gpu07: bad rail GPU 2 / mlx5_2:1 (...)``, or that no rail alone is at fault."""
    bad = [v for v in verdicts if v.bad]
    if not bad:
        return f"{node}: every rail passes alone: the fault needs several rails (or is not in a GPU/NIC pair)"
    return f"{node}: " + "; ".join(f"bad rail {v.rail.name} ({', '.join(v.evidence)})" for v in bad)
