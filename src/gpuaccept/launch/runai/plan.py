"""The Run:ai submit command (pure): options, and the ``runai training pytorch|mpi submit`` argv."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.errors import ConfigError
from gpuaccept.launch.jobargv import node_argv, torchrun_argv
from gpuaccept.launch.k8s.options import check_dns_label, check_dns_subdomain, parse_toleration
from gpuaccept.launch.pod_script import (
    MPI_LAUNCHER_ENV,
    NODE_SCRIPT,
    RESULTS_ENV,
    mpi_forward_env,
    mpi_launcher_script,
    mpi_ranks_per_worker,
)
from gpuaccept.launch.spec import JobSpec, as_list, option_values, with_known_gpus
from gpuaccept.launch.tool import shell_lines as tool_lines

KINDS = ("pytorch", "mpi")
#: The launcher's script travels in this ``--master-environment`` variable; ``--master-command`` only names it.
MPI_LAUNCHER_VAR = "GPUACCEPT_MPI_LAUNCHER"
#: Words that need no quoting, so the command is the same however the CLI splits it; Kubernetes expands
#: ``$(VAR)`` in a container's command from the container's environment.
MPI_MASTER_COMMAND = f"sh -c $({MPI_LAUNCHER_VAR})"


def k8s_literal(value: str) -> str:
    """``value`` escaped for an env value or command word, where Kubernetes expands ``$(VAR)`` and reduces
    ``$$`` to ``$``: every ``$`` doubled comes out as itself."""
    return value.replace("$", "$$")


@dataclass(frozen=True)
class RunaiOptions:
    """Options of the runai backend. ``tolerations`` are in Run:ai's ``operator=...,key=...`` form."""

    kind: str = "pytorch"
    project: str | None = None
    node_pools: list[str] = field(default_factory=list)
    large_shm: bool = True
    tolerations: list[str] = field(default_factory=list)
    image_pull_policy: str | None = None
    pod_results_dir: str = "/tmp/gpuaccept-results"
    runai_bin: str = "runai"
    extra_args: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "runai options") -> RunaiOptions:
        values = option_values(cls.__dataclass_fields__, raw, source, "runai")
        for name in ("node_pools", "tolerations", "extra_args"):
            if name in values:
                values[name] = [str(i) for i in as_list(values[name], source, name)]
        if "large_shm" in values and not isinstance(values["large_shm"], bool):
            raise ConfigError(source, "large_shm", "must be true or false")
        opts = cls(**values)
        opts.validate()
        return opts

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("--kind", str(self.kind), f"must be one of {', '.join(KINDS)}")
        if self.project is not None:
            check_dns_label(self.project, "--project")
        for pool in self.node_pools:
            check_dns_subdomain(pool, "--node-pool")
        if self.image_pull_policy not in (None, "Always", "IfNotPresent", "Never"):
            raise ConfigError("--image-pull-policy", str(self.image_pull_policy),
                              "must be Always, IfNotPresent or Never")
        if not self.pod_results_dir.startswith("/"):
            raise ConfigError("--pod-results-dir", self.pod_results_dir, "must be an absolute path in the container")
        if not self.runai_bin:
            raise ConfigError("--runai-bin", "", "must name the runai executable")


def runai_toleration(text: str) -> str:
    """``KEY[=VALUE][:EFFECT]`` (kubectl taint syntax) in Run:ai's ``operator=...,key=...`` form."""
    tol = parse_toleration(text)
    parts = [f"operator={tol['operator']}"]
    if "key" in tol:
        parts.append(f"key={tol['key']}")
    if "value" in tol:
        parts.append(f"value={tol['value']}")
    if "effect" in tol:
        parts.append(f"effect={tol['effect']}")
    return ",".join(parts)


def _mount_value(text: str, flag: str) -> str:
    if "," in text or "=" in text:
        raise ConfigError(flag, text, "Run:ai volume flags are comma-separated key=value lists: "
                                      "a path with ',' or '=' cannot be passed")
    return text


def build_argv(spec: JobSpec, opts: RunaiOptions) -> list[str]:
    """The ``runai training <kind> submit`` argv. Pure; raises ConfigError for what Run:ai cannot express."""
    if not spec.image:
        raise ConfigError("--image", "", "the runai backend needs a container image (with gpuaccept installed "
                                         "for the suite)")
    image, spec = spec.image, with_known_gpus(spec, "Run:ai")
    pod = _pod_spec(spec, opts)
    argv = [opts.runai_bin, "training", opts.kind, "submit", spec.name]
    if opts.project:
        argv += ["--project", opts.project]
    argv += ["--image", image]
    if opts.image_pull_policy:
        argv += ["--image-pull-policy", opts.image_pull_policy]
    argv += ["--workers", str(spec.nodes)]
    if opts.kind == "pytorch":
        argv.append("--no-master")
    else:
        argv += ["--slots-per-worker", str(spec.nproc)]
    if spec.gpus_per_node:
        argv += ["--gpu-devices-request", str(spec.gpus_per_node)]
    if opts.large_shm:
        argv.append("--large-shm")
    for pool in opts.node_pools:
        argv += ["--node-pools", pool]
    for tol in opts.tolerations:
        argv += ["--toleration", tol]
    for m in spec.mounts:
        target = _mount_value(m.target, "--mount")
        if m.source.startswith("/"):
            argv += ["--host-path", f"path={_mount_value(m.source, '--mount')},mount={target}"
                     + ("" if m.readonly else ",readwrite")]
        else:
            if m.readonly:
                raise ConfigError("--mount", str(m), "Run:ai mounts an existing PVC read-write; drop :ro")
            argv += ["--existing-pvc", f"claimname={check_dns_subdomain(m.source, '--mount')},path={target}"]
    for name, value in spec.env.items():
        argv += ["-e", f"{name}={value}"]
    if RESULTS_ENV not in spec.env:
        argv += ["-e", f"{RESULTS_ENV}={pod.run_results_dir}"]
    if spec.workdir:
        argv += ["--working-dir", spec.workdir]
    argv += opts.extra_args
    if opts.kind == "pytorch":
        job = torchrun_argv(pod, [], str(spec.nodes)) if spec.distributed else node_argv(pod)
        return [*argv, "--command", "--", "sh", "-c", NODE_SCRIPT, "gpuaccept", *job]
    if MPI_LAUNCHER_VAR in spec.env:
        raise ConfigError("--env", MPI_LAUNCHER_VAR, "is reserved: it carries the MPI launcher's script")
    script = mpi_launcher_script(spec.nodes, mpi_ranks_per_worker(spec), mpi_forward_env(spec), [])
    launcher = f"set -- {shlex.join(node_argv(pod))}\n{script}"
    for name, value in MPI_LAUNCHER_ENV.items():
        if name not in spec.env:
            argv += ["--master-environment", f"{name}={value}"]
    argv += ["--master-environment", f"{MPI_LAUNCHER_VAR}={k8s_literal(launcher)}"]
    return [*argv, "--master-command", MPI_MASTER_COMMAND, "--command", "--", "/usr/sbin/sshd", "-De"]


def _pod_spec(spec: JobSpec, opts: RunaiOptions) -> JobSpec:
    return dataclasses.replace(spec, results_dir=opts.pod_results_dir)


def shell_lines(argv: list[str]) -> str:
    """``argv`` quoted for sh, one option per line (continued with backslashes) up to ``--``."""
    return tool_lines(argv, head=5)
