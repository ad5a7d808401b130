"""The backend interface: a pure plan, then submit, wait, cancel and gather.

``plan(spec)`` must be deterministic and free of I/O: the same spec gives the
same files and argv, which ``--dry-run`` prints and golden files pin. A real
launch executes exactly that plan.
"""

from __future__ import annotations

import abc
import argparse
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gpuaccept.errors import InputError
from gpuaccept.launch.spec import JobSpec
from gpuaccept.model import NodeReport


@dataclass
class Plan:
    """Everything a backend would do, as data.

    ``files`` maps a relative file name to its text (sbatch script, manifests,
    hostfile); ``commands`` are the argv lists that submit it, run in order
    from the directory where the files are written; ``expected_hosts`` are the
    node names reports should come from, when known before submission.
    """

    backend: str
    files: dict[str, str] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)
    expected_hosts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: text a launch stores instead of ``files[name]`` for a file the backend hands to the job itself (the ssh
    #: node script, sent on standard input): the same file with secret values masked
    stored: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        """Human-readable dry run: each file, then each command."""
        import shlex

        out: list[str] = []
        for name, text in self.files.items():
            out.append(f"# ---- {name} ----")
            out.append(text.rstrip("\n"))
        if self.commands:
            out.append("# ---- commands ----")
            out.extend(shlex.join(c) for c in self.commands)
        out.extend(f"# note: {n}" for n in self.notes)
        return "\n".join(out) + "\n"

    def write(self, directory: Path, secrets: Collection[str] = (), *, launch: bool = False) -> list[Path]:
        """Write every file under ``directory``; one holding any of ``secrets`` gets mode 0600 (0700 for a script).

        ``launch``: the copy a launch keeps, where :attr:`stored` replaces the files the job gets another way.
        """
        from gpuaccept.launch.secrets import holds_secret, write_file

        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.files.items():
            if launch and name in self.stored:
                text = self.stored[name]
            path = directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file(path, text, private=holds_secret(text, secrets), executable=text.startswith("#!"))
            written.append(path)
        return written


@dataclass
class Submission:
    """A submitted job: the backend's handle (job id, process handles, names)."""

    backend: str
    job_id: str | None
    handle: Any = None
    hosts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class JobState:
    """Scheduler state of a submitted job. ``done`` is terminal; ``ok`` means it completed without error."""

    state: str
    done: bool
    ok: bool = False
    detail: str = ""


class Backend(abc.ABC):
    """One scheduler. Subclasses implement the pure ``plan`` and the I/O methods."""

    name: ClassVar[str]
    help: ClassVar[str]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Backend flags (``launch <backend> --help`` lists them). None by default."""
        return None

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """Validated backend options from parsed flags. Raise ConfigError/UsageError on bad values."""
        return {}

    @abc.abstractmethod
    def plan(self, spec: JobSpec) -> Plan:
        """Pure: the artefacts and argv for ``spec``."""

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        """Preflight before anything is written or submitted (a missing ``sbatch``, an unreachable host).

        Raise UsageError/ConfigError with one clear line; the launch then stops
        with exit 2 and nothing submitted. Not called for ``--dry-run``.
        Default: nothing to check.
        """
        return None

    @abc.abstractmethod
    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        """Execute the plan's commands; return a handle."""

    @abc.abstractmethod
    def poll(self, submission: Submission) -> JobState:
        """Current state of the job."""

    @abc.abstractmethod
    def cancel(self, submission: Submission) -> None:
        """Stop what was submitted (best effort, idempotent)."""

    def gather(self, submission: Submission, spec: JobSpec) -> list[NodeReport]:
        """Node reports of the run. The default reads ``spec.run_results_dir`` (a shared directory)."""
        return read_reports(Path(spec.run_results_dir))

    def logs(self, submission: Submission) -> str:
        """Scheduler-side output worth showing when the job failed (may be empty)."""
        return ""


def read_reports(directory: Path) -> list[NodeReport]:
    """Every ``*/report.json`` below ``directory``, parsed; unreadable ones raise InputError naming the file."""
    reports = []
    for path in sorted(directory.glob("**/report.json")):
        try:
            reports.append(NodeReport.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path}: not a gpuaccept report ({type(exc).__name__}: {exc})") from exc
    return reports


StatusCallback = Callable[[JobState], None]
