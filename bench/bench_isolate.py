"""Rounds and accuracy of ``gpuaccept isolate`` over seeded simulated trials (the planner with a fake pair test).

For N = 8, 64 and 512 nodes: 1 broken node, then 4 (2 broken, 2 slow) with noisier measurements,
in pairwise mode, and 1 broken node in bisection mode. Prints one line per case and a last line
``BENCH {json}``. Goal: 1 bad node among 64 in <= 3 rounds with 0 good nodes accused over 100 trials.

With ``--scale``: the planner's cost at fleet size instead, one trial of N = 1,024 and 4,096 nodes
(4 broken, 4 slow, noise 0.07): wall time of the whole trial and of its slowest single planning call
(``next_step``, which judges every result so far). Goal (issue 27): one round <= 30 s at 4,096 nodes,
1,024 -> 4,096 within 4.5x.

Usage: ``python bench/bench_isolate.py [--trials 100] [--seed 1] [--scale]``
"""

from __future__ import annotations

import argparse
import json
import random
import time

from gpuaccept.isolate import plan
from gpuaccept.isolate.plan import Result, Round, Settings
from gpuaccept.isolate.sim import Fleet, simulate

CASES = (  # (label, broken, slow, noise, mode)
    ("1 broken", 1, 0, 0.03, "pairs"),
    ("2 broken + 2 slow, noise 0.07", 2, 2, 0.07, "pairs"),
    ("1 broken, bisect", 1, 0, 0.03, "bisect"),
)


def scale(seed: int) -> None:
    """One trial per fleet size, timing every planning call."""
    rows = []
    for n in (1024, 4096):
        for mode in ("pairs", "bisect"):
            rng = random.Random(f"{seed}:{n}")
            nodes = [f"node{i:05d}" for i in range(n)]
            faulty = rng.sample(nodes, 8)
            fleet = Fleet(tuple(nodes), frozenset(faulty[:4]), frozenset(faulty[4:]), noise=0.07)
            settings = Settings(mode=mode, threshold=0.8 * fleet.nominal, seed=seed)  # type: ignore[arg-type]
            results: list[Result] = []
            calls: list[float] = []
            t0 = time.perf_counter()
            while True:
                t1 = time.perf_counter()
                step = plan.next_step(nodes, results, settings)
                calls.append(time.perf_counter() - t1)
                if not isinstance(step, Round):
                    break
                for test in step.tests:
                    results.append(Result(test, step.number, tuple(fleet.run(test, rng) for _ in range(step.repeat))))
            d = {"nodes": n, "mode": mode, "rounds": step.rounds, "tests": step.tests,
                 "seconds": round(time.perf_counter() - t0, 3), "slowest_call_s": round(max(calls), 3),
                 "bad_found": len(set(step.named("bad")) & set(faulty))}
            rows.append(d)
            print(f"N={n:<5} {mode:<7} rounds {d['rounds']:<3} tests {d['tests']:<6} trial {d['seconds']} s, "
                  f"slowest planning call {d['slowest_call_s']} s, bad found {d['bad_found']}/8")
    print("BENCH " + json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", action="store_true", help="time the planner at 1,024 and 4,096 nodes")
    args = ap.parse_args()
    if args.scale:
        scale(args.seed)
        return
    rows = []
    for n in (8, 64, 512):
        for label, broken, slow, noise, mode in CASES:
            t0 = time.perf_counter()
            d = simulate(n, broken, args.trials, args.seed, slow=slow, noise=noise,
                         settings=Settings(mode=mode)).to_dict()  # type: ignore[arg-type]
            d.update(case=label, mode=mode, noise=noise, seconds=round(time.perf_counter() - t0, 2))
            rows.append(d)
            print(f"N={n:<4} {label:<32} rounds mean {d['rounds_mean']:<5g} max {d['rounds_max']:<3} "
                  f"tests/trial {d['tests_mean']:<7g} found {d['bad_found']}/{d['bad_total']} "
                  f"accused {d['good_accused']} left suspect {d['suspects_left']} ({d['seconds']} s)")
    print("BENCH " + json.dumps(rows))


if __name__ == "__main__":
    main()
