"""A check's time limit counts from when its process can start (:meth:`ForkedChild.clock_start`): not while the
warm process is still in its first imports (torch's). Those imports are made slow here by a plugin that sleeps
at its import in the warm process only (tests/plugins/slow_first_import.py), longer than the check's limit.

Real processes throughout: the warm process, its forks, fresh interpreters.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import gpuaccept.node.warm as warm_mod
from gpuaccept.checks.base import Check
from gpuaccept.health.run import budget_end
from gpuaccept.model import Status
from gpuaccept.node.config import Config
from gpuaccept.node.local_group import wait_ranks
from gpuaccept.node.runner import DeadlineRunner, Runner
from gpuaccept.node.suite import RunOptions, plan_suite
from gpuaccept.node.warm import WarmProcess
from tests.helpers import ROOT
from tests.plugins import fake_checks, state_checks

REG: dict[str, type[Check]] = {c.name: c for c in (*fake_checks.CHECKS, *state_checks.CHECKS)}


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("GPUACCEPT_ZYGOTE", raising=False)


def _slow_warm(tmp_path: Path, seconds: float) -> WarmProcess:
    """A warm process whose first imports take ``seconds`` more; returns once its slow import has begun."""
    stamp = tmp_path / "slow-import.started"
    env = {**os.environ, "GPUACCEPT_PLUGINS": "tests.plugins.slow_first_import",
           "GPUACCEPT_TEST_SLOW_IMPORT_S": str(seconds), "GPUACCEPT_TEST_SLOW_IMPORT_STAMP": str(stamp)}
    warm = WarmProcess(env)
    deadline = time.monotonic() + 120
    while not stamp.exists():  # torch is imported before the plugins: wait for the sleep itself
        assert time.monotonic() < deadline and warm.proc.poll() is None, "the slow import never began"
        time.sleep(0.05)
    return warm


def _plan(checks: list[str], timeout_s: float, seconds: float = 0.0):  # type: ignore[no-untyped-def]
    plan = plan_suite(RunOptions(checks=checks), Config(), {n: REG[n] for n in checks}, "cpu")
    for c in plan.checks:
        c.timeout_s = timeout_s
        if c.name == "nap":
            c.params["seconds"] = seconds
    return plan


def test_a_slow_first_import_does_not_time_out_a_check_that_waits_for_it(tmp_path: Path) -> None:
    """probe's limit is 3 s; the warm process's first imports take 8 s more after it was asked for: probe is
    forked once they are done, passes, and its duration counts from then."""
    warm = _slow_warm(tmp_path, 8)
    asked = time.monotonic()
    report = Runner(_plan(["probe"], 3.0), tmp_path, host="testhost", warm=warm).run()
    probe = report.checks[0]
    assert probe.status is Status.PASS, probe.reason
    assert "gpuaccept.node.zygote" in probe.details["parent"], "forked by the warm process, not started afresh"
    assert warm.ready_at is not None and warm.ready_at - asked > 5, "the first imports outlasted the limit"
    assert probe.duration_s < 3.0


def test_a_first_import_that_hangs_is_given_up_on_and_the_check_starts_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for the warm process's own imports is bounded (BUSY_S, 2 s here): then the warm process counts as
    hung, is killed, and the check runs in a fresh interpreter with its whole limit."""
    monkeypatch.setattr(warm_mod, "BUSY_S", 2.0)
    warm = _slow_warm(tmp_path, 600)
    started = time.monotonic()
    probe, probe2 = Runner(_plan(["probe", "probe2"], 60.0), tmp_path, host="testhost", warm=warm).run().checks
    assert probe.status is Status.PASS, probe.reason
    assert "gpuaccept.node.zygote" not in probe.details["parent"]
    assert f"the warm process (pid {warm.proc.pid}) was still in its first imports (torch) 2 s after the check " \
           "was asked for; started afresh instead" == probe.details["warm_process"]
    assert probe2.status is Status.PASS and "gpuaccept.node.zygote" not in probe2.details["parent"]
    assert warm.proc.poll() is not None, "the hung warm process was killed"
    assert time.monotonic() - started < 40


def test_the_run_deadline_still_bounds_a_check_waiting_for_the_first_imports(tmp_path: Path) -> None:
    """Under a deadline (``run --budget``, ``healthcheck``) a check still waiting for the warm process's first
    imports when the deadline comes is not run: an ERROR that blames the warm process, never a PASS, and never a
    timeout of the check; the healthcheck makes it a SKIP of the budget."""
    warm = _slow_warm(tmp_path, 600)
    started = time.monotonic()
    runner = DeadlineRunner(_plan(["probe"], 60.0), tmp_path, host="testhost", warm=warm, deadline=started + 4)
    probe = runner.run().checks[0]
    assert time.monotonic() - started < 4 + 10
    assert probe.status is Status.ERROR and probe.details["not_started"], probe.reason
    assert probe.reason.startswith(f"not run: the warm process (pid {warm.proc.pid}) was still in its first "
                                   "imports (torch) when the run's deadline came"), probe.reason
    assert budget_end(probe, cut=False).status is Status.SKIP


def test_a_check_forked_late_and_stopped_by_the_deadline_says_so(tmp_path: Path) -> None:
    """nap (limit 20 s) is forked after 5 s of first imports and stopped by the deadline (at 9 s) before its own
    limit: a timeout marked ``deadline``, which the healthcheck does not count as a fault of the node."""
    warm = _slow_warm(tmp_path, 5)
    started = time.monotonic()
    runner = DeadlineRunner(_plan(["nap"], 20.0, seconds=60), tmp_path, host="testhost", warm=warm,
                            deadline=started + 9)
    nap = runner.run().checks[0]
    assert time.monotonic() - started < 9 + 10
    assert nap.status is Status.FAIL and nap.details["timeout"] and nap.details["deadline"], nap.details
    assert "cut by the run deadline" in nap.reason and nap.duration_s < 9
    assert budget_end(nap, cut=False).status is Status.SKIP


def test_rank_processes_count_their_limit_from_their_fork(tmp_path: Path) -> None:
    """A distributed check's rank processes (:func:`wait_ranks`): the limit (3 s) counts from when the last of them
    could start, not while the warm process was still in its first imports (8 s more)."""
    warm = _slow_warm(tmp_path, 8)
    runner = Runner(_plan(["probe"], 3.0), tmp_path, host="testhost", warm=warm)
    runner.prepare()
    try:
        outs = {r: tmp_path / f"rank{r}.outcome.json" for r in (0, 1)}
        procs = {r: runner.spawn(runner.plan.checks[0], outs[r], tmp_path / f"rank{r}.log") for r in (0, 1)}
        assert wait_ranks(procs, 3.0, 10.0, lambda r: outs[r].exists()) == {}
        assert all(o.exists() for o in outs.values()) and warm.ready is not None
    finally:
        runner.close_warm()


def test_rank_processes_the_warm_process_never_forks_are_killed_after_busy_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm_mod, "BUSY_S", 2.0)
    warm = _slow_warm(tmp_path, 600)
    runner = Runner(_plan(["probe"], 60.0), tmp_path, host="testhost", warm=warm)
    runner.prepare()
    try:
        outs = {r: tmp_path / f"rank{r}.outcome.json" for r in (0, 1)}
        procs = {r: runner.spawn(runner.plan.checks[0], outs[r], tmp_path / f"rank{r}.log") for r in (0, 1)}
        started = time.monotonic()
        killed = wait_ranks(procs, 60.0, 10.0, lambda r: outs[r].exists())
        assert time.monotonic() - started < 10
        assert sorted(killed) == [0, 1] and all(
            why.startswith("not started: the warm process was still in its first imports") for why in killed.values())
    finally:
        runner.close_warm()
