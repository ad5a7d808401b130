"""Torch CUDA ordinals to NVML GPUs, by UUID: what ``CUDA_VISIBLE_DEVICES`` hides NVML still sees.

NVML ignores ``CUDA_VISIBLE_DEVICES`` and numbers every GPU of the node in PCI
bus order, while torch's ``cuda:N`` counts only the visible devices, in the
order listed. :func:`map_visible_devices` is the pure mapping (visible-devices
string + NVML inventory -> torch ordinal, NVML index, UUID, PCI bus id), so a
check can open exactly the GPUs it tests with ``nvmlDeviceGetHandleByUUID``
(``nvidia-smi -i <uuid>``).

Entries CUDA accepts (CUDA C Programming Guide, "CUDA Environment Variables"):
a device index, a ``GPU-<uuid>`` UUID or any unique prefix of one, and a
``MIG-<uuid>`` MIG instance (or the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``). CUDA
stops enumerating at the first entry that is invalid, so ``0,2,-1,1`` exposes
only GPUs 0 and 2. Index entries are read as NVML (PCI bus) indices: that
matches CUDA's numbering when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (Slurm and most
schedulers set UUIDs or PCI-ordered indices) and on nodes of one GPU model,
where CUDA's default fastest-first order ties and falls back to bus order.
Not confirmed against the CUDA driver: that a repeated entry ends enumeration
(treated here as invalid) and how an ambiguous UUID prefix is handled (here: invalid).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuaccept.errors import InputError

HIDE_ALL = frozenset({"", "-1", "none", "NoDevFiles"})
"""``CUDA_VISIBLE_DEVICES`` values that hide every GPU (``NoDevFiles`` is what Slurm sets for no GPUs)."""


@dataclass(frozen=True)
class NvmlGpuId:
    """One GPU as NVML enumerates it: index (PCI order), ``GPU-...`` UUID, bus id, MIG instance UUIDs."""

    index: int
    uuid: str
    pci_bus_id: str = ""
    mig_uuids: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class VisibleGpu:
    """A torch ordinal and the NVML GPU it names (``mig_uuid`` set when the entry was a MIG instance)."""

    ordinal: int
    index: int
    uuid: str
    pci_bus_id: str = ""
    mig_uuid: str = ""

    @property
    def device(self) -> str:
        return f"cuda:{self.ordinal}"


def _match(entry: str, inventory: list[NvmlGpuId]) -> tuple[NvmlGpuId, str] | None:
    """The GPU (and MIG UUID) one ``CUDA_VISIBLE_DEVICES`` entry names, or None when CUDA would reject it."""
    if entry.lstrip("+").isdigit() or (entry.startswith("-") and entry[1:].isdigit()):
        i = int(entry)
        found = [g for g in inventory if g.index == i]
        return (found[0], "") if i >= 0 and found else None
    low = entry.lower()
    if low.startswith("mig-gpu-"):  # legacy MIG-GPU-<uuid>/<gi>/<ci> (CUDA 11.0-11.x)
        parent = "gpu-" + low[len("mig-gpu-"):].split("/", 1)[0]
        found = [g for g in inventory if g.uuid.lower() == parent]
        return (found[0], entry) if len(found) == 1 and "/" in low else None
    if low.startswith("mig-"):
        found = [g for g in inventory for m in g.mig_uuids if m.lower().startswith(low)]
        if len(found) != 1:
            return None
        mig = next(m for m in found[0].mig_uuids if m.lower().startswith(low))
        return found[0], mig
    if low.startswith("gpu-") and len(low) > len("gpu-"):
        found = [g for g in inventory if g.uuid.lower().startswith(low)]
        return (found[0], "") if len(found) == 1 else None
    return None


def map_visible_devices(visible: str | None, inventory: list[NvmlGpuId]) -> list[VisibleGpu]:
    """The GPUs torch sees as ``cuda:0..n-1`` for a ``CUDA_VISIBLE_DEVICES`` value (None: unset).

    Pure. Unset: every GPU in NVML index order. ``""``, ``-1``, ``none`` or
    ``NoDevFiles``: none. Otherwise entries are read left to right until the
    first one CUDA would reject (unknown index or UUID, ambiguous prefix, a
    repeat), as CUDA does.
    """
    ordered = sorted(inventory, key=lambda g: g.index)
    if visible is None:
        return [VisibleGpu(i, g.index, g.uuid, g.pci_bus_id) for i, g in enumerate(ordered)]
    if visible.strip() in HIDE_ALL:
        return []
    out: list[VisibleGpu] = []
    seen: set[int] = set()
    for raw in visible.split(","):
        hit = _match(raw.strip(), ordered)
        if hit is None or hit[0].index in seen:
            break
        g, mig = hit
        seen.add(g.index)
        out.append(VisibleGpu(len(out), g.index, g.uuid, g.pci_bus_id, mig))
    return out


def device_labels(visible: str | None, inventory: list[NvmlGpuId]) -> dict[int, str]:
    """NVML index -> ``cuda:N``, the label torch (and every metric) gives that GPU under
    ``CUDA_VISIBLE_DEVICES=visible``; GPUs CUDA cannot see are left out. Pure."""
    return {v.index: v.device for v in map_visible_devices(visible, inventory)}


def select_ordinals(visible: list[VisibleGpu], ordinals: list[int] | None) -> list[VisibleGpu]:
    """The visible GPUs at torch ``ordinals`` (``--gpus``; None: all visible), in the order asked.

    Raises :class:`InputError` for an ordinal torch would not have.
    """
    if ordinals is None:
        return list(visible)
    bad = [i for i in ordinals if not 0 <= i < len(visible)]
    if bad:
        raise InputError(f"GPU index {bad[0]} does not exist: {len(visible)} GPU(s) visible to CUDA")
    return [visible[i] for i in ordinals]


def normalize_pci_bus_id(bus_id: str) -> str:
    """A PCI address as ``dddd:bb:dd`` lower-case (domain 4 hex digits, function dropped).

    NVML's ``00000000:18:00.0``, the kernel log's ``0000:18:00`` and torch's
    ``0000:18:00.0`` all become ``0000:18:00``; raises InputError when malformed.
    """
    s = bus_id.strip().lower().removeprefix("pci:")
    s = s.split(".", 1)[0]
    parts = s.split(":")
    if len(parts) != 3 or not all(parts) or not all(c in "0123456789abcdef" for p in parts for c in p):
        raise InputError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, dev = (int(p, 16) for p in parts)
    if domain > 0xFFFFFFFF or bus > 0xFF or dev > 0x1F:
        raise InputError(f"PCI bus id out of range: {bus_id!r}")
    return f"{domain:04x}:{bus:02x}:{dev:02x}"
