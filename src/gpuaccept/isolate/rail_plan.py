"""Name the part, not only the node: per-rail tests of a bad node and the fabric counters around them (pure).

Once ``gpuaccept isolate`` has a bad node and a good partner (``--per-rail``, or ``--rails-of NODE=PARTNER``),
:func:`rail_tests` makes one test per rail, GPU ``i`` with its NIC port, one rank per node, run one after
the other through the same launcher path as the pair tests. With the collectives check (the default pair
test) each is ``--procs-per-node 1 --gpus i`` and ``NCCL_IB_HCA==mlx5_i:1`` (the leading ``=`` makes NCCL
use exactly that port); with nccl-tests ``CUDA_VISIBLE_DEVICES=i``, the same ``NCCL_IB_HCA`` and
``all_reduce_perf -g 1``. Where the node's ports are not known (no ``--rail-ports``, no RDMA port in its
reports) a rail is GPU ``i`` alone and NCCL picks its NIC (the nearest one, on a rail-optimised node).
:func:`split_plan` is the one-job alternative: all ranks with ``NCCL_TESTS_SPLIT="MOD G"``, which splits
the world into G communicators, one per local GPU index; nccl-tests prints rank 0's group only, so that job
says whether some rail is bad, and the per-rail tests say which.

:func:`judge_rails` names the rails at fault from each rail test's run and the RDMA port counters its check
read on the node before and after its traffic (the collectives check's ``fabric_counters``, read back from
the test's cluster report by :func:`counters_from_cluster`): a rail is bad when its test failed, when its
busbw is below ``slow_fraction`` of the median rail, or when an error counter of its port rose. Rails are
GPU ``i`` with the ``i``-th port when there are as many ports as GPUs (the usual 8 GPU / 8 NIC node); else
each GPU takes the ports local to its NUMA node in turn (:func:`gpuaccept.hw.rdma.locality`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.errors import UsageError
from gpuaccept.isolate.plan import Run, Test, Verdicts

MAX_RAILS = 64
"""GPUs per node the per-rail tests accept (a bound on the tests one bad node costs)."""


@dataclass(frozen=True)
class Rail:
    """GPU ``gpu`` (CUDA ordinal on the node) with the NIC port ``port`` (``mlx5_3:1``; None: NCCL's choice)."""

    gpu: int
    port: str | None

    @property
    def name(self) -> str:
        return f"GPU {self.gpu} / {self.port}" if self.port else f"GPU {self.gpu}"


def rails(gpus: int, ports: Sequence[str], locality: Sequence[Mapping[str, Any]] | None = None) -> list[Rail]:
    """The node's rails: GPU i with port i when the counts match, else with the ports local to its NUMA node;
    without ports, GPU i alone."""
    if not 1 <= gpus <= MAX_RAILS:
        raise UsageError(f"per-rail tests need 1 to {MAX_RAILS} GPUs per node, got {gpus}")
    if not ports:
        return [Rail(i, None) for i in range(gpus)]
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


@dataclass(frozen=True)
class RailTest:
    """One rail's test: ``test`` is the bad node and its partner (kind ``rail``); ``flags`` are the further
    ``gpuaccept launch`` flags that put it on the rail."""

    rail: Rail
    test: Test
    flags: tuple[str, ...]


def rail_flags(kind: str, rail: Rail) -> list[str]:
    """The launch flags of one rail's test (pure): ``collectives`` one rank per node on GPU ``i``
    (``--gpus i``, a torch ordinal), ``nccl-tests`` ``CUDA_VISIBLE_DEVICES=i``; both pin the port if known."""
    hca = ["--env", f"NCCL_IB_HCA=={rail.port}"] if rail.port else []
    if kind == "collectives":
        return ["--procs-per-node", "1", "--gpus", str(rail.gpu), *hca]
    if kind == "nccl-tests":
        return ["--env", f"CUDA_VISIBLE_DEVICES={rail.gpu}", *hca]
    raise UsageError(f"per-rail tests run collectives or nccl-tests, not {kind!r}")


def rail_tests(node: str, partner: str, node_rails: Sequence[Rail], kind: str) -> list[RailTest]:
    """One test per rail of ``node``, with its good ``partner`` (pure)."""
    if node == partner:
        raise UsageError(f"a node cannot be its own partner: {node}")
    return [RailTest(r, Test((node, partner), "rail"), tuple(rail_flags(kind, r))) for r in node_rails]


def pick_partner(node: str, verdicts: Verdicts) -> str | None:
    """A good partner for ``node``'s rail tests: one it failed with (a strike, trusted and still good), else
    the first good node by name; None when no node is good."""
    good = sorted(verdicts.named("good"))
    mine = next((v for v in verdicts.nodes if v.node == node), None)
    struck = [p for p in (mine.strikes if mine else []) if p in good]
    return struck[0] if struck else (good[0] if good else None)


def _fabric_info(cluster: Mapping[str, Any], node: str) -> dict[str, Any]:
    """``details.fabric_counters`` of ``node``'s collectives check in a cluster report (its local rank 0 reads
    them, once a node); {} when none."""
    for entry in cluster.get("nodes") or []:
        if not isinstance(entry, dict) or entry.get("host") != node:
            continue
        for check in (entry.get("report") or {}).get("checks") or []:
            details = check.get("details") if isinstance(check, dict) and check.get("name") == "collectives" else None
            info = details.get("fabric_counters") if isinstance(details, dict) else None
            if isinstance(info, dict):
                return info
    return {}


def ports_from_cluster(cluster: Mapping[str, Any], node: str) -> list[str]:
    """The RDMA ports ``node``'s collectives check read counters of, from a cluster report (pure; [] if none)."""
    info = _fabric_info(cluster, node)
    return sorted({*map(str, info.get("ports") or {}), *map(str, info.get("vanished") or [])})


@dataclass(frozen=True)
class PortCounters:
    """What a check saw of one port during its traffic: the error counters that rose, whether it vanished."""

    port: str
    rose: dict[str, int] = field(default_factory=dict)
    vanished: bool = False

    def rising(self) -> dict[str, int]:
        return dict(self.rose)


def counters_from_cluster(cluster: Mapping[str, Any], node: str) -> dict[str, PortCounters]:
    """``node``'s port counters around its collectives traffic, from a cluster report's ``fabric_counters``
    (:mod:`gpuaccept.checks.fabric_watch`; pure): every port read, its risen error counters, the vanished ones."""
    info = _fabric_info(cluster, node)
    rising = info.get("rising") or {}

    def rose(port: Any) -> dict[str, int]:
        found = rising.get(port) if isinstance(rising, dict) else None
        return {str(c): n for c, n in (found or {}).items()
                if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2**64}

    out = {str(k): PortCounters(str(k), rose(k)) for k in info.get("ports") or {}}
    out.update({str(k): PortCounters(str(k), vanished=True) for k in info.get("vanished") or []})
    return out


def merge_counters(seen: Sequence[Mapping[str, PortCounters]]) -> dict[str, PortCounters]:
    """The counters of several runs of one test added up (a port that vanished in any run vanished)."""
    out: dict[str, PortCounters] = {}
    for one in seen:
        for k, c in one.items():
            old = out.get(k, PortCounters(k))
            rose = dict(old.rose)
            for name, n in c.rose.items():
                rose[name] = rose.get(name, 0) + n
            out[k] = PortCounters(k, rose, old.vanished or c.vanished)
    return out


def split_plan(node: str, partner: str, gpus: int, args: Sequence[str] = ("-b", "8M", "-e", "1G", "-f", "2"),
               binary: str = "all_reduce_perf") -> list[str]:
    """The one-job alternative: every GPU of both nodes, the world split by local GPU index (pure)."""
    return ["gpuaccept", "launch", "mpi", "--nodes", "2", "--hosts", f"{node},{partner}", "--procs-per-node",
            str(gpus), "--gpus-per-node", str(gpus), "--run-id", f"rail-{node}-split",
            "--env", f"NCCL_TESTS_SPLIT=MOD {gpus}", "--", binary, *args, "-g", "1"]


@dataclass
class RailVerdict:
    """One rail's verdict: ``busbw`` (GB/s, a collectives/nccl-tests rail test), or ``gbps`` (Gb/s, perftest's
    ``BW average``) with ``bound_gbps``, the least it had to reach (None: measured, not judged)."""

    rail: Rail
    bad: bool
    evidence: list[str] = field(default_factory=list)
    busbw: float | None = None
    gbps: float | None = None
    bound_gbps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.rail.gpu, "port": self.rail.port, "name": self.rail.name, "bad": self.bad,
                "busbw": self.busbw, "gbps": self.gbps, "bound_gbps": self.bound_gbps,
                "evidence": list(self.evidence)}


def judge_rails(node_rails: Sequence[Rail], runs: Mapping[int, Run], counters: Mapping[Any, Any] | None = None,
                slow_fraction: float = 0.8) -> list[RailVerdict]:
    """Each rail's verdict from its run (by GPU) and its port's counters: the deltas of
    :func:`gpuaccept.hw.rdma.diff` or :class:`PortCounters` (anything with ``vanished`` and ``rising()``), by
    port for every rail, or by GPU (an ``int`` key: the counters its own test saw)."""
    speeds = [r.busbw for r in runs.values() if r.ok and r.busbw is not None]
    median = statistics.median(speeds) if speeds else None
    out = []
    for rail in node_rails:
        run = runs.get(rail.gpu)
        v = RailVerdict(rail, False, busbw=run.busbw if run is not None else None)
        if run is None:
            v.evidence.append("not tested")
        elif not run.ok:
            v.bad = True
            v.evidence.append(f"all_reduce failed: {run.reason or 'no reason given'}")
        elif run.busbw is not None and median and run.busbw < slow_fraction * median:
            v.bad = True
            v.evidence.append(f"busbw {run.busbw:.4g} GB/s, below {slow_fraction:g} x the median rail "
                              f"({median:.4g} GB/s)")
        seen = counters or {}
        delta = seen.get(rail.gpu, seen.get(rail.port)) if rail.port else None
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
