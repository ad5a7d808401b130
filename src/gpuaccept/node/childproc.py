"""What the runner and the rank launchers share about a check's child process.

Its interface (:class:`CheckProcess`: forked by the warm process, see :mod:`gpuaccept.node.warm`, or
started the old way, :class:`Spawned`), reading the outcome file it wrote, saying why it died
without one, killing its process group, and appending a result line to ``results.jsonl``.
Imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpuaccept.checks.base import Outcome
    from gpuaccept.model import CheckResult
    from gpuaccept.node.suite import PlannedCheck, SuitePlan

LOG_TAIL_LINES = 5

#: exit status of a check process that measured but could not write its outcome file (EX_IOERR)
OUTCOME_WRITE_FAILED = 74


def append_jsonl(path: Path, data: dict[str, Any]) -> None:
    """Append one JSON line and fsync it. On OSError (a full disk) the file is cut back to its
    previous length, so it never ends in half a line, and the error is raised."""
    line = (json.dumps(data, allow_nan=False) + "\n").encode()
    with open(path, "ab") as fh:
        size = fh.tell()
        try:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                fh.truncate(size)
            raise


def write_json_atomic(path: Path, data: dict[str, Any], *, indent: int | None = None) -> None:
    """Write ``path`` through ``path.tmp`` and a rename; on OSError the ``.tmp`` is removed and the
    error raised, so ``path`` keeps its previous content and nothing is left behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=indent, allow_nan=False, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_outcome(out: str, result: dict[str, Any]) -> int:
    """A check process's last act: write its outcome file. Returns the exit status for it:
    0, or :data:`OUTCOME_WRITE_FAILED` when the file cannot be written (the runner then reports
    a write failure of the report directory, not a failure of the check)."""
    try:
        write_json_atomic(Path(out), result)
    except OSError as exc:
        with contextlib.suppress(OSError):
            print(f"cannot write the outcome file {out}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return OUTCOME_WRITE_FAILED
    return 0


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def read_outcome(out: Path) -> dict[str, Any] | None:
    """The outcome JSON a check process wrote (the file is removed), or None when there is none."""
    try:
        raw: dict[str, Any] = json.loads(out.read_text())
    except (OSError, ValueError):
        return None
    out.unlink(missing_ok=True)
    return raw


def died_reason(returncode: int, log: Path) -> str:
    """Why a check process left no result: its exit status and the tail of its log."""
    how = signal_name(returncode) if returncode < 0 else f"exit code {returncode}"
    tail = log_tail(log)
    return f"check process died ({how}) without a result" + (f": {tail}" if tail else "")


class CheckProcess(Protocol):
    """A check's process in its own session: what the runner asks of it."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill_group(self) -> None:
        """SIGKILL its whole session (the check and anything it started)."""

    def clock_start(self) -> float | None:
        """When its time limit started counting (``time.monotonic()``), None while it waits for the warm process's
        own imports (:meth:`gpuaccept.node.warm.ForkedChild.clock_start`)."""


class Spawned:
    """A check process started the old way (a fresh interpreter, ``start_new_session=True``)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.started_at = time.monotonic()

    def clock_start(self) -> float | None:
        return self.started_at

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def kill_group(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ProcessHost(Protocol):
    """What starting a check's rank processes asks of the runner that owns them (:mod:`gpuaccept.node.local_group`
    and :class:`gpuaccept.node.runner.Runner`, which is one): where their files go, how one is started, killed,
    read back and judged. The rank launcher holds this, never the runner's class."""

    @property
    def plan(self) -> SuitePlan: ...

    @property
    def host(self) -> str: ...

    @property
    def nproc(self) -> int: ...

    @property
    def dist_timeout_s(self) -> float: ...

    @property
    def scratch_dir(self) -> Path: ...

    @property
    def log_dir(self) -> Path: ...

    @property
    def run_deadline(self) -> float | None: ...

    def spawn(self, check: PlannedCheck, out: Path, log: Path, *, env: dict[str, str] | None = None,
              module: str = ...) -> CheckProcess: ...

    def kill_children(self) -> None: ...

    def preload_beside(self, check: PlannedCheck) -> None: ...

    def outcome_of(self, raw: dict[str, Any]) -> Outcome: ...

    def outcome_not_written(self, check: PlannedCheck, returncode: int | None) -> None: ...

    def died_reason(self, child: CheckProcess, log: Path) -> str: ...

    def judge_outcome(self, check: PlannedCheck, outcome: Outcome, elapsed: float) -> CheckResult: ...


def spawn_fresh(module: str, request: dict[str, Any], env: Mapping[str, str] | None, log: Path) -> Spawned:
    """A fresh ``python -m module`` in its own session reading ``request`` on stdin, its output appended to
    ``log`` (the old way: where the warm process is off, gone, or cannot fork safely)."""
    with open(log, "ab") as log_fh:
        popen = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=log_fh,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env=None if env is None else dict(env))
    assert popen.stdin is not None
    popen.stdin.write(json.dumps(request).encode())
    popen.stdin.close()
    return Spawned(popen)


def wait_check(child: CheckProcess, limit_s: float, deadline: float | None = None) -> int:
    """``child``'s exit status, its ``limit_s`` seconds counted from its :meth:`~CheckProcess.clock_start` (not
    while the warm process it waits on is still in its own imports), and never past ``deadline`` (a
    ``time.monotonic()`` value). TimeoutExpired at either; WarmHung when the warm process does not fork it."""
    while True:
        start = child.clock_start()
        end = math.inf if deadline is None else deadline
        if start is not None:
            end = min(end, start + limit_s)
        left = end - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(f"check process {getattr(child, 'pid', None)}", limit_s)
        try:  # while its clock has not started, look again every 0.25 s
            return child.wait(timeout=left if start is not None else min(left, 0.25))
        except subprocess.TimeoutExpired:
            if start is not None:
                raise


def kill_tree(child: CheckProcess) -> None:
    """SIGKILL a check process's session and wait for it."""
    child.kill_group()
    child.wait()
