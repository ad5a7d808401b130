"""RDMA counters read around another check's traffic: errors that rose under its load, tied to their ports.

The collectives and nccl_tests checks take a counter snapshot of every RDMA port
(:func:`gpuaccept.hw.rdma.read_snapshot` below their ``fabric_root`` parameter, ``perfquery`` on
each port) before their traffic and another after it. The result:

- ``details.fabric_counters``: the root, the interval, every port's counter deltas (the data
  counters ``port_xmit_data``/``port_rcv_data`` count 4-octet words, so ``traffic_bytes`` shows
  which ports carried the load), the error counters that rose, counters that went down (cleared
  during the run: the delta is a lower bound), ports that vanished, and notes on unreadable files;
- the fabric check's ``rdma_<counter>_delta`` metrics, one per port and error counter, judged by
  the fabric check's own default rules (:data:`gpuaccept.checks.fabric.DELTA_RULES`): a rising
  ``link_downed`` fails, the other error counters warn;
- a port that vanished during the run turns a pass into a WARN naming it.

A node without RDMA devices records nothing at all. Reading never raises: what cannot be read is
a note. Distributed checks read the counters on local rank 0 only (once per node).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.checks.base import Outcome, Param
from gpuaccept.checks.fabric import DELTA_METRICS, DELTA_RULES, delta_metrics
from gpuaccept.errors import InputError
from gpuaccept.hw.rdma import DATA_COUNTERS, PortDelta, Snapshot, diff, read_snapshot
from gpuaccept.model import Status

__all__ = ["AFTER_ROOT_ENV", "DELTA_METRICS", "DELTA_RULES", "FABRIC_ROOT", "FabricWatch"]

AFTER_ROOT_ENV = "GPUACCEPT_TEST_FABRIC_AFTER"
"""Tests only: read the "after" snapshot below this root instead of ``fabric_root`` (a recorded tree
with risen counters stands for the same node after a run)."""

FABRIC_ROOT = Param("fabric_root", "str", "/",
                    "filesystem root under which the RDMA port counters are read before and after the run "
                    "(no RDMA devices there: nothing recorded)")

MAX_LISTED = 4


def _after_root(root: str, env: Mapping[str, str]) -> str:
    return env.get(AFTER_ROOT_ENV) or root


def _port_tags(key: str) -> dict[str, str | int | float]:
    dev, _, port = key.rpartition(":")
    return {"hca": dev, "port": int(port) if port.isdigit() else port}


def _rose(delta: PortDelta) -> str:
    return ", ".join(f"{name} +{n}" for name, n in delta.rising().items())


@dataclass
class FabricWatch:
    """A counter snapshot taken before a run; :meth:`finish` reads the second one and reports."""

    root: str
    before: Snapshot | None
    notes: list[str] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def start(cls, root: str, clock: Callable[[], float] = time.monotonic) -> FabricWatch | None:
        """The snapshot before the run; None where there is no RDMA port below ``root`` (nothing to record)."""
        notes: list[str] = []
        try:
            before = read_snapshot(root, clock, notes)
        except (OSError, InputError) as exc:
            return cls(root, None, [f"RDMA counters under {root!r} could not be read before the run: {exc}"], clock)
        if not before.ports:
            return None
        return cls(root, before, notes, clock)

    def finish(self, outcome: Outcome, env: Mapping[str, str] = os.environ) -> Outcome:
        """Read the counters again and add the deltas to ``outcome`` (details, metrics, reason, status)."""
        notes = list(self.notes)
        info: dict[str, Any] = {"root": self.root}
        outcome.details["fabric_counters"] = info
        if self.before is None:
            info["notes"] = notes
            return outcome
        root = _after_root(self.root, env)
        try:
            after = read_snapshot(root, self.clock, notes)
        except (OSError, InputError) as exc:
            info["notes"] = [*notes, f"RDMA counters under {root!r} could not be read after the run: {exc}"]
            return outcome
        deltas = diff(self.before, after)
        info["interval_s"] = round(max(0.0, after.taken_s - self.before.taken_s), 3)
        info["ports"] = {k: dict(d.deltas) for k, d in deltas.items() if not d.vanished}
        info["traffic_bytes"] = {k: {c.split("_")[1]: 4 * d.deltas[c] for c in DATA_COUNTERS if c in d.deltas}
                                 for k, d in deltas.items() if not d.vanished}
        info["rising"] = {k: d.rising() for k, d in deltas.items() if d.rising()}
        reset = {k: list(d.reset) for k, d in deltas.items() if d.reset}
        vanished = [k for k, d in deltas.items() if d.vanished]
        if reset:
            info["reset"] = reset
            listed = "; ".join(f"{k} {', '.join(v)}" for k, v in reset.items())
            notes.append(f"counters went down during the run (cleared?), deltas are lower bounds: {listed}")
        if vanished:
            info["vanished"] = vanished
        if notes:
            info["notes"] = notes
        for d in deltas.values():
            outcome.metrics += delta_metrics(d, _port_tags(d.port))
        said = [f"{k} ({_rose(deltas[k])})" for k in info["rising"]]
        said += [f"{k} vanished" for k in vanished]
        if said:
            more = f" and {len(said) - MAX_LISTED} more" if len(said) > MAX_LISTED else ""
            text = f"RDMA counters during the run: {'; '.join(said[:MAX_LISTED])}{more}"
            outcome.reason = f"{outcome.reason}; {text}" if outcome.reason else text
        if vanished and outcome.status is Status.PASS:
            outcome.status = Status.WARN
        return outcome
