"""``gpuaccept sweep flag``: every node of the history whose newest results fall against its own past.

The per-node ``gpuaccept trend --host H --metric M`` over the whole fleet: for each metric (every metric in the
history, or those named) the values of every host, split into series per piece of hardware (a GPU keeps its
history when it moves), each judged by :func:`gpuaccept.results.trend.build_trends` with one rule. A series
whose newest run regressed, and whose newest value is on a host (not a part replaced since), is a finding:
the node degrades before any threshold fails it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finding:
    """A regressed series: where it is now, what it is, and by how much (``change``: fraction, -0.12 = -12 %)."""

    host: str
    label: str
    unit: str
    value: float | None
    reference: float | None
    change: float | None
    deviation: float | None
    runs: int

    def line(self) -> str:
        pct = f"{self.change * 100:+.1f}%" if self.change is not None else "n/a"
        return (f"{self.host}: {self.label}: median {self.value:.4g} {self.unit} of the latest runs vs "
                f"{self.reference:.4g} before ({pct}, {self.deviation:.1f} robust deviations, {self.runs} runs)"
                if self.value is not None and self.reference is not None and self.deviation is not None
                else f"{self.host}: {self.label}: regressed")


def findings(series: Sequence[Any]) -> list[Finding]:
    """The regressed series of ``series`` (``SeriesTrend``), worst change first, on the host of their newest
    value; series that ended (a replaced part) are not judged."""
    out = []
    for s in series:
        if not s.regressed or s.replaced_by is not None:
            continue
        p = s.points[-1]
        out.append(Finding(host=p.host, label=s.describe(with_hw=True), unit=s.unit, value=p.recent,
                           reference=p.reference, change=p.change, deviation=p.deviation, runs=len(s.points)))
    return sorted(out, key=lambda f: (-(abs(f.change) if f.change is not None else 0.0), f.host, f.label))


def scan(store: Any, metrics: Sequence[str] | None, since: float | None, rule: Any) -> tuple[list[Finding], int]:
    """(findings, series judged) over the history ``store`` for ``metrics`` (None: every metric in it)."""
    from gpuaccept.errors import InputError
    from gpuaccept.results.trend import build_trends

    names = store.metric_names()
    if not names:
        raise InputError(f"{store} holds no metric values: nothing to judge")
    for name in metrics or ():
        if name not in names:
            raise InputError(f"no metric {name!r} in {store}")
    judged = 0
    out: list[Finding] = []
    for name in metrics or names:
        series = build_trends(store.metric_points(metric=name, since=since), rule)
        judged += sum(1 for s in series if s.latest is not None and s.latest.reference is not None)
        out += findings(series)
    return out, judged
