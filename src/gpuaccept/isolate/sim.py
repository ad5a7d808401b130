"""The isolation planner driven by a fake pair test: rounds and accuracy over seeded trials (pure, no I/O).

Every node has a nominal busbw (``nominal`` GB/s); a test's busbw is the lowest
of its nodes' rates, each times ``1 + noise * N(0, 1)``. A broken node fails
every test it is in; a slow one runs at ``slow_factor`` of the nominal rate.
The threshold is ``threshold_fraction`` of the nominal rate.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from gpuaccept.errors import UsageError
from gpuaccept.isolate.plan import Result, Round, Run, Settings, Test, Verdicts, next_step, validate


@dataclass(frozen=True)
class Fleet:
    """The simulated nodes: which are broken, which slow."""

    nodes: tuple[str, ...]
    broken: frozenset[str] = frozenset()
    slow: frozenset[str] = frozenset()
    nominal: float = 100.0
    slow_factor: float = 0.4
    noise: float = 0.03

    def run(self, test: Test, rng: random.Random) -> Run:
        if any(n in self.broken for n in test.nodes):
            return Run(False, None, "simulated broken node")
        rates = [self.nominal * (self.slow_factor if n in self.slow else 1.0) * (1 + self.noise * rng.gauss(0, 1))
                 for n in test.nodes]
        return Run(True, round(max(0.0, min(rates)), 3))


@dataclass
class Trial:
    rounds: int
    tests: int
    found: list[str]
    missed: list[str]
    accused: list[str]
    suspects: list[str]


@dataclass
class Summary:
    nodes: int
    bad: int
    slow: int
    trials: list[Trial] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        rounds = [t.rounds for t in self.trials]
        return {
            "nodes": self.nodes, "bad": self.bad, "slow": self.slow, "trials": len(self.trials),
            "rounds_mean": round(statistics.fmean(rounds), 3) if rounds else 0.0,
            "rounds_max": max(rounds, default=0),
            "tests_mean": round(statistics.fmean(t.tests for t in self.trials), 2) if self.trials else 0.0,
            "bad_found": sum(len(t.found) for t in self.trials),
            "bad_total": (self.bad + self.slow) * len(self.trials),
            "bad_missed": sum(len(t.missed) for t in self.trials),
            "good_accused": sum(len(t.accused) for t in self.trials),
            "suspects_left": sum(len(t.suspects) for t in self.trials),
            "exact_trials": sum(not t.missed and not t.accused and not t.suspects for t in self.trials),
        }


def drive(nodes: list[str], settings: Settings, fleet: Fleet, rng: random.Random) -> Verdicts:
    """Run the planner to its verdicts, each round's tests through ``fleet``."""
    results: list[Result] = []
    while True:
        step = next_step(nodes, results, settings)
        if not isinstance(step, Round):
            return step
        for test in step.tests:
            results.append(Result(test, step.number, tuple(fleet.run(test, rng) for _ in range(step.repeat))))


def simulate(n: int, bad: int, trials: int, seed: int, *, slow: int = 0, noise: float = 0.03,
             settings: Settings | None = None, threshold_fraction: float = 0.8) -> Summary:
    """``trials`` seeded trials of ``n`` nodes of which ``bad`` are broken and ``slow`` slow."""
    if bad + slow > n:
        raise UsageError(f"--bad {bad} plus --slow {slow} is more than the {n} nodes")
    if trials < 1:
        raise UsageError("--trials must be at least 1")
    base = settings or Settings()
    nodes = [f"node{i:04d}" for i in range(n)]
    summary = Summary(n, bad, slow)
    for t in range(trials):
        rng = random.Random(f"{seed}:{t}")
        faulty = rng.sample(nodes, bad + slow)
        fleet = Fleet(tuple(nodes), frozenset(faulty[:bad]), frozenset(faulty[bad:]), noise=noise)
        s = replace(base, seed=rng.randrange(1 << 30), threshold=threshold_fraction * fleet.nominal)
        validate(nodes, s)
        v = drive(nodes, s, fleet, rng)
        declared = set(v.named("bad"))
        summary.trials.append(Trial(
            rounds=v.rounds, tests=v.tests, found=sorted(declared & set(faulty)),
            missed=sorted(set(faulty) - declared), accused=sorted(declared - set(faulty)),
            suspects=sorted(set(v.named("suspect") + v.named("untested")) - set(faulty))))
    return summary


def summary_lines(d: dict[str, Any]) -> list[str]:
    return [f"[ISOLATE] simulated {d['trials']} trial(s): {d['nodes']} nodes, {d['bad']} broken, {d['slow']} slow",
            f"[ISOLATE] rounds: mean {d['rounds_mean']:g}, max {d['rounds_max']}; tests per trial: mean "
            f"{d['tests_mean']:g}",
            f"[ISOLATE] bad nodes found {d['bad_found']}/{d['bad_total']}, good nodes accused {d['good_accused']}, "
            f"good nodes left suspect {d['suspects_left']}; exact in {d['exact_trials']}/{d['trials']} trial(s)"]
