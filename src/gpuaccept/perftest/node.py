"""One node's half of an RDMA pair test: ``gpuaccept rdma pair-node``, started once per node by a launcher.

Rank 0 of the job (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``PMIX_RANK``, ``SLURM_PROCID``, else ``--rank``) runs
the servers of every rail of :func:`gpuaccept.perftest.plan.pair_plan` on the first node, rank 1 the clients on
the second; all rails at once, each on its own port. A client starts ``--client-delay`` seconds after launch and
tries again (up to ``--connect-tries``) while its output says ``Couldn't connect``: its server may not listen yet.
The error counters of the node's ports are read from sysfs before and after (:func:`gpuaccept.hw.rdma.read_snapshot`).

Every line printed is tagged ``@rdma RAIL SIDE NODE NIC PORT| <perftest's line>``, so that the two nodes' lines can
interleave in the launcher's log, and each run ends with ``@rdma RAIL SIDE NODE NIC PORT# {"exit": N, "counters":
{...}, "rate_gbps": R}`` (the error counters of ``NIC:1`` that rose, ``"vanished": true`` if the port went away;
the port's rate as this node's sysfs says). Read back with
:func:`gpuaccept.perftest.pairrun.read_log`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from gpuaccept.errors import UsageError
from gpuaccept.perftest.plan import RailPair

RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "NODE_RANK")
NAME_VARS = ("SLURMD_NODENAME", "GPUACCEPT_HOSTNAME")
TAG = "@rdma"


def own_gpus(inv: Any, nics: Sequence[str], memory: str, help_text: str | None, env: Mapping[str, str]
             ) -> tuple[list[int] | None, list[str | None] | None, str]:
    """This node's end of every rail (pure, from its :class:`gpuaccept.hw.rdma.Inventory` and its perftest's
    ``--help``): (the CUDA ordinal of each rail's GPU, each GPU's PCI address for ``--use_cuda_bus_id``, what
    memory and why). ``memory``: as the rdma check chooses (:func:`gpuaccept.perftest.loopback.memory_choice`);
    cuda without GPUs is a UsageError. Each NIC takes the GPU on its NUMA node
    (:func:`gpuaccept.perftest.loopback.nic_gpus`), named by PCI address where perftest takes it, else by its
    ordinal under ``CUDA_VISIBLE_DEVICES``; host memory, said why, when that hides it."""
    from gpuaccept.perftest.loopback import cuda_choice, memory_choice, nic_gpus

    use_gpu, why = memory_choice(inv, memory, "cuda", help_text, asked=f"--memory {memory}")
    if not use_gpu:
        return None, None, why
    gpus = nic_gpus(inv, nics)
    if not gpus:
        raise UsageError("pair-node --memory cuda: sysfs shows no NVIDIA GPU on this node")
    ordinals, bus, hidden = cuda_choice(gpus, None, help_text, env)
    if hidden:
        return None, None, hidden
    how = "by PCI address (--use_cuda_bus_id)" if bus else "by CUDA ordinal (--use_cuda)"
    return ([ordinals[n] for n in nics], [bus[n] for n in nics] if bus else None,
            f"GPU memory (GPUDirect RDMA), each NIC's GPU on its NUMA node, {how}")


def job_rank(env: Mapping[str, str], given: int | None = None, nodes: Sequence[str] = ()) -> int:
    """This task's side: 0 (the server node) or 1 (the client node). Under Slurm by its node's name
    (``SLURMD_NODENAME``; Slurm numbers the tasks in its own node order, not the order given) or its host label
    (``GPUACCEPT_HOSTNAME``, the ssh backend's), else by the rank of the launcher's job, else ``given``."""
    for var in NAME_VARS:
        name = env.get(var, "")
        if name and name in nodes:
            return list(nodes).index(name)
    for name in RANK_VARS:
        if env.get(name, "").isdigit():
            return int(env[name])
    if given is None:
        raise UsageError(f"pair-node: no rank: none of {', '.join(RANK_VARS)} is set (start it with mpirun or srun, "
                         "or give --rank)")
    return given


def tag(pair: RailPair, side: str) -> str:
    node, nic = (pair.server_node, pair.server_nic) if side == "server" else (pair.client_node, pair.client_nic)
    return f"{TAG} {pair.rail} {side} {node} {nic} {pair.port}"


@dataclass
class SideRun:
    pair: RailPair
    side: str
    returncode: int | None
    output: str


def _run(argv: Sequence[str], timeout_s: float) -> tuple[int | None, str]:
    from gpuaccept.perftest.loopback import CUDA_ORDER

    try:
        p = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace", timeout=timeout_s, check=False,
                           env={**os.environ, **CUDA_ORDER})
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out
    except OSError as exc:
        return 127, f"Couldn't start {argv[0]}: {exc}\n"


def run_side(pair: RailPair, side: str, *, timeout_s: float, client_delay_s: float = 1.0,
             connect_tries: int = 5) -> SideRun:
    """Run one rail's server or client (the client retries while it cannot connect)."""
    if side == "server":
        code, out = _run(pair.server_argv, timeout_s)
        return SideRun(pair, side, code, out)
    deadline = time.monotonic() + timeout_s
    code, out = None, ""
    for attempt in range(max(1, connect_tries)):
        time.sleep(client_delay_s if attempt == 0 else min(2.0, client_delay_s + attempt))
        code, out = _run(pair.client_argv, max(1.0, deadline - time.monotonic()))
        if "Couldn't connect" not in out or time.monotonic() >= deadline:
            break
    return SideRun(pair, side, code, out)


def counters(before: object, after: object, nic: str) -> dict[str, object]:
    """The error counters of ``nic:1`` that rose between two :class:`gpuaccept.hw.rdma.Snapshot`."""
    from gpuaccept.hw.rdma import diff

    delta = diff(before, after).get(f"{nic}:1")  # type: ignore[arg-type]
    if delta is None:
        return {}
    return {"vanished": True} if delta.vanished else {"rose": delta.rising()}


def port_rates(root: str) -> dict[str, float]:
    """The data rate in Gb/s of each device's port 1 under ``root`` (sysfs), by device name: its ``rate``, less
    the line encoding of the InfiniBand speeds that print the signalling rate
    (:func:`gpuaccept.perftest.judge.data_rate_gbps`: QDR 40 -> 32)."""
    from gpuaccept.hw.rdma import read_inventory
    from gpuaccept.perftest.judge import data_rate_gbps

    return {p.device: data_rate_gbps(p.rate_gbps, p.speed, p.link_layer) for p in read_inventory(root).ports
            if p.port == 1 and p.rate_gbps is not None}


def run_node(pairs: Sequence[RailPair], rank: int, *, timeout_s: float, sysfs_root: str = "/",
             client_delay_s: float = 1.0, connect_tries: int = 5, out: IO[str] | None = None) -> int:
    """Run this node's side of every rail at once and print the tagged lines; 0 when every run exited 0."""
    from gpuaccept.hw.rdma import read_snapshot

    if rank not in (0, 1):
        raise UsageError(f"pair-node: rank {rank}: a pair test has two ranks, one per node (0 server, 1 client)")
    side = "server" if rank == 0 else "client"
    out = out or sys.stdout
    before = read_snapshot(sysfs_root)
    with ThreadPoolExecutor(max_workers=max(1, len(pairs))) as pool:
        runs = list(pool.map(lambda p: run_side(p, side, timeout_s=timeout_s, client_delay_s=client_delay_s,
                                                connect_tries=connect_tries), pairs))
    after = read_snapshot(sysfs_root)
    rates = port_rates(sysfs_root)
    for r in runs:
        head = tag(r.pair, side)
        argv = r.pair.server_argv if side == "server" else r.pair.client_argv
        lines = [f"{head}| $ {shlex.join(argv)}"] + [f"{head}| {line}" for line in r.output.splitlines()]
        nic = r.pair.server_nic if side == "server" else r.pair.client_nic
        lines.append(f"{head}# " + json.dumps({"exit": r.returncode, "counters": counters(before, after, nic),
                                               "rate_gbps": rates.get(nic)}))
        out.write("\n".join(lines) + "\n")
    out.flush()
    return 0 if all(r.returncode == 0 for r in runs) else 1


def environment() -> Mapping[str, str]:
    return os.environ
