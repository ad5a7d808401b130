"""The Run:ai backend: ``runai training pytorch submit`` / ``runai training mpi submit`` built from the JobSpec.

``--kind pytorch`` starts one torchrun per pod, which reads the PET_*
variables the training operator injects; ``--kind mpi`` runs mpirun with
``--hostfile /etc/mpi/hostfile`` on the launcher and checks that the ranks
land on the workers. Submitting needs the ``runai`` CLI, logged in; reports
come back through ``runai training <kind> logs``. ``--dry-run`` prints the
command and ``--output DIR`` writes it as ``runai-submit.sh``. A --mount
whose source is an absolute path is a ``--host-path``; any other source
names an existing PVC (``--existing-pvc``).

Flag names follow the Run:ai v2 CLI reference (``runai training pytorch
submit --help``): ``--project``, ``--image``, ``--workers``,
``--gpu-devices-request``, ``--slots-per-worker``, ``--large-shm``,
``--node-pools`` (once per pool, in priority order), ``-e NAME=VALUE``
(``--environment`` in older CLIs, ``--environment-variable`` in newer ones;
the short form works in both), ``--toleration``, ``--existing-pvc``,
``--host-path``, ``--working-dir`` and ``--command -- ARGV``.

What the references settle and what they leave open (no Run:ai cluster is
reachable from here; the tests use a recorded fake ``runai`` that checks the
argv and expands the launcher's command as Kubernetes would):

- ``pytorch``: the reference describes ``--no-master`` as "Do not create a
  separate pod for the master" and ``--workers`` as "the number of workers
  that will be allocated", so ``--no-master --workers N`` gives N worker pods
  and no master pod. Not stated: that the training operator then makes worker
  0 the rendezvous master and injects ``PET_NNODES``, ``PET_NODE_RANK``,
  ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` into every worker (which
  ``torchrun`` and the suite's rank detection read).
- ``mpi``: how the CLI splits ``--master-command`` is not stated (the
  reference only says "the command can include arguments following it").
  The plan does not depend on it: the launcher's script, with the job's argv
  (``set -- ARGV``), is the value of ``--master-environment
  GPUACCEPT_MPI_LAUNCHER=...`` (a ``stringArray`` flag: no comma splitting),
  and ``--master-command`` is ``sh -c $(GPUACCEPT_MPI_LAUNCHER)``, whose words
  need no quoting. Kubernetes expands ``$(VAR)`` in a container's command from
  the container's environment ("Define a Command and Arguments for a
  Container"; the Container API's ``command``), and reduces ``$$`` to ``$`` in
  env values, so every ``$`` of the script is doubled. Still assumed: that
  the CLI puts the value into the launcher container's env unchanged.
  Workers run ``/usr/sbin/sshd -De``. The mpi submit reference has no
  ``--master-gpu-devices-request`` (the pytorch one has), so whether ``-g``
  also reaches the launcher is not stated either.
- Reports from an MPI run name the worker pods (ranks see the pod's
  hostname), not nodes. The Kubernetes downward API would give the node
  (``spec.nodeName``), but only newer CLIs (the v3.0 reference) offer
  ``--env-pod-field-ref ENV=FIELD``; it is absent from the v2 reference this
  backend follows, and ranks that mpirun starts through the workers' sshd do
  not inherit the container's environment, so a worker would also have to
  record the value where the rank wrapper reads it. Not done.
- ``describe -o json`` has the workload phase under ``phase`` or ``status``
  (top level or in ``general``) and the pods under ``pods``; ``logs --pod``
  reads one pod.
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
from gpuaccept.launch.base import Backend, JobState, Plan, Submission
from gpuaccept.launch.log_reports import reports_from_log
from gpuaccept.launch.runai.parse import parse_describe, phase_state
from gpuaccept.launch.runai.plan import KINDS, RunaiOptions, build_argv, runai_toleration, shell_lines
from gpuaccept.launch.spec import JobSpec
from gpuaccept.launch.tool import run_tool
from gpuaccept.model import NodeReport


@dataclass
class RunaiHandle:
    kind: str
    name: str
    project: str | None
    runai_bin: str
    problems: list[str] = field(default_factory=list)
    poll_failures: int = 0


class RunaiBackend(Backend):
    """Run:ai: --kind pytorch (runai training pytorch submit, one torchrun per pod reading PET_*) or mpi
    (runai training mpi submit, mpirun --hostfile /etc/mpi/hostfile on the launcher). --image is required;
    --dry-run prints the command. Submitting needs the runai CLI, logged in; reports come back through
    runai ... logs."""

    name = "runai"
    help = "Run:ai: runai training pytorch|mpi submit"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("runai")
        g.add_argument("--kind", choices=KINDS, default="pytorch",
                       help="pytorch: runai training pytorch submit; mpi: runai training mpi submit (default: pytorch)")
        g.add_argument("--project", default=None, help="Run:ai project (default: the CLI's current project)")
        g.add_argument("--node-pool", action="append", default=[], metavar="NAME",
                       help="node pool to schedule on, in priority order (repeatable)")
        g.add_argument("--large-shm", action=argparse.BooleanOptionalAction, default=True,
                       help="mount a large /dev/shm (default: yes)")
        g.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]",
                       help="tolerate a taint (kubectl taint syntax; repeatable)")
        g.add_argument("--image-pull-policy", choices=("Always", "IfNotPresent", "Never"), default=None)
        g.add_argument("--pod-results-dir", default="/tmp/gpuaccept-results", metavar="PATH",
                       help="where reports are written in the containers (default: /tmp/gpuaccept-results)")
        g.add_argument("--runai-bin", default="runai", metavar="PATH", help="the runai CLI (default: runai)")
        g.add_argument("--runai-arg", action="append", default=[], metavar="ARG",
                       help="extra argument for 'runai ... submit', e.g. --runai-arg=--preemptible (repeatable)")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        raw = {
            "kind": getattr(args, "kind", "pytorch"),
            "project": getattr(args, "project", None),
            "node_pools": list(getattr(args, "node_pool", None) or []),
            "large_shm": bool(getattr(args, "large_shm", True)),
            "tolerations": [runai_toleration(t) for t in getattr(args, "toleration", None) or []],
            "image_pull_policy": getattr(args, "image_pull_policy", None),
            "pod_results_dir": getattr(args, "pod_results_dir", "/tmp/gpuaccept-results"),
            "runai_bin": getattr(args, "runai_bin", "runai"),
            "extra_args": list(getattr(args, "runai_arg", None) or []),
        }
        return RunaiOptions.from_dict(raw, "runai").to_dict()

    def plan(self, spec: JobSpec) -> Plan:
        opts = RunaiOptions.from_dict(spec.options)
        argv = build_argv(spec, opts)
        script = ("#!/bin/sh\n# Submits the gpuaccept job to Run:ai (written by gpuaccept launch runai).\n"
                  "# shellcheck disable=SC2016 # the container's script is passed on literally\n"
                  "exec " + shell_lines(argv) + "\n")
        notes = ["reports come back through the pod logs (runai training "
                 f"{opts.kind} logs)"]
        if opts.kind == "mpi":
            notes.append("the launcher runs mpirun --hostfile /etc/mpi/hostfile and fails (exit 97) unless the ranks "
                          "land on the workers")
        if spec.time_limit_min:
            notes.append("Run:ai has no run-time limit flag for training: use --timeout to bound the wait")
        return Plan(backend=self.name, files={"runai-submit.sh": script}, commands=[argv], notes=notes)

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        opts = RunaiOptions.from_dict(spec.options)
        if shutil.which(opts.runai_bin) is None:
            raise UsageError(f"the runai CLI ({opts.runai_bin}) is not on PATH: install the Run:ai v2 CLI and log in, "
                             "or use --dry-run to print the command")

    def _run(self, handle: RunaiHandle, args: list[str], what: str, cwd: Path | None = None,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_tool([handle.runai_bin, *args], "runai", what, cwd=cwd, check=check)

    def _scope(self, handle: RunaiHandle) -> list[str]:
        return ["--project", handle.project] if handle.project else []

    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        opts = RunaiOptions.from_dict(spec.options)
        handle = RunaiHandle(opts.kind, spec.name, opts.project, opts.runai_bin)
        argv = plan.commands[0]
        self._run(handle, argv[1:], f"submitting {spec.name}", cwd=workdir)
        job_id = f"{opts.project}/{spec.name}" if opts.project else spec.name
        return Submission(backend=self.name, job_id=job_id, handle=handle)

    def resume(self, spec: JobSpec) -> Submission:
        """The handle of a workload submitted earlier from ``spec`` (after ``--detach``)."""
        opts = RunaiOptions.from_dict(spec.options)
        handle = RunaiHandle(opts.kind, spec.name, opts.project, opts.runai_bin)
        return Submission(backend=self.name, job_id=f"{opts.project}/{spec.name}" if opts.project else spec.name,
                          handle=handle)

    def _describe(self, handle: RunaiHandle) -> tuple[str, list[str]]:
        proc = self._run(handle, ["training", handle.kind, "describe", handle.name, *self._scope(handle),
                                  "--output", "json"], f"describing {handle.name}")
        return parse_describe(proc.stdout)

    def poll(self, submission: Submission) -> JobState:
        """The workload's phase; a failing ``describe`` gives ``unknown`` until 5 in a row, then UsageError."""
        handle: RunaiHandle = submission.handle
        try:
            phase, pods = self._describe(handle)
        except GpuacceptError as exc:
            handle.poll_failures += 1
            if handle.poll_failures >= 5:
                raise UsageError(f"{exc} ({handle.poll_failures} reads in a row failed)") from None
            return JobState("unknown", done=False, detail=f"cannot read the workload: {exc}")
        handle.poll_failures = 0
        state = phase_state(phase)
        return JobState(state.state, state.done, state.ok, state.detail or f"{len(pods)} pods")

    def cancel(self, submission: Submission) -> None:
        handle = submission.handle
        if isinstance(handle, RunaiHandle):
            proc = self._run(handle, ["training", handle.kind, "delete", handle.name, *self._scope(handle)],
                             f"deleting {handle.name}", check=False)
            if proc.returncode != 0:
                handle.problems.append(f"runai delete exited {proc.returncode}: {proc.stderr.strip()[:200]}")

    def _logs(self, handle: RunaiHandle, pod: str | None) -> str:
        args = ["training", handle.kind, "logs", handle.name, *self._scope(handle)]
        if pod:
            args += ["--pod", pod]
        proc = self._run(handle, args, f"reading the logs of {pod or handle.name}", check=False)
        if proc.returncode != 0:
            handle.problems.append(f"{pod or handle.name}: no log (runai exited {proc.returncode}: "
                                   f"{proc.stderr.strip()[:200]})")
            return ""
        return proc.stdout

    def gather(self, submission: Submission, spec: JobSpec) -> list[NodeReport]:
        """Reports from the pod logs (for mpi, the launcher's); logs and reports are also written under
        ``spec.run_results_dir`` (``logs/``, ``runai/<pod>/report.json``), where a later gather finds them when
        Run:ai cannot be reached. Unreadable logs or report blocks are listed in ``submission.handle.problems``."""
        handle: RunaiHandle = submission.handle
        try:
            _phase, pods = self._describe(handle)
        except UsageError as exc:
            raise InputError(f"cannot gather the reports: {exc}") from None
        targets: list[str | None] = [None] if handle.kind == "mpi" or not pods else list(pods)
        out_dir = Path(spec.run_results_dir)
        reports: list[NodeReport] = []
        for pod in targets:
            text = self._logs(handle, pod)
            if not text:
                continue
            label = pod or f"{handle.name}-launcher"
            found = reports_from_log(text, label)
            try:
                (out_dir / "logs").mkdir(parents=True, exist_ok=True)
                (out_dir / "logs" / f"{label}.log").write_text(text)
                for i, report in enumerate(found.reports):
                    sub = out_dir / "runai" / (label if len(found.reports) == 1 else f"{label}-{i}")
                    sub.mkdir(parents=True, exist_ok=True)
                    (sub / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
            except OSError as exc:
                raise InputError(f"cannot write the logs under {out_dir}: {exc.strerror}") from None
            handle.problems.extend(found.problems)
            reports.extend(found.reports)
        return reports

    def logs(self, submission: Submission) -> str:
        handle = submission.handle
        if not isinstance(handle, RunaiHandle):
            return ""
        text = self._logs(handle, None)
        return "\n".join(text.splitlines()[-40:])
