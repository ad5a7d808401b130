"""A metric over time on one node, and whether it regressed against the node's own past. Pure functions.

One noisy run is never a regression: each run is judged by the median of the
last ``recent`` runs (it and the ones just before it) against the runs before
those (at most ``window`` of them, at least ``min_history``). With ``med`` the
median of those earlier runs and ``mad`` their median absolute deviation
scaled by 1.4826 (equal to the standard deviation for normal noise), the run
is a regression when the recent median is worse than ``med`` by more than
``max_drop_sigma`` robust deviations *and* by more than ``min_drop_frac`` of
``med``. So a drop must hold for most of the last ``recent`` runs (2 of 3 by
default) to be flagged. The relative rule keeps a very stable metric (``mad``
near 0) from flagging noise; with ``mad`` exactly 0 only the relative rule
applies. "Worse" is lower for throughputs and higher for times, temperatures
and error counts.

A series is one piece of hardware (:func:`gpuaccept.results.hwid.hardware_units`):
a GPU that moved to another host keeps its series, one that replaced another in
the same slot starts a new one; values with no known hardware are a series per
host and device.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.results.hwid import hardware_units

MAD_TO_SIGMA = 1.4826
# Tags that describe how a value was measured in that run, not which series it belongs to.
VOLATILE_TAGS = frozenset({"bytes_verified"})
# Tags that say where a value was measured: the hardware identity of the series says it instead.
PLACE_TAGS = frozenset({"uuid", "pci_bus_id"})
_LOWER_UNITS = frozenset({"s", "ms", "us", "µs", "ns", "C", "degC"})
_LOWER_WORDS = ("error", "latency", "retired", "remap", "xid", "throttle", "loss")
_LOWER_SUFFIXES = ("_s", "_ms", "_us", "_ns", "_seconds", "_time")


@dataclass(frozen=True)
class TrendRule:
    """Regression test parameters: robust deviations, minimum relative change, history length, recent runs."""

    max_drop_sigma: float = 3.0
    min_drop_frac: float = 0.05
    window: int = 20
    min_history: int = 3
    recent: int = 3


@dataclass(frozen=True)
class TrendPoint:
    """One run's value and how it compares with the runs before it.

    ``recent`` is the median of this value and the ones just before it (``rule.recent``
    values; None until there are that many), the value that is judged; ``reference``
    is the median of the earlier values used (None when there were fewer than
    ``min_history``); ``deviation`` is how much worse than the reference the judged
    value is, in robust deviations (negative: better; infinite when the earlier
    values did not vary); ``change`` is ``judged/reference - 1``.
    """

    run_id: str
    started: str
    value: float
    reference: float | None = None
    spread: float | None = None
    history: int = 0
    deviation: float | None = None
    change: float | None = None
    regression: bool = False
    recent: float | None = None
    host: str | None = None
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["deviation"] is not None and not math.isfinite(d["deviation"]):
            d["deviation"] = "inf" if d["deviation"] > 0 else "-inf"
        return d


@dataclass
class SeriesTrend:
    """All values of one metric series (same check and tags) of one piece of hardware, oldest first.

    ``device`` is where the newest value was measured; ``hw_kind``/``hw_id``/``hw_serial`` name the
    hardware (None: not known, then the series is one host's device); ``hosts`` every host the
    values come from, in order.
    """

    check: str
    metric: str
    device: str | None
    tags: dict[str, Any]
    unit: str
    higher_is_better: bool
    points: list[TrendPoint] = field(default_factory=list)
    hw_kind: str | None = None
    hw_id: str | None = None
    hw_serial: str | None = None
    hosts: list[str] = field(default_factory=list)
    replaced_by: str | None = None
    """Other hardware was measured later where this series' newest value was: its id ("unknown" where
    it has none). The series has ended there (a replaced part, or one moved out of what was read)."""

    @property
    def latest(self) -> TrendPoint | None:
        return self.points[-1] if self.points else None

    @property
    def regressed(self) -> bool:
        """True when the newest value is a regression."""
        return bool(self.points) and self.points[-1].regression

    @property
    def label(self) -> str:
        """``compute gemm_bf16_tflops cuda:0 GPU-... dtype=bf16``: check, metric, device, hardware, tags."""
        return self.describe(with_hw=True)

    def describe(self, with_hw: bool) -> str:
        """:attr:`label`, with or without the hardware id (a board serial is never shown there)."""
        parts = [self.check, self.metric] + ([self.device] if self.device else [])
        parts += [self.hw_id] if with_hw and self.hw_id and self.hw_kind != "node" else []
        parts += [f"{k}={v}" for k, v in sorted(self.tags.items())]
        return " ".join(parts)

    @property
    def moved(self) -> bool:
        """True when the values come from more than one host or device."""
        return len({(p.host, p.device) for p in self.points}) > 1

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "metric": self.metric, "device": self.device, "tags": self.tags,
                "unit": self.unit, "higher_is_better": self.higher_is_better, "regressed": self.regressed,
                "hw_kind": self.hw_kind, "hw_id": self.hw_id, "hw_serial": self.hw_serial, "hosts": self.hosts,
                "replaced_by": self.replaced_by, "points": [p.to_dict() for p in self.points]}


def robust_center(values: Sequence[float]) -> tuple[float, float]:
    """``(median, 1.4826 * MAD)`` of ``values`` (non-empty)."""
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    return med, MAD_TO_SIGMA * mad


def higher_is_better(name: str, unit: str, threshold_op: str | None = None) -> bool:
    """Direction of a metric: from its threshold (``>=`` higher, ``<=`` lower), else from its unit and name."""
    if threshold_op == ">=":
        return True
    if threshold_op == "<=":
        return False
    if unit in _LOWER_UNITS:
        return False
    low = name.lower()
    return not (any(w in low for w in _LOWER_WORDS) or low.endswith(_LOWER_SUFFIXES))


def judge_point(value: float, earlier: Sequence[float], higher_better: bool, rule: TrendRule) -> TrendPoint:
    """Judge ``value`` against ``earlier`` values (oldest first); run_id/started left empty."""
    hist = list(earlier)[-rule.window:] if rule.window > 0 else list(earlier)
    if len(hist) < rule.min_history:
        return TrendPoint(run_id="", started="", value=value, history=len(hist))
    med, spread = robust_center(hist)
    worse = (med - value) if higher_better else (value - med)
    if spread > 0:
        deviation = worse / spread
    else:
        deviation = math.inf if worse > 0 else (-math.inf if worse < 0 else 0.0)
    change = (value / med - 1.0) if med != 0 else None
    rel_worse = (worse / abs(med)) if med != 0 else (math.inf if worse > 0 else 0.0)
    flagged = worse > 0 and deviation > rule.max_drop_sigma and rel_worse > rule.min_drop_frac
    return TrendPoint(run_id="", started="", value=value, reference=med, spread=spread, history=len(hist),
                      deviation=deviation, change=change, regression=flagged)


def judge_series(values: Sequence[float], higher_better: bool, rule: TrendRule) -> list[TrendPoint]:
    """Judge every value of a series (oldest first): the median of it and the ``rule.recent - 1`` values
    before it, against the values before those. run_id/started left empty."""
    k = max(rule.recent, 1)
    out = []
    for i, value in enumerate(values):
        if i + 1 < k:
            out.append(TrendPoint(run_id="", started="", value=value))
            continue
        recent = statistics.median(values[i + 1 - k:i + 1])
        judged = judge_point(recent, values[:i + 1 - k], higher_better, rule)
        out.append(TrendPoint(**{**asdict(judged), "value": value, "recent": recent}))
    return out


def series_key(check: str, device: str | None, tags: dict[str, Any]) -> tuple[str, str, str]:
    """What makes two values comparable: same check, device and tags (volatile and place tags ignored)."""
    kept = {k: v for k, v in tags.items() if k not in VOLATILE_TAGS and k not in PLACE_TAGS}
    return check, device or "", json.dumps(kept, sort_keys=True, default=str)


def build_trends(points: Sequence[Any], rule: TrendRule, direction: str = "auto") -> list[SeriesTrend]:
    """Split stored points (``MetricPoint``-like, oldest first) into series and judge every value.

    A series is one check and tag set of one piece of hardware (module docstring). ``direction``
    is ``auto`` (see :func:`higher_is_better`), ``higher`` or ``lower``. Points without a value
    (NaN in the report) are left out. Two values of one series in the same run are reduced to
    their median.
    """
    valued = [p for p in points if p.value is not None]
    keys = [series_key(p.check, None, p.tags) for p in valued]
    units = hardware_units(valued, key=lambda p: series_key(p.check, None, p.tags))
    grouped: dict[tuple[Any, ...], dict[str, Any]] = {}
    for p, (check, _none, tags_text), unit in zip(valued, keys, units, strict=True):
        g = grouped.setdefault((check, unit, tags_text), {"first": p, "runs": {}, "hw": None})
        run = g["runs"].setdefault((p.run_id, p.host), {"started": p.started, "ts": p.started_ts, "values": [],
                                                        "host": p.host, "device": p.device})
        run["values"].append(float(p.value))
        if p.threshold_op and not g["first"].threshold_op:
            g["first"] = p
        if p.hw_id is not None:
            g["hw"] = p
    out = []
    Place = tuple[str, str, str, str]  # check, tags, host, device
    ends: list[tuple[SeriesTrend, Place, float]] = []   # (series, where its newest value is, when)
    seen_at: dict[Place, list[tuple[float, SeriesTrend]]] = {}  # (when, series) of every value there
    for (check, unit, tags_text), g in grouped.items():
        first = g["first"]
        hib = {"higher": True, "lower": False}.get(direction)
        if hib is None:
            hib = higher_is_better(first.name, first.unit, first.threshold_op)
        runs = sorted(g["runs"].items(), key=lambda kv: (kv[1]["ts"], kv[0]))
        hw = g["hw"]
        series = SeriesTrend(check=check, metric=first.name, device=runs[-1][1]["device"],
                             tags=json.loads(tags_text), unit=first.unit, higher_is_better=hib,
                             hw_kind=unit[0] if unit[0] != "place" else None,
                             hw_id=unit[1] if unit[0] != "place" else None,
                             hw_serial=hw.hw_serial if hw is not None else None,
                             hosts=list(dict.fromkeys(run["host"] for _, run in runs)))
        judged = judge_series([statistics.median(run["values"]) for _, run in runs], hib, rule)
        series.points = [TrendPoint(**{**asdict(j), "run_id": run_id, "started": run["started"],
                                       "host": run["host"], "device": run["device"]})
                         for j, ((run_id, _host), run) in zip(judged, runs, strict=True)]
        out.append(series)
        last = runs[-1][1]
        ends.append((series, (check, tags_text, last["host"], last["device"] or ""), last["ts"]))
        for _, run in runs:
            seen_at.setdefault((check, tags_text, run["host"], run["device"] or ""), []).append((run["ts"], series))
    for series, place, ts in ends:
        after = [o for t, o in seen_at.get(place, []) if t > ts and o is not series]
        if after:
            series.replaced_by = after[0].hw_id or "unknown"
    def order(s: SeriesTrend) -> tuple[Any, ...]:
        tags_text = json.dumps(s.tags, sort_keys=True, default=str)
        return s.check, s.device or "", len(tags_text), tags_text, s.points[0].started, s.hw_id or ""

    out.sort(key=order)
    return out
