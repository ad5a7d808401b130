"""Wait for a submitted job: poll the backend, show progress, stop at a timeout, cancel on Ctrl-C.

On a terminal the progress is one live line; elsewhere (CI logs, cron) a
``[LAUNCH]`` line is printed whenever the state or progress changes, and at
least every ``HEARTBEAT_S`` seconds while nothing changes, so a log never
falls silent while the job runs.
SIGTERM is handled like Ctrl-C while waiting.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

from gpuaccept.launch.base import Backend, JobState, Submission

SETTLE_S = 30.0
HEARTBEAT_S = 10.0
"""Plain mode: the longest time without a progress line while the job runs."""


@dataclass
class WatchOutcome:
    """How the wait ended: the last state, and whether it was cut short by the timeout or by Ctrl-C."""

    state: JobState
    elapsed_s: float
    timed_out: bool = False
    interrupted: bool = False
    cancelled: bool = False


def _fmt(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def describe(submission: Submission, state: JobState, elapsed_s: float, progress: str = "") -> str:
    """``[LAUNCH] slurm job 12: RUNNING node[1-2] 0:00:05 reports 1/2``."""
    parts = [f"[LAUNCH] {submission.backend} job {submission.job_id}: {state.state}"]
    if state.detail:
        parts.append(state.detail)
    parts.append(_fmt(elapsed_s))
    if progress:
        parts.append(progress)
    return " ".join(parts)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (as Ctrl-C's SIGINT does) while in this block (main thread only)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def settle(backend: Backend, submission: Submission, *, grace_s: float = SETTLE_S, poll_s: float = 1.0,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> JobState:
    """After a cancel: poll until the job is done or ``grace_s`` passed (reports get their last write)."""
    deadline = clock() + grace_s
    state = backend.poll(submission)
    while not state.done and clock() < deadline:
        sleep(min(poll_s, max(0.0, deadline - clock())))
        state = backend.poll(submission)
    return state


class _Display:
    """A live status line on a terminal; elsewhere a printed line whenever the shown text changes."""

    def __init__(self, stream: IO[str], clock: Callable[[], float] = time.monotonic,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.stream = stream
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.printed_at = float("-inf")
        self.last_key = ""
        self.printed = ""
        self.live: Any = None
        if stream.isatty():
            from rich.console import Console

            self.live = Console(file=stream).status("")
            self.live.start()

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
        self.printed = line
        self.printed_at = self.clock()

    def show(self, line: str, key: str) -> None:
        if self.live is not None:
            self.live.update(line)
        elif key != self.last_key or self.clock() - self.printed_at >= self.heartbeat_s:
            self._print(line)
        self.last_key = key

    def close(self, final: str) -> None:
        """Stop the live line and print ``final`` (unless it is the line just printed)."""
        if self.live is not None:
            self.live.stop()
            self.live = None
            self._print(final)
        elif final != self.printed:
            self._print(final)


def cancel_early(backend: Backend, submission: Submission, stream: IO[str]) -> WatchOutcome:
    """Ctrl-C or SIGTERM after the job was submitted but before :func:`watch` took over: cancel it as watch would."""
    start = time.monotonic()
    print(f"[LAUNCH] interrupted: cancelling {submission.backend} job {submission.job_id}", file=stream, flush=True)
    backend.cancel(submission)
    return WatchOutcome(settle(backend, submission), time.monotonic() - start, interrupted=True, cancelled=True)


def watch(backend: Backend, submission: Submission, *, stream: IO[str], timeout_s: float | None = None,
          poll_s: float = 2.0, progress: Callable[[], str] | None = None, cancel_on_interrupt: bool = True,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          heartbeat_s: float = HEARTBEAT_S) -> WatchOutcome:
    """Poll until the job is done. At ``timeout_s`` (seconds) the job is cancelled; on Ctrl-C too, unless told not.
    Without a terminal a line is printed on every change and at least every ``heartbeat_s`` seconds."""
    start = clock()
    display = _Display(stream, clock, heartbeat_s)
    state = JobState("SUBMITTED", done=False)
    with sigterm_as_interrupt():
        try:
            while True:
                state = backend.poll(submission)
                elapsed = clock() - start
                extra = progress() if progress else ""
                display.show(describe(submission, state, elapsed, extra), f"{state.state}|{state.detail}|{extra}")
                if state.done:
                    display.close(describe(submission, state, elapsed, extra))
                    return WatchOutcome(state, elapsed)
                if timeout_s is not None and elapsed >= timeout_s:
                    display.close(f"[LAUNCH] timed out after {_fmt(elapsed)} (--timeout {timeout_s:g} s); "
                                  f"cancelling {submission.backend} job {submission.job_id}")
                    backend.cancel(submission)
                    return WatchOutcome(settle(backend, submission, clock=clock, sleep=sleep), clock() - start,
                                        timed_out=True, cancelled=True)
                sleep(poll_s)
        except KeyboardInterrupt:
            elapsed = clock() - start
            if not cancel_on_interrupt:
                display.close(f"[LAUNCH] stopped watching; {submission.backend} job {submission.job_id} "
                              "keeps running")
                return WatchOutcome(state, elapsed, interrupted=True)
            display.close(f"[LAUNCH] interrupted: cancelling {submission.backend} job {submission.job_id}")
            backend.cancel(submission)
            return WatchOutcome(settle(backend, submission, clock=clock, sleep=sleep), clock() - start,
                                interrupted=True, cancelled=True)
        finally:
            if display.live is not None:
                display.live.stop()
