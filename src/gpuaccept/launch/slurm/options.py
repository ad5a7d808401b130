"""Options of the slurm backend (``spec.options``) and the argparse types that validate them."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from gpuaccept.errors import ConfigError
from gpuaccept.launch.slurm.parse import expand_hostlist
from gpuaccept.launch.spec import env_names

SCRIPT = "job.sbatch"
RDZV_PORT_BASE = 20000
RUNTIMES = ("docker", "podman")
CONTAINER_GPUS = ("auto", "all", "none")
DEFAULT_SSH_PORT = 2222
_TOKEN = re.compile(r"^[A-Za-z0-9_.:@+-]+$")
_MEM = re.compile(r"^\d+[KMGT]?$")
_HOSTLIST = re.compile(r"^[A-Za-z0-9_.,\[\]-]+$")
_SHM = re.compile(r"^\d+[bkmgBKMG]?$")


def token_type(flag: str) -> Any:
    def check(text: str) -> str:
        if not _TOKEN.match(text):
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {flag} value (letters, digits, . _ : @ + -)")
        return text
    return check


def hostlist_type(text: str) -> str:
    if not _HOSTLIST.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm host list (e.g. node[1-4],gpu07)")
    try:
        expand_hostlist(text)
    except Exception as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def positive_type(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def mem_type(text: str) -> str:
    """An sbatch ``--mem`` value: a size in MB, or with a K/M/G/T suffix; ``0`` is the whole node."""
    value = text.strip().upper()
    if not _MEM.match(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size (e.g. 0 for the whole node, 500G, 64000)")
    return value


def choice_type(flag: str, choices: tuple[str, ...]) -> Any:
    def check(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {flag} value ({', '.join(choices)})")
        return text
    return check


def port_type(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def shm_type(text: str) -> str:
    """A container ``--shm-size``: bytes, or with a b/k/m/g suffix (``16g``)."""
    if not _SHM.match(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 16g, 512m)")
    return text.strip().lower()


def csv_list(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def sbatch_line_type(text: str) -> str:
    line = text.strip()
    if line.startswith("#SBATCH"):
        line = line[len("#SBATCH"):].strip()
    if not line.startswith("-") or "\n" in line or "\r" in line:
        raise argparse.ArgumentTypeError(f"{text!r}: an extra #SBATCH line is one sbatch option, "
                                         "e.g. --reservation=maint")
    return line


def dash_arg_type(text: str) -> str:
    if not text.startswith("-") or "\n" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: an srun argument starts with '-', e.g. --mpi=pmix")
    return text


def runtime_arg_type(text: str) -> str:
    if not text.startswith("-") or "\n" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: a container runtime option starts with '-', "
                                         "e.g. --ulimit=memlock=-1")
    return text


@dataclass(frozen=True)
class SlurmOptions:
    """Validated slurm backend options (``spec.options``). ``cpus_per_task`` is per node (one task per node).

    By default each node is the job's alone (``exclusive``) with all its memory (``mem`` ``"0"``): the one
    task per node runs every rank and check of the node, and a site that confines jobs with task/cgroup
    would otherwise give it one CPU and one DefMemPerCPU of memory. ``mem`` None leaves it to the site.
    """

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    exclusive: bool = True
    mem: str | None = "0"
    exclude: str | None = None
    nodelist: str | None = None
    cpus_per_task: int | None = None
    sbatch_lines: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()
    container_workdir: str | None = None
    container_mount_home: bool = True
    container_env: tuple[str, ...] = ()
    # --runtime docker|podman (containers started by the job itself; see runtime_script.py)
    runtime: str | None = None
    ssh_port: int = DEFAULT_SSH_PORT
    handshake_timeout_s: int = 120
    runtime_args: tuple[str, ...] = ()
    privileged: bool = False
    ipc_host: bool = True
    network: str = "host"
    shm_size: str | None = None
    container_gpus: str = "auto"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SlurmOptions:
        """Options from a dict (flags or a spec file), checked again: the plan never trusts its input."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError("slurm options", unknown[0], f"unknown option; known: {', '.join(sorted(known))}")
        checks = {"partition": token_type("--partition"), "account": token_type("--account"),
                  "qos": token_type("--qos"),
                  "exclude": hostlist_type, "nodelist": hostlist_type}
        values: dict[str, Any] = {}
        for key, value in d.items():
            if value is None:
                continue
            try:
                if key in checks:
                    values[key] = checks[key](str(value))
                elif key == "mem":
                    values[key] = None if str(value).lower() == "none" else mem_type(str(value))
                elif key == "cpus_per_task":
                    values[key] = positive_type(str(value))
                elif key == "sbatch_lines":
                    values[key] = tuple(sbatch_line_type(str(v)) for v in value)
                elif key == "srun_args":
                    values[key] = tuple(dash_arg_type(str(v)) for v in value)
                elif key == "container_env":
                    values[key] = tuple(n for v in value for n in env_names(str(v)))
                elif key == "runtime":
                    values[key] = choice_type("--runtime", RUNTIMES)(str(value))
                elif key == "container_gpus":
                    values[key] = choice_type("--container-gpus", CONTAINER_GPUS)(str(value))
                elif key == "ssh_port":
                    values[key] = port_type(str(value))
                elif key == "handshake_timeout_s":
                    values[key] = positive_type(str(value))
                elif key == "runtime_args":
                    values[key] = tuple(runtime_arg_type(str(v)) for v in value)
                elif key == "network":
                    values[key] = token_type("--network")(str(value))
                elif key == "shm_size":
                    values[key] = shm_type(str(value))
                elif key in ("exclusive", "container_mount_home", "privileged", "ipc_host"):
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
