"""Run-to-run noise of a metric: how far two runs of one machine may differ and still be "the same".

``gpuaccept compare`` calls a difference "worse" (or "better") only beyond the
metric's noise floor, ``max(rel * |A|, abs)`` in the metric's unit:

- from ``--noise-pct PCT`` when given: ``PCT`` % of A for every metric;
- else from the history when it holds at least :data:`MIN_HISTORY` earlier
  runs of that host and metric (same check, device and tags; the two runs
  compared left out): :data:`HISTORY_SIGMAS` x the standard deviation of the
  last :data:`HISTORY_WINDOW` of them (the larger of the two hosts' when A and
  B are different hosts);
- else the default of the metric's family (:data:`FAMILIES`, first match).

Pure functions; the history comes in as values (:func:`history_values`).
"""

from __future__ import annotations

import fnmatch
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_HISTORY = 4
"""Earlier runs of a host and metric needed before their spread is the noise floor."""
HISTORY_WINDOW = 10
"""At most this many of the most recent earlier runs make the spread."""
HISTORY_SIGMAS = 3.0
"""The floor from the history is this many standard deviations of the earlier runs."""

# (host, check, metric, device or "", tags as canonical JSON)
HistKey = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class Family:
    """A metric family's default noise floor: ``rel`` (fraction of |A|) and ``abs`` (in the metric's unit)."""

    name: str
    rel: float
    abs: float
    units: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    abs_unit: str = ""

    def text(self) -> str:
        """``3% of A``, ``3 C``, ``exact`` (how the floor reads in the output)."""
        if not self.rel and not self.abs:
            return "exact"
        parts = [f"{100 * self.rel:g}% of A"] if self.rel else []
        if self.abs:
            parts.append(f"{self.abs:g} {self.abs_unit}".strip())
        return " or ".join(parts)


FAMILIES: tuple[Family, ...] = (
    Family("counts", 0.0, 0.0, units=("count", "bool"),
           names=("*error*", "ecc_*", "retired_pages_*", "remapped_rows_*", "*xid*", "*_down", "*throttl*",
                  "gpu_count", "*_links_active", "*_count", "pcie_link_*")),
    Family("temperature", 0.0, 3.0, units=("C", "degC"), names=("temperature*",), abs_unit="C"),
    Family("time", 0.05, 0.0, units=("s", "ms", "us", "µs", "ns"), names=("*latency*", "*_ms")),
    Family("power", 0.05, 0.0, units=("W",)),
    Family("throughput", 0.03, 0.0, units=("*/s",)),
    Family("clock", 0.02, 0.0, units=("MHz", "GHz")),
    Family("fraction", 0.0, 0.02, units=("fraction",)),
    Family("percent", 0.0, 2.0, units=("%",), abs_unit="points"),
    Family("capacity", 0.01, 0.0, units=("GiB", "MiB", "KiB", "B", "bytes")),
    Family("other", 0.02, 0.0),
)
"""Default floors, first match by metric name, then by unit. Throughput (TFLOP/s, GB/s, any rate) 3 %: a
GEMM or a bandwidth test repeated on an idle node moves by 1-2 %; time and power 5 %; temperature 3 C;
counts (errors, links, GPUs) exact: any change is a change."""


def family(name: str, unit: str) -> Family:
    """The family of metric ``name`` in ``unit`` (:data:`FAMILIES`: names first, then units)."""
    for f in FAMILIES:
        if any(fnmatch.fnmatchcase(name, p) for p in f.names):
            return f
    for f in FAMILIES:
        if any(fnmatch.fnmatchcase(unit, p) for p in f.units):
            return f
    return FAMILIES[-1]


def history_values(points: Iterable[Any], exclude_runs: Iterable[str] = (),
                   volatile_tags: Iterable[str] = ()) -> dict[HistKey, list[float]]:
    """Finite values per (host, check, metric, device, tags) of stored metric points (oldest first, as
    ``HistoryStore.metric_points`` returns them), leaving out the runs ``exclude_runs`` and re-runs."""
    skip, volatile = set(exclude_runs), set(volatile_tags)
    out: dict[HistKey, list[float]] = {}
    for p in points:
        if p.run_id in skip or getattr(p, "rerun", False) or p.value is None:
            continue
        tags = {k: v for k, v in (p.tags or {}).items() if k not in volatile}
        key = (p.host, p.check, p.name, p.device or "", json.dumps(tags, sort_keys=True, separators=(",", ":"),
                                                                   default=str))
        out.setdefault(key, []).append(float(p.value))
    return out


@dataclass(frozen=True)
class NoisePolicy:
    """How wide "the same" is: ``override_pct`` (% of A, all metrics) or the history, else the family default."""

    override_pct: float | None = None
    history: Mapping[HistKey, Sequence[float]] | None = None

    def floor(self, hosts: Sequence[str], key: tuple[str, str, str, str], unit: str,
              a: float | None) -> tuple[float, str]:
        """(floor in the metric's unit, where it came from) for metric ``key`` = (check, metric, device, tags
        JSON) measured on ``hosts`` with value ``a`` in run A."""
        base = abs(a) if a is not None else 0.0
        if self.override_pct is not None:
            return self.override_pct / 100.0 * base, f"--noise-pct {self.override_pct:g}"
        spreads = []
        for h in dict.fromkeys(hosts):
            values = (self.history or {}).get((h, *key), [])[-HISTORY_WINDOW:]
            if len(values) >= MIN_HISTORY:
                spreads.append((statistics.stdev(values), len(values)))
        if spreads:
            sd, n = max(spreads)
            return HISTORY_SIGMAS * sd, f"history ({n} runs)"
        f = family(key[1], unit)
        return max(f.rel * base, f.abs), f"default {f.name}"


def defaults_text() -> str:
    """The default floors in one line, for the output and ``--help``."""
    return "; ".join(f"{f.name} {f.text()}" for f in FAMILIES)


def judge(delta: float | None, floor: float, higher_is_better: bool) -> str:
    """``worse``, ``better`` or ``same`` (|delta| within ``floor``); ``""`` when there is no delta."""
    if delta is None:
        return ""
    if abs(delta) <= floor:
        return "same"
    return "worse" if (delta < 0) == higher_is_better else "better"
