"""Progress of a launched job without a terminal: a line at a steady interval, with nodes and checks done."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from gpuaccept.launch.base import JobState, Submission
from gpuaccept.launch.collect import progress
from gpuaccept.launch.watch import watch


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class _Backend:
    """RUNNING with the same detail until ``done_at`` seconds, then COMPLETED."""

    name = "fake"

    def __init__(self, clock: _Clock, done_at: float) -> None:
        self.clock = clock
        self.done_at = done_at

    def poll(self, submission: Submission) -> JobState:
        if self.clock.now >= self.done_at:
            return JobState("COMPLETED", done=True, ok=True, detail="2/2 nodes done")
        return JobState("RUNNING", done=False, detail="0/2 nodes done")

    def cancel(self, submission: Submission) -> None:
        raise AssertionError("not cancelled")


def test_a_quiet_job_still_prints_a_line_at_a_steady_interval() -> None:
    clock = _Clock()
    out = io.StringIO()
    backend: Any = _Backend(clock, done_at=26.0)
    outcome = watch(backend, Submission("fake", "7"), stream=out, poll_s=2.0, clock=clock, sleep=clock.sleep,
                    heartbeat_s=10.0)
    assert outcome.state.state == "COMPLETED"
    lines = out.getvalue().splitlines()
    running = [line for line in lines if "RUNNING" in line]
    assert len(running) == 3, lines  # at 0, 10 and 20 s: never more than 10 s of silence
    assert "0:00:10" in running[1] and "0:00:20" in running[2]
    assert "COMPLETED" in lines[-1]


def test_progress_counts_checks_done_in_running_reports(tmp_path: Path) -> None:
    count = progress(tmp_path, 2)
    assert count() == ""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text(json.dumps(
        {"host": "n1", "verdict": "running", "checks": [{"name": "env"}, {"name": "compute"}]}))
    assert count() == "checks done 2"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "report.json").write_text(json.dumps(
        {"host": "n2", "verdict": "success", "checks": [{"name": "env"}]}))
    assert count() == "reports 1/2, checks done 3"
