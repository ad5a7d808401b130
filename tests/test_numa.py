"""NUMA placement of the H2D/D2H measurement: sysfs readers on planted trees, binding, and the memory check's use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks import memory
from gpuaccept.checks.memory import CopyResult, MemoryCheck, measure_pinned_numa, pinned_tags
from gpuaccept.hw.numa import (
    NumaBinding,
    bound_to,
    current_affinity,
    node_cpus,
    parse_cpulist,
    pci_numa_node,
    plan_binding,
    sysfs_pci_id,
)

DATA = Path(__file__).parent / "data" / "numa"
TWO = str(DATA / "two_socket")
ONE = str(DATA / "single_node")
ALL = set(range(64))

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity here")


@pytest.mark.parametrize(("text", "cpus"), [("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", []),
                                            ("\n", []), ("2-3,0-1", [0, 1, 2, 3])])
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("bad", ["a-b", "3-1", "1-", "-1"])
def test_parse_cpulist_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)


def test_sysfs_pci_id_from_nvml_and_torch_forms() -> None:
    assert sysfs_pci_id("00000000:18:00.0") == "0000:18:00.0"  # NVML
    assert sysfs_pci_id("0000:9A:00.0") == "0000:9a:00.0"
    assert sysfs_pci_id("00000001:9a:00.0") == "0001:9a:00.0"
    with pytest.raises(ValueError):
        sysfs_pci_id("18:00.0")


def test_readers_on_planted_trees() -> None:
    assert pci_numa_node("00000000:18:00.0", TWO) == 0
    assert pci_numa_node("0000:9A:00.0", TWO) == 1
    assert pci_numa_node("0000:18:00.0", ONE) is None  # -1
    assert pci_numa_node("0000:77:00.0", TWO) is None  # absent
    assert node_cpus(0, TWO) == [0, 1, 4] and node_cpus(1, TWO) == [2, 3, 5, 6]
    assert node_cpus(3, TWO) == [] and node_cpus(9, TWO) == []


def test_plan_binding_picks_the_gpus_node() -> None:
    local = plan_binding("00000000:9a:00.0", ALL, TWO)
    assert local.bound and local.node == 1 and local.cpus == (2, 3, 5, 6)
    assert "bound to node 1" in local.reason
    # a cpuset that allows only some of the node's CPUs: those
    assert plan_binding("0000:9a:00.0", {0, 1, 5}, TWO).cpus == (5,)


@pytest.mark.parametrize(("bus", "root", "allowed", "says"), [
    ("0000:18:00.0", ONE, ALL, "numa_node is -1 or absent"),
    ("0000:77:00.0", TWO, ALL, "numa_node is -1 or absent"),
    ("0000:18:00.0", "/nonexistent", ALL, "numa_node is -1 or absent"),
    ("0000:ab:00.0", TWO, ALL, "node 3 lists no CPUs"),
    ("0000:9a:00.0", TWO, {0, 1}, "none of node 1's CPUs"),
    (None, TWO, ALL, "PCI bus id is unknown"),
    ("garbage", TWO, ALL, "unrecognised PCI bus id"),
])
def test_plan_binding_unbound_says_why(bus: str | None, root: str, allowed: set[int], says: str) -> None:
    b = plan_binding(bus, allowed, root)
    assert not b.bound and b.node is None and b.cpus == ()
    assert says in b.reason and "measured unbound" in b.reason


@needs_affinity
def test_bound_to_binds_the_thread_and_restores() -> None:
    before = os.sched_getaffinity(0)
    one = min(before)
    with bound_to((one,)) as bound:
        assert bound and os.sched_getaffinity(0) == {one}
    assert os.sched_getaffinity(0) == before
    with pytest.raises(RuntimeError), bound_to((one,)):
        raise RuntimeError("boom")
    assert os.sched_getaffinity(0) == before
    with bound_to(None) as bound:
        assert not bound and os.sched_getaffinity(0) == before
    assert current_affinity() == before


def _fake_copy() -> CopyResult:
    return CopyResult(gbs=25.0, seconds=1.0, iterations=1, bytes_per_iter=1 << 20, mismatches=0)


@needs_affinity
def test_pinned_measurement_runs_bound_with_buffers_allocated_after_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix the pinned copies ran wherever the thread was, on cached pinned blocks."""
    events: list[Any] = []
    here = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)

    def fake_measure(device: Any, nbytes: int, iterations: int, warmup: int) -> tuple[CopyResult, CopyResult]:
        events.append(("measure", os.sched_getaffinity(0)))
        return _fake_copy(), _fake_copy()

    monkeypatch.setattr(memory, "measure_pinned", fake_measure)
    monkeypatch.setattr(memory, "release_pinned_cache",
                        lambda: events.append(("release", os.sched_getaffinity(0))))
    binding = NumaBinding(1, (here,), "bound to node 1")
    h2d, _d2h, bound = measure_pinned_numa("cuda:0", 1 << 20, 1, 0, binding)
    assert bound
    assert events == [("release", {here}), ("measure", {here}), ("release", {here})]
    assert os.sched_getaffinity(0) == before
    assert pinned_tags(h2d, binding, bound) == {"size_bytes": 1 << 20, "numa_node": 1}

    events.clear()
    unbound = NumaBinding(None, (), "numa_node is -1 or absent: measured unbound")
    h2d, _d2h, bound = measure_pinned_numa("cuda:0", 1 << 20, 1, 0, unbound)
    assert not bound and events[1] == ("measure", before)
    assert pinned_tags(h2d, unbound, bound)["numa_node"] == -1


def test_memory_check_declares_numa_params() -> None:
    for profile in ("quick", "standard", "full"):
        values = MemoryCheck.defaults(profile)
        assert values["numa_bind"] is True and values["root"] == "/"


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_pinned_copies_on_gpu_report_the_node_used() -> None:
    import torch

    from gpuaccept.checks.base import CheckContext
    from gpuaccept.model import Status

    params = MemoryCheck.defaults("quick")
    out = MemoryCheck().run(CheckContext(device="cuda", params=params, gpus=[0]))
    assert out.status in (Status.PASS, Status.WARN), out.reason
    h2d = next(m for m in out.metrics if m.name == "h2d_pinned_gbs")
    bus = memory.torch_pci_bus_id(torch.device("cuda", 0))
    node = pci_numa_node(bus, "/") if bus else None
    why = out.details["devices"]["cuda:0"]["numa"]
    if node is None:
        assert h2d.tags["numa_node"] == -1 and "measured unbound" in why
    else:  # bound to the GPU's node unless a cpuset keeps this process off it, which the details say
        assert h2d.tags["numa_node"] == node or (h2d.tags["numa_node"] == -1 and "measured unbound" in why), why
