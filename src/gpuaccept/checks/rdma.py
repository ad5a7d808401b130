"""The ``rdma`` check: each NIC's RDMA bandwidth on this node, by perftest in loopback, judged against its port.

For every RDMA device with an ACTIVE port (sysfs below ``root``; rail ``i`` is the ``i``-th device in natural
order, ``mlx5_0``, ``mlx5_1``, ..., whether its port is up or not) it runs perftest's server and client on that
device, the client connecting to ``localhost`` (:mod:`gpuaccept.perftest.loopback`): ``ib_write_bw -d mlx5_0
-p 18515 -s 1048576 -D 5 -F --report_gbits --use_cuda=0`` in the background, then the same with ``localhost``
last. GPU memory
(``--use_cuda``, the GPU on the NIC's NUMA node) where the node has GPUs, ``nvidia_peermem`` is loaded and the
binary takes ``--use_cuda``; host memory otherwise, said in the reason. ``parallel`` NICs at once, each on its
own port. The client's ``BW average`` is judged (:func:`gpuaccept.perftest.judge.judge`) against ``fraction``
x the port's data rate (``cat /sys/class/infiniband/mlx5_0/ports/1/rate``), or ``min_gbps``. A loopback
run exercises the NIC, its PCIe path and GPUDirect, not the cable or the switch (``gpuaccept isolate
--rail-test rdma`` does, between two nodes). The ports' error counters are read before and after
(:mod:`gpuaccept.checks.fabric_watch`): one that rose is named.

SKIP: no RDMA device, no ACTIVE port, perftest not on PATH. ERROR naming the NIC and rail: perftest's own error
line (``Couldn't connect``, ``Unable to find the Infiniband/RoCE device``) or no result.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, RequiredMetric, require
from gpuaccept.checks.fabric_watch import DELTA_METRICS, DELTA_RULES, FabricWatch
from gpuaccept.errors import ConfigError, InputError, UsageError
from gpuaccept.hw.rdma import IB_CLASS, Inventory, read_inventory
from gpuaccept.model import Status, worst
from gpuaccept.perftest.judge import DEFAULT_FRACTION, Ends, Judgement, data_rate_gbps, judge
from gpuaccept.perftest.loopback import (
    LoopbackRun,
    cuda_choice,
    device_rails,
    help_of,
    loopback_plan,
    memory_choice,
    nic_gpus,
    run_loopback,
)
from gpuaccept.perftest.parse import parse_text
from gpuaccept.perftest.plan import DEFAULT_ARGS, DEFAULT_BASE_PORT, gpudirect, rail_nics

TESTS = ("write_bw", "read_bw", "send_bw")
MAX_LISTED = 4
"""NICs not passed that the reason names; the rest are in ``details.nics``."""
PACKAGE = "perftest (Debian/Ubuntu: apt-get install perftest; RHEL: dnf install perftest)"


def sysfs_root(param: str, env: Mapping[str, str]) -> str:
    """The ``root`` parameter, else ``$GPUACCEPT_SYSFS_ROOT`` (a container mounting the host's /sys elsewhere),
    else ``/``."""
    return param or env.get("GPUACCEPT_SYSFS_ROOT") or "/"


def judge_nic(run: LoopbackRun, rate_gbps: float | None, port: int, params: dict[str, Any]) -> Judgement:
    """One NIC's verdict from its loopback run (pure): the client's output (the server's where no client ran,
    or where it printed nothing), judged against ``fraction`` x the port's data rate; metrics tagged with
    the NIC, port, rail and memory."""
    pair = run.pair
    nic, rail = pair.server_nic, pair.rail
    ends = Ends(client=f"rail {rail} ({nic})", server="itself (loopback)")
    text, code = run.client_output, run.client_exit
    if not text.strip() or (run.client_exit is None and run.server_exit not in (0, None)):
        text, code = run.server_output, run.server_exit
    try:
        result = parse_text(text)
    except InputError as exc:
        last = (text.strip().splitlines() or ["no output"])[-1]
        how = "killed at the timeout" if code is None else f"exit {code}"
        return Judgement(Status.ERROR, f"{pair.server_argv[0]} rail {rail} ({nic}): {exc} ({how}; last line: "
                                       f"{last[:200]})")
    min_gbps = float(params.get("min_gbps") or 0.0) or None
    j = judge(result, rate_gbps=rate_gbps, rate_source=f"{nic}:{port} data rate",
              fraction=float(params.get("fraction", DEFAULT_FRACTION)), min_gbps=min_gbps,
              min_source="min_gbps", ends=ends, returncode=code)
    if j.reason.startswith("perftest "):  # an output without its title (an error before it): name the binary
        j.reason = pair.server_argv[0] + j.reason[len("perftest"):]
    memory = "host" if pair.gpu is None else f"cuda:{pair.gpu}"
    for m in j.metrics:
        m.tags.pop("device", None)
        m.tags.update({"nic": nic, "port": port, "rail": rail, "memory": memory})
        m.device = f"{nic}:{port}"
    return j


def active_ports(inv: Inventory) -> dict[str, Any]:
    """Each device's first ACTIVE port (its :class:`gpuaccept.hw.rdma.RdmaPort`), by device name."""
    out: dict[str, Any] = {}
    for p in inv.ports:
        if p.up and p.device not in out:
            out[p.device] = p
    return out


class RdmaCheck(Check):
    """Each NIC's RDMA write bandwidth by perftest in loopback, against its port's data rate."""

    name = "rdma"
    tag = "RDMA"
    summary = "per NIC: perftest ib_write_bw in loopback (GPUDirect where it can), against the port's data rate"
    params: ClassVar[tuple[Param, ...]] = (
        Param("root", "str", "", "filesystem root of the sysfs tree read ('': $GPUACCEPT_SYSFS_ROOT, else /)"),
        Param("test", "str", "write_bw", "perftest bandwidth test, run as ib_<test>", choices=TESTS),
        Param("args", "list", list(DEFAULT_ARGS), "perftest arguments (-d, -p, -i and --use_cuda are set per NIC)"),
        Param("fraction", "float", DEFAULT_FRACTION, "of the port's data rate, the least a NIC must reach",
              minimum=0.01, maximum=2.0),
        Param("min_gbps", "float", 0.0, "the least Gb/s per NIC instead of the fraction (0: the fraction)",
              minimum=0, maximum=10000.0),
        Param("memory", "str", "auto", "buffers in GPU memory (--use_cuda) or host memory",
              choices=("auto", "cuda", "host")),
        Param("parallel", "int", 1, "NICs measured at once (each on its own port)", minimum=1, maximum=64),
        Param("base_port", "int", DEFAULT_BASE_PORT, "perftest port of rail 0 (rail i: base_port + i)",
              minimum=1024, maximum=65000),
        Param("nic_timeout_s", "float", 60.0, "seconds one NIC's run may take before it is killed",
              minimum=5.0, maximum=3600.0),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"args": ["-s", "1048576", "-D", "10", "-F", "--report_gbits"]},
        "burnin": {"args": ["-s", "1048576", "-D", "30", "-F", "--report_gbits"], "nic_timeout_s": 120.0},
    }
    thresholds = DELTA_RULES
    timeout_s: ClassVar[dict[str, float]] = {"standard": 300.0, "full": 600.0, "burnin": 1200.0}
    profiles: ClassVar[tuple[str, ...]] = ("standard", "full", "burnin")
    key_metric = "rdma_write_bw_gbps"
    metrics = (*(f"rdma_{t}_gbps" for t in TESTS), *(f"rdma_{t}_peak_gbps" for t in TESTS), *DELTA_METRICS)

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float | None:
        """:func:`gpuaccept.checks.estimates.rdma` with this node's NICs with an ACTIVE port (sysfs), or, where
        sysfs has no RDMA class at all, None: one NIC per GPU assumed."""
        root = sysfs_root(str(params.get("root", "")), os.environ)
        nics = len(rail_nics(read_inventory(root))) if (Path(root) / IB_CLASS).is_dir() else None
        return estimates.rdma(params, device, gpus, nics)

    @classmethod
    def preflight(cls, params: dict[str, Any], source: str, key: str) -> None:
        """A ``root`` given that is no directory (a typo, not a node without RDMA), or ``args`` that set what the
        plan sets per NIC (``-d``, ``-p``, ``-i``, ``--use_cuda``): ConfigError (exit 2)."""
        root = str(params.get("root", ""))
        if root and not Path(root).is_dir():
            raise ConfigError(source, f"{key}.root", f"{root!r} is not a directory (the root of a sysfs tree)")
        try:
            loopback_plan(["mlx5_0"], test=str(params.get("test", "write_bw")), args=list(params.get("args", [])))
        except UsageError as exc:
            raise ConfigError(source, f"{key}.args", str(exc)) from None

    def run(self, ctx: CheckContext) -> Outcome:
        p = ctx.params
        root = sysfs_root(str(p.get("root", "")), os.environ)
        inv = read_inventory(root)
        if not inv.devices:
            return Outcome.skip(f"no RDMA device under {Path(root) / IB_CLASS} (not an RDMA node, or its drivers "
                                "are not loaded)", root=root)
        ports = active_ports(inv)
        nics = rail_nics(inv)
        if not nics:
            down = ", ".join(f"{q.key} {q.state or '?'}/{q.phys_state or '?'}" for q in inv.ports)
            return Outcome.skip(f"no ACTIVE RDMA port: {down or 'no ports'}", root=root)
        binary = shutil.which(f"ib_{p['test']}")
        if binary is None:
            return Outcome.skip(f"perftest not found: no ib_{p['test']} on PATH; install {PACKAGE}")
        help_text = None
        if p["memory"] == "auto" and ctx.device != "cpu" and gpudirect(inv):
            help_text = help_of(binary)
        cuda, why = memory_choice(inv, p["memory"], ctx.device, help_text)
        gpus = nic_gpus(inv, nics) if cuda else {}
        if cuda and not gpus:
            return Outcome(Status.ERROR, "memory=cuda but sysfs shows no NVIDIA GPU on this node")
        ordinals, bus_ids, hidden = cuda_choice(gpus, binary if cuda else None, help_text, os.environ)
        if hidden:
            cuda, gpus, why = False, {}, hidden
        try:
            plan = loopback_plan(nics, test=p["test"], gpus=ordinals if cuda else None, bus_ids=bus_ids,
                                 base_port=int(p["base_port"]), args=list(p["args"]), rails=device_rails(inv),
                                 ib_ports={n: q.port for n, q in ports.items()})
        except UsageError as exc:
            return Outcome(Status.ERROR, str(exc))
        rates = {n: data_rate_gbps(q.rate_gbps, q.speed, q.link_layer) if q.rate_gbps is not None else None
                 for n, q in ports.items()}
        watch = FabricWatch.start(root)
        deadline = time.monotonic() + ctx.timeout_s * 0.95
        ctx.log(f"{len(plan)} NIC(s) by loopback, {p['parallel']} at once, {why}")

        def one(pair: Any) -> LoopbackRun:
            limit = max(1.0, min(float(p["nic_timeout_s"]), deadline - time.monotonic()))
            ctx.log("$ " + " ".join(pair.server_argv) + " &  " + " ".join(pair.client_argv))
            return run_loopback(pair, timeout_s=limit)

        with ThreadPoolExecutor(max_workers=min(int(p["parallel"]), len(plan))) as pool:
            runs = list(pool.map(one, plan))
        judged = [judge_nic(r, rates.get(r.pair.server_nic), ports[r.pair.server_nic].port, p) for r in runs]
        outcome = _outcome(runs, judged, why, gpus)
        outcome = require(outcome, [RequiredMetric(f"rdma_{p['test']}_gbps", f"{n}:{ports[n].port}") for n in nics])
        return watch.finish(outcome) if watch is not None else outcome


def _outcome(runs: list[LoopbackRun], judged: list[Judgement], why: str, gpus: dict[str, Any]) -> Outcome:
    """The check's outcome from each NIC's verdict: the bad NICs first in the reason, then the others."""
    status = worst(*(j.status for j in judged))
    bad = [j.reason for j in judged if j.status is not Status.PASS]
    good = [j for j in judged if j.status is Status.PASS]
    summary = f"{len(runs)} NIC(s) by loopback, {why}"
    if len(bad) > MAX_LISTED:
        bad = [*bad[:MAX_LISTED], f"and {len(bad) - MAX_LISTED} more NIC(s) not passed (details.nics)"]
    reason = "; ".join([*bad, summary] if bad else [summary, *(j.reason for j in good)])
    details = {"memory": why, "nics": [
        {"rail": r.pair.rail, "nic": r.pair.server_nic, "tcp_port": r.pair.port, "status": j.status.value,
         "gpu": None if r.pair.gpu is None else {"index": r.pair.gpu, "why": gpus[r.pair.server_nic].why,
                                                 "pci_address": gpus[r.pair.server_nic].pci_address},
         "server_argv": list(r.pair.server_argv), "client_argv": list(r.pair.client_argv),
         "server_exit": r.server_exit, "client_exit": r.client_exit, "seconds": round(r.seconds, 2),
         "client_output_tail": r.client_output[-1500:], "server_output_tail": r.server_output[-1500:]}
        for r, j in zip(runs, judged, strict=True)]}
    return Outcome(status, reason, [m for j in judged for m in j.metrics], details)


CHECKS = (RdmaCheck,)
