"""A PCI device's NUMA node and its CPUs, from sysfs under a root, and binding the calling thread to them.

``<root>/sys/bus/pci/devices/<pci id>/numa_node`` (-1: the firmware does not
say, or one node) and ``<root>/sys/devices/system/node/node<N>/cpulist``.
Equivalent: ``nvidia-smi topo -m`` (CPU and NUMA affinity columns) and
``numactl --cpunodebind=N --membind=N``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format); ValueError when malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"bad cpulist range {part!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def sysfs_pci_id(bus_id: str) -> str:
    """An NVML/CUDA PCI bus id as sysfs names it: ``00000000:18:00.0`` -> ``0000:18:00.0`` (lower case)."""
    domain, sep, rest = bus_id.strip().lower().rpartition(":")
    head, _, bus = domain.rpartition(":")
    if not sep or not head:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return f"{int(head, 16):04x}:{bus}:{rest}"


def pci_numa_node(bus_id: str, root: str = "/") -> int | None:
    """NUMA node of PCI device ``bus_id`` (``cat /sys/bus/pci/devices/<id>/numa_node``); None for -1 or unreadable."""
    path = Path(root) / "sys/bus/pci/devices" / sysfs_pci_id(bus_id) / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def node_cpus(node: int, root: str = "/") -> list[int]:
    """CPUs of NUMA node ``node`` (``cat /sys/devices/system/node/node<N>/cpulist``); [] when unreadable."""
    path = Path(root) / f"sys/devices/system/node/node{node}/cpulist"
    try:
        return parse_cpulist(path.read_text())
    except (OSError, ValueError):
        return []


@dataclass(frozen=True)
class NumaBinding:
    """Where to run a host-side measurement for one device: ``node`` and ``cpus``, or unbound with ``reason``."""

    node: int | None
    cpus: tuple[int, ...]
    reason: str

    @property
    def bound(self) -> bool:
        return self.node is not None and bool(self.cpus)


def plan_binding(bus_id: str | None, allowed: set[int], root: str = "/") -> NumaBinding:
    """The binding for the device at ``bus_id``: its node's CPUs that ``allowed`` (this process's affinity) permits.

    Unbound, with the reason, when the bus id is unknown, ``numa_node`` is -1 or
    absent, the node lists no CPUs, or none of them is allowed here (a cpuset).
    """
    if not bus_id:
        return NumaBinding(None, (), "the device's PCI bus id is unknown: measured unbound")
    try:
        pci = sysfs_pci_id(bus_id)
    except ValueError:
        return NumaBinding(None, (), f"unrecognised PCI bus id {bus_id!r}: measured unbound")
    node = pci_numa_node(bus_id, root)
    if node is None:
        return NumaBinding(None, (), f"{pci}: numa_node is -1 or absent (one node, or the firmware does not say): "
                                     f"measured unbound")
    cpus = node_cpus(node, root)
    if not cpus:
        return NumaBinding(None, (), f"{pci}: node {node} lists no CPUs: measured unbound")
    usable = tuple(c for c in cpus if c in allowed)
    if not usable:
        return NumaBinding(None, (), f"{pci}: none of node {node}'s CPUs is in this process's affinity: "
                                     f"measured unbound")
    return NumaBinding(node, usable, f"{pci}: bound to node {node} ({len(usable)} CPUs)")


def current_affinity() -> set[int]:
    """CPUs the calling thread may run on (``taskset -p $$``); all of ``os.cpu_count()`` where not supported."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


@contextlib.contextmanager
def bound_to(cpus: tuple[int, ...] | None) -> Iterator[bool]:
    """Run the block with the calling thread on ``cpus`` (``taskset -c``), then restore its affinity.

    Yields whether it bound; None or an empty tuple, or a platform without
    ``sched_setaffinity``, leaves the affinity alone. Memory first touched
    (or pinned) inside the block is placed on the node of those CPUs under the
    default local policy.
    """
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield False
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setaffinity(0, before)
