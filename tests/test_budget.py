"""``run --budget``'s planner, pure: durations, depth levels from the registry, the first-pass plan, what
is suspect, and the second pass's deeper re-runs. The command line is in ``tests/test_budget_cli.py``."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaccept.argtypes import MAX_DURATION_S, parse_duration
from gpuaccept.checks import registry
from gpuaccept.checks.base import Check, CheckContext, Outcome
from gpuaccept.errors import UsageError
from gpuaccept.model import CheckResult, Metric, Status, Threshold
from gpuaccept.node.budget import (
    RESERVE_FRACTION,
    BudgetPlan,
    Candidate,
    Depth,
    Level,
    Stretch,
    apply_budget,
    candidates,
    fmt_s,
    plan_budget,
    plan_reruns,
    refuse_empty,
    suspect,
)
from gpuaccept.node.config import CheckSettings, Config
from gpuaccept.node.suite import RunOptions, plan_suite

# ---------------------------------------------------------------- durations


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("600", 600), ("0.5s", 0.5), ("2d", 172800),
    ("7d", MAX_DURATION_S), (" 10M ", 600),
])
def test_a_duration_reads_as_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "words"), [
    ("0", "must be more than 0"), ("0s", "must be more than 0"), ("-5m", "must be more than 0"),
    ("-0.5", "must be more than 0"), ("abc", "is not a duration"), ("", "is not a duration"),
    ("5x", "is not a duration"), ("1e5", "is not a duration"), ("inf", "is not a duration"),
    ("nan", "is not a duration"), ("1h 30m", "is not a duration"), ("99999999999s", "is not a duration"),
    ("100d", "longer than the maximum, 7d"), ("7d1s", "longer than the maximum"),
])
def test_a_bad_duration_is_refused_with_a_reason(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "up", "text"), [
    (0, True, "0s"), (44.2, True, "45s"), (44.9, False, "44s"), (60, True, "1m"), (372, True, "6m12s"),
    (5400, True, "1h30m"), (183600, True, "2d3h"), (-3, False, "0s"),
])
def test_seconds_are_shown_in_whole_units(seconds: float, up: bool, text: str) -> None:
    assert fmt_s(seconds, up) == text


# ---------------------------------------------------------------- levels from the registry


def _cands(profile: str, device: str = "cpu", gpus: int = 0, config: Config | None = None,
           checks: list[str] | None = None) -> tuple[Any, list[Candidate]]:
    cfg = config or Config()
    plan = plan_suite(RunOptions(profile=profile, checks=checks), cfg, registry(), device)
    return plan, candidates(plan, cfg, registry(), gpus)


def test_the_levels_of_a_check_are_its_profiles_ordered_by_estimate() -> None:
    _, cands = _cands("standard")
    compute = next(c for c in cands if c.name == "compute")
    assert [lv.profile for lv in compute.levels] == ["quick", "standard", "full"]
    assert compute.levels[compute.planned].profile == "standard"
    assert [lv.estimate_s for lv in compute.levels] == sorted(lv.estimate_s for lv in compute.levels)
    assert compute.levels[0].params["warmup_s"] == 0.2 and compute.levels[2].params["trials"] == 10
    env = next(c for c in cands if c.name == "env")
    assert len(env.levels) == 1  # every profile the same: nothing shallower, nothing deeper


def test_a_gpu_run_is_planned_for_its_gpus() -> None:
    _, one = _cands("standard", "cuda", 1)
    _, eight = _cands("standard", "cuda", 8)
    c1, c8 = (next(c for c in cands if c.name == "compute") for cands in (one, eight))
    assert c8.levels[c8.planned].estimate_s > 4 * c1.levels[c1.planned].estimate_s


def test_a_duration_check_can_be_shortened_and_the_config_applies_at_every_level() -> None:
    cfg = Config(checks={"stress": CheckSettings(params={"window_s": 2.0})})
    _, cands = _cands("full", config=cfg)
    stress = next(c for c in cands if c.name == "stress")
    assert [lv.profile for lv in stress.levels] == ["full", "burnin"]
    assert all(lv.params["window_s"] == 2.0 for lv in stress.levels)
    stretch = stress.levels[0].stretch
    assert stretch is not None and stretch.param == "duration_s" and stretch.shortest == 10.0
    assert stretch.seconds(30.0) == pytest.approx(stress.levels[0].estimate_s)
    assert stress.levels[0].at(12.0)[0]["duration_s"] == 12.0


class NoEstimate(Check):
    """A plugin's check: no estimate_s."""

    name = "noestimate"
    tag = "X"
    summary = "declares no estimate"

    def run(self, ctx: CheckContext) -> Outcome:
        raise AssertionError("never run here")


def test_a_check_without_an_estimate_counts_its_timeout() -> None:
    reg: dict[str, type[Check]] = {**registry(), "noestimate": NoEstimate}
    plan = plan_suite(RunOptions(profile="quick", checks=["env", "noestimate"]), Config(), reg, "cpu")
    cands = candidates(plan, Config(), reg, 0)
    last = cands[-1]
    assert not last.estimated and len(last.levels) == 1
    assert last.levels[0].estimate_s == plan.checks[-1].timeout_s == 60.0


# ---------------------------------------------------------------- the first pass


def _lv(profile: str, seconds: float, **params: Any) -> Level:
    return Level(profile, {"p": profile, **params}, seconds)


def _cand(name: str, *seconds: float, planned: int | None = None, measures: bool = True) -> Candidate:
    levels = tuple(_lv(p, s) for p, s in zip(("quick", "standard", "full"), seconds, strict=False))
    return Candidate(name, levels, len(levels) - 1 if planned is None else planned, measures)


def _stretchy(name: str, seconds: float, value: float, shortest: float, fixed: float = 5.0) -> Candidate:
    per = (seconds - fixed) / value
    level = Level("full", {"duration_s": value}, seconds, Stretch("duration_s", shortest, fixed, per))
    return Candidate(name, (level,), 0)


def test_a_generous_budget_keeps_every_check_as_planned() -> None:
    cands = [_cand("a", 1, 2, 3, planned=1), _cand("b", 5, 10)]
    plan = plan_budget(cands, 600.0)
    assert [(c.name, c.level, c.why) for c in plan.kept] == [("a", "standard", "as planned"), ("b", "standard",
                                                                                              "as planned")]
    assert plan.left_out == [] and plan.estimate_s == 5.0 + 2 + 10  # never deeper than planned


def test_a_tight_budget_keeps_every_check_shallower_before_it_deepens_any() -> None:
    cands = [_cand("a", 10, 100), _cand("b", 10, 100), _cand("c", 10, 100)]
    plan = plan_budget(cands, 100.0)  # 95 s after the overhead: all three at quick, none deeper
    assert [c.level for c in plan.kept] == ["quick"] * 3 and plan.left_out == []
    assert plan.kept[0].why == "quick level, ~10s (standard, as planned, needs ~1m40s)"
    assert plan.kept[0].changed == {"p": ["standard", "quick"]}
    plan = plan_budget(cands, 300.0)  # 295 - 35: the reserve (60 s) leaves room for two to deepen
    assert [c.level for c in plan.kept] == ["standard", "standard", "quick"]
    assert plan.estimate_s <= 300.0 - RESERVE_FRACTION * 300.0


def test_what_does_not_fit_is_left_out_with_what_it_needs() -> None:
    cands = [_cand("big", 50, 80), _cand("small", 10, 20), _cand("tiny", 2)]
    plan = plan_budget(cands, 30.0)
    assert [c.name for c in plan.kept] == ["small", "tiny"]
    assert [c.to_dict() for c in plan.left_out] == [
        {"name": "big", "needs_s": 50, "why": "needs ~50s at its shallowest (quick level); 25s of the budget was left"}]
    assert plan.estimate_s <= 30.0


def test_a_duration_is_shortened_to_fit_and_lengthened_with_what_is_left() -> None:
    stress = _stretchy("stress", 305.0, 300.0, 10.0)
    plan = plan_budget([_cand("a", 10), stress], 100.0)
    (_, s) = plan.kept
    assert s.changed["duration_s"][0] == 300.0 and 10.0 < s.changed["duration_s"][1] < 300.0
    assert plan.estimate_s <= 100.0 - RESERVE_FRACTION * 100.0 + 0.5
    assert "duration_s" in s.why and s.why.startswith("full level, duration_s ")
    tight = plan_budget([stress], 5.0 + 15.0)
    assert tight.kept[0].params["duration_s"] == 10.0  # the shortest is all that fits
    assert plan_budget([stress], 5.0 + 14.0).left_out[0].why.startswith(
        "needs ~15s at its shallowest (full level, duration_s 10)")


def test_the_plan_is_the_same_every_time() -> None:
    _, cands = _cands("full")
    assert plan_budget(cands, 600.0).to_dict() == plan_budget(cands, 600.0).to_dict()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(0.5, 500), min_size=1, max_size=4), st.integers(0, 3),
                          st.booleans()), min_size=1, max_size=8),
       st.floats(1.0, 3000.0))
def test_every_plan_fits_its_budget_and_accounts_for_every_check(spec: list[tuple[list[float], int, bool]],
                                                                  budget: float) -> None:
    cands = []
    for i, (seconds, planned, stretchy) in enumerate(spec):
        secs = sorted(set(seconds))
        levels = [Level(f"l{j}", {"j": j, "d": 100.0}, s,
                        Stretch("d", 10.0, s / 2, s / 200) if stretchy else None) for j, s in enumerate(secs)]
        cands.append(Candidate(f"c{i}", tuple(levels), min(planned, len(levels) - 1)))
    plan = plan_budget(cands, budget)
    assert sorted(c.name for c in plan.kept + plan.left_out) == sorted(c.name for c in cands)
    if plan.kept:
        assert plan.estimate_s <= budget + 1e-6
    for choice in plan.kept:
        cand = next(c for c in cands if c.name == choice.name)
        assert choice.depth.level <= cand.planned  # the first pass never goes deeper than the profile
        assert choice.estimate_s == pytest.approx(cand.seconds(choice.depth))
    for out in plan.left_out:
        assert out.needs_s > 0


def test_a_budget_that_fits_nothing_is_refused_naming_the_smallest_check() -> None:
    cands = [_cand("a", 10), _cand("b", 4)]
    plan = plan_budget(cands, 8.0)
    with pytest.raises(UsageError, match=r"^--budget 8s fits no check; the smallest, b, needs ~4s and the run "
                                         r"itself ~5s$"):
        refuse_empty(plan, cands)
    cands = [_cand("env", 2, measures=False), _cand("compute", 6)]
    plan = plan_budget(cands, 10.0)
    assert [c.name for c in plan.kept] == ["env"]
    with pytest.raises(UsageError, match=r"fits no check that measures \(only env, which takes stock\); the "
                                         r"smallest, compute, needs ~6s"):
        refuse_empty(plan, cands)
    refuse_empty(plan_budget([_cand("env", 2, measures=False)], 10.0), [_cand("env", 2, measures=False)])


def test_the_chosen_values_and_their_timeouts_go_into_the_suite_plan() -> None:
    plan, cands = _cands("full", checks=["env", "compute", "stress"])
    bplan = plan_budget(cands, 60.0)
    cut = apply_budget(plan, bplan, registry(), Config())
    by = {c.name: c for c in cut.checks}
    assert by["compute"].params["trials"] == 3 and by["compute"].timeout_s == 120.0  # the quick level's timeout
    stress = next(c for c in bplan.kept if c.name == "stress")
    assert by["stress"].params["duration_s"] == stress.params["duration_s"] < 30.0
    assert by["env"] is plan.checks[0]  # unchanged
    scaled = apply_budget(plan, bplan, registry(), Config(), timeout_scale=2.0)
    assert {c.name: c for c in scaled.checks}["compute"].timeout_s == 240.0


# ---------------------------------------------------------------- suspect results


def _metric(value: float, op: str, bound: float, severity: Status = Status.FAIL, name: str = "m") -> Metric:
    return Metric(name, value, "GB/s", "cuda:0", threshold=Threshold(op, bound, severity))


@pytest.mark.parametrize(("status", "metrics", "words"), [
    (Status.WARN, [], "it warned: why"),
    (Status.PASS, [_metric(102, ">=", 100)], "m [cuda:0] = 102 is within 2.0% of its bound >= 100"),
    (Status.PASS, [_metric(96, "<=", 100)], "m [cuda:0] = 96 is within 4.0% of its bound <= 100"),
    (Status.PASS, [_metric(110, ">=", 100)], None),
    (Status.PASS, [_metric(0, "<=", 0, name="errors")], None),  # 0 errors is clean, never near
    (Status.PASS, [_metric(math.nan, ">=", 100)], None),
    (Status.FAIL, [_metric(97, ">=", 100)], "m [cuda:0] = 97 missed its bound >= 100 by 3.0%, a marginal miss"),
    (Status.FAIL, [_metric(80, ">=", 100)], None),  # a clear miss
    (Status.FAIL, [_metric(97, ">=", 100), _metric(3, "<=", 0, name="errors")], None),  # wrong results too
    (Status.FAIL, [_metric(110, ">=", 100)], None),  # the check's own failure (a wrong result, a timeout)
    (Status.FAIL, [], None),
    (Status.ERROR, [_metric(101, ">=", 100)], None),
    (Status.SKIP, [], None),
])
def test_what_is_suspect(status: Status, metrics: list[Metric], words: str | None) -> None:
    assert suspect(CheckResult("c", status, "why", metrics=metrics)) == words


# ---------------------------------------------------------------- the second pass


def _ran(cands: list[Candidate], budget: float) -> BudgetPlan:
    return plan_budget(cands, budget)


def test_a_suspect_check_runs_again_at_the_deepest_level_its_share_allows() -> None:
    cands = [_cand("a", 10, 30, 100, planned=0), _cand("b", 10, 30, 100, planned=0)]
    kept = _ran(cands, 60.0).kept
    results = [CheckResult("a", Status.WARN, "slow"), CheckResult("b", Status.PASS, "fine")]
    reruns, notes = plan_reruns(cands, kept, results, 150.0)
    assert notes == [] and len(reruns) == 1
    r = reruns[0].to_dict()
    assert r == {"name": "a", "level": "full", "depth": "full level", "estimate_s": 100, "why": "it warned: slow",
                 "changed": {"p": ["quick", "full"]}, "first": {"status": "warn", "level": "quick",
                                                             "why": "as planned"}}
    assert reruns[0].params == {"p": "full"}
    reruns, _ = plan_reruns(cands, kept, [CheckResult("a", Status.WARN, "x"), CheckResult("b", Status.WARN, "y")],
                            150.0)
    # a's share is 75 s: standard (30 s); b's is then all that is left, 120 s: full
    assert [(r.name, r.level) for r in reruns] == [("a", "standard"), ("b", "full")]


def test_a_suspect_check_that_cannot_go_deeper_is_noted_not_rerun() -> None:
    cands = [_cand("a", 10), _cand("b", 10, 300, planned=0)]
    kept = _ran(cands, 60.0).kept
    results = [CheckResult("a", Status.WARN, "w"), CheckResult("b", Status.WARN, "w")]
    reruns, notes = plan_reruns(cands, kept, results, 100.0)
    assert reruns == []
    assert notes == [
        {"name": "a", "why": "it warned: w", "status": "warn", "not_rerun": "no deeper level than the quick level it "
                                                                            "ran at"},
        {"name": "b", "why": "it warned: w", "status": "warn", "not_rerun": "the next deeper level needs ~5m, "
                                                                            "1m40s of the budget was left"}]


def test_a_rerun_takes_the_shallowest_deeper_level_left_when_no_share_fits() -> None:
    cands = [_cand("a", 10, 40, 500, planned=0), _cand("b", 10, 100, planned=0)]
    kept = _ran(cands, 60.0).kept
    reruns, _ = plan_reruns(cands, kept, [CheckResult("a", Status.WARN, ""), CheckResult("b", Status.WARN, "")],
                            60.0)
    assert [(r.name, r.level) for r in reruns] == [("a", "standard")]  # 40 s of 60; b's 100 s no longer fits


def test_a_shortened_duration_reruns_longer() -> None:
    stress = _stretchy("stress", 305.0, 300.0, 10.0)
    kept = plan_budget([stress], 40.0).kept
    assert kept[0].depth.value is not None
    reruns, _ = plan_reruns([stress], kept, [CheckResult("stress", Status.WARN, "hot")], 120.0)
    (r,) = reruns
    assert kept[0].params["duration_s"] < r.params["duration_s"] <= 300.0
    assert r.estimate_s <= 120.0 and r.changed["duration_s"][0] == kept[0].params["duration_s"]


def test_only_first_pass_results_of_kept_checks_count() -> None:
    cands = [_cand("a", 10, 30, planned=0)]
    kept = _ran(cands, 60.0).kept
    assert plan_reruns(cands, kept, [CheckResult("z", Status.WARN, "")], 100.0) == ([], [])
    assert plan_reruns(cands, kept, [CheckResult("a", Status.WARN, "")], 0.0)[0] == []


def test_depths_compare_by_estimate() -> None:
    stress = _stretchy("stress", 305.0, 300.0, 10.0)
    assert stress.seconds(Depth(0)) == 305.0 and stress.seconds(Depth(0, 10.0)) == pytest.approx(15.0)
    assert stress.shallowest() == Depth(0, 10.0)
