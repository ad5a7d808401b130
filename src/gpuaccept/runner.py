"""Runs a suite plan: one child process per check, a timeout each, results on disk as they come.

Files in ``<report_dir>/<run_id>/``:

- ``results.jsonl``: one CheckResult per line, appended and fsync'd as each check ends;
- ``report.json``: the NodeReport, rewritten atomically after each check (verdict
  ``running`` until the end), so a SIGKILL loses only the check in flight;
- ``logs/<check>.log``: the check's stdout and stderr.

A distributed check (a class with ``distributed = True``, see
:mod:`gpuaccept.distributed.group`) runs as ``nproc`` processes, one per GPU (two gloo
ranks on CPU), that meet on a c10d store rank 0 serves on a free loopback
port; their outcomes are merged into one result (``logs/<check>.rank<r>.log``).
With fewer than two ranks it is skipped. ``gpuaccept run --distributed``
uses :class:`gpuaccept.distributed.session.DistributedRunner` instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from gpuaccept import __version__
from gpuaccept.checks.base import Outcome
from gpuaccept.childproc import append_jsonl, died_reason, kill_tree, read_outcome
from gpuaccept.errors import UsageError
from gpuaccept.judge import judge
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Verdict
from gpuaccept.suite import PlannedCheck, SuitePlan


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


class Runner:
    """Executes a :class:`SuitePlan` and maintains the report files."""

    def __init__(self, plan: SuitePlan, report_dir: Path, *, run_id: str | None = None,
                 host: str | None = None, argv: list[str] | None = None,
                 events: RunEvents | None = None, verbose: bool = False,
                 nproc: int = 1, dist_timeout_s: float = 120.0) -> None:
        self.plan = plan
        self.nproc = nproc
        self.dist_timeout_s = dist_timeout_s
        self.host = host or os.environ.get("GPUACCEPT_HOSTNAME") or socket.gethostname().split(".")[0]
        self.run_id = run_id or new_run_id(self.host)
        self.run_dir = Path(report_dir) / self.run_id
        self.events = events or RunEvents()
        self.verbose = verbose
        self.report = NodeReport(run_id=self.run_id, host=self.host, profile=plan.profile,
                                 started=utc_now(), device=plan.device, argv=list(argv or []),
                                 version=__version__)
        self._children: list[subprocess.Popen[bytes]] = []

    @property
    def report_path(self) -> Path:
        return self.run_dir / "report.json"

    @property
    def results_path(self) -> Path:
        return self.run_dir / "results.jsonl"

    @property
    def log_dir(self) -> Path:
        """Where each check's log goes (``logs/<check>.log``)."""
        return self.run_dir / "logs"

    @property
    def scratch_dir(self) -> Path:
        """Where check processes drop their outcome files before the runner reads them."""
        return self.run_dir

    def _save(self) -> None:
        _write_json_atomic(self.report_path, self.report.to_dict())

    def prepare(self) -> None:
        """Create the run directory and the first report.json; UsageError when that is impossible."""
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._save()
        except OSError as exc:
            raise UsageError(f"cannot write the report directory {self.run_dir}: "
                             f"{exc.strerror or exc} (see --report-dir)") from None

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """While the suite runs, SIGTERM acts like Ctrl-C: either kills the check processes, saves the
        report as ``interrupted`` and raises :class:`Interrupted`."""
        old_term = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
        try:
            yield
        except KeyboardInterrupt:
            self._kill_child()
            self.report.verdict = Verdict.INTERRUPTED
            self.report.finished = utc_now()
            self._save()
            raise Interrupted(self.report, signal.SIGINT) from None
        finally:
            signal.signal(signal.SIGTERM, old_term)

    def run(self) -> NodeReport:
        """Run every planned check. Raises :class:`Interrupted` on SIGINT/SIGTERM."""
        self.prepare()
        with self.interruptible():
            total = len(self.plan.checks)
            for i, check in enumerate(self.plan.checks, 1):
                self.events.on_start(check, i, total)
                result = self._run_one(check)
                self.report.checks.append(result)
                append_jsonl(self.results_path, result.to_dict())
                self._save()
                self.events.on_end(check, result)
        self.report.verdict = self.report.decide()
        self.report.finished = utc_now()
        self._save()
        return self.report

    def _kill_child(self) -> None:
        """Kill every check process still running (and their process groups)."""
        for child in self._children:
            kill_tree(child)
        self._children = []

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

    def _spawn(self, check: PlannedCheck, out: Path, log: Path, *, env: dict[str, str] | None = None,
               module: str = "gpuaccept.child") -> subprocess.Popen[bytes]:
        """Start one check process in its own session, its output appended to ``log``."""
        out.unlink(missing_ok=True)
        with open(log, "ab") as log_fh:
            child = subprocess.Popen(
                [sys.executable, "-m", module],
                stdin=subprocess.PIPE, stdout=log_fh, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            )
        self._children.append(child)
        assert child.stdin is not None
        child.stdin.write(json.dumps(self._request(check, out)).encode())
        child.stdin.close()
        return child

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        if is_distributed(check):
            return self._run_group(check)
        out = self.scratch_dir / f".{check.name}.outcome.json"
        log = self.log_dir / f"{check.name}.log"
        log.unlink(missing_ok=True)
        started = time.monotonic()
        child = self._spawn(check, out, log)
        try:
            returncode: int | None = child.wait(timeout=check.timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
            self._kill_child()
        elapsed = time.monotonic() - started
        self._children = []
        if returncode is None:
            return CheckResult(check.name, Status.FAIL,
                               f"timed out after {elapsed:.1f} s (limit {check.timeout_s:g} s); killed",
                               duration_s=elapsed, details={"timeout": True, "log": str(log)})
        raw = read_outcome(out)
        if raw is None:
            return CheckResult(check.name, Status.ERROR, died_reason(returncode, log),
                               duration_s=elapsed, details={"log": str(log)})
        return self._judge(check, raw, elapsed)

    def _run_group(self, check: PlannedCheck) -> CheckResult:
        """A distributed check on this node: ``nproc`` rank processes, merged into one result."""
        from gpuaccept.distributed.local import run_local_group

        return run_local_group(self, check)

    def outcome_of(self, raw: dict[str, Any]) -> Outcome:
        """An Outcome from a check process's JSON (ValueError/KeyError/TypeError when malformed)."""
        outcome = Outcome(status=Status(raw["status"]), reason=str(raw.get("reason", "")),
                          metrics=[Metric.from_dict(m) for m in raw.get("metrics", [])],
                          details=dict(raw.get("details", {})), needs_gpu=bool(raw.get("needs_gpu")))
        for m in outcome.metrics:
            if m.value is None or (isinstance(m.value, float) and math.isnan(m.value)):
                m.value = math.nan
        return outcome

    #: (Baseline, rules) from ``--baseline``: its values become the metrics' expectations and bounds
    baseline: Any = None

    def judge_outcome(self, check: PlannedCheck, outcome: Outcome, elapsed: float) -> CheckResult:
        """Apply the plan's thresholds to ``outcome``; the result carries this runner's host.

        With a baseline, a metric's bound comes from the baseline (replacing the SKU bound); the
        user's config rules still win over it.
        """
        if self.baseline is not None:
            from gpuaccept.results.baseline_judge import overlay_baseline

            base, rules = self.baseline
            overlay_baseline(CheckResult(check.name, outcome.status, outcome.reason, metrics=outcome.metrics,
                                         details=outcome.details), self.report, base, rules)
        j = judge(outcome, check.defaults, check.overrides, require_gpu=self.plan.require_gpu)
        return CheckResult(check.name, j.status, j.reason, duration_s=elapsed, metrics=j.metrics,
                           details=outcome.details, host=self.host)

    def _judge(self, check: PlannedCheck, raw: dict[str, Any], elapsed: float) -> CheckResult:
        try:
            outcome = self.outcome_of(raw)
        except (KeyError, TypeError, ValueError) as exc:
            return CheckResult(check.name, Status.ERROR, f"malformed check result: {exc}", duration_s=elapsed)
        return self.judge_outcome(check, outcome, elapsed)


def is_distributed(check: PlannedCheck) -> bool:
    """Whether ``check`` runs as one process per rank (its class sets ``distributed = True``)."""
    from gpuaccept.checks import load_check

    return bool(getattr(load_check(check.path), "distributed", False))
