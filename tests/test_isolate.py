"""The isolation planner (pure), its simulator, the drain command and reading a pair test's cluster report."""

from __future__ import annotations

import random

import pytest

from gpuaccept.errors import UsageError
from gpuaccept.isolate.pairs import named_local_plan, node_flags, run_from_cluster
from gpuaccept.isolate.plan import (
    Result,
    Round,
    Run,
    Settings,
    Test,
    Verdicts,
    drain_argv,
    drain_reason,
    judge,
    next_step,
    validate,
)
from gpuaccept.isolate.sim import Fleet, drive, simulate

NODES = [f"n{i}" for i in range(8)]


def _round(step: Round | Verdicts) -> Round:
    assert isinstance(step, Round), step
    return step


def test_round_one_is_disjoint_pairs_covering_every_node_and_is_reproducible() -> None:
    s = Settings(seed=7)
    r1 = _round(next_step(NODES, [], s))
    assert r1.number == 1 and all(t.kind == "pair" and len(t.nodes) == 2 for t in r1.tests)
    used = [n for t in r1.tests for n in t.nodes]
    assert sorted(used) == sorted(NODES)
    assert next_step(NODES, [], s) == r1
    assert next_step(NODES, [], Settings(seed=8)) != r1


def test_a_broken_node_is_named_bad_with_its_partners_and_the_rest_good() -> None:
    fleet = Fleet(tuple(NODES), broken=frozenset({"n5"}))
    v = drive(NODES, Settings(seed=1, threshold=80.0), fleet, random.Random(1))
    assert v.named("bad") == ["n5"] and sorted(v.named("good")) == sorted(set(NODES) - {"n5"})
    bad = next(x for x in v.nodes if x.node == "n5")
    assert len(bad.strikes) >= 2 and all(not e["passed"] for e in bad.evidence)
    assert v.rounds <= 3


def test_an_odd_node_is_tested_with_a_node_that_passed() -> None:
    nodes = NODES[:7]
    s = Settings(seed=3)
    r1 = _round(next_step(nodes, [], s))
    odd = (set(nodes) - {n for t in r1.tests for n in t.nodes}).pop()
    results = [Result(t, 1, (Run(True, 50.0),)) for t in r1.tests]
    r2 = _round(next_step(nodes, results, s))
    assert [t.kind for t in r2.tests] == ["retest"] and r2.tests[0].nodes[0] == odd
    results.append(Result(r2.tests[0], 2, (Run(True, 50.0),)))
    v = next_step(nodes, results, s)
    assert isinstance(v, Verdicts) and v.all_good


def test_a_slow_pair_fails_only_below_the_threshold_and_repeats_are_judged_on_the_worst() -> None:
    t = Test(("a", "b"), "pair")
    assert Result(t, 1, (Run(True, 90.0),)).passed(80.0)
    assert not Result(t, 1, (Run(True, 90.0), Run(True, 30.0))).passed(80.0)
    assert Result(t, 1, (Run(True, 90.0), Run(True, 30.0))).busbw() == 30.0
    assert not Result(t, 1, (Run(True, 90.0), Run(False, None, "x"))).passed(None)


def test_a_failure_with_an_untrusted_partner_is_no_strike() -> None:
    t = Test(("a", "b"), "pair")
    states = judge(["a", "b"], [Result(t, 1, (Run(False),))], Settings())
    assert states["a"].state == states["b"].state == "suspect" and states["a"].strikes == []


def test_two_nodes_alone_cannot_say_which_is_bad() -> None:
    fleet = Fleet(("a", "b"), broken=frozenset({"a"}))
    v = drive(["a", "b"], Settings(), fleet, random.Random(0))
    assert v.named("bad") == [] and sorted(v.named("suspect")) == ["a", "b"]
    assert any("no test passed" in n for n in v.notes)


def test_racks_pair_within_a_rack_first_and_retest_across() -> None:
    racks = {n: ("r1" if i < 4 else "r2") for i, n in enumerate(NODES)}
    s = Settings(seed=2)
    r1 = _round(next_step(NODES, [], s, racks))
    assert all(racks[t.nodes[0]] == racks[t.nodes[1]] for t in r1.tests)
    failing = next(t for t in r1.tests if "n1" in t.nodes)
    results = [Result(t, 1, (Run(t is not failing, 50.0),)) for t in r1.tests]
    r2 = _round(next_step(NODES, results, s, racks))
    assert all(racks[t.nodes[0]] != racks[t.nodes[1]] for t in r2.tests)


def test_bisection_splits_the_failing_half_down_to_the_bad_node() -> None:
    nodes = [f"n{i}" for i in range(16)]
    fleet = Fleet(tuple(nodes), broken=frozenset({"n11"}))
    s = Settings(mode="bisect", threshold=80.0)
    assert _round(next_step(nodes, [], s)).tests == (Test(tuple(nodes), "full"),)
    v = drive(nodes, s, fleet, random.Random(0))
    assert v.named("bad") == ["n11"] and len(v.named("good")) == 15


def test_bisection_of_a_failure_no_half_shows_says_so() -> None:
    nodes = [f"n{i}" for i in range(8)]
    results = [Result(Test(tuple(nodes), "full"), 1, (Run(False),)),
               Result(Test(tuple(nodes[:4]), "half"), 2, (Run(True, 90.0),)),
               Result(Test(tuple(nodes[4:]), "half"), 2, (Run(True, 90.0),))]
    v = next_step(nodes, results, Settings(mode="bisect"))
    assert isinstance(v, Verdicts) and any("both halves pass" in n for n in v.notes)


def test_bad_input_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="at least 2 nodes"):
        validate(["a"], Settings())
    with pytest.raises(UsageError, match="twice"):
        validate(["a", "a"], Settings())
    with pytest.raises(UsageError, match="not among the nodes"):
        validate(["a", "b"], Settings(), {"c": "r1"})
    with pytest.raises(UsageError):
        node_flags("k8s", ["a", "b"])


def test_one_bad_node_among_64_is_isolated_in_at_most_3_rounds_without_accusing_a_good_one() -> None:
    d = simulate(64, 1, 100, seed=1234).to_dict()
    assert d["rounds_max"] <= 3
    assert d["bad_found"] == 100 and d["good_accused"] == 0 and d["suspects_left"] == 0


def test_noise_that_fails_some_healthy_pairs_accuses_no_good_node() -> None:
    # noise 0.07 at a threshold of 0.8: a healthy pair fails now and then (about 1 in 200)
    d = simulate(64, 2, 100, seed=5, slow=1, noise=0.07).to_dict()
    assert d["bad_found"] == 300 and d["good_accused"] == 0


def test_drain_argv_and_reason() -> None:
    fleet = Fleet(("a", "b", "c", "d"), broken=frozenset({"c"}))
    v = drive(["a", "b", "c", "d"], Settings(), fleet, random.Random(0))
    bad = next(x for x in v.nodes if x.state == "bad")
    argv = drain_argv(bad.node, drain_reason(bad))
    assert argv[:4] == ["scontrol", "update", "NodeName=c", "State=DRAIN"]
    assert argv[4].startswith("Reason=gpuaccept: isolated: failed with ")


def _cluster(verdict: str, busbw: list[float], missing: list[str] | None = None) -> dict[str, object]:
    nodes = [{"host": f"h{i}", "report": {"checks": [{"name": "collectives", "metrics": [
        {"name": "allreduce_busbw_large_gbs", "value": bw}, {"name": "allgather_busbw_large_gbs", "value": 1.0}]}]}}
        for i, bw in enumerate(busbw)]
    return {"nodes": nodes, "analysis": {"gather": {"missing": missing or []}, "cross_node": {
        "verdict": verdict, "checks": {"collectives": {"reason": "" if verdict == "success" else "rank 1: boom"}}}}}


def test_a_pair_run_is_read_from_its_cluster_report() -> None:
    assert run_from_cluster(_cluster("success", [40.0, 30.0])) == Run(True, 30.0)
    assert run_from_cluster(_cluster("failure", [40.0, 30.0])) == Run(False, 30.0, "rank 1: boom")
    assert not run_from_cluster(_cluster("success", [40.0], ["h1"])).ok
    assert not run_from_cluster({"nodes": [], "analysis": {}}).ok


def test_a_local_plan_reports_under_the_tested_node_names() -> None:
    from gpuaccept.launch.base import Plan

    plan = Plan(backend="local", commands=[["env", "GPUACCEPT_HOSTNAME=local-0", "x"],
                                           ["env", "GPUACCEPT_HOSTNAME=local-1", "x"]],
                expected_hosts=["local-0", "local-1"])
    named = named_local_plan(plan, ["gpu7", "gpu3"])
    assert named.commands[1] == ["env", "GPUACCEPT_HOSTNAME=gpu3", "x"] and named.expected_hosts == ["gpu7", "gpu3"]
