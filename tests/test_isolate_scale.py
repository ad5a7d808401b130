"""The isolation planner at fleet size: each planning call reads the results a fixed number of times (issue 27)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from gpuaccept.isolate.plan import Result, Round, Settings, judge, next_step, validate
from gpuaccept.isolate.sim import Fleet


class CountingList(list[Result]):
    """A result list that counts how often it is iterated from the start."""

    def __init__(self, items: list[Result]) -> None:
        super().__init__(items)
        self.passes = 0

    def __iter__(self) -> Iterator[Result]:
        self.passes += 1
        return super().__iter__()


def _drive(n: int, mode: str, seed: int = 3) -> tuple[list[str], list[Result], Settings, list[int]]:
    """Run a trial of ``n`` nodes (2 broken) to its verdicts; return every result and each call's passes."""
    rng = random.Random(seed)
    nodes = [f"n{i:05d}" for i in range(n)]
    fleet = Fleet(tuple(nodes), frozenset(rng.sample(nodes, 2)))
    settings = Settings(mode=mode, threshold=80.0, seed=seed)  # type: ignore[arg-type]
    results: list[Result] = []
    passes: list[int] = []
    while True:
        counted = CountingList(results)
        step = next_step(nodes, counted, settings)
        passes.append(counted.passes)
        if not isinstance(step, Round):
            assert set(step.named("bad")) == set(fleet.broken)
            return nodes, results, settings, passes
        results += [Result(t, step.number, (fleet.run(t, rng),)) for t in step.tests]


@pytest.mark.parametrize("mode", ["pairs", "bisect"])
def test_each_planning_call_reads_the_results_a_fixed_number_of_times_whatever_the_node_count(mode: str) -> None:
    _nodes, results, _settings, passes = _drive(512, mode)
    assert len(results) > 20
    assert max(passes) <= 6, passes  # once per node would be 512


def test_judge_reads_the_results_once_and_matches_a_per_node_reading() -> None:
    nodes, results, settings, _ = _drive(128, "pairs")
    counted = CountingList(results)
    states = judge(nodes, counted, settings)
    assert counted.passes == 1
    for node in nodes:  # the evidence of each node is its own results, in order
        mine = [r for r in results if node in r.test.nodes]
        assert [e["round"] for e in states[node].evidence] == [r.round for r in mine]
        assert states[node].passes == sum(r.passed(settings.threshold) for r in mine)


def test_a_duplicate_among_4096_nodes_is_named() -> None:
    nodes = [f"n{i:05d}" for i in range(4096)] + ["n01234"]
    with pytest.raises(Exception, match="node n01234 is named twice"):
        validate(nodes, Settings())
