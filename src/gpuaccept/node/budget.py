"""``gpuaccept run --budget``: which checks, at which depth, fit a maintenance window (pure; seconds).

A check's depth levels are the parameter values of each profile it belongs to (``Check.profiles``)
and of the run's own profile, the configuration's values over each, ordered by their estimated
seconds (:meth:`~gpuaccept.checks.base.Check.estimate_s` plus the process start). Those below the
run's profile are shallower, those above deeper. A check whose run time follows a duration
(:meth:`~gpuaccept.checks.base.Check.budget_stretch`: ``stress``, ``throughput``, ``disk``) can also be
shortened, down to its shortest useful value. A check without an estimate (a plugin's) has one level,
and its timeout counts.

:func:`plan_budget` fills the window in three steps, each in suite order:

1. coverage: each check at its shallowest (shortened as far as it goes) while it fits; one that does not
   is left out, saying what it needs and what was left;
2. depth: what is left, less :data:`RESERVE_FRACTION` of the budget kept for the second pass, deepens
   the kept checks one level at a time, round robin, up to the level the run's profile asks for;
3. length: what is still left lengthens the shortened durations, shared equally.

The second pass (:func:`plan_reruns`, run by :mod:`gpuaccept.node.budget_run`): each first-pass result that is
:func:`suspect` is run again, deeper than it ran, within what is left of the window. A re-run adds a
result; it never replaces the first, so it can confirm a problem, never hide one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuaccept.argtypes import fmt_s as fmt_s  # the one format of a duration, beside its parser
from gpuaccept.checks.base import PROFILES, Check
from gpuaccept.errors import UsageError
from gpuaccept.model import CheckResult, Status
from gpuaccept.node.config import Config
from gpuaccept.node.judge import NO_EXPECTATION, WARNED_FOR
from gpuaccept.node.suite import SuitePlan

RESERVE_FRACTION = 0.2
"""Share of the budget that the depth step leaves for deeper re-runs of suspect results."""
RUN_OVERHEAD_S = 5.0
"""Seconds of a run outside its checks: the warm process importing torch, planning, the report."""
START_S = {"cpu": 0.5, "cuda": 3.0}
"""Seconds to start one check's process (forked, then CUDA initialised on a GPU run)."""
DIST_START_S = 4.0
"""Seconds more for a distributed check: its rank processes and their rendezvous."""
NEAR_FRACTION = 0.05
"""A metric within this fraction of its bound (of the bound's size) is near it (:func:`suspect`)."""
ASSUMED_GPUS = 8
"""GPUs a CUDA run is planned for when NVML cannot count the selected ones."""


@dataclass(frozen=True)
class Stretch:
    """A duration parameter the estimate follows linearly: ``fixed_s + per_unit_s * value`` seconds."""

    param: str
    shortest: float
    fixed_s: float
    per_unit_s: float

    def seconds(self, value: float) -> float:
        return self.fixed_s + self.per_unit_s * value

    def value_for(self, seconds: float, longest: float) -> float | None:
        """The longest value, at most ``longest``, in tenths, whose estimate is within ``seconds``;
        None when even ``shortest`` is over it."""
        value = min(longest, math.floor((seconds - self.fixed_s) / self.per_unit_s * 10 + 1e-9) / 10)
        return value if value >= self.shortest else None


@dataclass(frozen=True)
class Level:
    """One depth of a check: the profile whose values these are, the values, their estimated seconds."""

    profile: str
    params: dict[str, Any]
    estimate_s: float
    stretch: Stretch | None = None

    def at(self, value: float | None) -> tuple[dict[str, Any], float]:
        """(parameter values, estimated seconds) with the stretched duration at ``value`` (None: the level's)."""
        if value is None or self.stretch is None:
            return dict(self.params), self.estimate_s
        old = self.params[self.stretch.param]
        return {**self.params, self.stretch.param: int(value) if isinstance(old, int) else value}, \
            self.stretch.seconds(value)


@dataclass(frozen=True)
class Depth:
    """Where a check stands: a level (index) and, when shortened, its duration's value."""

    level: int
    value: float | None = None


@dataclass(frozen=True)
class Candidate:
    """A selected check, its levels shallowest first; ``planned`` indexes the run's profile's level."""

    name: str
    levels: tuple[Level, ...]
    planned: int
    measures: bool = True
    estimated: bool = True
    required: bool = False
    """Kept whatever its estimate (the healthcheck's own checks: a node is never called healthy without them)."""
    ceiling: int | None = None
    """The deepest level the depth step may reach (None: ``planned``); the healthcheck plans its fast level and
    lets a budget with room go deeper."""

    @property
    def top(self) -> int:
        return self.planned if self.ceiling is None else self.ceiling

    def seconds(self, depth: Depth) -> float:
        return self.levels[depth.level].at(depth.value)[1]

    def shallowest(self) -> Depth:
        level = self.levels[0]
        return Depth(0, level.stretch.shortest) if level.stretch is not None else Depth(0)

    def describe(self, depth: Depth) -> str:
        """``quick level``, ``full level, duration_s 12``."""
        level = self.levels[depth.level]
        text = f"{level.profile} level"
        if depth.value is not None and level.stretch is not None:
            text += f", {level.stretch.param} {depth.value:g}"
        return text

    def stretched_within(self, seconds: float, levels: range) -> list[Depth]:
        """For each stretchable level in ``levels``: its longest shortening within ``seconds``."""
        out = []
        for j in levels:
            st = self.levels[j].stretch
            if st is not None:
                value = st.value_for(seconds, float(self.levels[j].params[st.param]))
                if value is not None:
                    out.append(Depth(j) if value >= float(self.levels[j].params[st.param]) else Depth(j, value))
        return out


@dataclass(frozen=True)
class Choice:
    """A check the budget keeps: the level and values it runs with (``changed``: name -> [planned, chosen])."""

    name: str
    level: str
    planned_level: str
    params: dict[str, Any]
    changed: dict[str, list[Any]]
    estimate_s: float
    why: str
    depth: Depth

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "level": self.level, "planned_level": self.planned_level,
                "estimate_s": round(self.estimate_s, 1), "changed": self.changed, "why": self.why}


@dataclass(frozen=True)
class LeftOut:
    """A check the budget leaves out: what it needs at its shallowest, and why it did not fit."""

    name: str
    needs_s: float
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "needs_s": round(self.needs_s, 1), "why": self.why}


@dataclass
class BudgetPlan:
    """What ``--budget`` chose; ``reruns`` is filled by the second pass."""

    budget_s: float
    overhead_s: float
    reserve_s: float
    gpus: int
    gpus_assumed: bool
    kept: list[Choice]
    left_out: list[LeftOut]
    reruns: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] | None = None
    """Where the estimates came from (:meth:`gpuaccept.node.calibrate.Calibration.to_dict`); None: the built-in ones."""

    @property
    def estimate_s(self) -> float:
        """The first pass's estimated seconds, the run's own overhead included."""
        return self.overhead_s + sum(c.estimate_s for c in self.kept)

    def to_dict(self) -> dict[str, Any]:
        return {"budget_s": self.budget_s, "estimate_s": round(self.estimate_s, 1),
                "overhead_s": self.overhead_s, "reserve_s": round(self.reserve_s, 1), "gpus": self.gpus,
                "gpus_assumed": self.gpus_assumed, "kept": [c.to_dict() for c in self.kept],
                "left_out": [c.to_dict() for c in self.left_out], "reruns": list(self.reruns),
                **({"calibration": self.calibration} if self.calibration is not None else {})}

    def lines(self) -> list[str]:
        """What the plan says, one line each, for the console."""
        out = [f"budget {fmt_s(self.budget_s)}: {len(self.kept)} of {len(self.kept) + len(self.left_out)} checks "
               f"fit, ~{fmt_s(self.estimate_s)} estimated; the rest is kept for deeper re-runs of suspect results"]
        if self.estimate_s > self.budget_s:
            out.append(f"the checks that always run need ~{fmt_s(self.estimate_s)}, more than the budget: they run "
                       "anyway, and one the deadline stops is a FAIL")
        if self.calibration is not None:
            out.append(str(self.calibration.get("summary", "")))
        out += [f"{c.name}: {c.why}" for c in self.kept if c.changed or c.level != c.planned_level]
        out += [f"left out: {c.name}: {c.why}" for c in self.left_out]
        return out


def _candidate(cls: type[Check], name: str, planned: dict[str, Any], profile: str, given: dict[str, Any],
               total: Callable[[dict[str, Any]], float | None], timeout_s: float) -> Candidate:
    """The levels of one check (see the module's docstring)."""
    measures = bool(getattr(cls, "measures", True))
    planned_s = total(planned)
    if planned_s is None:
        return Candidate(name, (Level(profile, dict(planned), timeout_s),), 0, measures, estimated=False)
    sets = [(profile, planned)] + [(p, {**cls.defaults(p), **given}) for p in PROFILES if p in cls.profiles]
    levels: list[Level] = []
    for prof, params in sets:
        seconds = total(params)
        if seconds is None or any(lv.params == params or lv.estimate_s == seconds for lv in levels):
            continue
        levels.append(Level(prof, dict(params), seconds, _stretch(cls, params, total)))
    mine = levels[0]
    levels.sort(key=lambda lv: lv.estimate_s)
    return Candidate(name, tuple(levels), levels.index(mine), measures)


def planned_gpus(device: str, selected: Sequence[int] | None, counted: int) -> tuple[int, bool]:
    """(GPUs the estimates plan for, whether assumed): the selection, else ``counted`` (what NVML counted;
    0 when not asked), else :data:`ASSUMED_GPUS`; (0, False) on a CPU run."""
    if device != "cuda":
        return 0, False
    gpus = len(selected) if selected else counted
    return (gpus, False) if gpus > 0 else (ASSUMED_GPUS, True)


def estimates_of(cands: Sequence[Candidate], chosen: BudgetPlan | None = None) -> dict[str, float]:
    """Each estimated check's built-in seconds (its process start included) as planned, or at the depth
    ``chosen`` keeps it: the report's ``estimates``, which later plans calibrate against
    (:mod:`gpuaccept.node.calibrate`). ``cands`` must be the uncalibrated ones, so that factors do not compound."""
    if chosen is None:
        return {c.name: round(c.levels[c.planned].estimate_s, 3) for c in cands if c.estimated}
    by_name = {c.name: c for c in cands}
    return {k.name: round(by_name[k.name].seconds(k.depth), 3) for k in chosen.kept
            if k.name in by_name and by_name[k.name].estimated}


def _stretch(cls: type[Check], params: dict[str, Any],
             total: Callable[[dict[str, Any]], float | None]) -> Stretch | None:
    spec = cls.budget_stretch(params)
    if spec is None:
        return None
    name, shortest = spec
    value = float(params[name])
    if value <= shortest:
        return None
    low, high = total({**params, name: shortest}), total(params)
    if low is None or high is None or high <= low:
        return None
    per_unit = (high - low) / (value - shortest)
    return Stretch(name, shortest, low - per_unit * shortest, per_unit)


def candidates(plan: SuitePlan, config: Config, registry: dict[str, type[Check]], gpus: int) -> list[Candidate]:
    """The depth levels of every planned check, in suite order, for a run on ``plan.device`` with ``gpus``
    selected GPUs."""
    out = []
    for check in plan.checks:
        cls = registry[check.name]
        settings = config.checks.get(check.name)
        start = START_S.get(plan.device, START_S["cuda"]) + (DIST_START_S if getattr(cls, "distributed", False)
                                                             else 0.0)

        def total(params: dict[str, Any], cls: type[Check] = cls, start: float = start) -> float | None:
            seconds = cls.estimate_s(params, plan.device, gpus)
            return None if seconds is None else seconds + start

        out.append(_candidate(cls, check.name, check.params, plan.profile,
                              dict(settings.params) if settings is not None else {}, total, check.timeout_s))
    return out


def _choice(c: Candidate, depth: Depth) -> Choice:
    planned = c.levels[c.planned]
    level = c.levels[depth.level]
    params, seconds = level.at(depth.value)
    changed = {k: [planned.params.get(k), v] for k, v in params.items() if planned.params.get(k) != v}
    if not c.estimated:
        why = "as planned (no estimate: its timeout counts)"
    elif depth.level == c.planned and depth.value is None:
        why = "as planned"
    elif depth.level > c.planned:
        why = (f"{c.describe(depth)}, ~{fmt_s(seconds)} (deeper than the {planned.profile} level planned, "
               f"~{fmt_s(planned.estimate_s)}: the budget has room)")
    else:
        why = (f"{c.describe(depth)}, ~{fmt_s(seconds)} "
               f"({planned.profile}, as planned, needs ~{fmt_s(planned.estimate_s)})")
    return Choice(c.name, level.profile, planned.profile, params, changed, seconds, why, depth)


def _next(c: Candidate, depth: Depth) -> Depth | None:
    """One step deeper toward the planned level (or the ceiling): the level unshortened, else the next level."""
    if depth.value is not None:
        return Depth(depth.level)
    return Depth(depth.level + 1) if depth.level < c.top else None


def plan_budget(cands: Sequence[Candidate], budget_s: float, gpus: int = 0, gpus_assumed: bool = False,
                overhead_s: float = RUN_OVERHEAD_S) -> BudgetPlan:
    """Which checks fit ``budget_s`` seconds, at which depth (see the module's docstring). Pure."""
    left = budget_s - overhead_s
    state: dict[str, Depth] = {}
    left_out: list[LeftOut] = []
    for c in cands:
        depth = c.shallowest()
        need = c.seconds(depth)
        if need <= left or c.required:
            state[c.name] = depth
            left -= need
        else:
            left_out.append(LeftOut(c.name, need, f"needs ~{fmt_s(need)} at its shallowest ({c.describe(depth)}); "
                                                  f"{fmt_s(max(left, 0.0), up=False)} of the budget was left"))
    kept = [c for c in cands if c.name in state]
    spend = left - RESERVE_FRACTION * budget_s
    grew = True
    while grew:  # step 2: whole steps, round robin
        grew = False
        for c in kept:
            step = _next(c, state[c.name])
            if step is not None and c.seconds(step) - c.seconds(state[c.name]) <= spend:
                spend -= c.seconds(step) - c.seconds(state[c.name])
                state[c.name] = step
                grew = True
    short = [c for c in kept if _next(c, state[c.name]) is not None]
    for i, c in enumerate(short):  # step 3: lengthen the shortened durations with what is left, shared equally
        now = c.seconds(state[c.name])
        share = max(spend, 0.0) / (len(short) - i)
        options = [d for d in c.stretched_within(now + share, range(state[c.name].level, c.top + 1))
                   if c.seconds(d) > now]
        if options:
            best = max(options, key=lambda d: (c.seconds(d), d.level))
            spend -= c.seconds(best) - now
            state[c.name] = best
    return BudgetPlan(budget_s, overhead_s, min(RESERVE_FRACTION * budget_s, max(left, 0.0)), gpus, gpus_assumed,
                      [_choice(c, state[c.name]) for c in kept], left_out)


def refuse_empty(bplan: BudgetPlan, cands: Sequence[Candidate]) -> None:
    """UsageError when the budget keeps no check, or none that measures where the selection has some."""
    if not bplan.kept:
        small = min(bplan.left_out, key=lambda c: c.needs_s)
        raise UsageError(f"--budget {fmt_s(bplan.budget_s)} fits no check; the smallest, {small.name}, needs "
                         f"~{fmt_s(small.needs_s)} and the run itself ~{fmt_s(bplan.overhead_s)}")
    measuring = {c.name for c in cands if c.measures}
    if measuring and not any(c.name in measuring for c in bplan.kept):
        small = min((c for c in bplan.left_out if c.name in measuring), key=lambda c: c.needs_s)
        stock = ", ".join(c.name for c in bplan.kept)
        raise UsageError(f"--budget {fmt_s(bplan.budget_s)} fits no check that measures (only {stock}, which "
                         f"takes stock); the smallest, {small.name}, needs ~{fmt_s(small.needs_s)} more than was left")


def apply_budget(plan: SuitePlan, bplan: BudgetPlan, registry: dict[str, type[Check]], config: Config,
                 timeout_scale: float = 1.0) -> SuitePlan:
    """``plan`` with only the kept checks, each with its chosen values and the timeout that goes with them."""
    kept = {c.name: c for c in bplan.kept}
    checks = []
    for check in plan.checks:
        choice = kept.get(check.name)
        if choice is None:
            continue
        if choice.params != check.params:
            check = replace(check, params=choice.params,
                            timeout_s=timeout_for(registry[check.name], choice.level, choice.params, config,
                                                  timeout_scale))
        checks.append(check)
    return replace(plan, checks=checks)


def timeout_for(cls: type[Check], profile: str, params: dict[str, Any], config: Config, scale: float) -> float:
    """The timeout of ``cls`` run with ``params`` of ``profile``'s level: the configuration's, else the check's."""
    settings = config.checks.get(cls.name)
    if settings is not None and settings.timeout_s is not None:
        return settings.timeout_s * scale
    return cls.timeout_for(profile, params) * scale


def suspect(result: CheckResult) -> str | None:
    """Why a first-pass result calls for a deeper run, or None.

    Suspect: a WARN (but not one only for figures without expectation, ``details.warned_for``: a deeper run
    cannot give them one, so it is judged as a PASS); a PASS with a metric within :data:`NEAR_FRACTION` of its
    bound (a bound of 0, a count of errors, is never near: 0 errors is clean); a FAIL whose failing metrics all
    missed their bound by at most that fraction (a marginal miss a longer measurement settles). Not suspect: a
    FAIL with a clear miss or a check's own failure (wrong results, a timeout), an ERROR or a SKIP: a deeper
    run does not clarify those.
    """
    unjudged_only = isinstance(result.details, dict) and result.details.get(WARNED_FOR) == NO_EXPECTATION
    if result.status is Status.WARN and not unjudged_only:
        return f"it warned: {result.reason[:200]}"
    if result.status not in (Status.PASS, Status.FAIL, Status.WARN):
        return None
    near: list[tuple[float, str]] = []
    missed: list[tuple[float, str]] = []
    for m in result.metrics:
        t = m.threshold
        if t is None:
            continue
        met = t.met_by(m.value)
        if t.value == 0 or not math.isfinite(m.value) or t.clamped:
            if not met and t.severity is Status.FAIL:
                missed.append((-math.inf, ""))
            continue
        gap = (m.value - t.value) / abs(t.value) * (1 if t.op == ">=" else -1)
        shown = f"{m.name}{f' [{m.device}]' if m.device else ''} = {m.value:.4g}"
        if met and gap <= NEAR_FRACTION:
            near.append((gap, f"{shown} is within {gap:.1%} of its bound {t.op} {t.value:.4g}"))
        elif not met and t.severity is Status.FAIL:
            missed.append((gap, f"{shown} missed its bound {t.op} {t.value:.4g} by {-gap:.1%}, a marginal miss"))
    if result.status is Status.FAIL:
        if missed and all(gap >= -NEAR_FRACTION for gap, _ in missed):
            return min(missed)[1]
        return None
    return min(near)[1] if near else None


@dataclass(frozen=True)
class Rerun:
    """A deeper run of a suspect check: the level (a profile's) and values it runs with, and why.
    ``depth`` describes the level (``standard level, duration_s 40``), ``changed`` the values that differ
    from the first pass's (name -> [first, now]), ``first`` how the first pass ran and ended."""

    name: str
    level: str
    depth: str
    params: dict[str, Any]
    estimate_s: float
    why: str
    changed: dict[str, list[Any]]
    first: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "level": self.level, "depth": self.depth, "estimate_s": round(self.estimate_s, 1),
                "why": self.why, "changed": self.changed, "first": self.first}


def plan_reruns(cands: Sequence[Candidate], kept: Sequence[Choice], results: Sequence[CheckResult],
                left_s: float) -> tuple[list[Rerun], list[dict[str, Any]]]:
    """The second pass within ``left_s`` seconds: (re-runs, notes on suspect results that are not re-run).

    Suspect results in suite order; each gets an equal share of what is left and the deepest level that
    fits the share (lengthened where it has a duration), else the shallowest deeper level that fits what
    is left, else a note saying what it would need. Pure.
    """
    by_name = {c.name: c for c in cands}
    ran = {k.name: k for k in kept}
    found = [(r, why) for r in results if r.name in ran and (why := suspect(r)) is not None]
    reruns: list[Rerun] = []
    notes: list[dict[str, Any]] = []
    left = left_s
    for i, (result, why) in enumerate(found):
        c, first = by_name[result.name], ran[result.name]
        now = c.seconds(first.depth)
        deeper = [Depth(j) for j in range(len(c.levels)) if c.seconds(Depth(j)) > now]
        share = max(left, 0.0) / (len(found) - i)
        fits = [d for d in deeper if c.seconds(d) <= share]
        fits += [d for d in c.stretched_within(share, range(first.depth.level, len(c.levels))) if c.seconds(d) > now]
        if not fits:  # no deeper level fits an equal share: the shallowest that fits what is left
            fits = sorted((d for d in deeper if c.seconds(d) <= left), key=c.seconds)[:1]
        note = {"name": result.name, "why": why, "status": result.status.value}
        if not deeper:
            notes.append({**note, "not_rerun": f"no deeper level than the {c.describe(first.depth)} it ran at"})
            continue
        if not fits:
            need = min(c.seconds(d) for d in deeper)
            notes.append({**note, "not_rerun": f"the next deeper level needs ~{fmt_s(need)}, "
                                               f"{fmt_s(left, up=False)} of the budget was left"})
            continue
        depth = max(fits, key=lambda d: (c.seconds(d), d.level))
        params, seconds = c.levels[depth.level].at(depth.value)
        left -= seconds
        changed = {k: [first.params.get(k), v] for k, v in params.items() if first.params.get(k) != v}
        reruns.append(Rerun(result.name, c.levels[depth.level].profile, c.describe(depth), params, seconds, why,
                            changed, {"status": result.status.value, "level": first.level, "why": first.why}))
    return reruns, notes
