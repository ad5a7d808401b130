"""The slurm backend: one sbatch script, submitted with ``sbatch --parsable``, watched, cancelled with scancel.

The script starts one task per node with ``srun``, on nodes the job has to
itself (``--exclusive``) with all their memory (``--mem=0``), unless
``--no-exclusive`` or ``--mem`` says otherwise. Each task names its node
(``GPUACCEPT_HOSTNAME=$SLURMD_NODENAME``) so that reports are attributed to
Slurm's node names, then runs the job: the suite once per node, a command
(or the suite with --distributed) under torchrun. Under torchrun the c10d
rendezvous is on the first allocated node (``scontrol show hostnames``), at
its ``NodeAddr``, on port ``20000 + job id % 20000``.

With ``--image`` the tasks run in a Pyxis/Enroot container: ``--container-image``
(a registry host is separated with ``#``: ``nvcr.io#nvidia/pytorch:24.05-py3``),
``--container-mounts`` (the results directory is mounted at the same path
unless a mount covers it), ``--container-env`` (the ``--env`` names, so they
override the image's), ``--container-workdir`` and ``--no-container-mount-home``.

Status comes from ``sacct``; where the cluster has no accounting, from
``squeue`` while the job is queued and ``scontrol show job`` once it left.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gpuaccept.argtypes import whole_seconds
from gpuaccept.errors import UsageError
from gpuaccept.launch.base import Backend, JobState, Plan, Submission
from gpuaccept.launch.slurm.options import (
    CONTAINER_GPUS,
    RUNTIMES,
    SCRIPT,
    SlurmOptions,
    choice_type,
    csv_list,
    dash_arg_type,
    hostlist_type,
    mem_type,
    port_type,
    positive_type,
    runtime_arg_type,
    sbatch_line_type,
    shm_type,
    token_type,
)
from gpuaccept.launch.slurm.parse import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmJob,
    parse_sacct,
    parse_sbatch,
    parse_scontrol_job,
    parse_squeue,
    sacct_unavailable,
)
from gpuaccept.launch.slurm.runtime_check import check_runtime_ready, node_failures, runtime_files, runtime_notes
from gpuaccept.launch.slurm.runtime_script import STATE_DIR
from gpuaccept.launch.slurm.script import render_script
from gpuaccept.launch.spec import JobSpec, env_names

_CMD_TIMEOUT_S = 60


@dataclass
class _Watch:
    log_dir: str = ""
    use_sacct: bool = True
    last: SlurmJob | None = None
    notes: list[str] = field(default_factory=list)


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=_CMD_TIMEOUT_S, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} did not answer in {_CMD_TIMEOUT_S} s")


def _mem_arg(text: str) -> str:
    return "none" if text.strip().lower() == "none" else mem_type(text)


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


class SlurmBackend(Backend):
    name: ClassVar[str] = "slurm"
    help: ClassVar[str] = "sbatch + srun (torchrun per node), Pyxis/Enroot or docker/podman containers"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("slurm options")
        g.add_argument("--container-image", dest="image", default=None, metavar="IMAGE",
                       help="same as --image: run the tasks in this Pyxis/Enroot image")
        g.add_argument("--container-mounts", dest="mount", action="extend", type=csv_list, default=None,
                       metavar="SRC:DST[:ro],...", help=argparse.SUPPRESS)  # --mount, comma-separated
        g.add_argument("--partition", type=token_type("--partition"), default=None, help="#SBATCH --partition")
        g.add_argument("--account", type=token_type("--account"), default=None, help="#SBATCH --account")
        g.add_argument("--qos", type=token_type("--qos"), default=None, help="#SBATCH --qos")
        g.add_argument("--exclusive", action="store_true", default=None,
                       help="#SBATCH --exclusive: each node is the job's alone (the default)")
        g.add_argument("--no-exclusive", dest="exclusive", action="store_false", default=None,
                       help="share the nodes with other jobs (no --exclusive line)")
        g.add_argument("--mem", type=_mem_arg, default=None, metavar="SIZE",
                       help="#SBATCH --mem per node (default: 0, all of the node's memory; none: no --mem line, "
                            "the site's default)")
        g.add_argument("--exclude", type=hostlist_type, default=None, metavar="HOSTLIST", help="nodes to avoid")
        g.add_argument("--nodelist", type=hostlist_type, default=None, metavar="HOSTLIST", help="nodes to use")
        g.add_argument("--cpus-per-task", type=positive_type, default=None, metavar="N",
                       help="CPUs of the one task per node (passed to srun too)")
        g.add_argument("--sbatch-line", dest="sbatch_lines", action="append", type=sbatch_line_type, default=None,
                       metavar="OPTION", help="an extra #SBATCH line, e.g. --reservation=maint (repeatable)")
        g.add_argument("--srun-arg", dest="srun_args", action="append", type=dash_arg_type, default=None,
                       metavar="ARG", help="an extra srun argument, e.g. --mpi=pmix (repeatable)")
        g.add_argument("--container-workdir", default=None, metavar="PATH", help="Pyxis --container-workdir")
        g.add_argument("--no-container-mount-home", dest="container_mount_home", action="store_false",
                       default=None, help="Pyxis --no-container-mount-home")
        g.add_argument("--container-env", action="append", type=env_names, default=None, metavar="A,B",
                       help="more variable names for Pyxis --container-env (the --env names always are)")
        r = parser.add_argument_group("slurm --runtime docker|podman (no Pyxis: the job starts its own containers)")
        r.add_argument("--runtime", type=choice_type("--runtime", RUNTIMES), default=None,
                       help="start --image with docker or podman on every node, as the calling user")
        r.add_argument("--mounts", dest="mount", action="extend", type=csv_list, default=None,
                       metavar="PATH|SRC:DST[:ro],...", help=argparse.SUPPRESS)  # --mount, comma-separated
        r.add_argument("--ssh-port", type=port_type, default=None, metavar="PORT",
                       help="a command's sshd listens on PORT + the node's index in the allocation (default 2222)")
        r.add_argument("--handshake-timeout", dest="handshake_timeout_s", type=whole_seconds, default=None,
                       metavar="DURATION", help="time the first node waits for every node's sshd (default 2m)")
        r.add_argument("--runtime-arg", dest="runtime_args", action="append", type=runtime_arg_type, default=None,
                       metavar="OPTION", help="an extra option of '<runtime> run', e.g. --ulimit=memlock=-1")
        r.add_argument("--privileged", action="store_true", default=None,
                       help="run the containers privileged (some sites need it for RDMA; a warning names the risk)")
        r.add_argument("--no-ipc-host", dest="ipc_host", action="store_false", default=None,
                       help="a private IPC namespace (default: --ipc=host, which NCCL's shared memory wants)")
        r.add_argument("--network", type=token_type("--network"), default=None, metavar="NET",
                       help="container network (default host: sshd and NCCL need the node's interfaces)")
        r.add_argument("--shm-size", type=shm_type, default=None, metavar="SIZE", help="container --shm-size")
        r.add_argument("--container-gpus", type=choice_type("--container-gpus", CONTAINER_GPUS), default=None,
                       help="auto (the default): the node's GPUs when it has /dev/nvidiactl; all; none")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        raw: dict[str, Any] = {}
        for key in SlurmOptions.__dataclass_fields__:
            value = getattr(args, key, None)
            if value is None:
                continue
            if key == "container_env":
                value = [n for group in value for n in (group if isinstance(group, list) else [group])]
            raw[key] = value
        SlurmOptions.from_dict(raw)
        return raw

    def plan(self, spec: JobSpec) -> Plan:
        opts = SlurmOptions.from_dict(spec.options)
        files = runtime_files(spec, opts) if opts.runtime else {SCRIPT: render_script(spec, opts)}
        notes = [f"every node writes under {spec.run_results_dir}: it must be on a filesystem all nodes share"]
        if spec.image and spec.command is None:
            notes.append(f"the image must have gpuaccept (and torch) installed for {spec.python!r}")
        if opts.runtime:
            notes += runtime_notes(spec, opts)
        return Plan(backend=self.name, files=files, commands=[["sbatch", "--parsable", SCRIPT]], notes=notes)

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        for tool in ("sbatch", "squeue", "scancel"):
            if shutil.which(tool) is None:
                raise UsageError(f"{tool} not found on PATH: run this on a Slurm login node "
                                 "(or add --dry-run to see the script)")
        opts = SlurmOptions.from_dict(spec.options)
        if opts.runtime:
            check_runtime_ready(spec, opts)

    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        job_id: str | None = None
        for argv in plan.commands:
            r = _run(argv, cwd=workdir)
            if r.returncode != 0:
                said = "; ".join(x.strip() for x in (r.stderr or r.stdout).splitlines() if x.strip())
                raise UsageError(f"{argv[0]} refused the job (exit {r.returncode}): {said[:400] or 'no message'}")
            if argv[0] == "sbatch":
                job_id = parse_sbatch(r.stdout)
        return Submission(backend=self.name, job_id=job_id, handle=_Watch(log_dir=str(workdir)), hosts=[])

    def _query(self, job_id: str, watch: _Watch) -> SlurmJob | None:
        if watch.use_sacct:
            r = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", SACCT_FIELDS])
            if r.returncode == 0:
                job = parse_sacct(r.stdout, job_id)
                if job is not None:
                    return job
            elif sacct_unavailable(r.stderr) or r.returncode == 127:
                watch.use_sacct = False
                watch.notes.append(f"sacct unavailable ({_last_line(r.stderr)}); watching with squeue")
        r = _run(["squeue", "-h", "-j", job_id, "-o", SQUEUE_FORMAT])
        if r.returncode == 0:
            job = parse_squeue(r.stdout, job_id)
            if job is not None and not job.done:
                return job
        r = _run(["scontrol", "show", "job", "-o", job_id])
        return parse_scontrol_job(r.stdout, job_id) if r.returncode == 0 else None

    def poll(self, submission: Submission) -> JobState:
        watch: _Watch = submission.handle
        assert submission.job_id is not None
        job = self._query(submission.job_id, watch)
        if job is None:
            if watch.last is None:
                return JobState("UNKNOWN", done=False, detail="not listed by the scheduler yet")
            return JobState("UNKNOWN", done=True, ok=False,
                            detail="the job left the queue and no accounting says how it ended")
        watch.last = job
        if job.hosts:
            submission.hosts = job.hosts
        detail = job.nodes or job.reason
        if job.done and job.exit_code not in ("", "0:0"):
            detail = f"exit {job.exit_code}" + (f" on {job.nodes}" if job.nodes else "")
        return JobState(job.state, done=job.done, ok=job.ok, detail=detail)

    @classmethod
    def live_state(cls, job_id: str) -> JobState | None:
        """The job's state now (for ``gpuaccept gather``); None when Slurm cannot be asked or does not know it."""
        job = cls()._query(job_id, _Watch())
        if job is None:
            return None
        return JobState(job.state, done=job.done, ok=job.ok, detail=job.nodes or job.reason)

    def cancel(self, submission: Submission) -> None:
        if submission.job_id:
            _run(["scancel", submission.job_id])

    def logs(self, submission: Submission) -> str:
        """The last lines of the job's ``slurm-<id>.out`` (the script writes it next to the plan), then, with
        ``--runtime``, why each failed node failed (its ``container/failed.<node>``) when those lines are not
        among them."""
        watch: _Watch = submission.handle
        try:
            text = (Path(watch.log_dir) / f"slurm-{submission.job_id}.out").read_text(errors="replace")
        except OSError:
            text = ""
        tail = text.splitlines()[-40:]
        tail += [line for line in node_failures(Path(watch.log_dir) / STATE_DIR) if line not in tail]
        return "\n".join(tail)
