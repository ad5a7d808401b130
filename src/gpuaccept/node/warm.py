"""The runner's side of the warm process (:mod:`gpuaccept.node.zygote`): start it, ask it to fork, watch.

:class:`WarmProcess` starts ``python -m gpuaccept.node.zygote`` in its own session with one end of a
socket pair, and keeps it for the run; :meth:`WarmProcess.spawn` returns a :class:`ForkedChild` at
once (the request waits in the socket while the warm process still imports torch), which answers
``poll``, ``wait`` and ``kill_group`` like :class:`gpuaccept.node.childproc.Spawned` does for a process
started the old way. A forked process is the warm process's child, so its exit status comes over
the socket; when the warm process dies, the processes it forked die with it (they are reported as
killed) and :class:`WarmGone` tells the runner to start the rest the old way. When the warm process
finds that a fork could not use CUDA (an import started it there) it refuses the requests: each
refused :class:`ForkedChild` runs in a fresh interpreter, and :class:`WarmPoisoned` tells the runner to
start the rest the old way.

:meth:`WarmProcess.preload` asks it to import modules now, beside a check that a busy CPU core does not
disturb (:class:`Preload` holds its answer).

``GPUACCEPT_ZYGOTE=0`` (or ``off``) turns the warm process off; it is only used on Linux.
``gpuaccept run`` starts it first thing (:func:`start_warm`), so that its imports overlap the
planning, and hands it to the runner.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaccept.node.childproc import Spawned, spawn_fresh
from gpuaccept.node.zygote import FD_ENV, PARENT_ENV

ENV = "GPUACCEPT_ZYGOTE"
#: seconds the warm process has to report the end of a check process it was asked to kill
REAP_S = 10.0
#: seconds a ready, idle warm process has to answer a fork request (its pid) before it counts as hung
FORK_ANSWER_S = 5.0
#: more seconds for a request whose ``imports`` the warm process has not imported yet
FORK_IMPORT_S = 30.0
#: seconds a fork request may wait on the warm process's first imports (torch's) before it counts as hung; the
#: check's clock does not run meanwhile (:meth:`ForkedChild.clock_start`)
BUSY_S = 300.0
_OFF = ("0", "off", "no", "false", "spawn")


class WarmGone(Exception):
    """The warm process cannot fork any more (it died, or was stopped); start processes the old way."""


class WarmPoisoned(WarmGone):
    """The warm process may not fork any more: a fork could not use CUDA (an import started it there)."""


class WarmHung(WarmGone):
    """The warm process does not answer a fork request (stopped, or hung): the runner stops it and starts the
    check the old way; the check is not to blame."""


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, SIGTSTP) or traced: state ``T`` or ``t`` in /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    fields = stat.rsplit(b")", 1)[-1].split()
    return bool(fields) and fields[0] in (b"T", b"t")


def start_warm() -> WarmProcess | None:
    """A warm process started now, so that it imports torch while the caller plans the run; None where it
    is off or cannot start (the runner then says why)."""
    if warm_disabled() is not None:
        return None
    try:
        return WarmProcess()
    except OSError:
        return None


def warm_disabled(env: Mapping[str, str] | None = None) -> str | None:
    """Why check processes must be started the old way here, or None when the warm process may be used."""
    value = (os.environ if env is None else env).get(ENV, "").strip().lower()
    if value in _OFF:
        return f"{ENV}={value}"
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return f"no warm process on {sys.platform} (fork is used on Linux only)"
    return None


@dataclass
class Preload:
    """Modules the warm process was asked to import beside the check ``beside``, and its answer."""

    modules: list[str]
    beside: str
    #: set when it answered: what failed to import ("module: error"), and seconds it took (all modules)
    failed: list[str] = field(default_factory=list)
    seconds: float | None = None

    def note(self, wanted: Sequence[str]) -> dict[str, Any]:
        """What a report says of the modules in ``wanted`` that this preload asked for."""
        mine = [m for m in self.modules if m in wanted]
        return {"modules": mine, "beside": self.beside, "seconds": self.seconds,
                "failed": [f for f in self.failed if f.split(":", 1)[0] in mine]}


class ForkedChild:
    """A check process forked by the warm process; the parts of :class:`subprocess.Popen` the runner uses."""

    def __init__(self, warm: WarmProcess, rid: int, start: tuple[str, dict[str, Any], dict[str, str], Path]) -> None:
        self.warm = warm
        self.id = rid
        self.pid: int | None = None
        self.returncode: int | None = None
        #: set when the warm process died while this process ran (it was killed with it)
        self.lost_with_warm = False
        #: module, request, environment and log: what a fresh interpreter needs when the fork is refused
        self.start = start
        #: why the warm process refused to fork it (then it runs in :attr:`fresh`)
        self.refused: str | None = None
        self.fresh: Spawned | None = None
        #: when the request was sent, and the seconds the warm process has to answer it once idle
        self.asked_at = time.monotonic()
        self.answer_s = FORK_ANSWER_S
        self.fresh_at: float | None = None

    def start_fresh(self, why: str) -> None:
        """The warm process refused the fork (``why``): run this process in a fresh interpreter instead."""
        self.refused = why
        self.fresh = spawn_fresh(*self.start)
        self.fresh_at = time.monotonic()
        self.pid = self.fresh.pid

    def clock_start(self) -> float | None:
        """When the check's time limit started counting: when it was asked for, or when the warm process finished
        its first imports (torch's) if that was later, or when it started in a fresh interpreter; None while the
        warm process is still in those imports, which are not the check's (a slow first import of torch does not
        time a check out). The check's own ``warm_imports``, done just before its fork, count, as they would in a
        fresh interpreter, and so does a wait behind an import beside an earlier check (bounded by the check's
        limit: :meth:`unanswered`)."""
        if self.fresh_at is not None:
            return self.fresh_at
        if self.warm.ready_at is None:
            return None if self.returncode is None else self.asked_at
        return max(self.asked_at, self.warm.ready_at)

    def poll(self) -> int | None:
        if self.returncode is None and self.fresh is None:
            self.warm.pump(0)
        if self.returncode is None and self.fresh is not None:
            self.returncode = self.fresh.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status; TimeoutExpired after ``timeout`` seconds, :class:`WarmHung` when the warm process
        does not fork it (:meth:`unanswered`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"check process {self.pid}", timeout or 0)
            if self.fresh is not None:
                self.returncode = self.fresh.wait(None if deadline is None else left)
                continue
            self.warm.pump(min(left, 0.25))
            why = self.unanswered() if self.returncode is None else None
            if why:
                raise WarmHung(why)
        return self.returncode

    def unanswered(self) -> str | None:
        """Why the warm process counts as hung on this request (None while it may still answer): it is stopped
        (it can neither fork this process nor report its end), it was still in its first imports :data:`BUSY_S`
        seconds after the request, or it was ready and idle (no import beside a check pending)
        for ``answer_s`` seconds without forking."""
        if self.warm.gone is not None or self.fresh is not None:
            return None
        pid = self.warm.proc.pid
        if stopped(pid):
            return f"the warm process (pid {pid}) is stopped (SIGSTOP or a debugger) and cannot fork or report"
        if self.pid is not None:
            return None
        if self.clock_start() is None and time.monotonic() - self.asked_at > BUSY_S:
            return (f"the warm process (pid {pid}) was still in its first imports (torch) {BUSY_S:g} s after the "
                    "check was asked for")
        idle = self.warm.idle_since()
        if idle is not None and time.monotonic() - max(idle, self.asked_at) > self.answer_s:
            return f"the warm process (pid {pid}) did not answer a fork request in {self.answer_s:g} s"
        return None

    def not_forked_why(self) -> str:
        """Why the warm process, not the check, is to blame for this process's timeout ("" when it is not): it
        never forked the check, although it had finished its first imports, or it was still in its first imports
        when the run's deadline came."""
        if self.pid is not None:
            return ""
        pid = self.warm.proc.pid
        if self.warm.ready is None:
            return f"the warm process (pid {pid}) was still in its first imports (torch)"
        return self.unanswered() or f"the warm process (pid {pid}) did not fork the check"

    def kill_group(self) -> None:
        """SIGKILL the process's session. Not forked yet: the request is cancelled while the warm process
        is still in its first imports, else the warm process is killed (it is stuck), as it is when it has
        not reported the end :data:`REAP_S` seconds after the SIGKILL."""
        if self.poll() is not None:
            return
        if self.fresh is not None:
            self.fresh.kill_group()
            return
        if self.pid is None and self.warm.ready is None:  # still importing torch: not stuck, only slow
            self.warm.cancel(self)
            return
        if self.pid is None:
            self.warm.stop("it did not fork a check process in time")
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        try:
            self.wait(REAP_S)
        except subprocess.TimeoutExpired:
            self.warm.stop(f"it did not reap a killed check process within {REAP_S:g} s")
        except WarmHung as exc:
            self.warm.stop(str(exc))


def _when(msg: dict[str, Any]) -> float:
    """When the warm process sent ``msg`` (its ``at``: ``time.monotonic()`` there, the same clock on Linux), or
    now when it did not say; never later than now."""
    now = time.monotonic()
    try:
        return min(now, float(msg.get("at", now)))
    except (TypeError, ValueError):
        return now


class WarmProcess:
    """One warm process for a run; see the module docstring."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        ours, theirs = socket.socketpair()
        child_env = dict(os.environ if env is None else env)
        child_env[FD_ENV] = str(theirs.fileno())
        child_env[PARENT_ENV] = str(os.getpid())
        #: its own output (warnings of its imports): an unnamed file until :meth:`save_output`
        self.output = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpuaccept.node.zygote"], stdin=subprocess.DEVNULL,
                                         stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True,
                                         pass_fds=(theirs.fileno(),), env=child_env)
        except OSError:
            ours.close()
            self.output.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.buf = b""
        self.next_id = 0
        self.pending: dict[int, ForkedChild] = {}
        #: preloads asked for, in order (the warm process answers them in that order)
        self.preloads: list[Preload] = []
        self.cancelled: set[int] = set()
        #: the warm process's first message: its pid, resident memory (KiB), threads, failed imports
        self.ready: dict[str, Any] | None = None
        #: why it can no longer fork (None while it can)
        self.gone: str | None = None
        #: why it may no longer fork: a fork could not use CUDA (from its ``ready`` or a refusal)
        self.poisoned: str | None = None
        #: when its first message came, and when it last answered a preload (``time.monotonic()``)
        self.ready_at: float | None = None
        self.preloaded_at = 0.0
        #: modules it was asked to import (a fork request's ``imports``, preloads)
        self.imported: set[str] = set()

    def spawn(self, module: str, request: dict[str, Any], env: Mapping[str, str], log: Path,
              imports: tuple[str, ...] = ()) -> ForkedChild:
        """Ask for a forked process running ``module``'s check protocol on ``request``, after the warm
        process has imported ``imports``; WarmGone when it cannot."""
        if self.gone is not None:
            raise WarmGone(self.gone)
        if self.poisoned is not None:
            raise WarmPoisoned(f"the warm process cannot fork safely: {self.poisoned}")
        self.next_id += 1
        child = ForkedChild(self, self.next_id, (module, request, dict(env), log))
        if not set(imports) <= self.imported:
            child.answer_s += FORK_IMPORT_S
        self.imported.update(imports)
        msg = {"id": child.id, "module": module, "request": request, "env": dict(env), "log": str(log),
               "cwd": os.getcwd(), "imports": list(imports)}
        try:
            self.sock.sendall((json.dumps(msg) + "\n").encode())
        except OSError as exc:
            self._lost(f"the warm process does not listen ({exc.strerror or exc})")
            raise WarmGone(str(self.gone)) from None
        self.pending[child.id] = child
        return child

    def preload(self, modules: Sequence[str], beside: str) -> Preload | None:
        """Ask the warm process to import ``modules`` now, while ``beside`` (a check just asked for, which a busy
        CPU core does not disturb) runs; requests sent later wait until it is done. None when it cannot listen
        (it died: the next :meth:`pump` finds out)."""
        if self.gone is not None or not modules:
            return None
        try:
            self.sock.sendall((json.dumps({"preload": list(modules)}) + "\n").encode())
        except OSError:
            return None
        asked = Preload(list(modules), beside)
        self.imported.update(modules)
        self.preloads.append(asked)
        return asked

    def pump(self, timeout: float) -> None:
        """Read what the warm process says, waiting up to ``timeout`` seconds for something."""
        if self.gone is not None:
            return
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._lost("the warm process exited")
            return
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self._dispatch(json.loads(line))

    def idle_since(self) -> float | None:
        """Since when it has been ready with no preload pending (None while it imports)."""
        if self.ready_at is None or any(p.seconds is None for p in self.preloads):
            return None
        return max(self.ready_at, self.preloaded_at)

    def wait_ready(self, timeout: float) -> dict[str, Any] | None:
        """Its first message (pid, memory, threads, failed imports), or None if it did not come in time."""
        deadline = time.monotonic() + timeout
        while self.ready is None and self.gone is None and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())
        return self.ready

    def cancel(self, child: ForkedChild) -> None:
        """Give up on ``child`` before it was forked: it counts as killed, and is killed if it comes."""
        with contextlib.suppress(OSError):
            self.sock.sendall((json.dumps({"cancel": child.id}) + "\n").encode())
        self.pending.pop(child.id, None)
        self.cancelled.add(child.id)
        child.returncode = -int(signal.SIGKILL)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "ready" in msg:
            self.ready = msg
            self.poisoned = msg.get("poisoned") or None
            self.ready_at = _when(msg)
            return
        if "preloaded" in msg:
            waiting = next((p for p in self.preloads if p.seconds is None), None)
            if waiting is not None:
                waiting.failed = [str(f) for f in msg.get("failed", [])]
                waiting.seconds = float(msg.get("seconds", 0.0))
                self.preloaded_at = _when(msg)
            return
        rid = int(msg["id"])
        if rid in self.cancelled:  # forked before the cancel arrived
            if "pid" in msg:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(msg["pid"]), signal.SIGKILL)
            if "exit" in msg:
                self.cancelled.discard(rid)
            return
        child = self.pending.get(rid)
        if child is None:
            return
        if "refused" in msg:  # it forks no more: this one, and the rest, start fresh
            self.poisoned = str(msg["refused"])
            del self.pending[child.id]
            child.start_fresh(self.poisoned)
            return
        if "pid" in msg:
            child.pid = int(msg["pid"])
        if "exit" in msg:
            child.returncode = int(msg["exit"])
            del self.pending[child.id]

    def _lost(self, why: str) -> None:
        """The warm process cannot go on: what it forked was killed with it (made sure of here)."""
        code = self.proc.poll()
        self.gone = why + (f" (exit status {code})" if code is not None else "")
        for child in self.pending.values():
            if child.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
            child.returncode = -int(signal.SIGKILL)
            child.lost_with_warm = True
        self.pending.clear()
        self._end(0.0)

    def stop(self, why: str) -> None:
        """Kill the warm process (it is stuck) and everything it forked."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._lost(f"stopped: {why}")

    def close(self) -> None:
        """End the warm process: it kills what it forked and leaves; killed if it does not within 5 s, and
        at once while it is still importing (it reads nothing then)."""
        if self.gone is None:
            self.gone = "closed"
        self._end(5.0 if self.ready is not None else 0.0)

    def save_output(self, path: Path) -> None:
        """Write what the warm process printed to ``path``, if it printed anything."""
        with contextlib.suppress(OSError, ValueError):
            self.output.seek(0)
            text = self.output.read()
            if text:
                path.write_bytes(text)
            self.output.close()

    def _end(self, grace_s: float) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
