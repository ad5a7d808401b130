"""Which node is bad: the pure planner of ``gpuaccept isolate``.

Plans are data. :func:`next_step` takes the nodes, the settings and every test
result so far, and returns either the next round (tests that run in parallel,
each on a disjoint group of nodes) or the final verdicts. It does no I/O and
keeps no state: the CLI runs a round through a launcher and calls it again,
and the simulator does the same with a fake pair test.

Pairwise mode: round 1 tests random disjoint pairs (within a rack first when
racks are given); a pair that fails makes both its nodes suspects. Each suspect
(and a node left over from an odd count) is then re-tested with a different
node that passed (across racks when racks are given, so a switch fault does not
hide), one partner per suspect. A failure with a trusted partner (one that had
passed a test without this node in an earlier round) is a strike; a node with ``confirm`` strikes
from distinct partners, more strikes than passes, is declared bad; a suspect
that passes with a trusted partner is cleared.

Bisection mode, for a failure that shows only at full scale: round 1 tests the
whole set; a failing group is split in halves, tested in parallel, and the
failing sides are split again down to pairs, whose nodes then go through the
same suspect re-tests with nodes from the passing halves.

A test repeated ``repeat`` times is judged on its worst run (any failed run,
the lowest busbw).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuaccept.errors import UsageError

Mode = Literal["pairs", "bisect"]
Kind = Literal["pair", "retest", "full", "half", "rail"]


@dataclass(frozen=True)
class Settings:
    """``threshold``: minimum busbw (GB/s) of a passing test, None to go by the test's own verdict;
    ``confirm``: strikes (failures with distinct trusted partners) that declare a node bad;
    ``repeat``: runs of each test, judged on the worst; ``max_rounds``: 0 for the default (enough for
    the mode and the node count)."""

    mode: Mode = "pairs"
    threshold: float | None = None
    confirm: int = 2
    repeat: int = 1
    max_rounds: int = 0
    seed: int = 0

    def rounds_limit(self, n: int) -> int:
        if self.max_rounds:
            return self.max_rounds
        depth = math.ceil(math.log2(max(n, 2)))
        return (depth + 1 if self.mode == "bisect" else 1) + 2 * self.confirm + 4


@dataclass(frozen=True)
class Test:
    """One test of a round: the nodes that run it together."""

    __test__ = False  # not a pytest class
    nodes: tuple[str, ...]
    kind: Kind

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "kind": self.kind}


@dataclass(frozen=True)
class Run:
    """One run of a test: whether the test itself passed and the busbw it measured (GB/s), if any."""

    ok: bool
    busbw: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class Result:
    """A test's runs, judged on the worst (``passed``)."""

    test: Test
    round: int
    runs: tuple[Run, ...]

    def busbw(self) -> float | None:
        values = [r.busbw for r in self.runs if r.busbw is not None]
        return min(values) if values else None

    def passed(self, threshold: float | None) -> bool:
        if not self.runs or not all(r.ok for r in self.runs):
            return False
        if threshold is None:
            return True
        low = self.busbw()
        return low is not None and low >= threshold

    def reason(self) -> str:
        return next((r.reason for r in self.runs if not r.ok and r.reason), "")

    def to_dict(self, threshold: float | None) -> dict[str, Any]:
        return {**self.test.to_dict(), "round": self.round, "passed": self.passed(threshold), "busbw": self.busbw(),
                "runs": [{"ok": r.ok, "busbw": r.busbw, "reason": r.reason} for r in self.runs]}


@dataclass(frozen=True)
class Round:
    number: int
    tests: tuple[Test, ...]
    repeat: int


@dataclass
class NodeVerdict:
    node: str
    state: Literal["good", "suspect", "bad", "untested"]
    rack: str | None = None
    passes: int = 0
    strikes: list[str] = field(default_factory=list)  # partners, trusted at the time, that it failed with
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "state": self.state, "rack": self.rack, "passes": self.passes,
                "strikes": list(self.strikes), "evidence": list(self.evidence)}


@dataclass
class Verdicts:
    nodes: list[NodeVerdict]
    rounds: int
    tests: int
    notes: list[str] = field(default_factory=list)

    def named(self, state: str) -> list[str]:
        return [v.node for v in self.nodes if v.state == state]

    @property
    def all_good(self) -> bool:
        return all(v.state == "good" for v in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "tests": self.tests, "good": self.named("good"),
                "suspect": self.named("suspect") + self.named("untested"), "bad": self.named("bad"),
                "notes": list(self.notes), "nodes": [v.to_dict() for v in self.nodes]}


def validate(nodes: Sequence[str], settings: Settings, racks: Mapping[str, str] | None = None) -> None:
    """UsageError for what no plan can be made of."""
    if len(nodes) < 2:
        raise UsageError(f"isolation needs at least 2 nodes, got {len(nodes)}")
    dup = sorted(n for n, k in Counter(nodes).items() if k > 1)
    if dup:
        raise UsageError(f"node {dup[0]} is named twice")
    if settings.confirm < 1 or settings.repeat < 1:
        raise UsageError("--confirm and --repeat must be at least 1")
    unknown = sorted(set(racks or {}) - set(nodes))
    if unknown:
        raise UsageError(f"--racks names {unknown[0]}, which is not among the nodes")


# ---------------------------------------------------------------- judging what happened


def _trusted(node: str, other: str, before: int, passed: Mapping[str, list[tuple[int, frozenset[str]]]]) -> bool:
    """``other`` had passed a test without ``node`` before round ``before`` (``passed``: each node's passed tests)."""
    return any(number < before and node not in group for number, group in passed.get(other, ()))


def judge(nodes: Sequence[str], results: Sequence[Result], settings: Settings,
          racks: Mapping[str, str] | None = None) -> dict[str, NodeVerdict]:
    """Each node's state from every result so far (pure; linear: results are indexed by node once)."""
    out: dict[str, NodeVerdict] = {}
    passed: dict[str, list[tuple[int, frozenset[str]]]] = {}
    by_node: dict[str, list[tuple[Result, bool]]] = {}
    for r in results:
        ok = r.passed(settings.threshold)
        if ok:
            group = frozenset(r.test.nodes)
            for n in r.test.nodes:
                passed.setdefault(n, []).append((r.round, group))
        for n in r.test.nodes:
            by_node.setdefault(n, []).append((r, ok))
    for node in nodes:
        v = NodeVerdict(node, "untested", rack=(racks or {}).get(node))
        fails_untrusted = 0
        for r, ok in by_node.get(node, ()):
            if len(r.test.nodes) <= 2:
                v.evidence.append({"round": r.round, "partners": [o for o in r.test.nodes if o != node],
                                   "passed": ok, "busbw": r.busbw(), "runs": [x.busbw for x in r.runs],
                                   "reason": r.reason()})
            if ok:
                v.passes += 1
            elif len(r.test.nodes) > 1 and all(_trusted(node, o, r.round, passed) for o in r.test.nodes if o != node):
                v.strikes.extend(o for o in r.test.nodes if o != node and o not in v.strikes)
            else:
                fails_untrusted += 1
        strikes = len(v.strikes)
        if strikes >= settings.confirm and strikes > v.passes:
            v.state = "bad"
        elif v.passes > strikes:
            v.state = "good"
        elif v.passes or strikes or fails_untrusted:
            v.state = "suspect"
        out[node] = v
    return out


# ---------------------------------------------------------------- planning


def _rng(settings: Settings, number: int) -> random.Random:
    return random.Random(f"{settings.seed}:{number}")


def _pairs(nodes: list[str], rng: random.Random, racks: Mapping[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Random disjoint pairs, within a rack first; the leftovers paired across racks; an odd node out is returned."""
    rng.shuffle(nodes)
    if racks:
        by_rack: dict[str, list[str]] = {}
        for n in nodes:
            by_rack.setdefault(racks.get(n, ""), []).append(n)
        ordered, leftovers = [], []
        for members in by_rack.values():
            even = len(members) - len(members) % 2
            ordered += members[:even]
            leftovers += members[even:]
        nodes = ordered + leftovers
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    return pairs, nodes[len(pairs) * 2:]


def _split(group: tuple[str, ...], racks: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Two halves of equal size (one more in the second), ordered by rack so that racks stay together."""
    ordered = sorted(group, key=lambda n: (racks.get(n, ""), n)) if racks else list(group)
    half = len(ordered) // 2
    return tuple(ordered[:half]), tuple(ordered[half:])


def _bisect_frontier(nodes: Sequence[str], results: Sequence[Result], settings: Settings,
                     racks: Mapping[str, str]) -> tuple[list[Test], set[str], list[str]]:
    """(half tests to run next, nodes of failing groups too small to split, notes)."""
    groups = [r for r in results if r.test.kind in ("full", "half")]
    tested = {r.test.nodes for r in groups}
    tests: list[Test] = []
    small: set[str] = set()
    notes: list[str] = []
    for r in groups:
        if r.passed(settings.threshold):
            continue
        g = r.test.nodes
        if len(g) <= 3:
            small.update(g)
            continue
        a, b = _split(g, racks)
        if a in tested and b in tested:
            if not any(x.test.nodes in (a, b) and not x.passed(settings.threshold) for x in groups):
                notes.append(f"{len(g)} nodes fail together but both halves pass: the fault needs more than "
                             f"{len(g) // 2} nodes; its nodes stay suspects")
                small.update(g)
            continue
        tests += [Test(a, "half"), Test(b, "half")]
    return tests, small, notes


def _retests(states: dict[str, NodeVerdict], need: list[str], results: Sequence[Result], number: int,
             settings: Settings, racks: Mapping[str, str]) -> list[Test]:
    """Each node of ``need`` with a distinct good partner it has not failed with, across racks first."""
    good = [n for n, v in states.items() if v.state == "good"]
    rng = _rng(settings, number)
    rng.shuffle(good)
    rng.shuffle(need)
    tests: list[Test] = []
    used: set[str] = set()
    wanted = set(need)
    met_by: dict[str, set[str]] = {}
    for r in results:  # whom each node of ``need`` has been tested with (one pass over the results)
        for n in r.test.nodes:
            if n in wanted:
                met_by.setdefault(n, set()).update(r.test.nodes)
    for node in need:
        met = met_by.get(node, set())
        options = [g for g in good if g not in used and g not in met] or [g for g in good if g not in used]
        if racks:  # another rack first: a suspect that fails across racks too is not its switch's fault
            options.sort(key=lambda g: racks.get(g) == racks.get(node))
        if not options:
            continue
        used.add(options[0])
        tests.append(Test((node, options[0]), "retest"))
    return tests


def next_step(nodes: Sequence[str], results: Sequence[Result], settings: Settings,
              racks: Mapping[str, str] | None = None) -> Round | Verdicts:
    """The next round, or the verdicts when nothing is left to test (or the round limit is reached)."""
    racks = dict(racks or {})
    nodes = list(nodes)
    done = max((r.round for r in results), default=0)
    number = done + 1
    states = judge(nodes, results, settings, racks)
    if done == 0:
        if settings.mode == "bisect":
            return Round(1, (Test(tuple(nodes), "full"),), settings.repeat)
        pairs, _odd = _pairs(list(nodes), _rng(settings, 1), racks)
        return Round(1, tuple(Test(p, "pair") for p in pairs), settings.repeat)
    notes: list[str] = []
    halves: list[Test] = []
    open_nodes = [n for n in nodes if states[n].state in ("suspect", "untested")]
    if settings.mode == "bisect":  # re-test only what the bisection narrowed down (and what is under re-test)
        halves, small, notes = _bisect_frontier(nodes, results, settings, racks)
        retested = {n for r in results if r.test.kind == "retest" for n in r.test.nodes}
        open_nodes = [n for n in open_nodes if n in small or n in retested]
    if number > settings.rounds_limit(len(nodes)):
        return _final(states, done, results, [*notes, f"stopped at the round limit ({done} rounds)"])
    if halves:
        busy = {n for t in halves for n in t.nodes}
        retests = _retests(states, [n for n in open_nodes if n not in busy], results, number, settings, racks)
        return Round(number, tuple(halves + retests), settings.repeat)
    if not open_nodes:
        return _final(states, done, results, notes)
    retests = _retests(states, list(open_nodes), results, number, settings, racks)
    if retests:
        return Round(number, tuple(retests), settings.repeat)
    if not any(v.state == "good" for v in states.values()):
        # nothing has passed yet: pair the open nodes anew, so that a healthy pair can show itself
        if number <= 3:
            pairs, _odd = _pairs(list(open_nodes), _rng(settings, number), racks)
            if pairs:
                return Round(number, tuple(Test(p, "pair") for p in pairs), settings.repeat)
        notes.append("no test passed: no node can be trusted as a partner (a threshold too high, or a fault "
                     "shared by every node)")
    return _final(states, done, results, notes)


def _final(states: dict[str, NodeVerdict], rounds: int, results: Sequence[Result], notes: list[str]) -> Verdicts:
    return Verdicts(list(states.values()), rounds, len(results), notes)


def drain_argv(node: str, reason: str) -> list[str]:
    """``scontrol update`` that drains ``node`` with ``Reason="gpuaccept: <reason>"`` (an argv, no shell)."""
    text = " ".join(f"gpuaccept: {reason}".split())[:200]
    return ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={text}"]


def drain_reason(v: NodeVerdict, bad_rails: Sequence[str] = ()) -> str:
    """``failed with gpu03 (12.1 GB/s), gpu07 (11.8 GB/s)``: the evidence, short enough for Slurm's Reason;
    the rails that ``--per-rail`` found bad first (``bad rail GPU 3 / mlx5_3:1``)."""
    bits = []
    for e in v.evidence:
        if not e["passed"] and e["partners"]:
            bw = f" ({e['busbw']:.3g} GB/s)" if e["busbw"] is not None else ""
            bits.append(f"{','.join(e['partners'])}{bw}")
    rails = f"bad rail {', '.join(bad_rails)}" if bad_rails else ""
    if not bits:
        return f"isolated as bad; {rails}" if rails else "isolated as bad"
    return f"isolated: {rails + '; ' if rails else ''}failed with " + "; ".join(bits[:4])


def drain_commands(verdicts: Verdicts, bad_rails: Mapping[str, Sequence[str]] | None = None) -> list[list[str]]:
    """The ``scontrol update`` argv of every bad node, in node order (pure; ``--drain`` prints them);
    ``bad_rails``: by node, the rails that the per-rail tests found at fault."""
    return [drain_argv(v.node, drain_reason(v, (bad_rails or {}).get(v.node, ())))
            for v in verdicts.nodes if v.state == "bad"]
