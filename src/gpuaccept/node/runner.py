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
uses :class:`gpuaccept.node.distributed_run.DistributedRunner` instead.

Check and rank processes are forked from one warm process that imported torch once for the run
(:mod:`gpuaccept.node.zygote`, :mod:`gpuaccept.node.warm`; what it prints goes to ``logs/zygote.log``). Where
fork is not used (``GPUACCEPT_ZYGOTE=0``, not Linux) or the warm process cannot start or dies,
each starts as a fresh ``python -m gpuaccept.node.child`` the old way, with the same guarantees. The modules
a check names in ``warm_imports`` are imported by the warm process before its fork, or earlier: right
after forking a check whose class sets ``imports_beside`` (one busy CPU core changes nothing it
measures: ``env``, ``health``, ``fabric``), the runner asks it to import the later checks' modules
beside that check (:meth:`Runner.preload_beside`); a check whose modules were imported that way says so
in ``details.preloaded`` of its result.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from gpuaccept import __version__
from gpuaccept.argtypes import check_run_id, host_part
from gpuaccept.checks.base import Outcome
from gpuaccept.errors import ReportWriteError, UsageError
from gpuaccept.faults import with_fault
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Verdict
from gpuaccept.node.childproc import (
    OUTCOME_WRITE_FAILED,
    CheckProcess,
    append_jsonl,
    died_reason,
    kill_tree,
    read_outcome,
    spawn_fresh,
    wait_check,
    write_json_atomic,
)
from gpuaccept.node.judge import NO_EXPECTATION, WARNED_FOR, judge
from gpuaccept.node.suite import (
    PlannedCheck,
    SuitePlan,
    child_env,
    imports_beside,
    is_distributed,
    measures,
    warm_imports,
)
from gpuaccept.node.warm import ForkedChild, Preload, WarmGone, WarmHung, WarmPoisoned, WarmProcess, warm_disabled


class Interrupted(Exception):
    """The run was stopped by SIGINT, SIGTERM or SIGHUP; the report holds what was measured."""

    def __init__(self, report: NodeReport, signum: int) -> None:
        self.report = report
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


MAX_HOST = 200
"""Characters of a host name that a run id (a directory name, at most 255 bytes) holds."""


def new_run_id(host: str) -> str:
    """``20261122T101500Z-node17-3fa2``: sortable, host-attributed, unique enough. UsageError for a host name that
    cannot be part of a directory name (over :data:`MAX_HOST` characters, or other than letters, digits, '.', '_',
    '-')."""
    if not host or len(host) > MAX_HOST or not all(c.isascii() and (c.isalnum() or c in "._-") for c in host) \
            or host.startswith("."):
        shown = host if len(host) <= 40 else f"{host[:40]}... ({len(host)} characters)"
        raise UsageError(f"host name {shown!r} cannot name a report directory (at most {MAX_HOST} letters, digits, "
                         "'.', '_' or '-'): set GPUACCEPT_HOSTNAME to a shorter plain name")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{host_part(host, 63)}-{uuid.uuid4().hex[:4]}"


@dataclass
class RunEvents:
    """Callbacks for progress display. Each defaults to doing nothing."""

    on_start: Callable[[PlannedCheck, int, int], None] = lambda check, i, n: None
    on_end: Callable[[PlannedCheck, CheckResult], None] = lambda check, result: None

    @classmethod
    def of(cls, display: Any) -> RunEvents:
        """The events of a display with ``on_start`` and ``on_end`` methods (the consoles of
        :mod:`gpuaccept.report.console`)."""
        return cls(on_start=display.on_start, on_end=display.on_end)


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data, indent=2)


#: signals that stop a run the way Ctrl-C does: SIGTERM (a scheduler) and SIGHUP (a closed ssh session)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def writing(path: Path, report: NodeReport | None = None) -> Iterator[None]:
    """Turns an OSError while writing ``path`` into :class:`ReportWriteError` (the environment's fault)."""
    try:
        yield
    except OSError as exc:
        raise ReportWriteError(f"cannot write {path}: {exc.strerror or exc}", report, exc) from None


def cpu_only_of(plan: SuitePlan, requested_device: str) -> str:
    """Why a cpu run uses no GPU, from the PCI bus under the env check's ``pci_root`` (``/`` without one);
    the env check's own reason, which also knows NVML and torch, replaces it when env ends."""
    from gpuaccept.hw.pcigpu import cpu_only_reason, read_bus_gpus

    root = next((str(c.params.get("pci_root", "/")) for c in plan.checks if c.name == "env"), "/")
    return cpu_only_reason(read_bus_gpus(root), os.environ, requested_device)


def this_host() -> str:
    """The host name reports carry: ``$GPUACCEPT_HOSTNAME``, else the short host name, made safe for a run id
    and a file name (:func:`gpuaccept.argtypes.host_part`: ``gpu node#1`` -> ``gpu-node-1``)."""
    return host_part(os.environ.get("GPUACCEPT_HOSTNAME") or socket.gethostname().split(".")[0])


class Runner:
    """Executes a :class:`SuitePlan` and maintains the report files."""

    def __init__(self, plan: SuitePlan, report_dir: Path, *, run_id: str | None = None,
                 host: str | None = None, argv: list[str] | None = None,
                 events: RunEvents | None = None, verbose: bool = False,
                 nproc: int = 1, dist_timeout_s: float = 120.0, warm: bool | WarmProcess | None = None,
                 requested_device: str = "auto") -> None:
        self.plan = plan
        self.nproc = nproc
        self.dist_timeout_s = dist_timeout_s
        self.host = host_part(host) if host else this_host()
        self.run_id = run_id or new_run_id(self.host)
        try:
            check_run_id(self.run_id)
        except ValueError as exc:
            raise UsageError(f"--run-id {exc}") from None
        self.run_dir = Path(report_dir) / self.run_id
        self.events = events or RunEvents()
        self.verbose = verbose
        self.report = NodeReport(run_id=self.run_id, host=self.host, profile=plan.profile,
                                 started=utc_now(), device=plan.device, argv=list(argv or []),
                                 version=__version__)
        if plan.device == "cpu":  # say so from the start: a CPU-only SUCCESS is never a GPU acceptance
            self.report.cpu_only = cpu_only_of(plan, requested_device)
        self._children: list[CheckProcess] = []
        #: why check processes start the old way (None: forked from the warm process); ``warm``: True or
        #: False forces it on or off, None leaves it to GPUACCEPT_ZYGOTE, a WarmProcess is used (and closed)
        self.warm_off: str | None = "turned off" if warm is False else (None if warm else warm_disabled())
        self.warm: WarmProcess | None = warm if isinstance(warm, WarmProcess) else None
        #: modules the warm process was asked to import (at a fork or beside a check): each asked for once
        self.warm_asked: set[str] = set()
        #: what was preloaded beside which check (:meth:`preload_beside`), in order
        self.preloads: list[Preload] = []
        #: why processes start fresh since the warm process was lost (not when it is off by choice)
        self.fresh_why: str | None = None
        #: the processes started for the check in flight
        self._spawned: list[CheckProcess] = []

    @property
    def run_deadline(self) -> float | None:
        """No check runs past this ``time.monotonic()`` value (:class:`DeadlineRunner`'s deadline); None: no bound."""
        return None

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
        with writing(self.report_path, self.report):
            _write_json_atomic(self.report_path, self.report.to_dict())

    def _append(self, result: CheckResult) -> None:
        """One line of results.jsonl (ReportWriteError when the disk refuses it)."""
        with writing(self.results_path, self.report):
            append_jsonl(self.results_path, result.to_dict())

    def refuse_reused_run_id(self) -> None:
        """UsageError when this run id already has results: two runs would interleave their lines."""
        for name in ("results.jsonl", "report.json"):
            if (self.run_dir / name).exists():
                raise UsageError(f"run id {self.run_id} already has results in {self.run_dir}; "
                                 "choose another --run-id (or none)")

    def prepare(self) -> None:
        """Create the run directory and the first report.json; UsageError when that is impossible
        (ReportWriteError when the disk is full)."""
        self.refuse_reused_run_id()
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._save()
        except ReportWriteError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise UsageError(f"cannot write the report directory {self.run_dir}: {exc.strerror} "
                             "(see --report-dir)") from None
        except OSError as exc:
            raise UsageError(f"cannot write the report directory {self.run_dir}: "
                             f"{exc.strerror or exc} (see --report-dir)") from None
        self.start_warm()

    @property
    def warm_log(self) -> Path:
        return self.log_dir / "zygote.log"

    def start_warm(self) -> None:
        """Start the warm process (once), unless it is off here; it imports torch while the run goes on."""
        if self.warm is not None or self.warm_off is not None:
            return
        try:
            self.warm = WarmProcess()
        except OSError as exc:
            self._warm_lost(f"cannot start the warm process: {exc.strerror or exc}")

    def _warm_lost(self, why: str) -> None:
        self.warm_off = self.fresh_why = why
        print(f"gpuaccept: {why}; the remaining checks start in fresh interpreters (slower, same results)",
              file=sys.stderr, flush=True)

    def close_warm(self) -> None:
        """End the warm process; what it printed, if anything, goes to ``logs/zygote.log``."""
        if self.warm is None:
            return
        self.warm.close()
        if self.log_dir.is_dir():
            self.warm.save_output(self.warm_log)
        self.warm = None

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """While the suite runs, SIGTERM and SIGHUP act like Ctrl-C: each kills the check processes,
        saves the report as ``interrupted`` and raises :class:`Interrupted`. A report that cannot be
        written kills the check processes and lets :class:`ReportWriteError` through."""
        caught = [int(signal.SIGINT)]
        old = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def on_stop(signum: int, frame: FrameType | None) -> None:
            caught[0] = signum
            raise KeyboardInterrupt

        for sig in STOP_SIGNALS:
            signal.signal(sig, on_stop)
        try:
            yield
        except KeyboardInterrupt:
            self.kill_children()
            self.report.verdict = Verdict.INTERRUPTED
            self.report.finished = utc_now()
            self._save()
            raise Interrupted(self.report, caught[0]) from None
        except ReportWriteError as exc:
            self.kill_children()
            exc.report = self.report
            raise
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def run(self) -> NodeReport:
        """Run every planned check. Raises :class:`Interrupted` on SIGINT/SIGTERM/SIGHUP and
        :class:`ReportWriteError` when the report directory refuses a write."""
        try:
            self.prepare()
            with self.interruptible():
                total = len(self.plan.checks)
                for i, check in enumerate(self.plan.checks, 1):
                    self._run_recorded(check, i, total)
                more = self.second_pass()
                for i, check in enumerate(more, 1):
                    self._run_recorded(check, total + i, total + len(more))
                self.report.verdict = self.report.decide(self.inventory_checks())
                self.report.finished = utc_now()
                self._save()
        finally:
            self.close_warm()
        return self.report

    def _run_recorded(self, check: PlannedCheck, i: int, total: int) -> None:
        """Run ``check`` (number ``i`` of ``total``) and record its result as it ends."""
        self.events.on_start(check, i, total)
        self.report.in_flight = check.name
        self._save()
        result = with_fault(self._run_one(check))
        self.report.checks.append(result)
        if self.plan.device == "cpu" and isinstance(result.details.get("cpu_only"), str):
            self.report.cpu_only = result.details["cpu_only"]  # env's reason knows what NVML and torch saw
        self.report.in_flight = None
        self._append(result)
        self._save()
        self.events.on_end(check, result)

    def second_pass(self) -> list[PlannedCheck]:
        """Checks to run after the plan's, chosen from its results (``run --budget``'s deeper re-runs,
        :mod:`gpuaccept.node.budget_run`). Default: none."""
        return []

    def inventory_checks(self) -> set[str]:
        """Names of the planned checks that only take stock (see :meth:`NodeReport.decide`)."""
        return {c.name for c in self.plan.checks if not measures(c)}

    def outcome_not_written(self, check: PlannedCheck, returncode: int | None) -> None:
        """Called when a check process left no outcome file: ReportWriteError when the report
        directory is to blame (the process said it could not write, or the directory refuses a small
        write now), so that a full disk is never recorded as an error of the node."""
        why = ""
        if returncode == OUTCOME_WRITE_FAILED:
            why = "the check process could not write its result"
        else:
            probe = self.scratch_dir / ".write-probe"
            try:
                with open(probe, "wb") as fh:
                    fh.write(b"\0" * 4096)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:
                why = f"the check process left no result and {self.scratch_dir} refuses writes ({exc.strerror})"
            finally:
                with contextlib.suppress(OSError):
                    probe.unlink()
        if why:
            raise ReportWriteError(f"{check.name}: {why} under {self.scratch_dir} (disk full or read-only?)",
                                   self.report)

    def kill_children(self) -> None:
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

    def spawn(self, check: PlannedCheck, out: Path, log: Path, *, env: dict[str, str] | None = None,
               module: str = "gpuaccept.node.child") -> CheckProcess:
        """Start one check process in its own session, its output appended to ``log``: forked from the
        warm process, or (where it is off or gone) a fresh interpreter."""
        out.unlink(missing_ok=True)
        request = self._request(check, out)
        env = child_env(check, os.environ if env is None else env)
        child: CheckProcess | None = None
        if self.warm is not None:
            try:
                imports = warm_imports(check)
                child = self.warm.spawn(module, request, env, log, imports)
                self.warm_asked.update(imports)
            except WarmGone as exc:
                self._warm_lost(str(exc) if isinstance(exc, WarmPoisoned) else f"the warm process is gone ({exc})")
                self.close_warm()
        if child is None:
            child = spawn_fresh(module, request, env, log)
        self._children.append(child)
        self._spawned.append(child)
        return child

    def preload_beside(self, check: PlannedCheck) -> None:
        """Called right after ``check``'s processes were forked: when its class sets ``imports_beside``, ask
        the warm process to import the later checks' ``warm_imports`` now, while ``check`` runs (once each).
        Never beside a check that measures something a busy CPU core changes."""
        if self.warm is None or not imports_beside(check):
            return
        names = [c.name for c in self.plan.checks]
        later = self.plan.checks[names.index(check.name) + 1:] if check.name in names else []
        modules = list(dict.fromkeys(m for c in later for m in warm_imports(c) if m not in self.warm_asked))
        asked = self.warm.preload(modules, check.name) if modules else None
        if asked is not None:
            self.warm_asked.update(modules)
            self.preloads.append(asked)

    def preload_note(self, check: PlannedCheck, result: CheckResult) -> CheckResult:
        """``result`` with ``details.preloaded`` (modules, the check they were imported beside, the seconds of
        that preload, what failed) when some of ``check``'s ``warm_imports`` were preloaded."""
        wanted = warm_imports(check)
        for asked in self.preloads:
            if wanted and set(wanted) & set(asked.modules):
                result.details = {**result.details, "preloaded": asked.note(wanted)}
                break
        return result

    def died_reason(self, child: CheckProcess, log: Path) -> str:
        """Why ``child`` left no result (its status, its log's tail, and the warm process if that died)."""
        code = child.returncode if child.returncode is not None else -9
        why = died_reason(code, log)
        if isinstance(child, ForkedChild) and child.lost_with_warm:
            why += f"; killed with the warm process it was forked from: {child.warm.gone}"
        return why

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        self._spawned = []
        result = self._run_group(check) if is_distributed(check) else self._run_process(check)
        return self.fresh_note(self.preload_note(check, result))

    def fresh_note(self, result: CheckResult) -> CheckResult:
        """``result`` with ``details.fresh_process`` when its processes started in a fresh interpreter although
        the warm process was to fork them (it was lost, or refused: a fork could not use CUDA); and, once the
        warm process said it cannot fork safely, that warm process closed and the reason printed."""
        why = {c.refused for c in self._spawned if isinstance(c, ForkedChild) and c.refused is not None}
        if self.fresh_why is not None and any(not isinstance(c, ForkedChild) for c in self._spawned):
            why.add(self.fresh_why)
        if self.warm is not None and self.warm.poisoned is not None:
            self._warm_lost(f"the warm process cannot fork safely: {self.warm.poisoned}")
            self.close_warm()
        if why:
            result.details = {**result.details, "fresh_process": "; ".join(sorted(why))}
        return result

    def _run_process(self, check: PlannedCheck) -> CheckResult:
        """``check`` in one process (forked from the warm process, or a fresh interpreter), judged. Its time limit
        counts from its :meth:`~gpuaccept.node.childproc.CheckProcess.clock_start`: not while the warm process is
        still in its first imports."""
        out = self.scratch_dir / f".{check.name}.outcome.json"
        log = self.log_dir / f"{check.name}.log"
        log.unlink(missing_ok=True)
        asked = time.monotonic()
        child = self.spawn(check, out, log)
        self.preload_beside(check)
        fallback = warm_why = when = ""
        clock: float | None = None
        try:
            try:
                returncode: int | None = wait_check(child, check.timeout_s, self.run_deadline)
            except WarmHung as exc:  # not the check's fault: start it afresh with the time it has left
                clock = child.clock_start()
                fallback = self._warm_hung(str(exc))
                left = check.timeout_s if clock is None else max(check.timeout_s - (time.monotonic() - clock), 0.1)
                child = self.spawn(check, out, log)
                returncode = wait_check(child, left, self.run_deadline)
        except subprocess.TimeoutExpired:
            returncode = None
            warm_why = child.not_forked_why() if isinstance(child, ForkedChild) else ""
            when = f"before its {check.timeout_s:g} s limit" if child.clock_start() else "when the run's deadline came"
            self.kill_children()
        clock = next((t for t in (clock, child.clock_start()) if t is not None), asked)
        elapsed = time.monotonic() - clock
        self._children = []
        if returncode is None and warm_why:
            return CheckResult(check.name, Status.ERROR, f"not run: {warm_why} {when}, and was killed (a fault of "
                               "gpuaccept's warm process, not known to be the node's)", duration_s=elapsed,
                               details={"warm_process": warm_why, "not_started": True, "log": str(log)},
                               host=self.host)
        if returncode is None:  # ``deadline``: the run's deadline came before the check's own limit
            cut = self.run_deadline is not None and clock + check.timeout_s > self.run_deadline + 0.5
            result = CheckResult(check.name, Status.FAIL, f"timed out after {elapsed:.1f} s (limit {check.timeout_s:g}"
                                 f" s{', cut by the run deadline' if cut else ''}); killed", duration_s=elapsed,
                                 details={"timeout": True, "log": str(log), **({"deadline": True} if cut else {})})
        else:
            result = self._finish_process(check, child, out, log, returncode, elapsed)
        if fallback:
            result.details = {**result.details, "warm_process": fallback}
        return result

    def _warm_hung(self, why: str) -> str:
        """The warm process did not answer a fork request: stop it; the rest start the old way. Returns what
        the check's details say of it."""
        if self.warm is not None:
            self.warm.stop(why)
        self._children = []
        self._warm_lost(why)
        self.close_warm()
        return f"{why}; started afresh instead"

    def _finish_process(self, check: PlannedCheck, child: CheckProcess, out: Path, log: Path, returncode: int,
                        elapsed: float) -> CheckResult:
        """The result of a check process that ended: its outcome judged, or an ERROR saying why it left none."""
        raw = read_outcome(out)
        if raw is None:
            self.outcome_not_written(check, returncode)
            return CheckResult(check.name, Status.ERROR, self.died_reason(child, log),
                               duration_s=elapsed, details={"log": str(log)})
        return self._judge(check, raw, elapsed)

    def _run_group(self, check: PlannedCheck) -> CheckResult:
        """A distributed check on this node: ``nproc`` rank processes, merged into one result."""
        from gpuaccept.node.local_group import run_local_group

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
        j = judge(outcome, check.defaults, check.overrides, require_gpu=self.plan.require_gpu,
                  device=self.plan.device, check=check.name)
        details = {**outcome.details, WARNED_FOR: NO_EXPECTATION} if j.only_unjudged else outcome.details
        return CheckResult(check.name, j.status, j.reason, duration_s=elapsed, metrics=j.metrics,
                           details=details, host=self.host)

    def _judge(self, check: PlannedCheck, raw: dict[str, Any], elapsed: float) -> CheckResult:
        try:
            outcome = self.outcome_of(raw)
        except (KeyError, TypeError, ValueError) as exc:
            return CheckResult(check.name, Status.ERROR, f"malformed check result: {exc}", duration_s=elapsed)
        return self.judge_outcome(check, outcome, elapsed)


MIN_SLICE_S = 1.0
"""A check is not started with less than this left before a :class:`DeadlineRunner`'s deadline."""


class DeadlineRunner(Runner):
    """A :class:`Runner` whose checks all end by ``deadline`` (a ``time.monotonic()`` value): each gets what
    is left at most, and a check the deadline leaves no time for is a FAIL ("not run"), never a silent pass."""

    def __init__(self, plan: SuitePlan, report_dir: Path, *, deadline: float, **kwargs: Any) -> None:
        super().__init__(plan, report_dir, **kwargs)
        self.deadline = deadline

    @property
    def run_deadline(self) -> float | None:
        return self.deadline

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        left = self.deadline - time.monotonic()
        if left < MIN_SLICE_S:
            return CheckResult(check.name, Status.FAIL, f"not run: the budget was spent ({left:.1f} s left)",
                               details={"budget": True}, host=self.host)
        if check.timeout_s > left:
            check = replace(check, timeout_s=round(left, 1))
        return super()._run_one(check)
