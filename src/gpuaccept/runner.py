"""Runs a suite plan: one child process per check, a timeout each, results on disk as they come.

Files in ``<report_dir>/<run_id>/``:

- ``results.jsonl``: one CheckResult per line, appended and fsync'd as each check ends;
- ``report.json``: the NodeReport, rewritten atomically after each check (verdict
  ``running`` until the end), so a SIGKILL loses only the check in flight;
- ``logs/<check>.log``: the check's stdout and stderr.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from gpuaccept import __version__
from gpuaccept.checks.base import Outcome
from gpuaccept.judge import judge
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Verdict
from gpuaccept.suite import PlannedCheck, SuitePlan

LOG_TAIL_LINES = 5


class Interrupted(Exception):
    """The run was stopped by SIGINT or SIGTERM; the report holds what was measured."""

    def __init__(self, report: NodeReport, signum: int) -> None:
        self.report = report
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def new_run_id(host: str) -> str:
    """``20261122T101500Z-node17-3fa2``: sortable, host-attributed, unique enough."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{host}-{uuid.uuid4().hex[:4]}"


@dataclass
class RunEvents:
    """Callbacks for progress display. Each defaults to doing nothing."""

    on_start: Callable[[PlannedCheck, int, int], None] = lambda check, i, n: None
    on_end: Callable[[PlannedCheck, CheckResult], None] = lambda check, result: None


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, allow_nan=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _append_jsonl(path: Path, data: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(data, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class Runner:
    """Executes a :class:`SuitePlan` and maintains the report files."""

    def __init__(self, plan: SuitePlan, report_dir: Path, *, run_id: str | None = None,
                 host: str | None = None, argv: list[str] | None = None,
                 events: RunEvents | None = None, verbose: bool = False) -> None:
        self.plan = plan
        self.host = host or socket.gethostname().split(".")[0]
        self.run_id = run_id or new_run_id(self.host)
        self.run_dir = Path(report_dir) / self.run_id
        self.events = events or RunEvents()
        self.verbose = verbose
        self.report = NodeReport(run_id=self.run_id, host=self.host, profile=plan.profile,
                                 started=utc_now(), device=plan.device, argv=list(argv or []),
                                 version=__version__)
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def report_path(self) -> Path:
        return self.run_dir / "report.json"

    @property
    def results_path(self) -> Path:
        return self.run_dir / "results.jsonl"

    def _save(self) -> None:
        _write_json_atomic(self.report_path, self.report.to_dict())

    def run(self) -> NodeReport:
        """Run every planned check. Raises :class:`Interrupted` on SIGINT/SIGTERM."""
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._save()
        old_term = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
        try:
            total = len(self.plan.checks)
            for i, check in enumerate(self.plan.checks, 1):
                self.events.on_start(check, i, total)
                result = self._run_one(check)
                self.report.checks.append(result)
                _append_jsonl(self.results_path, result.to_dict())
                self._save()
                self.events.on_end(check, result)
        except KeyboardInterrupt:
            self._kill_child()
            self.report.verdict = Verdict.INTERRUPTED
            self.report.finished = utc_now()
            self._save()
            raise Interrupted(self.report, signal.SIGINT) from None
        finally:
            signal.signal(signal.SIGTERM, old_term)
        self.report.verdict = self.report.decide()
        self.report.finished = utc_now()
        self._save()
        return self.report

    def _kill_child(self) -> None:
        child = self._child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()

    def _request(self, check: PlannedCheck, out: Path) -> dict[str, Any]:
        return {
            "path": check.path,
            "out": str(out),
            "parent_pid": os.getpid(),
            "ctx": {
                "device": self.plan.device,
                "params": check.params,
                "gpus": self.plan.gpus,
                "require_gpu": self.plan.require_gpu,
                "expect_gpus": self.plan.expect_gpus,
                "timeout_s": check.timeout_s,
                "profile": self.plan.profile,
                "verbose": self.verbose,
            },
        }

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        out = self.run_dir / f".{check.name}.outcome.json"
        log = self.run_dir / "logs" / f"{check.name}.log"
        out.unlink(missing_ok=True)
        started = time.monotonic()
        with open(log, "wb") as log_fh:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "gpuaccept.child"],
                stdin=subprocess.PIPE, stdout=log_fh, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            assert self._child.stdin is not None
            self._child.stdin.write(json.dumps(self._request(check, out)).encode())
            self._child.stdin.close()
            try:
                returncode: int | None = self._child.wait(timeout=check.timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
                self._kill_child()
        elapsed = time.monotonic() - started
        self._child = None
        if returncode is None:
            return CheckResult(check.name, Status.FAIL,
                               f"timed out after {elapsed:.1f} s (limit {check.timeout_s:g} s); killed",
                               duration_s=elapsed, details={"timeout": True, "log": str(log)})
        try:
            raw = json.loads(out.read_text())
            out.unlink()
        except (OSError, ValueError):
            how = _signal_name(returncode) if returncode < 0 else f"exit code {returncode}"
            tail = _log_tail(log)
            return CheckResult(check.name, Status.ERROR,
                               f"check process died ({how}) without a result" + (f": {tail}" if tail else ""),
                               duration_s=elapsed, details={"log": str(log)})
        return self._judge(check, raw, elapsed)

    def _judge(self, check: PlannedCheck, raw: dict[str, Any], elapsed: float) -> CheckResult:
        try:
            outcome = Outcome(status=Status(raw["status"]), reason=str(raw.get("reason", "")),
                              metrics=[Metric.from_dict(m) for m in raw.get("metrics", [])],
                              details=dict(raw.get("details", {})), needs_gpu=bool(raw.get("needs_gpu")))
        except (KeyError, TypeError, ValueError) as exc:
            return CheckResult(check.name, Status.ERROR, f"malformed check result: {exc}", duration_s=elapsed)
        for m in outcome.metrics:
            if m.value is None or (isinstance(m.value, float) and math.isnan(m.value)):
                m.value = math.nan
        j = judge(outcome, check.defaults, check.overrides, require_gpu=self.plan.require_gpu)
        return CheckResult(check.name, j.status, j.reason, duration_s=elapsed, metrics=j.metrics,
                           details=outcome.details, host=self.host)
