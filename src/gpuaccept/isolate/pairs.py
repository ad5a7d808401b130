"""The pair test of ``gpuaccept isolate``: a round's tests as launches of the collectives check, side by side.

Each test is ``gpuaccept launch BACKEND --nodes K --checks collectives`` on
just its nodes (``--nodelist`` on slurm, ``--hosts`` on ssh and mpi; on the
local backend the node processes are given the test's node names), built with
the launch module's own functions (parser, spec, plan, submit, gather, merge),
so a pair test is exactly what a user's launch would run. Every test of a
round is submitted before any is waited on, and all are polled from this
thread. What a test measured is read from its cluster report: the cross-node
verdict, and the lowest ``allreduce_busbw_large_gbs`` of any rank.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpuaccept.errors import UsageError
from gpuaccept.isolate.plan import Round, Run, Test

BACKENDS = ("slurm", "ssh", "mpi", "local")
BUSBW_METRIC = "allreduce_busbw_large_gbs"


def node_flags(backend: str, nodes: Sequence[str]) -> list[str]:
    """The launch flags that put a test on exactly ``nodes``."""
    if backend == "slurm":
        return ["--nodes", str(len(nodes)), "--nodelist", ",".join(nodes)]
    if backend in ("ssh", "mpi"):
        return ["--nodes", str(len(nodes)), "--hosts", ",".join(nodes)]
    if backend == "local":
        return ["--nodes", str(len(nodes))]
    raise UsageError(f"isolation runs over {', '.join(BACKENDS)}; not {backend!r}")


def named_local_plan(plan: Any, nodes: Sequence[str]) -> Any:
    """A local plan whose node ``i`` reports as ``nodes[i]`` instead of ``local-i`` (pure)."""
    from gpuaccept.launch.local.backend import node_name

    commands = []
    for i, argv in enumerate(plan.commands):
        old = f"GPUACCEPT_HOSTNAME={node_name(i)}"
        commands.append([f"GPUACCEPT_HOSTNAME={nodes[i]}" if a == old else a for a in argv])
    return dataclasses.replace(plan, commands=commands, expected_hosts=list(nodes))


def run_from_cluster(cluster: Mapping[str, Any]) -> Run:
    """A test's run from its cluster report (a dict as written): passed when every node reported and the
    cross-node checks passed; busbw the lowest of every rank's ``allreduce_busbw_large_gbs`` (pure)."""
    fabric = (cluster.get("analysis") or {}).get("cross_node") or {}
    values: list[float] = []
    for node in cluster.get("nodes") or []:
        for check in ((node.get("report") or {}).get("checks") or []):
            if check.get("name") == "collectives":
                values += [float(m["value"]) for m in check.get("metrics") or [] if m.get("name") == BUSBW_METRIC]
    busbw = min(values) if values else None
    missing = (cluster.get("analysis") or {}).get("gather", {}).get("missing") or []
    if missing:
        return Run(False, busbw, f"no report from {', '.join(missing)}")
    if not fabric:
        return Run(False, busbw, "no cross-node result: the collectives check did not run across the nodes")
    if fabric.get("verdict") != "success":
        reasons = [v.get("reason") for v in (fabric.get("checks") or {}).values() if v.get("reason")]
        return Run(False, busbw, reasons[0] if reasons else "the cross-node check failed")
    return Run(True, busbw)


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def job_text(backend: str, launch_dir: Path, job_id: str, hosts: Sequence[str]) -> str:
    """The pair job's output as its launcher keeps it: ``mpirun.log`` or ``slurm-<job>.out`` (one log, both
    nodes), or under ssh each host's ``LABEL.log`` (:mod:`gpuaccept.launch.ssh`), the hosts' one after the other;
    '' when there is none. Only files named from the launch's own host labels are read."""
    from gpuaccept.isolate.nccl import job_output

    if backend != "ssh":
        return job_output(backend, launch_dir, job_id)
    from gpuaccept.launch.hosts import safe_dirname

    parts = []
    for label in hosts:
        try:
            parts.append((launch_dir / f"{safe_dirname(label)}.log").read_text(errors="replace"))
        except OSError:
            continue
    return "\n".join(parts)


@dataclass(frozen=True)
class PairTest:
    """What each pair test runs: ``collectives`` (our check, the default) or ``nccl-tests`` (all_reduce_perf
    with ``gpus`` GPUs per node, ``args`` and ``binary``; see :mod:`gpuaccept.isolate.nccl`)."""

    kind: str = "collectives"
    gpus: int = 8
    args: tuple[str, ...] = ()
    binary: str = "all_reduce_perf"
    min_busbw: float | None = None


def launch_argv(backend: str, nodes: Sequence[str], run_id: str, results_dir: str, name: str,
                pair: PairTest, launch_args: Sequence[str] = (), port: int | None = None) -> list[str]:
    """The ``gpuaccept launch`` argv (without ``gpuaccept``) of one test on ``nodes`` (pure)."""
    head = ["launch", backend, *node_flags(backend, nodes), "--report-dir", results_dir, "--run-id", run_id,
            "--name", name, *(["--master-port", str(port)] if port else []), *launch_args]
    if pair.kind == "collectives":
        return [*head, "--checks", "collectives"]
    if pair.kind == "nccl-tests":
        from gpuaccept.isolate.nccl import launch_flags

        return [*head, *launch_flags(backend, pair.gpus, pair.args, pair.binary)]
    if pair.kind == "rdma":  # the command comes with the rail test's own flags (gpuaccept.isolate.rdma)
        return head
    raise UsageError(f"--pair-test is collectives or nccl-tests, not {pair.kind!r}")


@dataclass
class _Job:
    test: Test
    run_id: str
    backend: Any
    spec: Any
    plan: Any
    pair: PairTest
    submission: Any = None
    started: float = 0.0
    result: Run | None = None
    state: Any = None


@dataclass
class PairRunner:
    """Runs rounds through ``backend``; ``launch_args`` are further ``gpuaccept launch`` flags."""

    backend: str
    results_dir: Path
    launch_args: list[str] = field(default_factory=list)
    timeout_s: float | None = None
    poll_s: float = 1.0
    name: str = "isolate"
    log: IO[str] | None = None
    pair: PairTest = field(default_factory=PairTest)
    cluster_reports: dict[str, str] = field(default_factory=dict)  # run id -> path of its cluster report or log
    rdma_logs: dict[str, str] = field(default_factory=dict)  # run id -> the rdma pair job's log (its text)

    def argv(self, test: Test, run_id: str, port: int | None = None, flags: Sequence[str] = (),
             pair: PairTest | None = None) -> list[str]:
        """The test's ``gpuaccept launch`` argv; ``flags`` are further launch flags of this test alone (a rail's),
        ``pair`` replaces the runner's pair test for it."""
        return launch_argv(self.backend, test.nodes, run_id, str(self.results_dir), self.name, pair or self.pair,
                           [*self.launch_args, *flags], port)

    def _prepare(self, test: Test, run_id: str, port: int | None, flags: Sequence[str] = (),
                 pair: PairTest | None = None) -> _Job:
        from gpuaccept.cli import build_parser
        from gpuaccept.launch.cli import build_spec

        args = build_parser().parse_args(self.argv(test, run_id, port, flags, pair))
        cls = args.launch_parser.load()
        spec = build_spec(args, cls)
        backend = cls()
        plan = backend.plan(spec)
        if self.backend == "local":
            plan = named_local_plan(plan, test.nodes)
        return _Job(test, run_id, backend, spec, plan, pair or self.pair)

    def _say(self, line: str) -> None:
        if self.log is not None:
            print(line, file=self.log, flush=True)

    def run_round(self, rnd: Round, tag: str) -> list[tuple[Test, list[Run]]]:
        """Every test of the round ``rnd.repeat`` times; the tests of one repeat run side by side."""
        runs: dict[int, list[Run]] = {i: [] for i in range(len(rnd.tests))}
        for rep in range(rnd.repeat):
            ports = free_ports(len(rnd.tests)) if self.backend == "local" else [0] * len(rnd.tests)
            jobs = [self._prepare(t, f"{tag}-r{rnd.number}-t{i}-{rep}", ports[i]) for i, t in enumerate(rnd.tests)]
            for job in jobs:
                self._submit(job)
            self._wait(jobs)
            for i, job in enumerate(jobs):
                assert job.result is not None
                runs[i].append(job.result)
        return [(t, runs[i]) for i, t in enumerate(rnd.tests)]

    def run_one(self, test: Test, run_id: str, flags: Sequence[str] = (), pair: PairTest | None = None) -> Run:
        """One test alone (a rail's): submitted, waited on, collected; its report path in ``cluster_reports``."""
        port = free_ports(1)[0] if self.backend == "local" else None
        job = self._prepare(test, run_id, port, flags, pair)
        self._submit(job)
        self._wait([job])
        assert job.result is not None
        return job.result

    def run_many(self, tests: Sequence[tuple[Test, str, Sequence[str]]], pair: PairTest) -> list[Run]:
        """Tests ``(test, run id, its own launch flags)`` side by side: all submitted, then all waited on."""
        jobs = [self._prepare(test, rid, None, flags, pair) for test, rid, flags in tests]
        for job in jobs:
            self._submit(job)
        self._wait(jobs)
        return [job.result or Run(False, None, "no result") for job in jobs]

    def _submit(self, job: _Job) -> None:
        from gpuaccept.launch.jobargv import launch_dir
        from gpuaccept.launch.secrets import secret_values

        workdir = Path(launch_dir(job.spec))
        workdir.mkdir(parents=True, exist_ok=True)
        job.plan.write(workdir, secret_values(job.spec.env), launch=True)
        try:
            job.backend.check_ready(job.plan, job.spec)
            job.submission = job.backend.submit(job.plan, job.spec, workdir)
        except Exception as exc:  # a test that cannot start is a failed test, with the reason as evidence
            job.result = Run(False, None, f"cannot start: {exc}")
            return
        job.started = time.monotonic()
        self._say(f"[ISOLATE] {', '.join(job.test.nodes)}: {job.backend.name} job {job.submission.job_id} "
                  f"({job.run_id})")

    def _wait(self, jobs: list[_Job]) -> None:
        pending = [j for j in jobs if j.result is None]
        while pending:
            for job in list(pending):
                state = job.backend.poll(job.submission)
                late = self.timeout_s is not None and time.monotonic() - job.started >= self.timeout_s
                if late and not state.done:
                    job.backend.cancel(job.submission)
                job.state = state
                if state.done or late:
                    job.result = self._collect(job, timed_out=late and not state.done)
                    pending.remove(job)
            if pending:
                time.sleep(self.poll_s)

    def _collect(self, job: _Job, timed_out: bool) -> Run:
        if job.pair.kind == "rdma":
            run = self._rdma_run(job)
        else:
            run = self._nccl_run(job) if job.pair.kind == "nccl-tests" else self._cluster_run(job)
        if timed_out:
            run = Run(False, run.busbw, f"timed out after {self.timeout_s:g} s")
        bw = f"{run.busbw:.3g} GB/s" if run.busbw is not None else "no busbw"
        self._say(f"[ISOLATE] {', '.join(job.test.nodes)}: {'pass' if run.ok else 'FAIL'} ({bw})"
                  + (f": {run.reason}" if run.reason else ""))
        return run

    def _nccl_run(self, job: _Job) -> Run:
        from gpuaccept.isolate.nccl import job_output, run_from_output
        from gpuaccept.launch.jobargv import launch_dir

        where = Path(launch_dir(job.spec))
        text = job_output(self.backend, where, job.submission.job_id)
        self.cluster_reports[job.run_id] = str(where)
        state = job.state
        return run_from_output(text, len(job.test.nodes), job.pair.gpus, job_ok=bool(state and state.ok),
                               job_state=getattr(state, "state", ""), min_busbw=job.pair.min_busbw)

    def _rdma_run(self, job: _Job) -> Run:
        """An rdma pair job (:mod:`gpuaccept.isolate.rdma`): ok when its log has ``rdma pair-node`` lines; the log
        kept in ``rdma_logs`` for the rail judge."""
        from gpuaccept.launch.jobargv import launch_dir

        where = Path(launch_dir(job.spec))
        self.cluster_reports[job.run_id] = str(where)
        hosts = job.submission.hosts or job.plan.expected_hosts
        text = self.rdma_logs[job.run_id] = job_text(self.backend, where, job.submission.job_id, hosts)
        if "@rdma " not in text:
            state = getattr(job.state, "state", "") or "job state unknown"
            return Run(False, None, f"no rdma pair-node output in the job's log ({state})")
        return Run(True, None)

    def _cluster_run(self, job: _Job) -> Run:
        from gpuaccept.launch.collect import backend_reports, write_cluster
        from gpuaccept.launch.gather import merge_reports

        run_dir = Path(job.spec.run_results_dir)
        reports = backend_reports(job.backend, job.submission, job.spec, run_dir)
        cluster = merge_reports(reports, run_id=job.run_id, backend=job.backend.name, started="",
                                expected_hosts=job.submission.hosts or job.plan.expected_hosts,
                                expected_nodes=len(job.test.nodes), job_id=job.submission.job_id)
        self.cluster_reports[job.run_id] = str(write_cluster(cluster, run_dir, None))
        return run_from_cluster(cluster.to_dict())
