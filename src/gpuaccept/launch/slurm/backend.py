"""The slurm backend: one sbatch script, submitted with ``sbatch --parsable``, watched, cancelled with scancel.

The script starts one task per node with ``srun``. Each task names its node
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
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gpuaccept.errors import ConfigError, UsageError
from gpuaccept.launch.base import Backend, JobState, Plan, Submission
from gpuaccept.launch.jobargv import launch_dir, node_argv, torchrun_job
from gpuaccept.launch.slurm.parse import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmJob,
    expand_hostlist,
    parse_sacct,
    parse_sbatch,
    parse_scontrol_job,
    parse_squeue,
    sacct_unavailable,
)
from gpuaccept.launch.spec import JobSpec, Mount, env_names

SCRIPT = "job.sbatch"
RDZV_PORT_BASE = 20000
_TOKEN = re.compile(r"^[A-Za-z0-9_.:@+-]+$")
_HOSTLIST = re.compile(r"^[A-Za-z0-9_.,\[\]-]+$")
_CMD_TIMEOUT_S = 60


def _token(flag: str) -> Any:
    def check(text: str) -> str:
        if not _TOKEN.match(text):
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {flag} value (letters, digits, . _ : @ + -)")
        return text
    return check


def _hostlist(text: str) -> str:
    if not _HOSTLIST.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm host list (e.g. node[1-4],gpu07)")
    try:
        expand_hostlist(text)
    except Exception as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _csv_list(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def _sbatch_line(text: str) -> str:
    line = text.strip()
    if line.startswith("#SBATCH"):
        line = line[len("#SBATCH"):].strip()
    if not line.startswith("-") or "\n" in line or "\r" in line:
        raise argparse.ArgumentTypeError(f"{text!r}: an extra #SBATCH line is one sbatch option, "
                                         "e.g. --reservation=maint")
    return line


def _dash_arg(text: str) -> str:
    if not text.startswith("-") or "\n" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: an srun argument starts with '-', e.g. --mpi=pmix")
    return text



@dataclass(frozen=True)
class SlurmOptions:
    """Validated slurm backend options (``spec.options``). ``cpus_per_task`` is per node (one task per node)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    exclusive: bool = False
    exclude: str | None = None
    nodelist: str | None = None
    cpus_per_task: int | None = None
    sbatch_lines: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()
    container_workdir: str | None = None
    container_mount_home: bool = True
    container_env: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SlurmOptions:
        """Options from a dict (flags or a spec file), checked again: the plan never trusts its input."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError("slurm options", unknown[0], f"unknown option; known: {', '.join(sorted(known))}")
        checks = {"partition": _token("--partition"), "account": _token("--account"), "qos": _token("--qos"),
                  "exclude": _hostlist, "nodelist": _hostlist}
        values: dict[str, Any] = {}
        for key, value in d.items():
            if value is None:
                continue
            try:
                if key in checks:
                    values[key] = checks[key](str(value))
                elif key == "cpus_per_task":
                    values[key] = _positive(str(value))
                elif key == "sbatch_lines":
                    values[key] = tuple(_sbatch_line(str(v)) for v in value)
                elif key == "srun_args":
                    values[key] = tuple(_dash_arg(str(v)) for v in value)
                elif key == "container_env":
                    values[key] = tuple(n for v in value for n in env_names(str(v)))
                elif key in ("exclusive", "container_mount_home"):
                    if not isinstance(value, bool):
                        raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
                    values[key] = value
                elif key == "container_workdir":
                    if not str(value).startswith("/"):
                        raise argparse.ArgumentTypeError(f"{value!r} is not an absolute path")
                    values[key] = str(value)
            except argparse.ArgumentTypeError as exc:
                raise ConfigError("slurm options", key, str(exc)) from None
        return cls(**values)


def pyxis_image(image: str) -> str:
    """The image as Pyxis/Enroot want it: ``nvcr.io/nvidia/pytorch:24.05-py3`` -> ``nvcr.io#nvidia/pytorch:24.05-py3``.

    A registry host (a first path component with ``.`` or ``:``, or
    ``localhost``) is separated with ``#``; Docker Hub names, squashfs files
    and images that already have a ``#`` are kept.
    """
    image = image.removeprefix("docker://")
    if "#" in image or image.startswith(("/", "./", "../")) or image.endswith(".sqsh"):
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def _sbatch_value(flag: str, value: str) -> str:
    """One ``#SBATCH --flag=value`` line; sbatch honours double quotes around a value with spaces."""
    if '"' in value or "\n" in value or "\r" in value:
        raise ConfigError(flag, value, "cannot contain double quotes or newlines in an #SBATCH line")
    if any(c.isspace() for c in value):
        value = f'"{value}"'
    return f"#SBATCH {flag}={value}"


def _container_mounts(spec: JobSpec) -> list[Mount]:
    mounts = list(spec.mounts)
    results = spec.results_dir.rstrip("/") or "/"
    covered = any(results == m.target.rstrip("/") or results.startswith(m.target.rstrip("/") + "/")
                  for m in mounts)
    if not covered:
        mounts.append(Mount(results, results))
    for m in mounts:
        for path in (m.source, m.target):
            if "," in path or any(c.isspace() for c in path):
                raise ConfigError("--mount", str(m), "Pyxis mounts cannot contain commas or whitespace "
                                                      "(the results directory is mounted too)")
    return mounts


def _check_container_options(spec: JobSpec, opts: SlurmOptions) -> None:
    if spec.image:
        return
    if spec.mounts:
        raise ConfigError("--mount", str(spec.mounts[0]),
                          "bind mounts need a container image: give --image (Pyxis/Enroot)")
    for flag, used in (("--container-workdir", opts.container_workdir is not None),
                       ("--no-container-mount-home", not opts.container_mount_home),
                       ("--container-env", bool(opts.container_env))):
        if used:
            raise ConfigError(flag, "", "is a Pyxis option and needs a container image: give --image")


def _quoted(text: str) -> str:
    """Single-quoted even when shlex would not quote (a comma list in a bash array trips SC2054)."""
    q = shlex.quote(text)
    return q if q.startswith("'") else f"'{text}'"


def _continued(words: list[str], indent: str = "  ") -> str:
    """Shell words on continuation lines of at most ~100 characters."""
    lines: list[str] = []
    cur = ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > 100:
            lines.append(cur)
            cur = indent + w
        else:
            cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return " \\\n".join(lines)


def render_script(spec: JobSpec, opts: SlurmOptions) -> str:
    """The sbatch script for ``spec``: pure and deterministic."""
    _check_container_options(spec, opts)
    q = shlex.quote
    out_dir = launch_dir(spec)
    what = "the acceptance suite" if spec.command is None else "a command"
    how = f"torchrun x{spec.nproc} per node" if spec.distributed else "one process per node"
    out = [
        "#!/bin/bash",
        f"# gpuaccept launch slurm: {what} on {spec.nodes} node(s), {how}; run {spec.run_id}.",
        "# Generated from a job spec: the same spec gives the same script.",
        _sbatch_value("--job-name", spec.name),
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if spec.gpus_per_node:
        out.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    if opts.cpus_per_task:
        out.append(f"#SBATCH --cpus-per-task={opts.cpus_per_task}")
    if spec.time_limit_min:
        out.append(f"#SBATCH --time={spec.time_limit_min}")
    for flag, value in (("--partition", opts.partition), ("--account", opts.account), ("--qos", opts.qos),
                        ("--exclude", opts.exclude), ("--nodelist", opts.nodelist)):
        if value:
            out.append(_sbatch_value(flag, value))
    if opts.exclusive:
        out.append("#SBATCH --exclusive")
    out.append(_sbatch_value("--output", out_dir.replace("%", "%%") + "/slurm-%j.out"))
    if spec.workdir and not spec.image:
        out.append(_sbatch_value("--chdir", spec.workdir))
    out.extend(f"#SBATCH {line}" for line in opts.sbatch_lines)
    out += ["set -euo pipefail", ""]

    for name, value in spec.env.items():
        out.append(f"export {name}={q(value)}")
    out.append(f"mkdir -p {q(spec.run_results_dir)}")
    out.append("")

    srun = ['--nodes="$SLURM_JOB_NUM_NODES"', "--ntasks-per-node=1",
            f"--kill-on-bad-exit={1 if spec.distributed else 0}"]
    if opts.cpus_per_task:
        srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
    if spec.image:
        srun.append(_quoted(f"--container-image={pyxis_image(spec.image)}"))
        srun.append(_quoted("--container-mounts=" + ",".join(str(m) for m in _container_mounts(spec))))
        passed = list(dict.fromkeys([*spec.env, *opts.container_env]))
        if passed:
            srun.append(_quoted("--container-env=" + ",".join(passed)))
        workdir = opts.container_workdir or spec.workdir
        if workdir:
            srun.append(q(f"--container-workdir={workdir}"))
        if not opts.container_mount_home:
            srun.append("--no-container-mount-home")
    srun.extend(_quoted(a) if "," in a else q(a) for a in opts.srun_args)

    if spec.distributed:
        out += [
            "# c10d rendezvous on the first allocated node, at the address Slurm itself uses for it.",
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
            'head_addr=$(scontrol show node "$head_node" -o 2>/dev/null '
            "| sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p' || true)",
            'head_addr=${head_addr:-$head_node}',
            f"rdzv_port=$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % 20000 ))",
            'echo "[LAUNCH] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: rendezvous $head_addr:$rdzv_port"',
            "",
        ]
        job = [q(spec.python), "-m", "torch.distributed.run", '--nnodes="$SLURM_JOB_NUM_NODES"',
               f"--nproc-per-node={spec.nproc}", "--rdzv-backend=c10d", '--rdzv-endpoint="$head_addr:$rdzv_port"',
               '--rdzv-id="$SLURM_JOB_ID"', *(q(a) for a in torchrun_job(spec))]
    else:
        out += ['echo "[LAUNCH] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"', ""]
        job = [q(a) for a in node_argv(spec)]
    out.append("srun_args=(")
    out.extend(f"  {a}" for a in srun)
    out.append(")")
    out.append("# Each task names its node, so reports are attributed to Slurm's node names.")
    out.append("# shellcheck disable=SC2016")
    wrapper = ['srun', '"${srun_args[@]}"', "sh", "-c",
               q('GPUACCEPT_HOSTNAME="$SLURMD_NODENAME"; export GPUACCEPT_HOSTNAME; exec "$@"'), "gpuaccept-node"]
    out.append(_continued([*wrapper, *job]))
    return "\n".join(out) + "\n"


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


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


class SlurmBackend(Backend):
    name: ClassVar[str] = "slurm"
    help: ClassVar[str] = "sbatch + srun (torchrun per node), Pyxis/Enroot containers"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("slurm options")
        g.add_argument("--container-image", dest="image", default=None, metavar="IMAGE",
                       help="same as --image: run the tasks in this Pyxis/Enroot image")
        g.add_argument("--container-mounts", dest="mount", action="extend", type=_csv_list, default=None,
                       metavar="SRC:DST[:ro],...", help="same as --mount, comma-separated (needs an image)")
        g.add_argument("--partition", type=_token("--partition"), default=None, help="#SBATCH --partition")
        g.add_argument("--account", type=_token("--account"), default=None, help="#SBATCH --account")
        g.add_argument("--qos", type=_token("--qos"), default=None, help="#SBATCH --qos")
        g.add_argument("--exclusive", action="store_true", default=None, help="#SBATCH --exclusive")
        g.add_argument("--exclude", type=_hostlist, default=None, metavar="HOSTLIST", help="nodes to avoid")
        g.add_argument("--nodelist", type=_hostlist, default=None, metavar="HOSTLIST", help="nodes to use")
        g.add_argument("--cpus-per-task", type=_positive, default=None, metavar="N",
                       help="CPUs of the one task per node (passed to srun too)")
        g.add_argument("--sbatch-line", dest="sbatch_lines", action="append", type=_sbatch_line, default=None,
                       metavar="OPTION", help="an extra #SBATCH line, e.g. --reservation=maint (repeatable)")
        g.add_argument("--srun-arg", dest="srun_args", action="append", type=_dash_arg, default=None,
                       metavar="ARG", help="an extra srun argument, e.g. --mpi=pmix (repeatable)")
        g.add_argument("--container-workdir", default=None, metavar="PATH", help="Pyxis --container-workdir")
        g.add_argument("--no-container-mount-home", dest="container_mount_home", action="store_false",
                       default=None, help="Pyxis --no-container-mount-home")
        g.add_argument("--container-env", action="append", type=env_names, default=None, metavar="A,B",
                       help="more variable names for Pyxis --container-env (the --env names always are)")

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
        script = render_script(spec, opts)
        notes = [f"every node writes under {spec.run_results_dir}: it must be on a filesystem all nodes share"]
        if spec.image and spec.command is None:
            notes.append(f"the image must have gpuaccept (and torch) installed for {spec.python!r}")
        return Plan(backend=self.name, files={SCRIPT: script},
                    commands=[["sbatch", "--parsable", SCRIPT]], notes=notes)

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        for tool in ("sbatch", "squeue", "scancel"):
            if shutil.which(tool) is None:
                raise UsageError(f"{tool} not found on PATH: run this on a Slurm login node "
                                 "(or add --dry-run to see the script)")

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

    def cancel(self, submission: Submission) -> None:
        if submission.job_id:
            _run(["scancel", submission.job_id])

    def logs(self, submission: Submission) -> str:
        """The last lines of the job's ``slurm-<id>.out`` (the script writes it next to the plan)."""
        watch: _Watch = submission.handle
        try:
            text = (Path(watch.log_dir) / f"slurm-{submission.job_id}.out").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-40:])
