"""Rounds and accuracy of ``gpuaccept isolate`` over seeded simulated trials (the planner with a fake pair test).

For N = 8, 64 and 512 nodes: 1 broken node, then 4 (2 broken, 2 slow) with noisier measurements,
in pairwise mode, and 1 broken node in bisection mode. Prints one line per case and a last line
``BENCH {json}``. Goal: 1 bad node among 64 in <= 3 rounds with 0 good nodes accused over 100 trials.

Usage: ``python bench/bench_isolate.py [--trials 100] [--seed 1]``
"""

from __future__ import annotations

import argparse
import json
import time

from gpuaccept.isolate.plan import Settings
from gpuaccept.isolate.sim import simulate

CASES = (  # (label, broken, slow, noise, mode)
    ("1 broken", 1, 0, 0.03, "pairs"),
    ("2 broken + 2 slow, noise 0.07", 2, 2, 0.07, "pairs"),
    ("1 broken, bisect", 1, 0, 0.03, "bisect"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
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
