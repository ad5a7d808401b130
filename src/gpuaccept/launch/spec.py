"""The job description every backend reads, validated once.

A JobSpec says what to run (the suite with ``gpuaccept run`` options, or a
user command), where (nodes, GPUs per node, image, mounts, env), for how long,
and where per-node reports go. Backend-specific options are a validated dict.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.argtypes import check_run_id
from gpuaccept.errors import ConfigError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_NODES = 100_000
"""The most nodes a job may ask for."""
MAX_PER_NODE = 1024
"""The most GPUs or processes per node."""
MAX_TIME_MIN = 366 * 24 * 60
"""The longest ``--time`` (a year, in minutes)."""
_JOB_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 48


@dataclass(frozen=True)
class Mount:
    """A bind mount (or volume) ``source:target[:ro]``; paths are absolute."""

    source: str
    target: str
    readonly: bool = False

    @classmethod
    def parse(cls, text: str, source: str = "--mount") -> Mount:
        """``SRC:DST``, ``SRC:DST:ro`` or one absolute path (mounted at the same path)."""
        if text.startswith("/") and ":" not in text:
            return cls(text, text)
        parts = text.split(":")
        if len(parts) not in (2, 3) or not all(parts[:2]):
            raise ConfigError(source, text, "a mount is SOURCE:TARGET, SOURCE:TARGET:ro or one absolute path")
        ro = len(parts) == 3
        if ro and parts[2] not in ("ro", "rw"):
            raise ConfigError(source, text, f"mount mode must be ro or rw, got {parts[2]!r}")
        if not parts[1].startswith("/"):
            raise ConfigError(source, text, "the mount target must be an absolute path")
        return cls(parts[0], parts[1], ro and parts[2] == "ro")

    def __str__(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.readonly else "")


def option_values(fields: Any, raw: dict[str, Any], source: str, backend: str) -> dict[str, Any]:
    """The values ``raw`` sets (None left out) for a backend's options dataclass with ``fields``
    (its ``__dataclass_fields__``). A key that is not a field is a ConfigError naming the known ones."""
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(source, unknown[0], f"unknown {backend} option; known: {', '.join(sorted(fields))}")
    return {k: v for k, v in raw.items() if v is not None}


def as_list(value: Any, source: str, name: str) -> list[Any]:
    """``value`` as a list: one string is a list of one; anything else but a list is a ConfigError."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConfigError(source, name, f"expected a list, got {type(value).__name__}")
    return value


def sanitize_name(raw: str) -> str:
    """Lower-case DNS-1123 label from ``raw`` (``My_Job`` -> ``my-job``), at most 48 characters.

    Raises ConfigError when nothing usable is left.
    """
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:MAX_NAME].strip("-")
    if not name or not _JOB_NAME.match(name):
        raise ConfigError("--name", raw, "a job name needs letters or digits (it becomes a DNS label)")
    return name


def env_names(text: str) -> list[str]:
    """argparse converter: ``"A, B"`` -> ``["A", "B"]``, each a valid environment variable name."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if not _ENV_NAME.match(n):
            raise argparse.ArgumentTypeError(f"{n!r} is not an environment variable name")
    return names


def parse_env(items: list[str], source: str = "--env") -> dict[str, str]:
    """``["A=1", "B=x y"]`` to a dict. Names must be valid shell identifiers; values are kept verbatim."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(source, item, "expected NAME=VALUE")
        if not _ENV_NAME.match(name):
            raise ConfigError(source, name, "an environment variable name is letters, digits and _, "
                                            "not starting with a digit")
        if "\0" in value:
            raise ConfigError(source, name, "a value cannot contain a NUL byte")
        env[name] = value
    return env


@dataclass
class JobSpec:
    """One multi-node job.

    ``command`` None means the acceptance suite: every node runs
    ``gpuaccept run`` with ``suite_args`` and writes its report under
    ``results_dir/<run_id>/``. ``gpus_per_node`` None means the launch did not say:
    every GPU each node has (0: a CPU job, no GPU requested). ``procs_per_node``
    defaults to the GPUs per node (see :attr:`nproc`). ``time_limit_min`` is in minutes.
    """

    name: str
    nodes: int
    run_id: str
    results_dir: str
    gpus_per_node: int | None = None
    procs_per_node: int | None = None
    command: list[str] | None = None
    suite_args: list[str] = field(default_factory=list)
    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    time_limit_min: int | None = None
    workdir: str | None = None
    distributed: bool = True
    python: str = "python3"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.nodes < 1:
            raise ConfigError("--nodes", "", f"must be at least 1, got {self.nodes}")
        if self.nodes > MAX_NODES:
            raise ConfigError("--nodes", "", f"must be at most {MAX_NODES}, got {self.nodes}")
        if self.gpus_per_node is not None and not 0 <= self.gpus_per_node <= MAX_PER_NODE:
            raise ConfigError("--gpus-per-node", "", f"must be 0 to {MAX_PER_NODE}, got {self.gpus_per_node}")
        if self.procs_per_node is not None and not 1 <= self.procs_per_node <= MAX_PER_NODE:
            raise ConfigError("--procs-per-node", "", f"must be 1 to {MAX_PER_NODE}, got {self.procs_per_node}")
        if self.time_limit_min is not None and not 1 <= self.time_limit_min <= MAX_TIME_MIN:
            raise ConfigError("--time", "", f"must be 1 to {MAX_TIME_MIN} minutes, got {self.time_limit_min}")
        try:
            check_run_id(self.run_id)
        except ValueError as exc:
            raise ConfigError("--run-id", "", str(exc)) from None
        if self.command is not None and not self.command:
            raise ConfigError("command", "", "the command after -- is empty")
        if not _JOB_NAME.match(self.name):
            raise ConfigError("--name", self.name, "must be a DNS label (use sanitize_name)")

    @property
    def nproc(self) -> int | None:
        """Ranks per node: ``procs_per_node``, else ``gpus_per_node`` (1 for a CPU job); None when neither was
        given: one per GPU the node has, counted on the node at run time (:mod:`gpuaccept.launch.gpucount`)."""
        if self.procs_per_node:
            return self.procs_per_node
        return None if self.gpus_per_node is None else max(self.gpus_per_node, 1)

    @property
    def run_results_dir(self) -> str:
        """Where every node writes: ``<results_dir>/<run_id>``."""
        return f"{self.results_dir.rstrip('/')}/{self.run_id}"

    def suite_argv(self) -> list[str]:
        """``gpuaccept run`` argv of the default job; every node writes under :attr:`run_results_dir`.

        Nodes do not store their reports in the history: the launcher stores the cluster
        report, node reports included, once (no shared SQLite file written by 2,000 nodes).
        """
        return ["gpuaccept", "run", *self.suite_args, "--no-history", "--report-dir", self.run_results_dir]

    def job_argv(self) -> list[str]:
        """What each node (or each rank, under torchrun) executes."""
        return list(self.command) if self.command is not None else self.suite_argv()


def with_known_gpus(spec: JobSpec, backend: str, requested: str | None = None) -> JobSpec:
    """``spec`` for a backend whose scheduler gives a container only the GPUs it asks for (k8s, runai), so they
    cannot be counted on the node: ``gpus_per_node`` from the flag, else from ``requested`` (the GPU quantity of
    ``--resource``); a ConfigError naming --gpus-per-node when neither says."""
    if spec.gpus_per_node is not None:
        return spec
    if requested is not None and requested.strip().isdigit():
        return dataclasses.replace(spec, gpus_per_node=int(requested))
    from gpuaccept.launch.gpucount import HINT

    raise ConfigError("--gpus-per-node", "", f"{backend} gives a container only the GPUs it requests, so it "
                                             f"cannot test every GPU of a node without a count: {HINT}")


def risk_warnings(spec: JobSpec) -> list[str]:
    """One line per option of ``spec`` that weakens the isolation of the nodes under test, naming the risk."""
    opts = spec.options or {}
    out = []
    if opts.get("privileged"):
        out.append("--privileged: the containers run privileged, with every device and capability of the host; "
                   "a process in them can take over the node")
    if opts.get("host_network"):
        out.append("--host-network: the pods share the node's network namespace; every port they open is open on "
                   "the node and they can reach services bound to its loopback")
    for m in spec.mounts:
        if m.source.startswith("/"):
            mode = "read-only" if m.readonly else "read-write"
            out.append(f"--mount {m}: host path {m.source} is mounted {mode} into the containers; they can read"
                       + ("" if m.readonly else " and change") + " those files of the node")
    return out
