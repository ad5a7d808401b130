"""``gpuaccept isolate --per-rail`` and ``--rails-of NODE=PARTNER``: which GPU/NIC rail of a bad node is at fault.

The plan is :func:`gpuaccept.isolate.rail_plan.rail_tests` (pure; ``--dry-run`` prints it as ``gpuaccept
launch`` commands): one test per rail, the bad node with a good partner, run one after the other through
the pair tests' own runner (:class:`gpuaccept.isolate.pairs.PairRunner`), each ``--repeat`` times and
judged on its worst run. The node's ports are ``--rail-ports``, else those its collectives check read
counters of in an earlier test's cluster report, else unknown (a rail is then GPU ``i`` alone). With the
collectives check, each rail test's cluster report also holds the node's port counters around its
traffic (``fabric_counters``), which name a rail whose error counters rose. nccl-tests rail tests run over
mpi only: under Slurm, the GPU binding of the job overrides ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpuaccept.errors import UsageError
from gpuaccept.isolate.pairs import PairRunner, PairTest
from gpuaccept.isolate.plan import Run
from gpuaccept.isolate.rail_plan import (
    PortCounters,
    RailTest,
    RailVerdict,
    counters_from_cluster,
    judge_rails,
    merge_counters,
    ports_from_cluster,
    rail_summary,
    rail_tests,
    rails,
)

_PORT = re.compile(r"^[A-Za-z0-9_.-]{1,64}:\d{1,3}$")


def parse_rails_of(text: str) -> tuple[str, str]:
    """``NODE=PARTNER`` -> ``(NODE, PARTNER)``; UsageError otherwise."""
    node, sep, partner = text.partition("=")
    node, partner = node.strip(), partner.strip()
    if not sep or not node or not partner or "," in text:
        raise UsageError(f"--rails-of: {text!r} is not NODE=PARTNER (the bad node and a good one)")
    if node == partner:
        raise UsageError(f"--rails-of: {node} cannot be its own partner")
    return node, partner


def parse_rail_ports(text: str | None) -> list[str]:
    """``mlx5_0:1,mlx5_1:1`` -> the ports, each DEVICE:PORT as NCCL_IB_HCA names them; [] for None."""
    if text is None:
        return []
    ports = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in ports if not _PORT.match(p)]
    if bad or not ports:
        raise UsageError(f"--rail-ports: {bad[0] if bad else text!r} is not DEVICE:PORT (e.g. mlx5_0:1)")
    if len(set(ports)) != len(ports):
        raise UsageError("--rail-ports: a port is named twice")
    return ports


def check_rail_backend(backend: str, pair: PairTest) -> None:
    """UsageError where a rail test cannot be put on one GPU: nccl-tests under anything but mpi."""
    if pair.kind == "nccl-tests" and backend != "mpi":
        raise UsageError("per-rail tests with --pair-test nccl-tests run over mpi only (under Slurm the job's GPU "
                         "binding overrides CUDA_VISIBLE_DEVICES); use the collectives pair test there")


def rail_pair(pair: PairTest) -> PairTest:
    """The pair test of one rail: one GPU per node, and no --min-busbw (set for whole nodes; rails are judged
    against each other)."""
    return dataclasses.replace(pair, gpus=1, min_busbw=None)


def ports_from_reports(node: str, paths: Iterable[str]) -> list[str]:
    """The node's RDMA ports as its collectives check read them in the first of these cluster reports that
    names any; [] when none does (or a path is a launch directory: nccl-tests)."""
    for path in paths:
        try:
            cluster = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        ports = ports_from_cluster(cluster, node) if isinstance(cluster, dict) else []
        if ports:
            return ports
    return []


def worst(runs: Sequence[Run]) -> Run:
    """The run a repeated test is judged on: the first that failed, else the one with the lowest busbw."""
    failed = [r for r in runs if not r.ok]
    if failed:
        return failed[0]
    return min(runs, key=lambda r: float("inf") if r.busbw is None else r.busbw)


@dataclass
class RailReport:
    """What the rail tests of one node found."""

    node: str
    partner: str
    ports_from: str
    verdicts: list[RailVerdict]
    tests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def bad(self) -> list[RailVerdict]:
        return [v for v in self.verdicts if v.bad]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "partner": self.partner, "ports_from": self.ports_from,
                "summary": rail_summary(self.node, self.verdicts),
                "bad_rails": [v.rail.name for v in self.bad], "rails": [v.to_dict() for v in self.verdicts],
                "rail_table": rail_rows(self), "tests_run": list(self.tests)}


def rail_rows(report: RailReport) -> list[dict[str, Any]]:
    """One row per rail that names it (node, rail index, NIC port, GPU) with its figure and verdict (pure): the
    ``rail_table`` of isolate's JSON, the rows of its console table and of its HTML NIC x node table. ``figure``
    is perftest's Gb/s (``unit`` ``Gb/s``, ``bound`` the least it had to reach) or the rail test's busbw
    (``GB/s``, judged against the median rail: no bound); ``verdict`` is ``bad``, ``ok`` or ``not judged`` (a
    figure without a bound and nothing wrong)."""
    rows = []
    for i, v in enumerate(report.verdicts):
        figure, unit = (v.gbps, "Gb/s") if v.gbps is not None else (v.busbw, "GB/s" if v.busbw is not None else None)
        judged = v.bad or v.bound_gbps is not None or (v.gbps is None and v.busbw is not None)
        rows.append({"node": report.node, "rail": i, "port": v.rail.port, "gpu": v.rail.gpu,
                     "partner": report.partner, "figure": figure, "unit": unit, "bound": v.bound_gbps,
                     "verdict": "bad" if v.bad else ("ok" if judged else "not judged"),
                     "evidence": list(v.evidence)})
    return rows


def plan(runner: PairRunner, node: str, partner: str, gpus: int, ports: Sequence[str]) -> list[RailTest]:
    """The rail tests of ``node`` with ``partner`` (pure)."""
    check_rail_backend(runner.backend, runner.pair)
    return rail_tests(node, partner, rails(gpus, ports), runner.pair.kind)


def run_id(tag: str, rt: RailTest, rep: int) -> str:
    return f"{tag}-rail-{rt.test.nodes[0]}-gpu{rt.rail.gpu}-{rep}"


def dry_run_lines(runner: PairRunner, tests: Sequence[RailTest], tag: str) -> list[str]:
    """Each rail test as its ``gpuaccept launch`` command (what ``--dry-run`` prints)."""
    return [shlex.join(["gpuaccept", *runner.argv(rt.test, run_id(tag, rt, 0), flags=rt.flags,
                                                  pair=rail_pair(runner.pair))]) for rt in tests]


def run_rails(runner: PairRunner, tests: Sequence[RailTest], repeat: int, tag: str, ports_from: str,
              log: IO[str] | None = None) -> RailReport:
    """Run every rail test (one at a time, ``repeat`` times each) and judge the rails."""
    node, partner = tests[0].test.nodes
    runs: dict[int, Run] = {}
    counters: dict[Any, PortCounters] = {}
    done: list[dict[str, Any]] = []
    for rt in tests:
        if log is not None:
            print(f"[ISOLATE] rail {rt.rail.name} of {node} with {partner}", file=log, flush=True)
        seen: list[Run] = []
        seen_counters: list[dict[str, PortCounters]] = []
        for rep in range(repeat):
            rid = run_id(tag, rt, rep)
            seen.append(runner.run_one(rt.test, rid, rt.flags, rail_pair(runner.pair)))
            path = runner.cluster_reports.get(rid)
            if runner.pair.kind == "collectives" and path:
                try:
                    seen_counters.append(counters_from_cluster(json.loads(Path(path).read_text()), node))
                except (OSError, ValueError):
                    pass
        runs[rt.rail.gpu] = worst(seen)
        merged = merge_counters(seen_counters)
        if rt.rail.port and rt.rail.port in merged:
            counters[rt.rail.gpu] = merged[rt.rail.port]
        done.append({"gpu": rt.rail.gpu, "port": rt.rail.port,
                     "runs": [{"ok": r.ok, "busbw": r.busbw, "reason": r.reason} for r in seen],
                     "counters": {k: {"rose": c.rose, "vanished": c.vanished} for k, c in merged.items()}})
    verdicts = judge_rails([rt.rail for rt in tests], runs, counters)
    return RailReport(node, partner, ports_from, verdicts, done)


def table(report: RailReport) -> list[str]:
    """One line per rail: node, rail index, NIC port, GPU, figure (and its bound), verdict and evidence."""
    lines = [f"{'NODE':<16} {'RAIL':>4} {'PORT':<12} {'GPU':>3} {'FIGURE':>22} {'VERDICT':<10} "
             f"EVIDENCE (partner {report.partner})"]
    for row in rail_rows(report):
        fig = "-" if row["figure"] is None else f"{row['figure']:.4g} {row['unit']}"
        if row["bound"] is not None:
            fig += f" >= {row['bound']:g}"
        lines.append(f"{row['node']:<16} {row['rail']:>4} {row['port'] or '-':<12} {row['gpu']:>3} {fig:>22} "
                     f"{row['verdict'].upper() if row['verdict'] == 'bad' else row['verdict']:<10} "
                     f"{'; '.join(row['evidence']) or '-'}")
    return lines
