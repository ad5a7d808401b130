"""The circuit breaker on mass drains (pure): before ``healthcheck --slurm drain`` drains a node, it counts the nodes
gpuaccept drained within a sliding window and holds back past a limit, so a fault of something shared (a
filesystem, the fabric, a bad driver push) does not drain the cluster one node after another.

The source of truth is Slurm's own record, so that every node's healthcheck sees the same count with no server of
ours: ``sinfo -R -N -h -o '%N|%H|%E'`` lists each drained or down node with its reason's time and text; gpuaccept's
reasons are recognizable (:func:`gpuaccept.health.slurm.is_ours`). A drain counts while it stands (a resumed node
no longer does), its reason's time is within the window, and no person reset the breaker over it
(``healthcheck --breaker reset`` marks the counted reasons ``gpuaccept:node,ack``, :func:`gpuaccept.health.slurm.
acked`; such a node stays gpuaccept's to resume).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuaccept.errors import InputError, UsageError
from gpuaccept.health.slurm import is_acked, is_ours

DEFAULT_WINDOW_S = 3600.0
SINFO_FORMAT = "%N|%H|%E"


def reasons_argv(sinfo: str = "sinfo") -> list[str]:
    """Every drained or down node, one a line, with its reason's time and text."""
    return [sinfo, "-R", "-N", "-h", "-o", SINFO_FORMAT]


def nodes_argv(sinfo: str = "sinfo") -> list[str]:
    """Every node's name, one a line (a node in two partitions twice)."""
    return [sinfo, "-N", "-h", "-o", "%N"]


@dataclass(frozen=True)
class Drained:
    """One line of :func:`reasons_argv`: the node, when its reason was set (local time; None when Slurm has
    none), the reason."""

    node: str
    when: datetime | None
    reason: str


def parse_reasons(text: str) -> list[Drained]:
    """Parse :func:`reasons_argv`'s output; InputError for a line not of its format."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) != 3:
            raise InputError(f"sinfo -R: expected NODE|TIME|REASON, got {line[:120]!r}")
        node, when, reason = (p.strip() for p in parts)
        try:
            at = datetime.fromisoformat(when) if when and when not in ("Unknown", "None") else None
        except ValueError:
            raise InputError(f"sinfo -R: {when!r} is not a time (NODE|TIME|REASON)") from None
        out.append(Drained(node, at, reason))
    return out


def node_count(text: str) -> int:
    """The number of distinct nodes in :func:`nodes_argv`'s output."""
    return len({ln.strip() for ln in text.splitlines() if ln.strip()})


@dataclass(frozen=True)
class Breaker:
    """The limits: at most ``limit`` nodes (0: no such limit) and at most ``percent`` % of the cluster's nodes
    (0: none; at least one node) drained by gpuaccept within ``window_s`` seconds."""

    limit: int = 0
    percent: float = 0.0
    window_s: float = DEFAULT_WINDOW_S

    @property
    def enabled(self) -> bool:
        return self.limit > 0 or self.percent > 0

    def allowed(self, nodes: int) -> int:
        """How many nodes may stand drained by gpuaccept within the window, of ``nodes`` in the cluster."""
        caps = [self.limit] if self.limit > 0 else []
        if self.percent > 0:
            caps.append(max(1, math.floor(self.percent * nodes / 100)))
        return min(caps) if caps else nodes

    def describe(self) -> str:
        parts = ([f"{self.limit} node(s)"] if self.limit else []) + ([f"{self.percent:g} %"] if self.percent else [])
        return f"{' and '.join(parts)} per {self.window_s:g} s"


def check_breaker(limit: int, percent: float, window_s: float) -> Breaker:
    """The flags' breaker; UsageError for a percentage outside 0..100 or a window under a minute."""
    if not 0 <= percent <= 100:
        raise UsageError(f"--breaker-percent {percent:g}: give 0 to 100 (0: no percentage limit)")
    if window_s < 60:
        raise UsageError(f"--breaker-window {window_s:g}: give at least 60 seconds")
    return Breaker(limit, percent, window_s)


def counted(drained: list[Drained], now: datetime, window_s: float, exclude: str = "") -> list[Drained]:
    """gpuaccept's standing drains whose reason was set within ``window_s`` of ``now``, not reset by a person,
    other than ``exclude`` (the node asking: re-draining it adds none)."""
    since = now - timedelta(seconds=window_s)
    return [d for d in drained if d.node != exclude and is_ours(d.reason) and not is_acked(d.reason)
            and d.when is not None and d.when >= since]


@dataclass(frozen=True)
class Verdict:
    """``hold``: the breaker is open (do not drain); ``why`` in words, with the nodes counted."""

    hold: bool
    why: str
    nodes: tuple[str, ...] = ()


def decide(breaker: Breaker, drained: list[Drained], nodes: int, now: datetime, node: str) -> Verdict:
    """Whether draining ``node`` now would pass the breaker's limit (pure)."""
    mine = counted(drained, now, breaker.window_s, exclude=node)
    allowed = breaker.allowed(nodes)
    names = tuple(sorted(d.node for d in mine))
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    if len(mine) >= allowed:
        return Verdict(True, f"circuit breaker open: {len(mine)} node(s) drained by gpuaccept in the last "
                             f"{breaker.window_s:g} s ({shown}), limit {allowed} of {nodes} "
                             f"({breaker.describe()}); a person resets it with gpuaccept healthcheck --breaker reset",
                       names)
    return Verdict(False, f"circuit breaker closed: {len(mine)} of {allowed} allowed", names)
