"""The warm process ("zygote") that check processes are forked from (``python -m gpuaccept.node.zygote``).

``gpuaccept run`` starts it once per run (:mod:`gpuaccept.node.warm` is the runner's side). It imports
torch, ``torch.distributed`` and the check modules, and never touches CUDA (no ``torch.cuda`` call,
no torch operation: a fork after CUDA or an OpenMP pool has started is unsafe), then forks one
process per check and per local rank on request. It dies with the runner (PR_SET_PDEATHSIG) and
ignores SIGTERM, SIGHUP and SIGINT, which are the runner's to act on. A forked process starts its
own session, dies with the warm process the same way, puts back what a fresh interpreter would have
(the requested environment and working directory, the signal handlers, fresh seeds for ``random``,
numpy and torch's CPU generator, torch's thread count when ``OMP_NUM_THREADS`` differs), runs the
check as :mod:`gpuaccept.node.child` does and leaves with ``os._exit``: whatever a check changes dies
with its process, and the warm process stays as it was after the imports.

Protocol on the socket whose descriptor is in ``GPUACCEPT_ZYGOTE_FD``, one JSON object per line:

- runner to warm: ``{"id", "module", "request", "env", "log", "cwd", "imports"}``, one per process to
  fork (``imports``: the check's ``warm_imports``, imported here before the fork); ``{"cancel": id}``
  for a request whose check timed out before it was forked (read together with it: not forked);
  ``{"preload": [module, ...]}``: import these now (a failed import is only reported), then go on
  with the next message. The runner sends it right after a fork request for a check that one busy
  CPU core does not disturb (``imports_beside``), naming the later checks' ``warm_imports``, so that
  they are imported while that check runs; requests that come meanwhile wait in the socket, so an
  import never runs beside a check that measures;
- warm to runner: ``{"ready": pid, "rss_kib", "threads", "failed", "at"}`` once, when the imports are done
  (``at``: ``time.monotonic()`` here, the runner's clock too on Linux);
  ``{"id", "pid"}`` once the forked process has its own session; ``{"id", "exit"}`` when it ended
  (the status as :class:`subprocess.Popen` gives it: negative for a signal); ``{"preloaded": [module,
  ...], "failed": ["module: error", ...], "seconds", "at"}`` for each ``preload``, once it is done.

After its first imports, each ``preload`` and each fork request's imports that were new, the warm
process checks that a fork could still use CUDA (:func:`gpuaccept.node.forksafe.fork_poison`: an
import that started CUDA poisons every later fork). Once that fails it forks nothing more: ``ready``
carries ``"poisoned": why`` (None while it can fork), and each later fork request is answered
``{"id", "refused": why}``, for the runner to start that process in a fresh interpreter.

End of file on the socket: the warm process kills what it forked and leaves.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import random
import select
import signal
import socket
import sys
import time
import traceback
import warnings
from typing import Any, NoReturn

from gpuaccept.node.forksafe import fork_poison

FD_ENV = "GPUACCEPT_ZYGOTE_FD"
PARENT_ENV = "GPUACCEPT_ZYGOTE_PARENT"

#: modules imported before the first fork, besides the registered check modules
PRELOAD = ("torch", "torch.distributed", "torch.nn.functional", "gpuaccept.node.child",
           "gpuaccept.distributed.group", "gpuaccept.distributed.gather")

#: entry modules a forked process may run; the rank processes leave without the interpreter's exit handlers
ENTRY_MODULES = ("gpuaccept.node.child", "gpuaccept.node.rank_child")


def preload() -> list[str]:
    """Import torch and the check modules; returns what failed to import (the checks report it themselves)."""
    failed = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing torch is a check's SKIP, not the warm process's death
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    try:
        from gpuaccept.checks import registry

        registry()
    except Exception as exc:
        failed.append(f"check registry: {type(exc).__name__}: {exc}")
    return failed


def _status_of(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.waitstatus_to_exitcode(wait_status)


def _proc_status(key: str) -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


class Zygote:
    """The warm process's loop: fork on request, report each child's pid and exit status."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        gc.freeze()  # what the imports built is never collected in a child, so its pages stay shared
        self.pid = os.getpid()
        self.start_env = dict(os.environ)
        self.handlers = {s: signal.getsignal(s) for s in signal.valid_signals()
                         if s not in (signal.SIGKILL, signal.SIGSTOP)}
        self.children: dict[int, int] = {}  # pid -> request id
        self.reaping = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        #: why a fork could not use CUDA any more (an import started it); None while forks are safe
        self.poisoned: str | None = None

    def check_forks(self) -> None:
        """After imports: stop forking once a fork could not use CUDA (:func:`fork_poison`)."""
        if self.poisoned is None:
            self.poisoned = fork_poison()

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(msg) + "\n").encode())

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a scheduler's SIGTERM to every process of
            signal.signal(sig, signal.SIG_IGN)  # the job is the runner's to act on; this one ends with the runner
        buf = b""
        try:
            while True:
                ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [])
                if self.wake_r in ready:
                    os.read(self.wake_r, 4096)
                self.reap()
                if self.sock.fileno() not in ready:
                    continue
                data = self.sock.recv(1 << 16)
                if not data:
                    return
                buf += data
                lines = buf.split(b"\n")
                buf = lines.pop()
                msgs = [json.loads(line) for line in lines]
                cancelled = {m["cancel"] for m in msgs if "cancel" in m}
                for msg in msgs:
                    if "preload" in msg:
                        self.import_beside(msg["preload"])
                    elif "cancel" not in msg and msg["id"] not in cancelled:
                        self.fork(msg)
                self.reap()
        finally:
            for pid in self.children:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)

    def reap(self) -> None:
        self.reaping = True  # a SIGCHLD while reaping (during an import beside a check) leaves it to this loop
        try:
            while self.children:
                try:
                    pid, wait_status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return
                if pid == 0:
                    return
                rid = self.children.pop(pid, None)
                if rid is not None:
                    self.send({"id": rid, "exit": _status_of(wait_status)})
        finally:
            self.reaping = False

    def import_beside(self, names: list[str]) -> None:
        """Import ``names`` now, beside a check that a busy CPU core does not disturb; report what it took.
        A check process that ends meanwhile is reported at once (SIGCHLD), so that a long or hung import
        never makes the check it runs beside look hung; the next fork waits for the import."""
        started = time.monotonic()
        done: list[str] = []
        failed: list[str] = []
        old = signal.signal(signal.SIGCHLD, lambda signum, frame: None if self.reaping else self.reap())
        try:
            for name in names:
                try:
                    importlib.import_module(name)
                    done.append(name)
                except Exception as exc:  # the check that needs it imports it again at its fork, and reports it
                    failed.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            signal.signal(signal.SIGCHLD, old)
        self.check_forks()
        self.send({"preloaded": done, "failed": failed, "seconds": round(time.monotonic() - started, 3),
                   "at": time.monotonic()})
        self.reap()

    def fork(self, msg: dict[str, Any]) -> None:
        new = [name for name in msg.get("imports", ()) if name not in sys.modules]
        for name in new:  # the check's warm_imports: once per run, here
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        if new:
            self.check_forks()
        if self.poisoned is not None:
            self.send({"id": msg["id"], "refused": self.poisoned})
            return
        gc.freeze()
        set_r, set_w = os.pipe()
        with warnings.catch_warnings():  # Python 3.12 warns of numpy's OpenBLAS thread, which OpenBLAS
            warnings.simplefilter("ignore", DeprecationWarning)  # itself stops around a fork (pthread_atfork)
            pid = os.fork()
        if pid == 0:
            os.close(set_r)
            self.become_check(msg, set_w)
        os.close(set_w)
        with contextlib.suppress(OSError):
            os.read(set_r, 1)  # the child has its own session (or died trying)
        os.close(set_r)
        self.children[pid] = msg["id"]
        self.send({"id": msg["id"], "pid": pid})

    def become_check(self, msg: dict[str, Any], set_w: int) -> NoReturn:
        """In the forked process: become a fresh check process, run the check, leave."""
        code = 70
        try:
            os.setsid()
            from gpuaccept.node.child import _die_with_parent

            _die_with_parent(self.pid)
            os.write(set_w, b"1")
            os.close(set_w)
            self.reset(msg)
            code = self.run_check(msg)
        except SystemExit as exc:  # a check that calls sys.exit leaves with that status, as before
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # whatever happens, never return into the warm process's loop
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def reset(self, msg: dict[str, Any]) -> None:
        """What a fresh interpreter would have: stdio, environment, signal handlers, seeds, threads."""
        signal.set_wakeup_fd(-1)
        for sig, handler in self.handlers.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, handler)
        self.sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(msg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        env: dict[str, str] = msg["env"]
        os.environ.clear()
        os.environ.update(env)
        with contextlib.suppress(OSError):
            os.chdir(msg["cwd"])
        sys.argv = [msg["module"]]
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        torch = sys.modules.get("torch")
        if torch is not None:  # a fresh process seeds the CPU generator at random; CUDA's are seeded at their start
            torch.default_generator.seed()
        threads = env.get("OMP_NUM_THREADS")
        if torch is not None and threads != self.start_env.get("OMP_NUM_THREADS"):
            with contextlib.suppress(ValueError, TypeError):
                if threads is not None and int(threads) > 0:
                    torch.set_num_threads(int(threads))

    @staticmethod
    def run_check(msg: dict[str, Any]) -> int:
        from gpuaccept.node.child import run_request
        from gpuaccept.node.childproc import write_outcome

        module = msg["module"]
        if module not in ENTRY_MODULES:
            raise ValueError(f"not a check entry module: {module}")
        code = write_outcome(msg["request"]["out"], run_request(msg["request"]))
        if module == "gpuaccept.node.child":  # as at a normal interpreter exit; a rank process skips them
            atexit._run_exitfuncs()
        return code


def main() -> int:
    parent = int(os.environ.pop(PARENT_ENV, "0"))
    fd = int(os.environ.pop(FD_ENV))
    from gpuaccept.node.child import _die_with_parent

    if parent:
        _die_with_parent(parent)
    sock = socket.socket(fileno=fd)
    failed = preload()
    zygote = Zygote(sock)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1
    zygote.check_forks()  # after the count: the probe's fork stops numpy's OpenBLAS thread
    zygote.send({"ready": zygote.pid, "rss_kib": _proc_status("VmRSS"), "threads": threads, "failed": failed,
                 "poisoned": zygote.poisoned, "at": time.monotonic()})
    try:
        zygote.serve()
    except (BrokenPipeError, ConnectionResetError):
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
