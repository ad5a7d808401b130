"""The p2p check's pure parts: pair planning, byte accounting, expectations, judging and the matrix view.

No torch, no NVML: the GPU-side measuring is in :mod:`gpuaccept.checks.p2p`, which feeds what it
measures through these functions, so that everything but the copies themselves is tested on CPU.

Byte accounting (nvbandwidth's convention: a byte copied counts once, not once read and once written):

- unidirectional: ``iterations x N`` bytes over the timed interval, for copies of ``N`` bytes from GPU
  ``i`` to GPU ``j`` (``nvbandwidth -t device_to_device_memcpy_write_ce``; the read variant differs only
  in which GPU's copy engine pulls);
- bidirectional: copies ``i -> j`` and ``j -> i`` run at once on two streams; both directions' bytes
  count, ``2 x iterations x N`` over the interval (``p2pBandwidthLatencyTest``'s "Bidirectional" matrix;
  nvbandwidth's ``*_bidirectional_*`` tests print one direction of it, about half);
- host<->device: ``iterations x N`` per direction from or to pinned host memory
  (``nvbandwidth -t host_to_device_memcpy_ce`` / ``device_to_host_memcpy_ce``);
- latency: the time of one small copy ``i -> j`` in microseconds, the mean over a timed loop
  (``p2pBandwidthLatencyTest``'s "P2P=Enabled Latency" matrix). Measured, not judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuaccept.hw.fabric_expect import FabricInputs, GpuLinks, gpu_links, intra_node
from gpuaccept.hw.nvml import UNSUPPORTED, NvmlSnapshot
from gpuaccept.hw.sku import Sku
from gpuaccept.model import Metric, Status, Threshold

Pair = tuple[int, int]
"""Positions ``(i, j)`` in the check's device list: a copy from device ``i`` to device ``j``."""

UNIDIR = "p2p_unidir_gbs"
BIDIR = "p2p_bidir_gbs"
LATENCY = "p2p_latency_us"
H2D = "p2p_h2d_gbs"
D2H = "p2p_d2h_gbs"
METRICS = (UNIDIR, BIDIR, LATENCY, H2D, D2H)


def links_of(ordinals: Sequence[int], snap: NvmlSnapshot | None) -> tuple[list[GpuLinks] | None, list[str]]:
    """The NVML links and UUIDs of the GPUs torch calls ``cuda:<ordinal>``, in the order of ``ordinals``, from a
    snapshot taken through ``CUDA_VISIBLE_DEVICES`` (each GPU's ``ordinal`` set). (None, []) when the snapshot
    is missing or lacks one of them; the UUIDs are [] unless every one is known."""
    by_ordinal = {g.ordinal: g for g in snap.gpus} if snap is not None else {}
    found = [by_ordinal.get(o) for o in ordinals]
    gpus = [g for g in found if g is not None]
    if len(gpus) != len(ordinals):
        return None, []
    uuids = [str(g.uuid) for g in gpus]
    return [gpu_links(g) for g in gpus], uuids if all(g.uuid != UNSUPPORTED for g in gpus) else []


def ordered_pairs(n: int) -> list[Pair]:
    """Every ordered pair of ``n`` devices, ``(0, 1), (0, 2), ... (n-1, n-2)``: the unidirectional copies."""
    return [(i, j) for i in range(n) for j in range(n) if i != j]


def unordered_pairs(n: int) -> list[Pair]:
    """Every pair once, ``i < j``: the bidirectional copies."""
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def copy_bytes(nbytes: int, iterations: int, bidirectional: bool = False) -> int:
    """Bytes a timed loop moved: ``iterations`` copies of ``nbytes``, both directions counted when bidirectional."""
    return (2 if bidirectional else 1) * nbytes * iterations


def rate_gbs(nbytes: int, seconds: float) -> float:
    """GB/s (1e9 bytes per second) of ``nbytes`` moved in ``seconds``; 0.0 for a non-positive time."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


@dataclass(frozen=True)
class Expect:
    """An expected rate in GB/s and its bound: at least ``gbs x fraction``, a miss is ``severity``;
    ``source`` is the label reports show (``sku:h100_sxm``, ``fabric: NVLink4 18 links ...``)."""

    gbs: float
    fraction: float
    severity: Status
    source: str
    path: str

    def threshold(self, scale: float = 1.0) -> Threshold:
        """The ``>=`` bound for a rate expected at ``scale x gbs`` (2 for a bidirectional pair)."""
        return Threshold(">=", round(self.gbs * scale * self.fraction, 3), self.severity, self.source)


def _fraction(sku: Sku, family: str, default: float) -> float:
    try:
        return sku.pass_fraction(family)
    except KeyError:
        return default


def pair_expectation(sku: Sku | None, links: Sequence[GpuLinks] | None, nvlink_pair: bool | None,
                     cc: tuple[int, int] | None = None) -> Expect | None:
    """The one-direction copy rate expected between two GPUs of ``sku`` and its bound; None: nothing to judge by.

    ``links`` are the two GPUs' NVML links (None: unknown); ``nvlink_pair`` whether NVML reports NVLink P2P
    between them (None: unknown). NVLink (the SKU joins every pair, or NVML says this pair): the SKU's
    ``p2p_gbs`` (fraction ``p2p``, FAIL) or else the NVLink ceiling of :func:`gpuaccept.hw.fabric_expect.intra_node`
    (fraction ``nvlink``, FAIL). Otherwise PCIe: the links' per-direction rate (fraction ``pcie``, WARN: the
    path through switches and sockets varies).
    """
    if sku is None:
        return None
    nvlink = bool(sku.nvlink_gbs) and (sku.nvlink_all_pairs or bool(nvlink_pair))
    if nvlink and sku.p2p_gbs:
        return Expect(sku.p2p_gbs, _fraction(sku, "p2p", 0.85), Status.FAIL, f"sku:{sku.id}", "nvlink")
    gpus = list(links) if links is not None else None
    inp = FabricInputs(sku, 1, 2, gpus=gpus, all_pairs=nvlink, compute_capability=cc)
    exp, why = intra_node(inp)
    if exp is not None:
        family = "nvlink" if exp.path == "nvlink" else "pcie"
        severity = Status.FAIL if exp.path == "nvlink" else Status.WARN
        return Expect(exp.ceiling_gbs, _fraction(sku, family, 0.6), severity, f"sku:{sku.id} {why}", exp.path)
    if nvlink:
        return None
    gbs = sku.pcie_bandwidth_gbs()
    return Expect(round(gbs, 3), _fraction(sku, "pcie", 0.7), Status.WARN,
                  f"sku:{sku.id} PCIe gen{sku.pcie_gen} x{sku.pcie_width} = {gbs:g} GB/s per direction", "pcie")


def host_expectation(sku: Sku | None, link: GpuLinks | None = None) -> Expect | None:
    """The pinned host<->device rate expected per direction: the SKU's ``h2d_gbs`` (fraction ``h2d``, FAIL),
    else the PCIe per-direction rate of the GPU's link (or the SKU's) with fraction ``pcie``, WARN."""
    if sku is None:
        return None
    if sku.h2d_gbs:
        return Expect(sku.h2d_gbs, _fraction(sku, "h2d", 0.92), Status.FAIL, f"sku:{sku.id}", "pcie")
    from gpuaccept.hw.sku import pcie_gbs

    gen, width = (link.pcie_gen, link.pcie_width) if link and link.pcie_gen and link.pcie_width else \
        (sku.pcie_gen, sku.pcie_width)
    try:
        gbs = round(pcie_gbs(gen, width), 3)
    except KeyError:
        return None
    return Expect(gbs, _fraction(sku, "pcie", 0.7), Status.WARN,
                  f"sku:{sku.id} PCIe gen{gen} x{width} = {gbs:g} GB/s per direction", "pcie")


def pair_metrics(labels: Sequence[str], unidir: Mapping[Pair, float], bidir: Mapping[Pair, float],
                 latency: Mapping[Pair, float], expect: Mapping[Pair, Expect | None],
                 tags: Mapping[str, str | int | float] | None = None) -> list[Metric]:
    """One metric per measured pair: device = the source GPU, tag ``peer`` = the destination GPU.

    Unidirectional and bidirectional rates carry the pair's expectation and bound (bidirectional: twice
    the one-direction rate); latency carries none (measured, not judged).
    """
    base = dict(tags or {})
    out: list[Metric] = []
    for (i, j), v in sorted(unidir.items()):
        e = expect.get((i, j))
        out.append(Metric("p2p_unidir_gbs", round(v, 3), "GB/s", device=labels[i], tags={**base, "peer": labels[j]},
                          expected=e.gbs if e else None, threshold=e.threshold() if e else None, performance=True))
    for (i, j), v in sorted(bidir.items()):
        e = expect.get((i, j))
        out.append(Metric("p2p_bidir_gbs", round(v, 3), "GB/s", device=labels[i], tags={**base, "peer": labels[j]},
                          expected=2 * e.gbs if e else None, threshold=e.threshold(2.0) if e else None,
                          performance=True))
    for (i, j), v in sorted(latency.items()):
        out.append(Metric("p2p_latency_us", round(v, 3), "us", device=labels[i], tags={**base, "peer": labels[j]}))
    return out


def matrix(n: int, values: Mapping[Pair, float], ndigits: int = 1) -> list[list[float | None]]:
    """``m[i][j]`` = the value of pair ``(i, j)`` rounded, None where not measured (the diagonal, one direction
    of a bidirectional pair)."""
    return [[round(values[(i, j)], ndigits) if (i, j) in values else None for j in range(n)] for i in range(n)]


def slowest(values: Mapping[Pair, float]) -> tuple[Pair, float] | None:
    """The pair with the lowest rate and its rate (ties: the first in order); None without pairs."""
    if not values:
        return None
    pair = min(sorted(values), key=lambda p: values[p])
    return pair, values[pair]


def below(values: Mapping[Pair, float], expect: Mapping[Pair, Expect | None], scale: float = 1.0
          ) -> list[tuple[Pair, float, Expect]]:
    """The pairs whose rate is under their bound (``expected x scale x fraction``), slowest first."""
    out = [(p, v, e) for p, v in values.items() if (e := expect.get(p)) is not None
           and v < e.gbs * scale * e.fraction]
    return sorted(out, key=lambda t: (t[1], t[0]))


def format_matrix(labels: Sequence[str], m: Sequence[Sequence[float | None]], title: str) -> str:
    """A text matrix as nvbandwidth prints one: rows are sources, columns destinations, ``N/A`` unmeasured."""
    short = [lab.removeprefix("cuda:") for lab in labels]
    width = max(8, *(len(s) + 1 for s in short))
    lines = [title, " " * 6 + "".join(f"{s:>{width}}" for s in short)]
    for s, row in zip(short, m, strict=True):
        lines.append(f"{s:>5} " + "".join(f"{'N/A' if v is None else f'{v:.1f}':>{width}}" for v in row))
    return "\n".join(lines)


def matrix_details(labels: Sequence[str], unidir: Mapping[Pair, float], bidir: Mapping[Pair, float],
                   latency: Mapping[Pair, float], expect: Mapping[Pair, Expect | None]) -> dict[str, Any]:
    """The evidence the report renders as a GPU x GPU matrix (``details.p2p_matrix``): device labels, one
    matrix per measure (rows: source, columns: destination), each pair's bound, and the slowest pair."""
    n = len(labels)
    bound = {p: round(e.gbs * e.fraction, 1) for p, e in expect.items() if e is not None}
    out: dict[str, Any] = {
        "devices": list(labels),
        "unidir_gbs": matrix(n, unidir),
        "bidir_gbs": matrix(n, bidir),
        "latency_us": matrix(n, latency, 2),
        "min_unidir_gbs": matrix(n, bound),
    }
    low = slowest(unidir)
    if low is not None:
        (i, j), v = low
        out["slowest"] = {"src": labels[i], "dst": labels[j], "gbs": round(v, 1)}
    return out


def summary(labels: Sequence[str], unidir: Mapping[Pair, float], expect: Mapping[Pair, Expect | None],
            bidir: Mapping[Pair, float] | None = None, most: int = 4) -> str:
    """One line: pair count, the one-way range, the slowest pair and what it was held to, then the pairs under
    their bound (one way, then both ways; at most ``most`` named)."""
    low = slowest(unidir)
    if low is None:
        return "no GPU pair measured"
    (i, j), v = low
    e = expect.get((i, j))
    held = f" (held to >= {e.gbs * e.fraction:.0f}, {e.source})" if e else " (no expectation: not judged)"
    text = (f"{len(labels)} GPUs, {len(unidir)} directed pairs: {v:.0f}-{max(unidir.values()):.0f} GB/s one way, "
            f"slowest {labels[i]} -> {labels[j]} {v:.1f} GB/s{held}")
    under = [f"{labels[a]} -> {labels[b]} {x:.1f} < {ex.gbs * ex.fraction:.0f}"
             for (a, b), x, ex in below(unidir, expect)]
    under += [f"{labels[a]} <-> {labels[b]} {x:.1f} < {2 * ex.gbs * ex.fraction:.0f}"
              for (a, b), x, ex in below(bidir or {}, expect, 2.0)]
    if under:
        more = f" and {len(under) - most} more" if len(under) > most else ""
        text += f"; under their bound (GB/s): {', '.join(under[:most])}{more}"
    return text
