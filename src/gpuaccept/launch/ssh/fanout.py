"""The fan-out: one ssh process per host in a bounded window, output streamed with a ``[host]`` prefix, stop logic."""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from gpuaccept.launch.base import JobState
from gpuaccept.launch.ssh.options import SshOptions
from gpuaccept.launch.ssh.plan import SETUP_FAILED, NodeSlot

TAIL_LINES = 20
LOCAL_GRACE_S = 15
"""Seconds a stop waits for the ssh sessions to end before terminating the local ssh clients
(the remote clean-up goes on without them)."""

@dataclass
class HostRun:
    slot: NodeSlot
    argv: list[str]
    state: str = "pending"  # pending, running, done, skipped
    proc: subprocess.Popen[bytes] | None = None
    rc: int | None = None
    open_fds: int = 0
    partial: dict[int, bytes] = field(default_factory=dict)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    log: IO[bytes] | None = None
    stopped: bool = False
    exited_at: float | None = None


class SshJob:
    """The running job: ssh processes, a reader thread that streams output, and the stop logic.

    Thread-safe: ``poll``-side reads and ``cancel`` may come from another
    thread than the reader loop.
    """

    def __init__(self, nodes: list[HostRun], script: bytes, opts: SshOptions, *, kill_argvs: dict[str, list[str]],
                 stream: TextIO, log_dir: Path | None, fail_fast: bool, time_limit_s: float | None) -> None:
        self.nodes = nodes
        self.script = script
        self.opts = opts
        self.kill_argvs = kill_argvs
        self.stream = stream
        self.log_dir = log_dir
        self.fail_fast = fail_fast
        self.time_limit_s = time_limit_s
        self.lock = threading.RLock()
        self.stop_reason: str | None = None
        self.timed_out = False
        self.cancelled = False
        self.started_at = time.monotonic()
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._loop, name="gpuaccept-ssh", daemon=True)
        self._stopper: threading.Thread | None = None
        self.finished = threading.Event()

    # -- life cycle

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)

    def _emit(self, node: HostRun, line: str) -> None:
        node.tail.append(line)
        with contextlib.suppress(ValueError, OSError):
            self.stream.write(f"[{node.slot.label}] {line}\n")
            self.stream.flush()

    def _launch(self, node: HostRun) -> None:
        if self.log_dir is not None:
            try:
                node.log = open(self.log_dir / f"{node.slot.dirname}.log", "ab")  # closed in _reap
            except OSError as exc:
                self._emit(node, f"cannot keep a log of this host: {exc}")
        try:
            proc = subprocess.Popen(node.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            node.state, node.rc = "done", 127
            self._emit(node, f"cannot start ssh: {exc}")
            return
        node.proc, node.state = proc, "running"
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            proc.stdin.write(self.script)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # ssh died at once; its stderr says why
        for pipe in (proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ, node)
            node.open_fds += 1

    def _read(self, pipe: IO[bytes], node: HostRun) -> None:
        fd = pipe.fileno()
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if node.log is not None and data:
            node.log.write(data)
            node.log.flush()
        buf = node.partial.get(fd, b"") + data
        *lines, rest = buf.split(b"\n")
        for raw in lines:
            self._emit(node, raw.decode(errors="replace").rstrip("\r"))
        if data:
            node.partial[fd] = rest
            return
        if rest:
            self._emit(node, rest.decode(errors="replace"))
        node.partial.pop(fd, None)
        self._selector.unregister(pipe)
        pipe.close()
        node.open_fds -= 1

    def _reap(self, node: HostRun) -> None:
        """Record the exit of ``node``'s ssh once its output is drained (or 2 s after it exited:
        a process it left behind may hold the pipes)."""
        assert node.proc is not None
        if node.open_fds > 0:
            if node.proc.poll() is None:
                return
            node.exited_at = node.exited_at or time.monotonic()
            if time.monotonic() - node.exited_at < 2.0:
                return
            for key in [k for k in self._selector.get_map().values() if k.data is node]:
                self._selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
            for rest in node.partial.values():
                if rest:
                    self._emit(node, rest.decode(errors="replace"))
            node.partial.clear()
            node.open_fds = 0
        rc = node.proc.wait()
        node.rc, node.state = rc, "done"
        if node.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                node.proc.stdin.close()
        if node.log is not None:
            node.log.close()
            node.log = None
        if rc != 0 and self.fail_fast and self.stop_reason is None:
            others = [n for n in self.nodes if n.state in ("running", "pending")]
            if others:
                self._emit(node, f"failed ({_describe_rc(rc)}); stopping the other hosts")
                self.stop(f"{node.slot.label} failed", internal=True)

    def _loop(self) -> None:
        try:
            while True:
                with self.lock:
                    if self.stop_reason is None:
                        running = sum(n.state == "running" for n in self.nodes)
                        for node in self.nodes:
                            if running >= self.opts.max_connections:
                                break
                            if node.state == "pending":
                                self._launch(node)
                                running += 1
                    if all(n.state in ("done", "skipped") for n in self.nodes):
                        return
                    if (self.time_limit_s is not None and self.stop_reason is None
                            and time.monotonic() - self.started_at > self.time_limit_s):
                        self.timed_out = True
                        self.stop(f"time limit of {self.time_limit_s / 60:g} min reached", internal=True)
                for key, _ in self._selector.select(timeout=0.2) if self._selector.get_map() else []:
                    self._read(key.fileobj, key.data)  # type: ignore[arg-type]
                if not self._selector.get_map():
                    time.sleep(0.05)
                with self.lock:
                    for node in self.nodes:
                        if node.state == "running":
                            self._reap(node)
        except Exception as exc:  # a bug here must not leave remote jobs running unseen
            with contextlib.suppress(ValueError, OSError):
                self.stream.write(f"[ssh] internal error: {type(exc).__name__}: {exc}; stopping every host\n")
            self.stop(f"internal error: {exc}", internal=True)
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is None:
                    node.proc.terminate()
                if node.state == "running":
                    node.state, node.rc = "done", node.proc.wait() if node.proc is not None else -1
        finally:
            self._selector.close()
            self.finished.set()

    # -- stopping

    def stop(self, reason: str, *, internal: bool = False) -> None:
        """Stop every host (idempotent): skip pending ones, end running ones' input, kill through a second ssh."""
        with self.lock:
            if self.stop_reason is not None:
                return
            self.stop_reason = reason
            self.cancelled = not internal
            victims = []
            for node in self.nodes:
                if node.state == "pending":
                    node.state = "skipped"
                elif node.state == "running":
                    node.stopped = True
                    victims.append(node)
                    if node.proc is not None and node.proc.stdin is not None:
                        with contextlib.suppress(OSError, ValueError):
                            node.proc.stdin.close()
        self._stopper = threading.Thread(target=self._kill, args=(victims,), name="gpuaccept-ssh-stop", daemon=True)
        self._stopper.start()

    def _kill(self, victims: list[HostRun]) -> None:
        timeout = self.opts.connect_timeout_s + 20

        def kill_one(node: HostRun) -> None:
            if node.rc is not None:
                return
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run(self.kill_argvs[node.slot.label], stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=timeout)

        if victims:
            with ThreadPoolExecutor(max_workers=min(len(victims), self.opts.max_connections)) as pool:
                list(pool.map(kill_one, victims))
        if not self.finished.wait(LOCAL_GRACE_S):
            for node in victims:
                if node.proc is not None and node.proc.poll() is None:
                    node.proc.terminate()
            if not self.finished.wait(5):
                for node in victims:
                    if node.proc is not None and node.proc.poll() is None:
                        node.proc.kill()

    def join_stopper(self, timeout: float) -> None:
        if self._stopper is not None:
            self._stopper.join(timeout)

    # -- state

    def state(self) -> JobState:
        with self.lock:
            n = len(self.nodes)
            done = [x for x in self.nodes if x.state == "done"]
            failed = [x for x in done if x.rc != 0]
            if not self.finished.is_set():
                running = sum(x.state == "running" for x in self.nodes)
                detail = f"{len(done)}/{n} hosts finished, {running} running"
                if failed:
                    detail += "; failed: " + ", ".join(f"{x.slot.label} ({_describe_rc(x.rc)})" for x in failed)
                return JobState("RUNNING" if running else "PENDING", done=False, detail=detail)
            skipped = [x.slot.label for x in self.nodes if x.state == "skipped"]
            parts = [f"{x.slot.label}: {'stopped' if x.stopped else _describe_rc(x.rc)}" for x in failed]
            if skipped:
                parts.append("not started: " + ", ".join(skipped))
            if self.stop_reason:
                parts.insert(0, self.stop_reason)
            ok = not failed and not skipped and self.stop_reason is None
            state = ("COMPLETED" if ok else "TIMEOUT" if self.timed_out else "CANCELLED" if self.cancelled
                     else "FAILED")
            return JobState(state, done=True, ok=ok, detail="; ".join(parts) or f"{n}/{n} hosts succeeded")

    def failed_tails(self) -> str:
        with self.lock:
            out = []
            for node in self.nodes:
                if node.state == "done" and node.rc != 0:
                    out.append(f"--- {node.slot.label} ({_describe_rc(node.rc)}), last lines:")
                    out.extend(f"[{node.slot.label}] {line}" for line in node.tail)
            return "\n".join(out)


def _describe_rc(rc: int | None) -> str:
    if rc is None:
        return "running"
    if rc == 255:
        return "ssh error 255"
    if rc == SETUP_FAILED:
        return "setup failed"
    if rc < 0:
        return f"ssh killed by signal {-rc}"
    if rc > 128:
        return f"exit {rc} (signal {rc - 128})"
    return f"exit {rc}"


def parallel(fn: Any, items: list[Any], width: int) -> Iterator[Any]:
    if not items:
        return iter(())
    with ThreadPoolExecutor(max_workers=max(1, min(width, len(items)))) as pool:
        return iter(list(pool.map(fn, items)))
