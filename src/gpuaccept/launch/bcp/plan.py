"""The Base Command submit command (pure): options, the job's command line and the ``ngc`` argv."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.argtypes import check_abs_path
from gpuaccept.errors import ConfigError
from gpuaccept.launch.jobargv import node_argv, nproc_option, port_from, torchrun_job
from gpuaccept.launch.pod_script import (
    EXIT_PLACEMENT,
    MPI_ALWAYS_FORWARD,
    MPI_LAUNCHER_ENV,
    MPI_MASTER_PORT,
    NODE_SCRIPT,
    RESULTS_ENV,
    mpi_forward_env,
    mpi_ranks_per_worker,
)
from gpuaccept.launch.spec import JobSpec, as_list, option_values, with_known_gpus
from gpuaccept.launch.tool import shell_lines as tool_lines

ARRAY_TYPES = ("MPI", "PYTORCH")
PREEMPT_CLASSES = ("RUNONCE", "RESUMABLE", "RESTARTABLE")
PRIORITIES = ("LOW", "NORMAL", "HIGH")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DATASET = re.compile(r"^[A-Za-z0-9_-]+:/[^:]*$")

TORCHRUN_NGC = """\
# gpuaccept: one torchrun agent per replica; NGC sets the array size, index and master address.
master=${NGC_MASTER_ADDR:-launcher-svc-${NGC_JOB_ID:?NGC_JOB_ID is not set}}
exec "$0" -m torch.distributed.run --nnodes="${NGC_ARRAY_SIZE:?not a multi-node job}" \\
  --node-rank="${NGC_ARRAY_INDEX:?NGC_ARRAY_INDEX is not set}" --master-addr="$master" "$@"
"""
"""Run on every replica of a PYTORCH array job (``sh -c TORCHRUN_NGC PYTHON TORCHRUN-ARGS...``)."""


def launcher_script(replicas: int, ranks_per_replica: int, forward_env: list[str]) -> str:
    """The command line of an ``--array-type MPI`` job, run on replica 0 (which is also a worker).

    Checks that ``mpirun --hostfile /etc/mpi/hostfile`` starts ``replicas * ranks_per_replica`` ranks on
    ``replicas`` distinct hosts (else exit 97), runs the job argv (the arguments) under mpirun with the
    job's environment, ``MASTER_ADDR`` (the hostfile's first host) and ``MASTER_PORT`` forwarded, then prints
    each replica's reports, one replica at a time, with a one-rank mpirun of :data:`NODE_SCRIPT`.
    """
    np = replicas * ranks_per_replica
    names = [*forward_env, RESULTS_ENV, *MPI_ALWAYS_FORWARD]
    forward = " ".join(f"-x {name}" for name in dict.fromkeys(names))
    mapping = f'--hostfile "$hostfile" -np {np} --map-by ppr:{ranks_per_replica}:node'
    assert "'" not in NODE_SCRIPT
    return f"""\
# gpuaccept Base Command launcher: check rank placement, run the job (the arguments), print the reports.
hostfile=/etc/mpi/hostfile
replicas={replicas}
np={np}
fail() {{
  printf 'gpuaccept: %s\\n' "$*" >&2
  exit {EXIT_PLACEMENT}
}}
[ -r "$hostfile" ] || fail "$hostfile is missing: is this an --array-type MPI job?"
listed=$(grep -c '[^[:space:]]' "$hostfile")
[ "$listed" -eq "$replicas" ] || fail "$hostfile lists $listed hosts, expected $replicas"
placement=$(mpirun {mapping} cat /proc/sys/kernel/hostname) ||
  fail "mpirun could not start $np ranks on the $replicas replicas"
ranks=$(printf '%s\\n' "$placement" | grep -c .)
hosts=$(printf '%s\\n' "$placement" | sort -u | grep -c .)
[ "$ranks" -eq "$np" ] || fail "mpirun started $ranks ranks, expected $np"
[ "$hosts" -eq "$replicas" ] || fail "ranks ran on $hosts hosts, expected $replicas"
MASTER_ADDR=${{MASTER_ADDR:-$(awk 'NF {{print $1; exit}}' "$hostfile")}}
MASTER_PORT=${{MASTER_PORT:-{MPI_MASTER_PORT}}}
LD_LIBRARY_PATH=${{LD_LIBRARY_PATH:-}}
export MASTER_ADDR MASTER_PORT LD_LIBRARY_PATH
rc=0
mpirun {mapping} {forward} "$@" || rc=$?
# shellcheck disable=SC2016 # expanded on each replica, not here
emit='{NODE_SCRIPT}'
awk 'NF {{print $1}}' "$hostfile" | while IFS= read -r host; do
  mpirun --host "$host" -np 1 -x {RESULTS_ENV} sh -c "$emit" gpuaccept true </dev/null || true
done
exit "$rc"
"""


@dataclass(frozen=True)
class BcpOptions:
    """Options of the bcp backend (``ngc base-command job run``)."""

    instance: str | None = None
    ace: str | None = None
    org: str | None = None
    team: str | None = None
    array_type: str = "MPI"
    result_mount: str = "/results"
    preempt: str = "RUNONCE"
    priority: str | None = None
    labels: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    ngc_bin: str = "ngc"
    extra_args: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "bcp options") -> BcpOptions:
        values = option_values(cls.__dataclass_fields__, raw, source, "bcp")
        for name in ("labels", "datasets", "extra_args"):
            if name in values:
                values[name] = [str(i) for i in as_list(values[name], source, name)]
        for name in ("array_type", "preempt", "priority"):
            if isinstance(values.get(name), str):
                values[name] = values[name].upper()
        opts = cls(**values)
        opts.validate()
        return opts

    def validate(self) -> None:
        for flag, value in (("--instance", self.instance), ("--ace", self.ace), ("--org", self.org),
                            ("--team", self.team)):
            if value is not None and not _NAME.match(value):
                raise ConfigError(flag, value, "must be an NGC name (letters, digits, '.', '_', '-')")
        if self.array_type not in ARRAY_TYPES:
            raise ConfigError("--array-type", self.array_type, f"must be one of {', '.join(ARRAY_TYPES)}")
        if self.preempt not in PREEMPT_CLASSES:
            raise ConfigError("--preempt", self.preempt, f"must be one of {', '.join(PREEMPT_CLASSES)}")
        if self.priority is not None and self.priority not in PRIORITIES:
            raise ConfigError("--priority", self.priority, f"must be one of {', '.join(PRIORITIES)}")
        if ":" in self.result_mount:
            raise ConfigError("--result-mount", self.result_mount, "must be an absolute path in the container")
        _container_path(self.result_mount, "--result-mount")
        for ds in self.datasets:
            if not _DATASET.match(ds):
                raise ConfigError("--dataset", ds, "a dataset mount is ID:/MOUNT/POINT")
            _container_path(ds.split(":", 1)[1], "--dataset")
        if not self.ngc_bin:
            raise ConfigError("--ngc-bin", "", "must name the ngc executable")


def _container_path(path: str, flag: str) -> None:
    try:
        check_abs_path(path)
    except ValueError as exc:
        raise ConfigError(flag, path, f"must be an absolute path in the container: {exc}") from None


def node_spec(spec: JobSpec, opts: BcpOptions) -> JobSpec:
    """``spec`` as the replicas see it: reports go under the job's result mount."""
    return dataclasses.replace(spec, results_dir=opts.result_mount)


def container_argv(spec: JobSpec, opts: BcpOptions) -> list[str]:
    """What the job's command line runs, as argv (it is handed to the container's shell quoted).

    One node: the job under :data:`NODE_SCRIPT`, through torchrun (``--standalone``) when distributed.
    ``PYTORCH`` (run on every replica): the same, with one torchrun agent per replica placed by the
    ``NGC_ARRAY_*`` variables. ``MPI`` (run on replica 0): :func:`launcher_script`.
    """
    pod = node_spec(spec, opts)
    if spec.nodes > 1 and opts.array_type == "MPI":
        script = launcher_script(spec.nodes, mpi_ranks_per_worker(spec), mpi_forward_env(spec))
        return ["sh", "-c", script, "gpuaccept-launcher", *node_argv(pod)]
    if not spec.distributed:
        job = node_argv(pod)
    elif spec.nodes == 1:
        job = [spec.python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
               nproc_option(spec), *torchrun_job(pod)]
    else:
        job = ["sh", "-c", TORCHRUN_NGC, spec.python, nproc_option(spec),
               f"--master-port={port_from(spec.run_id)}", *torchrun_job(pod)]
    return ["sh", "-c", NODE_SCRIPT, "gpuaccept", *job]


def _workspace(source: str, target: str, readonly: bool) -> str:
    if source.startswith("/"):
        raise ConfigError("--mount", source, "Base Command mounts workspaces (WORKSPACE:/TARGET[:ro]), not host "
                                             "paths")
    if not _NAME.match(source) or ":" in target:
        raise ConfigError("--mount", f"{source}:{target}", "the source must be a workspace name or id")
    return f"{source}:{target}:{'RO' if readonly else 'RW'}"


def instance_gpus(instance: str) -> str | None:
    """The GPUs of an instance type by NGC's naming, ``GPU.MEMORY.COUNT.CLASS``: ``dgxa100.80g.8.norm`` -> ``8``."""
    parts = instance.split(".")
    return parts[2] if len(parts) == 4 and parts[2].isdigit() else None


def build_argv(spec: JobSpec, opts: BcpOptions) -> list[str]:
    """The ``ngc base-command job run`` argv. Pure; raises ConfigError for what Base Command cannot express."""
    if not spec.image:
        raise ConfigError("--image", "", "the bcp backend needs a container image (with gpuaccept installed for "
                                         "the suite)")
    if not opts.instance:
        raise ConfigError("--instance", "", "the bcp backend needs an instance type, e.g. dgxa100.80g.8.norm "
                                            "(ngc base-command ace info ACE lists them)")
    image, spec = spec.image, with_known_gpus(spec, f"Base Command (instance {opts.instance})",
                                              instance_gpus(opts.instance))
    argv = [opts.ngc_bin, "base-command", "job", "run", "--name", spec.name, "--image", image,
            "--instance", opts.instance]
    for flag, value in (("--ace", opts.ace), ("--org", opts.org), ("--team", opts.team)):
        if value:
            argv += [flag, value]
    if spec.nodes > 1:
        argv += ["--replicas", str(spec.nodes), "--array-type", opts.array_type]
    argv += ["--result", opts.result_mount, "--preempt", opts.preempt]
    if opts.priority:
        argv += ["--priority", opts.priority]
    if spec.time_limit_min:
        argv += ["--total-runtime", f"{spec.time_limit_min * 60}s"]
    for m in spec.mounts:
        argv += ["--workspace", _workspace(m.source, m.target, m.readonly)]
    for ds in opts.datasets:
        argv += ["--datasetid", ds]
    env = dict(spec.env)
    env.setdefault(RESULTS_ENV, node_spec(spec, opts).run_results_dir)
    if spec.nodes > 1 and opts.array_type == "MPI":
        for name, value in MPI_LAUNCHER_ENV.items():
            env.setdefault(name, value)
    for name, value in env.items():
        argv += ["--env-var", f"{name}:{value}"]
    for label in opts.labels:
        argv += ["--label", label]
    argv += opts.extra_args
    command = shlex.join(container_argv(spec, opts))
    if spec.workdir:
        command = f"cd {shlex.quote(spec.workdir)} && {command}"
    return [*argv, "--commandline", command]


def shell_lines(argv: list[str]) -> str:
    """``argv`` quoted for sh, one ``--option`` per line (continued with backslashes)."""
    return tool_lines(argv, head=4, option_prefix="--", stop=None)
