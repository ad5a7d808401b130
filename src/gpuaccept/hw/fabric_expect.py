"""The bus bandwidth a run may expect, derived from the fabric the nodes report (pure; no torch).

Busbw is nccl-tests' figure, in GB/s (10^9 B/s): allreduce busbw = algbw x 2(n-1)/n,
allgather, reducescatter and alltoall busbw = algbw x (n-1)/n (n ranks), which makes a ring's
busbw equal to the rate of its slowest link for every op. The model, per op of
:data:`MODELLED_OPS` (allreduce, allgather, reducescatter, broadcast: ring; alltoall and sendrecv: below):

- **NVLink** (one node, NVLink joins every pair of GPUs: the SKU is ``nvlink_all_pairs`` (NVSwitch
  or full mesh) or NVML reports NVLink P2P between every pair): ceiling = min over the GPUs of
  active NVLink links x per-link rate of the generation (:data:`NVLINK_LINK_GBS`, per direction:
  NVLink 4 (H100) 18 x 25 = 450 GB/s), at most the SKU's ``nvlink_gbs / 2``. The generation comes
  from the compute capability (:data:`NVLINK_GEN_BY_CC`): NVML's ``nvmlDeviceGetNvLinkVersion``
  is not used, as drivers report NVLink 5 for H100. Without NVML the SKU's figure stands alone.
- **PCIe** (GPUs not all joined by NVLink): ceiling = min over the GPUs of the PCIe per-direction
  rate of the link's maximum generation and width (gen5 x16: 63 GB/s; ``pcie_link_gen_max``,
  ``pcie_link_width_max``: idle links train down). Severity WARN: busbw over PCIe depends on
  switches, sockets and P2P settings as much as on the links.
- **Network** (ranks on several nodes): per node, NICs = the active RDMA ports (ACTIVE, LinkUp) at
  the node's most common active rate, at most one per GPU of the node; ceiling = NICs x rate / 8
  (8 x NDR 400 Gb/s = 400 GB/s), the smallest over the nodes, and not above the intra-node ceiling.
  Ports at another rate (a front-end NIC, a port trained down) are left out and named; the
  ``fabric`` check judges the ports themselves.
- **alltoall** intra-node as above; across nodes a rank's remote share crosses its NIC share:
  ceiling = (NICs x rate / 8 / G) x (n-1)/(n-G), G ranks per node.
- **broadcast** is a pipelined ring (busbw = algbw): the ring ceiling above.
- **sendrecv** (each rank sends to its ring neighbour, busbw = algbw): intra-node one GPU's link as
  above; across nodes the pair that crosses a node boundary goes through one NIC: ceiling = one
  port's rate / 8 (NDR 400 Gb/s: 50 GB/s), not above the intra-node ceiling.
- Other ops (reduce, gather, scatter) are not modelled: no expectation.

Expected busbw = ceiling x efficiency (:data:`NVLINK_EFFICIENCY`, :data:`PCIE_EFFICIENCY`,
:data:`NETWORK_EFFICIENCY`: the share of the line rate a healthy system reaches at large sizes).
The judged bound is the expectation x ``FABRIC_TOLERANCE`` (:mod:`gpuaccept.nccltests.busbw`).
Equivalent measurement: ``all_reduce_perf -b 8 -e 8G -f 2 -g 8`` (one node) or the same with
``-g 1`` under ``mpirun`` across nodes; compare its last row's busbw with :attr:`Expectation.gbs`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpuaccept.hw.nvml import UNSUPPORTED, GpuSnapshot
from gpuaccept.hw.rdma import RdmaPort
from gpuaccept.hw.sku import Sku, pcie_gbs
from gpuaccept.model import Status

NVLINK_EFFICIENCY = 0.75
"""Share of the per-GPU NVLink rate a healthy all-reduce reaches (8 x H100: about 340 of 450 GB/s)."""
PCIE_EFFICIENCY = 0.6
"""Share of the PCIe per-direction rate a ring through PCIe switches and host bridges reaches."""
NETWORK_EFFICIENCY = 0.85
"""Share of the summed NIC line rate an inter-node all-reduce reaches (IB NDR: about 340 of 400 GB/s)."""
NVLINK_LINK_GBS: dict[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
"""GB/s per direction of one NVLink link, by generation."""
NVLINK_GEN_BY_CC: dict[tuple[int, int], int] = {(6, 0): 1, (7, 0): 2, (7, 5): 2, (8, 0): 3, (9, 0): 4,
                                                 (10, 0): 5, (10, 3): 5}
"""NVLink generation by compute capability (P100, V100, Turing, A100, H100/H200, B200/GB200, B300)."""
MODELLED_OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")
RING_OPS = ("allreduce", "allgather", "reducescatter", "broadcast")


@dataclass(frozen=True)
class GpuLinks:
    """One GPU's links as NVML reports them: active NVLink links and the PCIe link's maximum
    generation and width (None: unknown). ``nvidia-smi nvlink -s``, ``nvidia-smi -q -d PCIE``."""

    nvlink_links: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None


@dataclass(frozen=True)
class NodeNics:
    """The NICs one node contributes: ``ports`` active RDMA ports at ``rate_gbps`` (Gb/s) each;
    ``excluded`` active ports at other rates; ``layer`` InfiniBand or Ethernet (RoCE)."""

    host: str
    ports: int
    rate_gbps: float
    speed: str | None = None
    layer: str | None = None
    excluded: int = 0


@dataclass(frozen=True)
class Expectation:
    """An expected busbw: ``gbs`` = ``ceiling_gbs`` x ``efficiency`` (GB/s), from ``path``
    (nvlink, pcie or network); ``source`` is the label reports show; a miss is ``severity``."""

    ceiling_gbs: float
    efficiency: float
    path: str
    source: str
    severity: Status = Status.FAIL

    @property
    def gbs(self) -> float:
        return round(self.ceiling_gbs * self.efficiency, 3)


@dataclass(frozen=True)
class FabricInputs:
    """What a run knows of its fabric. ``gpus``: NVML links of the ranks' GPUs (None: NVML
    unavailable); ``all_pairs``: NVML reports NVLink P2P between every pair (None: unknown);
    ``nics``: one entry per node (None: RDMA ports not read)."""

    sku: Sku | None
    num_nodes: int
    gpus_per_node: int
    gpus: Sequence[GpuLinks] | None = None
    all_pairs: bool | None = None
    nics: Sequence[NodeNics] | None = None
    compute_capability: tuple[int, int] | None = None


def _known_int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v != UNSUPPORTED else None


def gpu_links(g: GpuSnapshot) -> GpuLinks:
    """:class:`GpuLinks` of one NVML snapshot GPU (``python -m gpuaccept.hw.nvml --dump``)."""
    links = sum(g.nvlink_active) if isinstance(g.nvlink_active, list) else None
    return GpuLinks(links, _known_int(g.pcie_link_gen_max), _known_int(g.pcie_link_width_max))


def node_nics(ports: Sequence[RdmaPort], host: str = "") -> NodeNics | None:
    """The NICs of one node from its RDMA ports (:func:`gpuaccept.hw.rdma.read_inventory`): the
    active ports at the most common active rate (ties: the faster); None without an active port."""
    up = [p for p in ports if p.up and p.rate_gbps]
    if not up:
        return None
    counts = Counter(p.rate_gbps for p in up)
    rate = max(counts, key=lambda r: (counts[r], r))
    chosen = [p for p in up if p.rate_gbps == rate]
    assert rate is not None
    return NodeNics(host, len(chosen), float(rate), chosen[0].speed, chosen[0].link_layer, len(up) - len(chosen))


def nvlink_generation(cc: tuple[int, int] | None) -> int | None:
    """NVLink generation of a GPU of compute capability ``cc``; None when unknown or without NVLink."""
    return NVLINK_GEN_BY_CC.get(cc) if cc is not None else None


def _nvlink(inp: FabricInputs) -> tuple[Expectation | None, str]:
    sku = inp.sku
    assert sku is not None and sku.nvlink_gbs
    sku_dir = sku.nvlink_gbs / 2
    gen = nvlink_generation(inp.compute_capability or sku.compute_capability)
    links = [g.nvlink_links for g in inp.gpus or () if g.nvlink_links is not None]
    if gen is None or not links or len(links) < len(inp.gpus or ()):
        what = f"{sku.id}: NVLink {sku_dir:g} GB/s per GPU per direction (SKU table; NVML link count unknown)"
        label = f"fabric: {what}, efficiency {NVLINK_EFFICIENCY}"
        return Expectation(sku_dir, NVLINK_EFFICIENCY, "nvlink", label), what
    low = min(links)
    ceiling = min(low * NVLINK_LINK_GBS[gen], sku_dir)
    span = f"{low} links" if low == max(links) else f"{low} links (fewest of {len(links)} GPUs)"
    what = f"NVLink{gen} {span} x {NVLINK_LINK_GBS[gen]:g} GB/s per GPU = {ceiling:g} GB/s per direction"
    if ceiling <= 0:
        return None, f"{what}: no active NVLink link"
    return Expectation(ceiling, NVLINK_EFFICIENCY, "nvlink", f"fabric: {what}, efficiency {NVLINK_EFFICIENCY}"), what


def _pcie(inp: FabricInputs) -> tuple[Expectation | None, str]:
    known = [(g.pcie_gen, g.pcie_width) for g in inp.gpus or () if g.pcie_gen and g.pcie_width]
    if not known or len(known) < len(inp.gpus or ()):
        return None, "PCIe generation and width unknown (NVML unavailable): no intra-node expectation"
    try:
        gen, width = min(known, key=lambda gw: pcie_gbs(gw[0], gw[1]))
        ceiling = round(pcie_gbs(gen, width), 3)
    except KeyError:
        return None, f"PCIe generation {min(known)[0]} unknown: no intra-node expectation"
    what = f"PCIe gen{gen} x{width} = {ceiling:g} GB/s per direction"
    return Expectation(ceiling, PCIE_EFFICIENCY, "pcie", f"fabric: {what}, efficiency {PCIE_EFFICIENCY}",
                       Status.WARN), what


def intra_node(inp: FabricInputs) -> tuple[Expectation | None, str]:
    """The intra-node expectation (NVLink or PCIe, see the module doc) and why."""
    sku = inp.sku
    if sku is not None and sku.nvlink_gbs and (sku.nvlink_all_pairs or inp.all_pairs):
        return _nvlink(inp)
    return _pcie(inp)


def _network(inp: FabricInputs, op: str) -> tuple[Expectation | None, str]:
    nics = list(inp.nics or ())
    if not nics or len(nics) < inp.num_nodes:
        missing = inp.num_nodes - len(nics)
        return None, f"RDMA ports of {missing} of {inp.num_nodes} nodes unknown: no network expectation"
    per_node = [(min(n.ports, max(inp.gpus_per_node, 1)) * n.rate_gbps / 8, n) for n in nics]
    gbs, node = min(per_node, key=lambda t: t[0])
    if gbs <= 0:
        return None, f"{node.host or 'a node'} has no active RDMA port: no network expectation"
    used = min(node.ports, max(inp.gpus_per_node, 1))
    kind = "RoCE " if node.layer == "Ethernet" else f"{node.speed} " if node.speed else ""
    what = f"{used}x {kind}{node.rate_gbps:g} Gb/s per node = {gbs:g} GB/s"
    if node.excluded:
        what += f" ({node.excluded} active ports at other rates left out)"
    if op == "sendrecv":
        gbs = node.rate_gbps / 8
        what = f"one {kind}{node.rate_gbps:g} Gb/s port per node boundary = {gbs:g} GB/s (sendrecv)"
    if op == "alltoall":
        g, n = max(inp.gpus_per_node, 1), inp.num_nodes * max(inp.gpus_per_node, 1)
        gbs = gbs / g * (n - 1) / (n - g)
        what += f"; alltoall: / {g} GPUs x {n - 1}/{n - g} = {gbs:.4g} GB/s"
    return Expectation(round(gbs, 3), NETWORK_EFFICIENCY, "network",
                       f"fabric: {what}, efficiency {NETWORK_EFFICIENCY}"), what


def expect_busbw(op: str, inp: FabricInputs) -> tuple[Expectation | None, str]:
    """The expected busbw of ``op`` on the fabric ``inp`` describes, and why (see the module doc).

    ``op`` is the collectives spelling (allreduce, allgather, reducescatter, alltoall, ...).
    """
    if op not in MODELLED_OPS:
        return None, "not modelled, no fabric expectation"
    ranks = inp.num_nodes * inp.gpus_per_node
    if ranks < 2:
        return None, "one rank: no bus traffic, no fabric expectation"
    intra, why = intra_node(inp) if inp.gpus_per_node > 1 else (None, "one GPU per node")
    if inp.num_nodes <= 1:
        return intra, why
    net, net_why = _network(inp, op)
    if net is None:
        return None, net_why
    if intra is not None and intra.gbs < net.gbs:
        return intra, f"{why} (below the network's {net_why})"
    return net, net_why


def expect_all(ops: Sequence[str], inp: FabricInputs) -> tuple[dict[str, Expectation], dict[str, str]]:
    """:func:`expect_busbw` for each op: the expectations (modelled ops only) and why, by op."""
    found: dict[str, Expectation] = {}
    why: dict[str, str] = {}
    for op in dict.fromkeys(ops):
        exp, why[op] = expect_busbw(op, inp)
        if exp is not None:
            found[op] = exp
    return found, why
