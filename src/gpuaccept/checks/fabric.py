"""The ``fabric`` check: RDMA ports, error counters, GPUDirect RDMA, GPU/NIC locality, NCCL selection.

Everything comes from sysfs below the ``root`` parameter (:mod:`gpuaccept.hw.rdma`), so recorded
trees replay in tests, and is judged by the pure function :func:`evaluate_fabric`:

- every port of every RDMA device (``ibstat``): ``rdma_port_up`` (state ACTIVE and phys_state
  LinkUp), ``rdma_port_rate_gbps`` against the expected rate (``expect_rate_gbps``, else the most
  common rate of this node's active ports of the same link layer), ``rdma_ports_active`` against
  ``expect_ports``, the link layer against ``link_layer``;
- the error counters (``perfquery``): totals since the counters were last cleared, and what they
  rose by over ``sample_s`` seconds between two reads (``rdma_<counter>_delta``);
- GPUDirect RDMA: ``nvidia_peermem`` (or the older ``nv_peer_mem``) loaded where there are both
  GPUs and RDMA devices (``lsmod | grep peermem``);
- ``NCCL_SOCKET_IFNAME`` and ``NCCL_IB_HCA`` name interfaces and HCAs that exist;
- ``details.locality``: each GPU's NUMA node and the RDMA devices on it (``nvidia-smi topo -m``).

No RDMA device at all is a SKIP with the reason (unless NCCL is told to use HCAs).
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, RequiredMetric, ThresholdRule, require
from gpuaccept.hw.nccl_env import parse_list
from gpuaccept.hw.rdma import (
    ERROR_COUNTERS,
    IB_CLASS,
    Inventory,
    PortDelta,
    RdmaPort,
    diff,
    locality,
    read_inventory,
    read_snapshot,
)
from gpuaccept.model import Metric, Status, worst

TOTAL_COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors", "excessive_buffer_overrun_errors")
"""Counters whose totals are reported as metrics (the rest are in ``details``)."""

PEERMEM_COST = ("without it NCCL cannot use GPUDirect RDMA and stages inter-node traffic through host "
                "memory (lower inter-node bandwidth, more CPU and PCIe load) unless it uses DMA-BUF "
                "(Linux >= 5.12 with the open GPU kernel modules); load it with `modprobe nvidia_peermem`")


@dataclass(frozen=True)
class Finding:
    """A verdict that is not a number: a state, a name, a missing module, an unreadable file."""

    status: Status
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status.value, "message": self.message}


def _ignored(port: RdmaPort, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(port.device, p) or fnmatch.fnmatchcase(port.key, p) for p in patterns)


def expected_rates(ports: list[RdmaPort], configured: float) -> dict[str, float]:
    """The expected rate in Gb/s per link layer: ``configured`` when > 0, else the most common rate
    among the active ports of that layer (the higher one on a tie)."""
    layers = {p.link_layer or "unknown" for p in ports}
    if configured > 0:
        return dict.fromkeys(layers, configured)
    out = {}
    for layer in layers:
        rates = Counter(p.rate_gbps for p in ports
                        if (p.link_layer or "unknown") == layer and p.up and p.rate_gbps is not None)
        if rates:
            out[layer] = max(rates, key=lambda r: (rates[r], r))
    return out


def nccl_findings(env: Mapping[str, str], inv: Inventory) -> list[Finding]:
    """Do ``NCCL_SOCKET_IFNAME`` and ``NCCL_IB_HCA`` name interfaces and HCAs that exist here?

    A list that selects nothing is a FAIL (NCCL cannot start, or falls back to sockets); an item
    of an inclusion list that matches nothing is a WARN (a typo, or a NIC missing on this node).
    """
    out: list[Finding] = []
    value = env.get("NCCL_SOCKET_IFNAME")
    if value:
        try:
            sel = parse_list(value, ports=False)
        except ValueError as exc:
            out.append(Finding(Status.FAIL, f"NCCL_SOCKET_IFNAME={value!r}: {exc}"))
        else:
            chosen = [n for n in inv.netdevs if sel.selects(n)]
            if not chosen:
                out.append(Finding(Status.FAIL, f"NCCL_SOCKET_IFNAME={value!r} selects none of this node's "
                                                f"interfaces ({', '.join(inv.netdevs) or 'none'})"))
            elif not sel.exclude:
                for e in sel.entries:
                    if not any(sel.entry_matches(e, n) for n in inv.netdevs):
                        out.append(Finding(Status.WARN, f"NCCL_SOCKET_IFNAME item {e.text()!r} matches no interface"))
    value = env.get("NCCL_IB_HCA")
    if value:
        ports = inv.ports
        try:
            sel = parse_list(value, ports=True)
        except ValueError as exc:
            out.append(Finding(Status.FAIL, f"NCCL_IB_HCA={value!r}: {exc}"))
        else:
            chosen_ports = [p.key for p in ports if sel.selects(p.device, p.port)]
            if not chosen_ports:
                have = ", ".join(p.key for p in ports) or "no RDMA devices"
                out.append(Finding(Status.FAIL, f"NCCL_IB_HCA={value!r} selects no RDMA port here ({have})"))
            elif not sel.exclude:
                for e in sel.entries:
                    if not any(sel.entry_matches(e, p.device, p.port) for p in ports):
                        out.append(Finding(Status.WARN, f"NCCL_IB_HCA item {e.text()!r} matches no RDMA device port"))
    return out


def _port_metrics(p: RdmaPort, expected: dict[str, float], delta: PortDelta | None) -> list[Metric]:
    tags: dict[str, str | int | float] = {"hca": p.device, "port": p.port, "link_layer": p.link_layer or "unknown"}
    metrics = [Metric("rdma_port_up", 1.0 if p.up else 0.0, "bool", device=p.key, tags=tags)]
    if p.up and p.rate_gbps is not None:
        metrics.append(Metric("rdma_port_rate_gbps", p.rate_gbps, "Gb/s", device=p.key,
                              expected=expected.get(p.link_layer or "unknown"), tags=tags))
    for name in TOTAL_COUNTERS:
        if name in p.counters:
            metrics.append(Metric(f"rdma_{name}_total", float(p.counters[name]), "count", device=p.key, tags=tags))
    if delta is not None:
        metrics += delta_metrics(delta, tags)
    return metrics


def delta_metrics(delta: PortDelta, tags: Mapping[str, str | int | float]) -> list[Metric]:
    """``rdma_<counter>_delta`` for each error counter of one port (none for a vanished port); the
    fabric check's delta rules (:data:`DELTA_RULES`) judge them wherever they are reported."""
    if delta.vanished:
        return []
    return [Metric(f"rdma_{name}_delta", float(delta.deltas[name]), "count", device=delta.port,
                   tags={**tags, "interval_s": round(delta.interval_s, 3)})
            for name in ERROR_COUNTERS if name in delta.deltas]


DELTA_METRICS = tuple(f"rdma_{name}_delta" for name in ERROR_COUNTERS)
"""The names :func:`delta_metrics` gives (checks that watch the fabric declare them)."""


def _summary(ports: list[RdmaPort], inv: Inventory) -> str:
    up = [p for p in ports if p.up]
    groups = Counter((p.rate_gbps, p.link_layer or "unknown") for p in up)
    text = ", ".join(f"{n}x {'unknown rate' if rate is None else f'{rate:g} Gb/s'} {layer}"
                     for (rate, layer), n in sorted(groups.items(), key=str))
    down = [f"{p.key} {p.state or '?'}/{p.phys_state or '?'}" for p in ports if not p.up]
    out = f"{len(up)}/{len(ports)} RDMA port(s) up" + (f" ({text})" if text else "")
    if down:
        out += f"; down: {', '.join(down)}"
    if inv.gpus:
        out += f"; {len(inv.gpus)} GPU(s), GPUDirect RDMA module {inv.peermem or 'not loaded'}"
    return out


def evaluate_fabric(inv: Inventory, deltas: dict[str, PortDelta] | None, env: Mapping[str, str],
                    params: Mapping[str, Any]) -> Outcome:
    """The fabric verdicts from an inventory, the counter deltas over the sample (None: one read)
    and the environment. Pure, so every branch is testable on recorded trees."""
    ignore = list(params.get("ignore", []))
    all_ports = inv.ports
    ports = [p for p in all_ports if not _ignored(p, ignore)]
    findings = nccl_findings(env, inv)
    details: dict[str, Any] = {
        "root": inv.root,
        "devices": [d.to_dict() for d in inv.devices],
        "ignored_ports": [p.key for p in all_ports if p not in ports],
        "gpus": [{"pci_address": g.pci_address, "device_id": g.device_id, "numa_node": g.numa_node}
                 for g in inv.gpus],
        "locality": locality(inv),
        "netdevs": inv.netdevs,
        "gpudirect_rdma_module": inv.peermem,
        "nccl_env": {k: env[k] for k in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA") if k in env},
    }
    if not ports:
        where = str(Path(inv.root) / IB_CLASS)
        what = (f"every RDMA port is ignored ({', '.join(ignore)})" if all_ports else
                f"no RDMA devices under {where} (not an RDMA node, or the RDMA drivers are not loaded)")
        if not findings:
            return Outcome.skip(f"{what}: fabric not checked", **details)
        details["findings"] = [f.to_dict() for f in findings]
        return Outcome(worst(*(f.status for f in findings)), f"{'; '.join(f.message for f in findings)}; {what}",
                       [], details)

    findings += [Finding(Status.WARN, e) for e in inv.errors]
    layer = str(params.get("link_layer", "any"))
    for p in ports:
        if layer != "any" and (p.link_layer or "").lower() != layer:
            found = p.link_layer or "unknown"
            findings.append(Finding(Status.FAIL, f"{p.key} link layer is {found}, expected {layer}"))
    if inv.gpus and inv.peermem is None and params.get("require_peermem", True):
        findings.append(Finding(Status.WARN, f"{len(inv.gpus)} GPU(s) and {len(inv.devices)} RDMA device(s) but "
                                             f"nvidia_peermem is not loaded: {PEERMEM_COST}"))
    if deltas is not None:
        for p in ports:
            d = deltas.get(p.key)
            if d is not None and d.vanished:
                findings.append(Finding(Status.FAIL, f"{p.key} disappeared while its counters were sampled"))
            elif d is not None and d.reset:
                findings.append(Finding(Status.WARN, f"{p.key} counters went down while sampled (cleared?): "
                                                     f"{', '.join(d.reset)}"))

    expected = expected_rates(ports, float(params.get("expect_rate_gbps", 0.0)))
    metrics: list[Metric] = []
    for p in ports:
        metrics += _port_metrics(p, expected, deltas.get(p.key) if deltas is not None else None)
    expect_ports = int(params.get("expect_ports", 0))
    metrics.append(Metric("rdma_ports_active", float(sum(p.up for p in ports)), "count",
                          expected=float(expect_ports) if expect_ports > 0 else None))
    details["expected_rate_gbps"] = expected
    details["findings"] = [f.to_dict() for f in findings]
    if deltas is not None:
        details["counter_deltas"] = {k: d.rising() for k, d in deltas.items() if d.rising()}
    status = worst(*(f.status for f in findings)) if findings else Status.PASS
    ordered = sorted(findings, key=lambda f: -f.status.severity)
    reason = "; ".join([*(f.message for f in ordered[:4]), _summary(ports, inv)])
    if len(ordered) > 4:
        reason += f" (and {len(ordered) - 4} more finding(s) in details)"
    return require(Outcome(status, reason, metrics, details), [RequiredMetric("rdma_ports_active")]
                   + [RequiredMetric("rdma_port_up", p.key) for p in ports])


class FabricCheck(Check):
    """RDMA ports up at the expected rate, no rising error counters, GPUDirect RDMA, NCCL selection."""

    name = "fabric"
    tag = "FABRIC"
    summary = "RDMA ports (state, rate, link layer), error counters, nvidia_peermem, GPU/NIC NUMA, NCCL env"
    params: ClassVar[tuple[Param, ...]] = (
        Param("root", "str", "/", "filesystem root under which sys/ is read (a recorded tree in tests)"),
        Param("expect_ports", "int", 0, "RDMA ports that must be up (0: not checked)", minimum=0, maximum=1024),
        Param("expect_rate_gbps", "float", 0.0,
              "expected port rate in Gb/s (0: the most common rate of this node's active ports)", minimum=0,
              maximum=10000.0),
        Param("link_layer", "str", "any", "required link layer of every port",
              choices=("any", "infiniband", "ethernet")),
        Param("ignore", "list", [], "RDMA devices or ports to leave out (globs: mlx5_8, mlx5_*:2)"),
        Param("sample_s", "float", 5.0, "seconds between the two counter reads (0: one read, no deltas)",
              minimum=0, maximum=3600.0),
        Param("require_peermem", "bool", True,
              "warn when GPUs and RDMA devices exist but nvidia_peermem is not loaded"),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"sample_s": 1.0}, "standard": {"sample_s": 5.0}, "full": {"sample_s": 30.0},
    }
    thresholds: ClassVar[tuple[ThresholdRule, ...]] = (
        ThresholdRule("rdma_port_up", min=1.0),
        ThresholdRule("rdma_port_rate_gbps", min_fraction=1.0),
        ThresholdRule("rdma_ports_active", min_fraction=1.0),
        ThresholdRule("rdma_link_downed_delta", max=0.0),
        ThresholdRule("rdma_symbol_error_delta", max=0.0, severity=Status.WARN),
        ThresholdRule("rdma_link_error_recovery_delta", max=0.0, severity=Status.WARN),
        ThresholdRule("rdma_port_rcv_errors_delta", max=0.0, severity=Status.WARN),
        ThresholdRule("rdma_local_link_integrity_errors_delta", max=0.0, severity=Status.WARN),
        ThresholdRule("rdma_excessive_buffer_overrun_errors_delta", max=0.0, severity=Status.WARN),
    )
    timeout_s: ClassVar[dict[str, float]] = {"quick": 60.0, "standard": 60.0, "full": 120.0}
    key_metric = "rdma_ports_active"
    metrics = ("rdma_port_up", "rdma_port_rate_gbps", "rdma_ports_active",
               *(f"rdma_{name}_total" for name in TOTAL_COUNTERS), *DELTA_METRICS)
    imports_beside = True  # sysfs reads and counter deltas over sample_s: no CPU or GPU work timed

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """The count of active ports (the per-port state of every port found is required where the
        ports are known: :func:`evaluate_fabric`)."""
        return [RequiredMetric("rdma_ports_active")]

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.fabric(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        root = str(ctx.params.get("root", "/"))
        if not Path(root).is_dir():
            return Outcome.failed(f"fabric root {root!r} is not a directory")
        inv = read_inventory(root)
        deltas = None
        sample = min(float(ctx.params.get("sample_s", 0.0)), ctx.timeout_s / 2)
        if inv.devices and sample > 0:
            before = read_snapshot(root)
            ctx.log(f"sampling RDMA counters of {len(before.ports)} port(s) for {sample:g} s")
            time.sleep(sample)
            deltas = diff(before, read_snapshot(root))
        return evaluate_fabric(inv, deltas, os.environ, ctx.params)


DELTA_RULES: tuple[ThresholdRule, ...] = tuple(r for r in FabricCheck.thresholds if r.metric.endswith("_delta"))
"""The default rules on error counters that rose (``link_downed``: FAIL; the others: WARN), shared with the
checks that read the counters around their own traffic (:mod:`gpuaccept.checks.fabric_watch`)."""

CHECKS = (FabricCheck,)
