"""The one judging path for busbw at the large sizes: the ``collectives`` check, the ``nccl_tests``
check and ``gpuaccept nccl-tests`` all take their expectation and bound from :func:`busbw_reference`.

Precedence (first that applies):

1. a fleet baseline: ``gpuaccept run --baseline`` overlays its value and bound on the metric after
   the check (:func:`gpuaccept.results.baseline_judge.overlay_baseline`); ``baseline`` here is the
   same for callers that hold one;
2. an explicit bound: ``min_busbw_gbs`` of either check, ``--min-busbw`` of the CLI;
3. the fabric-derived expectation (:mod:`gpuaccept.hw.fabric_expect`) x :data:`FABRIC_TOLERANCE`,
   with the expectation's severity (WARN over PCIe, else FAIL).

The fabric figure is the metric's ``expected`` (``expected_source`` its label, ``fabric: ...``)
whenever it is known and no baseline replaced it, so every report shows it next to the measured
busbw. Equivalent by hand: the last row's busbw of ``all_reduce_perf -b 8 -e 8G -f 2 -g 8`` >=
expected x 0.8.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpuaccept.hw.fabric_expect import Expectation, FabricInputs, NodeNics, expect_busbw, gpu_links
from gpuaccept.model import Status, Threshold

if TYPE_CHECKING:
    from gpuaccept.hw.nvml import NvmlSnapshot
    from gpuaccept.nccltests.parse import NcclTestsResult

FABRIC_TOLERANCE = 0.8
"""The share of the fabric-derived expectation a run must reach at the large sizes."""


@dataclass(frozen=True)
class Reference:
    """What a busbw metric is judged against: ``expected`` (GB/s) and its label, and the bound."""

    expected: float | None = None
    expected_source: str | None = None
    threshold: Threshold | None = None


def busbw_reference(fabric: Expectation | None = None, *, min_busbw_gbs: float | None = None,
                    min_source: str = "param:min_busbw_gbs", baseline: Reference | None = None) -> Reference:
    """The expectation and bound of one op's ``<op>_busbw_large_gbs`` metric (see the module doc)."""
    if baseline is not None and (baseline.threshold is not None or baseline.expected is not None):
        return baseline
    expected = fabric.gbs if fabric is not None else None
    source = fabric.source if fabric is not None else None
    if min_busbw_gbs:
        return Reference(expected, source, Threshold(">=", float(min_busbw_gbs), Status.FAIL, min_source))
    if fabric is None:
        return Reference()
    bound = Threshold(">=", round(fabric.gbs * FABRIC_TOLERANCE, 3), fabric.severity,
                      f"fabric:{fabric.path} x {FABRIC_TOLERANCE:g}")
    return Reference(expected, source, bound)


def busbw_verdict(value: float, ref: Reference) -> Status:
    """PASS when ``value`` meets the bound (or there is none), else the bound's severity."""
    if ref.threshold is None or ref.threshold.met_by(value):
        return Status.PASS
    return ref.threshold.severity


def describe(ref: Reference) -> str:
    """``expected 337.5 GB/s (fabric: ...), bound >= 270 GB/s (fabric:nvlink x 0.8)``; "" without either."""
    parts = []
    if ref.expected is not None:
        parts.append(f"expected {ref.expected:.4g} GB/s ({ref.expected_source})")
    if ref.threshold is not None:
        parts.append(f"bound {ref.threshold.op} {ref.threshold.value:.4g} GB/s ({ref.threshold.source})")
    return ", ".join(parts)


@dataclass(frozen=True)
class FabricFacts:
    """What a nccl-tests run knows of its fabric besides its log: an NVML snapshot of a node's GPUs
    (``python -m gpuaccept.hw.nvml --dump``), that node's NICs (:func:`gpuaccept.hw.fabric_expect.node_nics`
    of its sysfs, taken to stand for every node of the run) and whether NVLink joins every GPU pair."""

    snapshot: NvmlSnapshot | None = None
    nics: NodeNics | None = None
    all_pairs: bool | None = None


def result_fabric(result: NcclTestsResult, op: str, facts: FabricFacts | None = None
                  ) -> tuple[Expectation | None, str]:
    """The fabric expectation of a parsed nccl-tests run of ``op`` (collectives spelling): nodes and
    GPUs per node from its ``# Rank`` lines, the SKU from the GPU name (the snapshot's, else the log's)."""
    from gpuaccept.hw.nvml import UNSUPPORTED
    from gpuaccept.hw.sku import match_sku

    facts = facts or FabricFacts()
    hosts = result.hosts
    nodes = max(len(hosts), 1)
    per_node = max(len(result.devices) // nodes, 1) if result.devices else 0
    snap = facts.snapshot
    names = [g.name for g in snap.gpus if g.name != UNSUPPORTED] if snap is not None else []
    names = names or [d.name for d in result.devices]
    if not per_node:
        if snap is None or not snap.gpus:
            return None, "the log names no ranks: no fabric expectation"
        per_node = len(snap.gpus)
    sku = match_sku(names[0]) if names else None
    gpus = [gpu_links(g) for g in snap.gpus][:per_node] if snap is not None and snap.gpus else None
    nics = [replace(facts.nics, host=h) for h in (hosts or ["this node"])] if facts.nics is not None else None
    return expect_busbw(op, FabricInputs(sku, nodes, per_node, gpus, facts.all_pairs, nics))


def live_facts(visible: str | None, fabric_root: str | None = "/") -> FabricFacts:
    """:class:`FabricFacts` of this node: NVML for the GPUs ``CUDA_VISIBLE_DEVICES=visible`` shows, the NVLink
    P2P matrix between them, and the RDMA ports under ``fabric_root`` (None: not read). Empty where NVML
    or sysfs cannot tell."""
    from gpuaccept.errors import GpuacceptError
    from gpuaccept.hw.fabric_expect import node_nics
    from gpuaccept.hw.nvml import read_visible_snapshot
    from gpuaccept.hw.p2p import joins_every_pair, nvlink_matrix

    snap = None
    all_pairs = None
    try:
        snap = read_visible_snapshot(visible, sample_s=0.0)
        uuids = [g.uuid for g in snap.gpus if isinstance(g.uuid, str) and g.uuid != "unsupported"]
        matrix = nvlink_matrix(uuids) if len(uuids) == len(snap.gpus) else None
        all_pairs = joins_every_pair(matrix) if matrix is not None else None
    except GpuacceptError:
        pass
    nics = None
    if fabric_root is not None:
        try:
            from gpuaccept.hw.rdma import read_inventory

            nics = node_nics(read_inventory(fabric_root).ports)
        except GpuacceptError:
            pass
    return FabricFacts(snap, nics, all_pairs)

