"""NVLink error counters read around another check's traffic: a link whose errors rise under load fails.

The p2p, collectives and nccl_tests checks (on a GPU) take an NVML snapshot of their GPUs before their traffic and
another after it (``nvidia-smi nvlink -e`` twice; :func:`gpuaccept.hw.nvml.read_visible_snapshot`) and
compare them link by link (:func:`gpuaccept.hw.nvlink_counters.diff_nvlink`). The result:

- ``details.nvlink_counters``: the links that rose (GPU, link, counter, delta), the counters read steady
  (how many links), what could not be read (with NVML's message), counters cleared during the run;
- one ``nvlink_<counter>_delta`` metric per GPU and counter read in both snapshots (CRC flit, replay,
  recovery errors added over the GPU's links; tag ``links`` names the links that rose), bounded at 0
  (FAIL): a link whose error counters rise while it carries traffic is failing, whatever the rate;
- a rise turns a PASS or WARN into a FAIL whose reason names GPU, link and counter.

Counters NVML cannot read (no NVLink, an older driver) are a "not read" note, never a failure. Reading
never raises. The watch is given its reader, so tests replay recorded snapshots (``tests/data/nvml``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.checks.base import Outcome
from gpuaccept.errors import GpuacceptError
from gpuaccept.hw.nvlink_counters import SHORT, diff_nvlink
from gpuaccept.hw.nvml import NvmlSnapshot
from gpuaccept.hw.nvml_ext import NVLINK_COUNTERS
from gpuaccept.model import Metric, Status, Threshold

DELTA_METRICS = tuple(f"{name}_delta" for name in NVLINK_COUNTERS)
"""``nvlink_crc_flit_errors_delta``, ``nvlink_replay_errors_delta``, ``nvlink_recovery_errors_delta``."""
SOURCE = "nvlink counters under load"
MAX_LISTED = 4

Reader = Callable[[], NvmlSnapshot]


def visible_reader(ordinals: list[int] | None) -> Reader:
    """Reads the GPUs torch sees as ``cuda:<ordinal>`` (None: all visible), without clock sampling."""
    def read() -> NvmlSnapshot:
        from gpuaccept.hw.nvml import read_visible_snapshot

        return read_visible_snapshot(os.environ.get("CUDA_VISIBLE_DEVICES"), ordinals, sample_s=0.0)
    return read


def node_reader() -> NvmlSnapshot:
    """Reads every GPU NVML sees on this node (labels ``cuda:<NVML index>``): what a distributed check's
    local rank 0 reads, whatever ``CUDA_VISIBLE_DEVICES`` its own process has."""
    from gpuaccept.hw.nvml import read_snapshot

    return read_snapshot(None, sample_s=0.0)


def _read(reader: Reader, when: str, notes: list[str]) -> NvmlSnapshot | None:
    try:
        return reader()
    except (GpuacceptError, OSError) as exc:
        notes.append(f"NVLink counters not read {when} the run: {exc}")
        return None


@dataclass
class NvlinkWatch:
    """An NVML snapshot taken before a run; :meth:`finish` takes the second one and reports."""

    reader: Reader
    before: NvmlSnapshot | None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, reader: Reader) -> NvlinkWatch:
        notes: list[str] = []
        return cls(reader, _read(reader, "before", notes), notes)

    def finish(self, outcome: Outcome) -> Outcome:
        """Read the counters again and add what rose to ``outcome`` (details, metrics, reason, status)."""
        notes = list(self.notes)
        info: dict[str, Any] = {}
        outcome.details["nvlink_counters"] = info
        after = _read(self.reader, "after", notes) if self.before is not None else None
        if self.before is None or after is None:
            info["notes"] = notes
            return outcome
        diff = diff_nvlink(self.before, after)
        info["rising"] = [{"device": r.device, "link": r.link, "counter": r.counter, "delta": r.delta}
                          for r in diff.rises]
        info["steady"] = diff.steady
        if diff.not_read:
            info["not_read"] = diff.not_read
        if diff.reset:
            notes.append("counters went down during the run (cleared?): " + "; ".join(diff.reset))
        if diff.gone:
            notes.append(f"GPUs missing from the second snapshot: {', '.join(diff.gone)}")
        if notes:
            info["notes"] = notes
        devices = {g.device for g in self.before.gpus}
        for device in sorted(devices):
            for name in NVLINK_COUNTERS:
                rose = diff.deltas(device, name)
                if not rose and name not in diff.steady.get(device, {}):
                    continue  # not read: no metric, a note
                tags: dict[str, str | int | float] = {"links": ",".join(map(str, sorted(rose)))} if rose else {}
                outcome.metrics.append(Metric(f"{name}_delta", float(sum(rose.values())), "count", device=device,
                                              threshold=Threshold("<=", 0.0, Status.FAIL, SOURCE), tags=tags))
        if diff.rises:
            said = [r.describe() for r in diff.rises]
            more = f" and {len(said) - MAX_LISTED} more" if len(said) > MAX_LISTED else ""
            text = f"NVLink errors rose under load: {'; '.join(said[:MAX_LISTED])}{more}"
            outcome.reason = f"{text}; {outcome.reason}" if outcome.reason else text
            if outcome.status in (Status.PASS, Status.WARN):
                outcome.status = Status.FAIL
        elif diff.not_read and not diff.steady:
            info["summary"] = "not read: " + ", ".join(sorted(SHORT.values()))
        return outcome
