"""Estimates calibrated from this host's history: how long each check took against what was estimated.

Every run records each check's built-in estimate as it ran (the report's ``estimates``,
:func:`gpuaccept.node.budget.estimates_of`). A check's factor is the largest ratio of measured to
estimated seconds over its newest :data:`NEWEST` first-pass results at one level (the same built-in
estimate: the same parameters, device and GPU count) on this host and device (any status but an
ERROR, which may be a timeout or a crash; a check that skips on this host, such as ``health``
without NVML, is learnt to be short), clamped to [:data:`MIN_FACTOR`, :data:`MAX_FACTOR`]. The
largest and not the median, because a plan that runs late is stopped by its deadline (in the
healthcheck, a FAIL), while one that runs early only leaves time unused. A factor is not carried to
a level that never ran here, unless it says the host is slower than the built-in rates: a deeper
level's fixed durations (a 5 s warm-up, a sampling time) do not shrink on a fast host (see
:func:`calibrate`). A check without history keeps the built-in estimates. Pure, but for
:func:`from_history`, the I/O edge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuaccept.model import NodeReport, Status
from gpuaccept.node.budget import Candidate, Level, Stretch

NEWEST = 5
"""Results per check that count: enough to catch a slow run, few enough to follow a change of the node."""
RUNS_READ = 30
"""Newest runs of the host read from the history."""
MIN_FACTOR, MAX_FACTOR = 0.02, 20.0
COUNTED = (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP)


@dataclass(frozen=True)
class Sample:
    """One first-pass result: its check, measured and estimated seconds, and the run it came from."""

    name: str
    duration_s: float
    estimate_s: float
    run_id: str

    @property
    def ratio(self) -> float:
        return self.duration_s / self.estimate_s


def samples_of(report: NodeReport, device: str) -> list[Sample]:
    """The calibration samples of one stored run on ``device`` (none from a run on another device, a run
    without estimates, or a deeper re-run, whose estimate was itself calibrated)."""
    if report.device != device or not report.estimates:
        return []
    out = []
    for c in report.checks:
        est = report.estimates.get(c.name)
        if c.is_rerun or est is None or c.status not in COUNTED:
            continue
        if math.isfinite(c.duration_s) and c.duration_s > 0 and math.isfinite(est) and est > 0:
            out.append(Sample(c.name, c.duration_s, est, report.run_id))
    return out


def level_key(estimate_s: float) -> float:
    """A level's identity in the history: its built-in estimate (seconds, rounded as reports keep it). The
    estimate follows from the check's parameters, the device and the GPU count, so equal keys ran alike."""
    return round(estimate_s, 3)


@dataclass(frozen=True)
class Calibration:
    """Per check and level (:func:`level_key`), the factor (measured / estimated seconds); per check, the
    largest of them and how many results they rest on."""

    levels: dict[str, dict[float, float]]
    results: dict[str, int]
    runs: int
    source: str

    @property
    def factors(self) -> dict[str, float]:
        """Each check's largest factor over its levels."""
        return {n: max(f.values()) for n, f in self.levels.items()}

    def summary(self) -> str:
        if not self.levels:
            return f"estimates: built in (no past run of this host on this device in {self.source})"
        shown = ", ".join(f"{n} x{f:.2g}" for n, f in sorted(self.factors.items()))
        return f"estimates: calibrated from {self.runs} past runs of this host in {self.source} ({shown})"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "runs": self.runs,
                "factors": {n: round(f, 3) for n, f in sorted(self.factors.items())},
                "results": dict(sorted(self.results.items())), "summary": self.summary()}


def calibration(reports: Sequence[NodeReport], device: str, source: str, newest: int = NEWEST) -> Calibration:
    """The factors from ``reports``, newest first (see the module's docstring). Pure."""
    ratios: dict[str, dict[float, list[float]]] = {}
    runs = set()
    for report in reports:
        for s in samples_of(report, device):
            mine = ratios.setdefault(s.name, {}).setdefault(level_key(s.estimate_s), [])
            if len(mine) < newest:
                mine.append(s.ratio)
                runs.add(s.run_id)
    levels = {n: {k: min(MAX_FACTOR, max(MIN_FACTOR, max(r))) for k, r in by.items()} for n, by in ratios.items()}
    return Calibration(levels, {n: sum(len(r) for r in by.values()) for n, by in ratios.items()}, len(runs), source)


def calibrate(cands: Sequence[Candidate], cal: Calibration) -> list[Candidate]:
    """``cands`` with each level (and its stretch) of a check with history scaled: a level that ran here by its
    own factor; one that did not by the check's largest factor where that is above 1 (this host is slower than
    the built-in rates), else not at all, because a level's fixed durations (a warm-up, a sampling time) do not
    shrink with a faster host. Then no level is estimated above a deeper one (it does less)."""
    out = []
    for c in cands:
        mine = cal.levels.get(c.name)
        if not mine or not c.estimated:
            out.append(c)
            continue
        slower = max(1.0, max(mine.values()))
        levels = [_scaled(lv, mine.get(level_key(lv.estimate_s), slower)) for lv in c.levels]
        for i in range(len(levels) - 2, -1, -1):
            if levels[i].estimate_s > levels[i + 1].estimate_s:
                levels[i] = replace(levels[i], estimate_s=levels[i + 1].estimate_s)
        out.append(replace(c, levels=tuple(levels)))
    return out


def _scaled(level: Level, f: float) -> Level:
    st = level.stretch
    stretch = None if st is None else Stretch(st.param, st.shortest, st.fixed_s * f, st.per_unit_s * f)
    return replace(level, estimate_s=level.estimate_s * f, stretch=stretch)


def from_history(url: str | None, host: str, device: str) -> Calibration:
    """The calibration from the history at ``url`` (None: ``$GPUACCEPT_DB`` or the default file), read only.
    Raises GpuacceptError when it cannot be read; the caller warns and plans with the built-in estimates."""
    from gpuaccept.results.dburl import parse_db_url, resolve_db_url
    from gpuaccept.results.history import open_store

    parsed = resolve_db_url(None) if url is None else parse_db_url(url)
    if parsed.kind == "sqlite" and parsed.path is not None and not parsed.path.exists():
        return calibration([], device, parsed.redacted())  # no history yet: nothing to learn from
    store = open_store(parsed, read_only=True)
    try:
        reports = store.recent_reports(host, RUNS_READ)
        return calibration(reports, device, store.url.redacted())
    finally:
        store.close()


def planned_with_history(cands: list[Candidate], device: str, db: str | None, host: str,
                         off: str = "") -> tuple[list[Candidate], dict[str, Any], str | None]:
    """(``cands`` calibrated from ``host``'s history at ``db``, what the calibration says for the report, a
    warning or None). ``off`` says why the history is not read (then nothing is); a history that cannot be
    read costs a warning and the built-in estimates, never the run."""
    from gpuaccept.errors import GpuacceptError

    if off:
        return cands, _builtin(f"estimates: built in ({off}: the history is not read)"), None
    try:
        cal = from_history(db, host, device)
    except GpuacceptError as exc:
        return cands, _builtin("estimates: built in (the history could not be read)"), (
            f"the history cannot be read to calibrate the estimates ({exc}); planning with the built-in ones")
    return calibrate(cands, cal), cal.to_dict(), None


def _builtin(summary: str) -> dict[str, Any]:
    return {"source": "", "runs": 0, "factors": {}, "results": {}, "summary": summary}
