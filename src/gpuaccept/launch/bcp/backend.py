"""The NVIDIA Base Command Platform backend (DGX Cloud): ``ngc base-command job run`` built from the JobSpec.

One node runs the job under the shared node script. On 2+ nodes the job is
an array of ``--replicas N``: ``--array-type MPI`` (default) runs the shared
MPI launcher script on the launcher replica (``mpirun --hostfile
/etc/mpi/hostfile``, exit 97 unless the ranks land one group per replica);
``--array-type PYTORCH`` runs the node script on every replica, with one
torchrun agent per replica placed by ``NGC_ARRAY_SIZE``, ``NGC_ARRAY_INDEX``
and ``NGC_MASTER_ADDR``. Reports are written under the job's result mount
(``--result``, default ``/results``) and printed to the job log between the
pod-script markers. ``--mount WORKSPACE:/target[:ro]`` is a ``--workspace``
(RW unless ``:ro``); ``--time`` is ``--total-runtime``. Waiting reads
``ngc base-command job info ID``, cancelling is ``ngc base-command job kill
ID``, gathering is ``ngc base-command result download ID --dest DIR``: the
reports are read from the downloaded tree, or from the job log in it
(``joblog.log``) when no ``report.json`` came back. ``--dry-run`` prints the
command and ``--output DIR`` writes it as ``bcp-submit.sh``.

Flag names follow the NGC CLI (``ngc base-command job run``, formerly
``ngc batch run``) as its reference examples and NVIDIA's published job
scripts use them: ``--name``, ``--image``, ``--instance``, ``--ace``,
``--org``, ``--team``, ``--replicas``, ``--array-type``, ``--result``,
``--preempt``, ``--priority``, ``--total-runtime`` (``3600s``; ``1H``/``7D``
also appear), ``--workspace ID_OR_NAME:MOUNT:RW|RO``, ``--datasetid
ID:MOUNT``, ``--env-var NAME:VALUE``, ``--label`` and ``--commandline``.

Not confirmed, since no Base Command cluster or NGC account is reachable from
here (the tests use a recorded fake ``ngc`` that checks the argv):

- Where the command line runs. Public multi-node scripts run it on every
  replica under ``PYTORCH`` (they branch on ``NGC_REPLICA_ID``/``NGC_ARRAY_INDEX``
  or pass ``--node_rank=${NGC_ARRAY_INDEX}`` to torch's launcher) and start
  ``mpirun``/``bcprun`` from it under ``MPI``; the reference does not say so.
  The MPI path checks rank placement and fails (exit 97) rather than run on
  the launcher alone; the PYTORCH path fails if ``NGC_ARRAY_SIZE`` or
  ``NGC_ARRAY_INDEX`` is unset.
- ``NGC_MASTER_ADDR``: seen in public scripts, some of which set it
  themselves to ``launcher-svc-$NGC_JOB_ID``; that is the fallback here.
- That the MPI array type provides ``/etc/mpi/hostfile`` (public scripts use
  ``/etc/mpi/`` for NVIDIA's launch helpers), and that the command line is
  run by a shell (public examples use ``&&``, ``;`` and ``$VAR`` in it).
- ``--env-var NAME:VALUE`` with a value that holds ``:``: taken to split at
  the first colon.
- ``result download``: that ``--dest`` names the download directory (as for
  ``workspace download``), that the tree is ``DEST/<job id>/`` with
  ``joblog.log`` in it, and whether a multi-node job's download holds every
  replica's result directory; when fewer reports than nodes come back,
  ``<id>:<replica>`` is downloaded for each other replica (the ``job
  telemetry`` syntax), and a failure there is listed, not raised.
- ``job info`` prints ``Status: WORD`` (as in the reference example); the
  status words come from the ``job list --status`` choices.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaccept.errors import GpuacceptError, InputError, UsageError
from gpuaccept.launch.base import Backend, JobState, Plan, Submission, read_reports
from gpuaccept.launch.bcp.parse import parse_job_id, parse_job_status, status_state
from gpuaccept.launch.bcp.plan import ARRAY_TYPES, PREEMPT_CLASSES, PRIORITIES, BcpOptions, build_argv, shell_lines
from gpuaccept.launch.jobargv import launch_dir
from gpuaccept.launch.log_reports import reports_from_log
from gpuaccept.launch.spec import JobSpec
from gpuaccept.launch.tool import run_tool
from gpuaccept.model import NodeReport

JOB_ID_FILE = "bcp-job-id"
"""Written next to job.json at submission: ``gpuaccept gather`` finds the job again with it."""


@dataclass
class BcpHandle:
    job_id: str
    ngc_bin: str
    nodes: int
    scope: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    poll_failures: int = 0


class BcpBackend(Backend):
    """NVIDIA Base Command Platform: ngc base-command job run (--replicas N --array-type MPI|PYTORCH on 2+ nodes).
    --image and --instance are required; --dry-run prints the command. Submitting needs the ngc CLI, configured;
    reports come back through ngc base-command result download."""

    name = "bcp"
    help = "NVIDIA Base Command Platform: ngc base-command job run"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("bcp")
        g.add_argument("--instance", default=None, metavar="TYPE",
                       help="instance type, e.g. dgxa100.80g.8.norm (required)")
        g.add_argument("--ace", default=None, help="ACE to run in (default: the ngc CLI's configuration)")
        g.add_argument("--org", default=None, help="NGC org (default: the ngc CLI's configuration)")
        g.add_argument("--team", default=None, help="NGC team (default: the ngc CLI's configuration)")
        g.add_argument("--array-type", choices=ARRAY_TYPES, type=str.upper, default="MPI",
                       help="multi-node jobs: MPI runs mpirun on the launcher replica, PYTORCH one torchrun per "
                            "replica (default: MPI)")
        g.add_argument("--result-mount", default="/results", metavar="PATH",
                       help="the job's result directory in the container (default: /results)")
        g.add_argument("--preempt", choices=PREEMPT_CLASSES, type=str.upper, default="RUNONCE")
        g.add_argument("--priority", choices=PRIORITIES, type=str.upper, default=None)
        g.add_argument("--label", action="append", default=[], metavar="LABEL", help="job label (repeatable)")
        g.add_argument("--dataset", action="append", default=[], metavar="ID:/MOUNT",
                       help="mount a dataset read-only (--datasetid; repeatable)")
        g.add_argument("--ngc-bin", default="ngc", metavar="PATH", help="the ngc CLI (default: ngc)")
        g.add_argument("--ngc-arg", action="append", default=[], metavar="ARG",
                       help="extra argument for 'ngc base-command job run', e.g. --ngc-arg=--order=50 (repeatable)")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        raw = {
            "instance": getattr(args, "instance", None),
            "ace": getattr(args, "ace", None),
            "org": getattr(args, "org", None),
            "team": getattr(args, "team", None),
            "array_type": getattr(args, "array_type", "MPI"),
            "result_mount": getattr(args, "result_mount", "/results"),
            "preempt": getattr(args, "preempt", "RUNONCE"),
            "priority": getattr(args, "priority", None),
            "labels": list(getattr(args, "label", None) or []),
            "datasets": list(getattr(args, "dataset", None) or []),
            "ngc_bin": getattr(args, "ngc_bin", "ngc"),
            "extra_args": list(getattr(args, "ngc_arg", None) or []),
        }
        return BcpOptions.from_dict(raw, "bcp").to_dict()

    def plan(self, spec: JobSpec) -> Plan:
        opts = BcpOptions.from_dict(spec.options)
        argv = build_argv(spec, opts)
        script = ("#!/bin/sh\n# Submits the gpuaccept job to Base Command (written by gpuaccept launch bcp).\n"
                  "# shellcheck disable=SC2016 # the container's command line is passed on literally\n"
                  "exec " + shell_lines(argv) + "\n")
        notes = [f"reports come back with ngc base-command result download (from {opts.result_mount}, or the job "
                 "log in it)"]
        if spec.nodes > 1 and opts.array_type == "MPI":
            notes.append("the launcher replica runs mpirun --hostfile /etc/mpi/hostfile and fails (exit 97) unless "
                         "the ranks land on every replica")
        if not spec.time_limit_min:
            notes.append("no --time: the ACE's default total runtime applies")
        return Plan(backend=self.name, files={"bcp-submit.sh": script}, commands=[argv], notes=notes)

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        opts = BcpOptions.from_dict(spec.options)
        if shutil.which(opts.ngc_bin) is None:
            raise UsageError(f"the ngc CLI ({opts.ngc_bin}) is not on PATH: install the NGC CLI and run "
                             "'ngc config set', or use --dry-run to print the command")

    @staticmethod
    def _scope(opts: BcpOptions) -> list[str]:
        out: list[str] = []
        for flag, value in (("--ace", opts.ace), ("--org", opts.org), ("--team", opts.team)):
            if value:
                out += [flag, value]
        return out

    def _run(self, ngc_bin: str, args: list[str], what: str, cwd: Path | None = None, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_tool([ngc_bin, *args], "ngc", what, cwd=cwd, check=check, timeout=timeout)

    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        opts = BcpOptions.from_dict(spec.options)
        argv = plan.commands[0]
        proc = self._run(opts.ngc_bin, argv[1:], f"submitting {spec.name}", cwd=workdir)
        try:
            job_id = parse_job_id(proc.stdout)
        except InputError as exc:
            raise UsageError(f"submitting {spec.name}: {exc}; look for the job with 'ngc base-command job list' "
                             "before submitting again") from None
        try:
            (workdir / JOB_ID_FILE).write_text(job_id + "\n")
        except OSError as exc:
            raise InputError(f"job {job_id} submitted, but {workdir / JOB_ID_FILE} cannot be written: "
                             f"{exc.strerror}") from None
        handle = BcpHandle(job_id, opts.ngc_bin, spec.nodes, self._scope(opts))
        return Submission(backend=self.name, job_id=job_id, handle=handle)

    def resume(self, spec: JobSpec) -> Submission:
        """The handle of a job submitted earlier from ``spec`` (after ``--detach``): its id is in the launch
        directory. InputError when it is not there."""
        opts = BcpOptions.from_dict(spec.options)
        path = Path(launch_dir(spec)) / JOB_ID_FILE
        try:
            job_id = path.read_text().strip()
        except OSError as exc:
            raise InputError(f"cannot find the Base Command job again: {path}: {exc.strerror}") from None
        if not job_id.isdigit():
            raise InputError(f"{path}: not a Base Command job id: {job_id[:40]!r}")
        return Submission(backend=self.name, job_id=job_id,
                          handle=BcpHandle(job_id, opts.ngc_bin, spec.nodes, self._scope(opts)))

    def poll(self, submission: Submission) -> JobState:
        """The job's status; a failing ``job info`` gives ``unknown`` until 5 in a row, then UsageError."""
        handle: BcpHandle = submission.handle
        try:
            proc = self._run(handle.ngc_bin, ["base-command", "job", "info", handle.job_id, *handle.scope],
                             f"reading job {handle.job_id}")
            status, details = parse_job_status(proc.stdout)
        except GpuacceptError as exc:
            handle.poll_failures += 1
            if handle.poll_failures >= 5:
                raise UsageError(f"{exc} ({handle.poll_failures} reads in a row failed)") from None
            return JobState("unknown", done=False, detail=f"cannot read the job: {exc}")
        handle.poll_failures = 0
        return status_state(status, details)

    def cancel(self, submission: Submission) -> None:
        handle = submission.handle
        if isinstance(handle, BcpHandle):
            proc = self._run(handle.ngc_bin, ["base-command", "job", "kill", handle.job_id, *handle.scope],
                             f"killing job {handle.job_id}", check=False)
            if proc.returncode != 0:
                handle.problems.append(f"ngc job kill exited {proc.returncode}: {proc.stderr.strip()[:200]}")

    def _download(self, handle: BcpHandle, target: str, dest: Path) -> Path | None:
        """``ngc base-command result download TARGET --dest DEST``; the tree it made, or None (listed)."""
        dest.mkdir(parents=True, exist_ok=True)
        before = {p.name for p in dest.iterdir()}
        proc = self._run(handle.ngc_bin, ["base-command", "result", "download", target, "--dest", str(dest),
                                          *handle.scope], f"downloading the result of {target}", check=False,
                         timeout=3600)
        if proc.returncode != 0:
            handle.problems.append(f"{target}: no result (ngc exited {proc.returncode}: {proc.stderr.strip()[:200]})")
            return None
        made = sorted(p for p in dest.iterdir() if p.name not in before and p.is_dir())
        for name in (target, target.replace(":", "_")):
            if (dest / name).is_dir():
                return dest / name
        return made[0] if made else dest

    def _reports_in(self, handle: BcpHandle, tree: Path, label: str, keep: Path) -> list[NodeReport]:
        """``report.json`` files under ``tree``; when there are none, the reports in its ``*.log`` files, of which
        a copy is kept as ``keep/<host>/report.json`` (where a later gather finds them)."""
        reports = read_reports(tree)
        if reports:
            return reports
        for log in sorted(tree.rglob("*.log")):
            try:
                text = log.read_text(errors="replace")
            except OSError as exc:
                handle.problems.append(f"{log}: unreadable ({exc.strerror})")
                continue
            found = reports_from_log(text, f"{label}/{log.name}")
            handle.problems.extend(found.problems)
            reports.extend(found.reports)
        for report in reports:
            (keep / report.host).mkdir(parents=True, exist_ok=True)
            (keep / report.host / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        return reports

    def gather(self, submission: Submission, spec: JobSpec) -> list[NodeReport]:
        """Reports from the job's downloaded result (under ``spec.run_results_dir/bcp``, where a later gather
        finds them when NGC cannot be reached), one per host. Results that could not be downloaded and
        unreadable report blocks are listed in ``submission.handle.problems``."""
        handle: BcpHandle = submission.handle
        dest = Path(spec.run_results_dir) / "bcp"
        keep = Path(spec.run_results_dir) / "bcp-reports"
        try:
            tree = self._download(handle, handle.job_id, dest)
            if tree is None:
                raise InputError(f"cannot gather the reports: {handle.problems.pop()}")
            by_host = {r.host: r for r in self._reports_in(handle, tree, handle.job_id, keep)}
            if len(by_host) < handle.nodes:
                for replica in range(1, handle.nodes):
                    target = f"{handle.job_id}:{replica}"
                    sub = self._download(handle, target, dest / "replicas")
                    if sub is not None:
                        for r in self._reports_in(handle, sub, target, keep):
                            by_host.setdefault(r.host, r)
        except OSError as exc:
            raise InputError(f"cannot write under {dest}: {exc.strerror}") from None
        return list(by_host.values())

    def logs(self, submission: Submission) -> str:
        return ""
