"""NVLink error counters compared across a load: which link's CRC, replay or recovery count rose (pure).

Two NVML snapshots (:class:`gpuaccept.hw.nvml.NvmlSnapshot`, taken before and after a check's traffic;
``nvidia-smi nvlink -e`` twice) are compared GPU by GPU (matched by UUID, else by NVML index) and link
by link for the counters of :data:`gpuaccept.hw.nvml_ext.NVLINK_COUNTERS`: ``nvlink_crc_flit_errors``
(data-link CRC errors on flits), ``nvlink_replay_errors`` (flits the link layer re-sent) and
``nvlink_recovery_errors`` (link retrains). A counter that rose is a :class:`LinkRise`; one NVML could not
read in either snapshot is "not read" (named, with NVML's message), never a rise; one that went down was
cleared in between (``nvidia-smi nvlink -re``) and is noted, its delta unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuaccept.hw.nvml import UNSUPPORTED, GpuSnapshot, NvmlSnapshot
from gpuaccept.hw.nvml_ext import NVLINK_COUNTERS

SHORT: dict[str, str] = {"nvlink_crc_flit_errors": "CRC flit", "nvlink_replay_errors": "replay",
                         "nvlink_recovery_errors": "recovery"}
"""Counter field -> the word reasons use."""


@dataclass(frozen=True)
class LinkRise:
    """Counter ``counter`` of link ``link`` of GPU ``device`` (``cuda:N``) rose by ``delta`` (> 0)."""

    device: str
    link: int
    counter: str
    delta: int

    def describe(self) -> str:
        return f"{self.device} link {self.link} {SHORT.get(self.counter, self.counter)} +{self.delta}"


@dataclass
class CounterDiff:
    """What comparing two snapshots found: ``rises``; ``steady`` the (device, counter) pairs read in both
    with no rise, with how many links; ``not_read`` a note per device and counter that could not be
    compared; ``reset`` the counters that went down; ``gone`` GPUs of the first snapshot missing from the second."""

    rises: list[LinkRise] = field(default_factory=list)
    steady: dict[str, dict[str, int]] = field(default_factory=dict)
    not_read: list[str] = field(default_factory=list)
    reset: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)

    def deltas(self, device: str, counter: str) -> dict[int, int]:
        """Link -> rise of ``counter`` on ``device`` (links that did not rise left out)."""
        return {r.link: r.delta for r in self.rises if r.device == device and r.counter == counter}


def _why(g: GpuSnapshot, name: str) -> str:
    return g.errors.get(name) or g.errors.get("nvlink_active") or "not reported"


def _match(before: GpuSnapshot, after: NvmlSnapshot) -> GpuSnapshot | None:
    if before.uuid != UNSUPPORTED:
        for g in after.gpus:
            if g.uuid == before.uuid:
                return g
    return next((g for g in after.gpus if g.index == before.index and g.uuid in (before.uuid, UNSUPPORTED)), None)


def diff_nvlink(before: NvmlSnapshot, after: NvmlSnapshot) -> CounterDiff:
    """The NVLink error counters that changed between ``before`` and ``after``, link by link."""
    out = CounterDiff()
    for b in before.gpus:
        a = _match(b, after)
        if a is None:
            out.gone.append(b.device)
            continue
        for name in NVLINK_COUNTERS:
            old, new = getattr(b, name), getattr(a, name)
            if not isinstance(old, dict) or not isinstance(new, dict):
                side = b if not isinstance(old, dict) else a
                out.not_read.append(f"{b.device} {SHORT[name]}: {_why(side, name)}")
                continue
            links = sorted(set(old) & set(new), key=int)
            if not links:
                out.not_read.append(f"{b.device} {SHORT[name]}: no link read in both snapshots")
                continue
            rose = False
            for link in links:
                d = int(new[link]) - int(old[link])
                if d > 0:
                    out.rises.append(LinkRise(b.device, int(link), name, d))
                    rose = True
                elif d < 0:
                    out.reset.append(f"{b.device} link {link} {SHORT[name]} {old[link]} -> {new[link]}")
            if not rose:
                out.steady.setdefault(b.device, {})[name] = len(links)
    return out
