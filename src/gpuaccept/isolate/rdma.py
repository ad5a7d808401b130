"""``gpuaccept isolate --rail-test rdma``: the rails of a bad node measured with perftest, every NIC at once.

One ``gpuaccept launch`` job per node pair (pure plan: :func:`launch_flags`): ``gpuaccept rdma pair-node`` on
both nodes, the good partner serving and the bad node as the clients, NIC ``i`` to NIC ``i``
(:mod:`gpuaccept.perftest.node`); under ``mpi`` one rank per node (``--procs-per-node 1``), under ``slurm`` and
``ssh`` one task per node (``--no-torchrun``). The job's log (``mpirun.log``, ``slurm-<job>.out``; under ssh each
host's ``LABEL.log`` in the launch directory, read by :func:`gpuaccept.isolate.pairs.job_text`) holds both
nodes' tagged lines; :func:`gpuaccept.perftest.pairrun.judge_rails` judges each rail against its port rate (the
node's sysfs) and the error counters each end read before and after, and :func:`verdicts` turns that into the
rail verdicts that name the node, the rail and the NIC: ``node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380``.

Several pair jobs run at once (:func:`run_many`: every bad node of ``--per-rail``); each gets its own block of
perftest ports (:func:`base_ports`: ``--base-port`` 18515, then 18515 + the rails of the jobs before it), so two
jobs that share a good partner never have two servers on one port.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

from gpuaccept.errors import UsageError
from gpuaccept.isolate.plan import Run, Test
from gpuaccept.isolate.rail_plan import Rail, RailVerdict
from gpuaccept.perftest.plan import DEFAULT_BASE_PORT

RDMA_BACKENDS = ("mpi", "slurm", "ssh")


def nics_of(ports: Sequence[str]) -> list[str]:
    """``mlx5_0:1`` -> ``mlx5_0``: the devices of the rail ports, rail 0 first; UsageError when none."""
    if not ports:
        raise UsageError("--rail-test rdma needs the NICs of the rails: --rail-ports mlx5_0:1,mlx5_1:1,...")
    return [p.split(":", 1)[0] for p in ports]


def launch_flags(backend: str, node: str, partner: str, nics: Sequence[str], python: str | None = None,
                 extra: Sequence[str] = (), base_port: int = DEFAULT_BASE_PORT) -> list[str]:
    """The launch flags after the node flags: one task per node running ``rdma pair-node`` (pure). The partner
    (good) serves; ``node`` is the client; its rails listen on ``base_port`` + rail (``--base-port`` when not
    perftest's default)."""
    if backend not in RDMA_BACKENDS:
        raise UsageError(f"--rail-test rdma runs over {', '.join(RDMA_BACKENDS)}; not {backend}")
    per_node = ["--procs-per-node", "1"] if backend == "mpi" else ["--no-torchrun"]
    port = ["--base-port", str(base_port)] if base_port != DEFAULT_BASE_PORT else []
    cmd = [python or sys.executable, "-m", "gpuaccept", "rdma", "pair-node", "--nodes", f"{partner},{node}",
           "--nics", ",".join(nics), *port, *extra]
    return [*per_node, "--", *cmd]


def base_ports(rails: Sequence[int], first: int = DEFAULT_BASE_PORT) -> list[int]:
    """The ``--base-port`` of each of several pair jobs run at once, given each one's number of rails (pure):
    ``first``, then ``first`` + the rails of every job before it, so that no two servers share a port (the
    ports of job ``k`` are ``base_ports[k]`` .. ``base_ports[k] + rails[k] - 1``). UsageError past 65535."""
    out, port = [], first
    for n in rails:
        if port + n - 1 > 65535:
            raise UsageError(f"{len(rails)} rdma pair jobs at once need perftest ports {first}..{port + n - 1}, past "
                             "65535")
        out.append(port)
        port += n
    return out


def verdicts(node: str, nics: Sequence[str], text: str, run: Run) -> tuple[list[RailVerdict], list[dict[str, Any]]]:
    """The rail verdicts of ``node`` from its pair job's log, and each rail's result as JSON."""
    from gpuaccept.errors import InputError
    from gpuaccept.perftest.pairrun import judge_rails, rail_line, read_log

    rails = [Rail(i, f"{nic}:1") for i, nic in enumerate(nics)]
    if not run.ok:
        return [RailVerdict(r, True, [f"rdma pair test failed: {run.reason}"]) for r in rails], []
    try:
        results = {r.rail: r for r in judge_rails(read_log(text))}
    except InputError as exc:
        return [RailVerdict(r, True, [f"rdma pair log: {exc}"]) for r in rails], []
    out = []
    for rail in rails:
        res = results.get(rail.gpu)
        if res is None:
            out.append(RailVerdict(rail, True, ["not in the pair test's log"]))
            continue
        bad = res.judgement.status.is_failure
        evidence = [rail_line(res, node)] + ([res.judgement.reason] if bad else [])
        for side, c in sorted(res.counters.items()):
            if c.get("rose"):
                evidence.append(f"{side} error counters rose: " + ", ".join(f"{k} +{n}" for k, n in
                                                                             sorted(c["rose"].items())))
        metric = res.judgement.metrics[0] if res.judgement.metrics else None
        bound = metric.threshold.value if metric is not None and metric.threshold is not None else None
        out.append(RailVerdict(rail, bad, evidence, gbps=res.gbps, bound_gbps=bound))
    return out, [r.to_dict() for r in results.values()]


def remote_python(launch_args: Sequence[str]) -> str | None:
    """The interpreter the launch runs on the nodes when ``launch_args`` name one (``--remote-python PATH`` or
    ``--remote-python=PATH``, the ssh launcher's flag; the last wins), else None: the pair-node command then
    runs under this machine's interpreter path, as every other launched command does. Pure."""
    found = None
    for i, arg in enumerate(launch_args):
        if arg.startswith("--remote-python="):
            found = arg.split("=", 1)[1] or None
        elif arg == "--remote-python" and i + 1 < len(launch_args):
            found = launch_args[i + 1]
    return found


def run_rails(runner: Any, node: str, partner: str, nics: Sequence[str], tag: str, ports_from: str,
              log: IO[str] | None = None, python: str | None = None) -> Any:
    """Run the pair job of ``node``'s rails with ``partner`` and judge them: a :class:`RailReport`."""
    return run_many(runner, [(node, partner, nics, ports_from)], tag, log, python)[0]


def run_many(runner: Any, jobs: Sequence[tuple[str, str, Sequence[str], str]], tag: str, log: IO[str] | None = None,
             python: str | None = None) -> list[Any]:
    """Run the pair jobs ``(node, partner, nics, ports_from)`` at once, each on its own ports
    (:func:`base_ports`), and judge each: a :class:`RailReport` per job, in order."""
    from gpuaccept.isolate.pairs import PairTest
    from gpuaccept.isolate.rails import RailReport

    python = python or remote_python(getattr(runner, "launch_args", None) or ())
    ports = base_ports([len(nics) for _n, _p, nics, _f in jobs])
    tests: list[tuple[Test, str, list[str]]] = []
    for (node, partner, nics, _src), base in zip(jobs, ports, strict=True):
        if log is not None:
            print(f"[ISOLATE] rails of {node} with {partner}: perftest on {len(nics)} NICs at once (ports {base}.."
                  f"{base + len(nics) - 1})", file=log, flush=True)
        tests.append((Test((partner, node), "rail"), f"{tag}-rdma-{node}",
                      launch_flags(runner.backend, node, partner, nics, python, base_port=base)))
    runs = runner.run_many(tests, PairTest("rdma"))
    out = []
    for (node, partner, nics, ports_from), (_test, rid, _flags), run in zip(jobs, tests, runs, strict=True):
        found, results = verdicts(node, nics, runner.rdma_logs.get(rid, ""), run)
        out.append(RailReport(node, partner, ports_from, found, [{"run_id": rid, "ok": run.ok, "reason": run.reason,
                                                                   "rails": results}]))
    return out


def estimate_line(nics: Sequence[str]) -> str:
    """What ``--dry-run`` says of the time the pair job takes (pure): each rail's perftest estimate
    (:func:`gpuaccept.perftest.plan.estimate_s` of the pair-node's default arguments); the rails run at once."""
    from gpuaccept.perftest.plan import DEFAULT_ARGS, estimate_s

    seconds, how = estimate_s(DEFAULT_ARGS)
    each = f"about {seconds:g} s" if seconds is not None else "unknown"
    return (f"# estimate: each rail test (ib_write_bw {' '.join(DEFAULT_ARGS)}) {each} ({how}); the {len(nics)} "
            f"rails run at once: {each} for the job, plus the launcher's start")


def dry_run_line(runner: Any, node: str, partner: str, nics: Sequence[str], tag: str) -> list[str]:
    """The pair job as its ``gpuaccept launch`` argv (what ``--dry-run`` prints)."""
    from gpuaccept.isolate.pairs import PairTest

    return ["gpuaccept", *runner.argv(Test((partner, node), "rail"), f"{tag}-rdma-{node}",
                                      flags=launch_flags(runner.backend, node, partner, nics,
                                                         remote_python(getattr(runner, "launch_args", None) or ())),
                                      pair=PairTest("rdma"))]
