"""The local backend: N "nodes" as processes on this machine, through the same plan/submit/watch/gather flow.

Node ``i`` is named ``local-i`` (``GPUACCEPT_HOSTNAME``), gets ``NODE_RANK``
and the spec's environment, and runs the job directly or as one torchrun
agent with a static rendezvous on 127.0.0.1 (port derived from the run id).
Its output goes to ``<run dir>/launch/node-i.log``. The plan's commands are
started together, one per node, not one after another.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from gpuaccept.errors import ConfigError
from gpuaccept.launch.base import Backend, JobState, Plan, Submission
from gpuaccept.launch.gpucount import wrapped
from gpuaccept.launch.jobargv import node_argv, port_from, torchrun_argv
from gpuaccept.launch.spec import JobSpec

MAX_LOCAL_NODES = 64
KILL_GRACE_S = 5.0


def node_name(rank: int) -> str:
    return f"local-{rank}"


def _port(text: str) -> int:
    if not text.isdigit() or not 1024 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port from 1024 to 65535")
    return int(text)


@dataclass
class _Procs:
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    files: list[IO[bytes]] = field(default_factory=list)


class LocalBackend(Backend):
    name: ClassVar[str] = "local"
    help: ClassVar[str] = "N nodes as processes on this machine (try the flow, tests)"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("local options")
        g.add_argument("--master-port", type=_port, default=None, metavar="PORT",
                       help="torchrun rendezvous port (default: derived from the run id)")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        port = getattr(args, "master_port", None)
        return {"master_port": port} if port is not None else {}

    def plan(self, spec: JobSpec) -> Plan:
        unknown = sorted(set(spec.options) - {"master_port"})
        if unknown:
            raise ConfigError("local options", unknown[0], "unknown option; known: master_port")
        if spec.nodes > MAX_LOCAL_NODES:
            raise ConfigError("--nodes", str(spec.nodes), f"the local backend runs at most {MAX_LOCAL_NODES} nodes")
        if spec.image or spec.mounts:
            raise ConfigError("--image" if spec.image else "--mount", "",
                              "the local backend runs no containers; drop --image/--mount")
        port = int(spec.options.get("master_port") or port_from(spec.run_id, 29500, 20000))
        commands = []
        for rank in range(spec.nodes):
            env = [f"GPUACCEPT_HOSTNAME={node_name(rank)}", f"NODE_RANK={rank}",
                   *(f"{k}={v}" for k, v in spec.env.items())]
            if spec.distributed:
                job = torchrun_argv(spec, [f"--node-rank={rank}", "--master-addr=127.0.0.1",
                                           f"--master-port={port}"], str(spec.nodes))
                if spec.nproc is None:  # one rank per GPU of this machine, counted when the node starts
                    job = wrapped(job)
            else:
                job = node_argv(spec)
            commands.append(["env", *env, *job])
        notes = [f"the {spec.nodes} commands start together, one per node; output in <run dir>/launch/node-N.log"]
        if spec.workdir:
            notes.append(f"working directory: {spec.workdir}")
        return Plan(backend=self.name, commands=commands,
                    expected_hosts=[node_name(r) for r in range(spec.nodes)], notes=notes)

    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        handle = _Procs()
        cwd = spec.workdir or None
        try:
            for rank, argv in enumerate(plan.commands):
                log = workdir / f"node-{rank}.log"
                fh = open(log, "wb")  # kept open for the process's lifetime
                handle.files.append(fh)
                handle.logs.append(log)
                handle.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh,
                                                     stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True))
        except OSError as exc:
            self._kill(handle)
            raise ConfigError("local", plan.commands[len(handle.procs)][0], f"cannot start: {exc}") from exc
        return Submission(backend=self.name, job_id=f"pid{handle.procs[0].pid}", handle=handle,
                          hosts=list(plan.expected_hosts))

    def poll(self, submission: Submission) -> JobState:
        h: _Procs = submission.handle
        codes = [p.poll() for p in h.procs]
        running = sum(c is None for c in codes)
        if running:
            return JobState("RUNNING", done=False, detail=f"{len(codes) - running}/{len(codes)} nodes done")
        self._close(h)
        failed = [f"{node_name(i)} exit {c}" for i, c in enumerate(codes) if c != 0]
        if failed:
            return JobState("FAILED", done=True, ok=False, detail=", ".join(failed))
        return JobState("COMPLETED", done=True, ok=True)

    @staticmethod
    def _close(h: _Procs) -> None:
        for fh in h.files:
            fh.close()
        h.files.clear()

    def _kill(self, h: _Procs) -> None:
        for p in h.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + KILL_GRACE_S
        for p in h.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self._close(h)

    def cancel(self, submission: Submission) -> None:
        """SIGTERM to every node's process group (the runner saves its report), SIGKILL after 5 s."""
        self._kill(submission.handle)

    def logs(self, submission: Submission) -> str:
        h: _Procs = submission.handle
        out: list[str] = []
        for i, log in enumerate(h.logs):
            try:
                tail = log.read_text(errors="replace").splitlines()[-15:]
            except OSError:
                continue
            out.extend(f"[{node_name(i)}] {line}" for line in tail)
        return "\n".join(out)
