"""Continuous validation of idle Slurm nodes (pure): which nodes a sweep tests, and the job it submits to each.

A sweep reads the partition's nodes (``sinfo --Node``) and the sweep jobs already queued (``squeue``), picks the
nodes that are idle right now and have no sweep job of their own, and submits to each one low-priority,
non-requeued, one-node job that runs ``gpuaccept run`` there and stores its result in the history (the run's
own ``--db``, with the node's hardware identity, as every run does). The site's QOS (``--qos``, with
``PreemptMode=CANCEL`` or ``REQUEUE`` on the QOS of real work) makes real work preempt it; ``--nice`` lowers its
priority further; ``--deadline`` drops a job that did not start in time (the node was taken meanwhile).

Equivalent by hand: ``sinfo -h -N -p gpu -t idle -o %N`` then, per node,
``sbatch -p gpu --qos=scavenger --nice=10000 --no-requeue -w NODE -N 1 --exclusive -t 30 job.sh``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuaccept.argtypes import check_host

JOB_NAME = "gpuaccept-sweep"
"""Every sweep job's name: how a sweep finds the jobs an earlier sweep queued (``squeue --name``)."""
SINFO_FORMAT = "%N|%T|%P"
"""``sinfo --Node --noheader --format`` of :func:`parse_sinfo`: node, long state with its flags, partition."""
SQUEUE_FORMAT = "%i|%T|%N|%n"
"""``squeue --noheader --name=gpuaccept-sweep --format`` of :func:`parse_squeue`: job, state, nodes it runs on,
nodes it asked for (a pending job has only the latter)."""
_STATE_FLAGS = "*~#!%$@^-"
"""sinfo's state suffixes: not responding, powered off, powering up, powering down (``!``, ``%``), in a
maintenance reservation, reboot pending, reboot issued, planned by backfill. A node with any is not idle for a
sweep."""
_NODE_LIST = re.compile(r"^[A-Za-z0-9_.,\[\]-]*$")


@dataclass(frozen=True)
class NodeState:
    """One line of ``sinfo --Node``: ``state`` is sinfo's long state with its suffix flags (``idle``, ``idle~``,
    ``mixed``, ``allocated``, ``drained``)."""

    name: str
    state: str
    partition: str

    @property
    def idle(self) -> bool:
        """Idle, responding, powered on, not draining, not reserved: only ``idle`` exactly."""
        return self.state == "idle"


@dataclass(frozen=True)
class SweepOptions:
    """What every sweep job asks Slurm for, and what it runs (``run_args``: ``gpuaccept run`` arguments)."""

    python: str
    results_dir: str
    db: str | None = None
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    nice: int = 10000
    time_min: int = 30
    deadline_min: int | None = 60
    max_nodes: int | None = None
    gpus_per_node: int | None = None
    run_args: tuple[str, ...] = ("--profile", "quick")
    extra: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Decision:
    """A node the sweep looked at: ``submit`` or not, and why not."""

    node: str
    submit: bool
    why: str


def parse_sinfo(text: str) -> list[NodeState]:
    """Nodes of ``sinfo --Node --noheader --format='%N|%T|%P'``, each once (a node in several partitions is
    listed once per partition; the first line is kept, so its state is the same). A partition's default mark
    ``*`` is dropped. ValueError on a line that is not three fields."""
    seen: dict[str, NodeState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise ValueError(f"unexpected sinfo line {line[:80]!r} (expected NODE|STATE|PARTITION)")
        name, state, partition = parts
        seen.setdefault(name, NodeState(name, state.lower(), partition.rstrip("*")))
    return list(seen.values())


def parse_squeue(text: str) -> dict[str, str]:
    """Sweep jobs still queued or running, ``{node: job id}``, from ``squeue --noheader --name=gpuaccept-sweep
    --format='%i|%T|%N|%n'``: a running job's node, else the node it asked for. A finished job is not listed
    by squeue (COMPLETING is, and still holds its node)."""
    from gpuaccept.launch.slurm.parse import expand_hostlist

    jobs: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 4:
            raise ValueError(f"unexpected squeue line {line[:80]!r} (expected JOB|STATE|NODES|REQUESTED)")
        job, _state, running, asked = parts
        nodes = running if running and running != "(null)" else asked
        if nodes and nodes != "(null)" and _NODE_LIST.match(nodes):
            for node in expand_hostlist(nodes):
                jobs.setdefault(node, job)
    return jobs


def decide(nodes: Sequence[NodeState], queued: dict[str, str], max_nodes: int | None = None) -> list[Decision]:
    """For each node, in ``sinfo``'s order: submit when it is idle and has no sweep job yet, at most
    ``max_nodes`` of them. A name that is not a valid host name is never submitted to (it becomes a path)."""
    out: list[Decision] = []
    chosen = 0
    for node in nodes:
        try:
            check_host(node.name)
        except ValueError:
            out.append(Decision(node.name, False, "not a valid node name"))
            continue
        if not node.idle:
            out.append(Decision(node.name, False, f"not idle ({node.state})"))
        elif node.name in queued:
            out.append(Decision(node.name, False, f"sweep job {queued[node.name]} already queued"))
        elif max_nodes is not None and chosen >= max_nodes:
            out.append(Decision(node.name, False, f"over --max-nodes {max_nodes}"))
        else:
            chosen += 1
            out.append(Decision(node.name, True, "idle"))
    return out


def sinfo_argv(partition: str | None, sinfo: str = "sinfo") -> list[str]:
    argv = [sinfo, "--Node", "--noheader", f"--format={SINFO_FORMAT}"]
    return argv + ([f"--partition={partition}"] if partition else [])


def squeue_argv(squeue: str = "squeue") -> list[str]:
    return [squeue, "--noheader", f"--name={JOB_NAME}", f"--format={SQUEUE_FORMAT}"]


def job_script(node: str, opts: SweepOptions, log_dir: str | None = None) -> str:
    """The sbatch script for one node: its ``#SBATCH`` lines, then ``gpuaccept run`` on that node, its report in
    ``RESULTS/<stamp>-<node>-<suffix>/`` (the run's own id) and its result stored in the history. ``log_dir``: where the
    job's output goes (default: the results directory)."""
    check_host(node)
    lines = ["#!/bin/sh", f"# gpuaccept idle-node sweep of {node}",
             *(f"#SBATCH {a}" for a in sbatch_options(node, opts, log_dir))]
    run = [opts.python, "-m", "gpuaccept", "run", *opts.run_args]
    if opts.db:
        run += ["--db", opts.db]
    run += ["--report-dir", opts.results_dir]
    lines += ['GPUACCEPT_HOSTNAME="$SLURMD_NODENAME"; export GPUACCEPT_HOSTNAME',
              "exec " + " ".join(shlex.quote(a) for a in run), ""]
    return "\n".join(lines)


def sbatch_options(node: str, opts: SweepOptions, log_dir: str | None = None) -> list[str]:
    """The job's sbatch options: one node, that node, exclusive, low priority, never requeued, a time limit,
    a start deadline, and the site's partition/QOS/account."""
    out = [f"--job-name={JOB_NAME}", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--exclusive",
           f"--nice={opts.nice}", "--no-requeue", f"--time={opts.time_min}",
           f"--output={(log_dir or opts.results_dir).rstrip('/')}/{node}-%j.out", f"--comment={JOB_NAME}"]
    if opts.deadline_min is not None:
        out.append(f"--deadline=now+{opts.deadline_min}minutes")
    for flag, value in (("partition", opts.partition), ("qos", opts.qos), ("account", opts.account)):
        if value:
            out.append(f"--{flag}={value}")
    if opts.gpus_per_node:
        out.append(f"--gpus-per-node={opts.gpus_per_node}")
    return out + list(opts.extra)


def sbatch_argv(script_path: str, sbatch: str = "sbatch") -> list[str]:
    """``sbatch --parsable SCRIPT``: prints the job id (and the cluster after ``;`` on a federation)."""
    return [sbatch, "--parsable", script_path]


def summary(decisions: Iterable[Decision]) -> list[str]:
    """One line per node: ``node1: submit (idle)`` / ``node2: skip (not idle (allocated))``."""
    return [f"{d.node}: {'submit' if d.submit else 'skip'} ({d.why})" for d in decisions]
