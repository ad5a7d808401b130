"""The healthcheck's runner: :class:`~gpuaccept.node.runner.DeadlineRunner`, one deadline for the
whole run, or with ``--budget`` the planned window's runner (a second pass included). Each check gets what
is left of the budget at most; a check the budget leaves no time for, or that the budget's end stops, is a
SKIP marked ``budget`` (:func:`budget_end`): the run then has no verdict on the node (never a silent pass,
never a fault by itself).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace

from gpuaccept.health.ladder import first_failure, ladder_reruns, ladder_result, verdict_after_reruns
from gpuaccept.health.plan import CHECKS
from gpuaccept.model import CheckResult, NodeReport, Status
from gpuaccept.node.budget import fmt_s
from gpuaccept.node.budget_run import WindowRunner
from gpuaccept.node.runner import DeadlineRunner
from gpuaccept.node.suite import PlannedCheck

FAULT_ENV = "GPUACCEPT_TEST_HEALTH_FAULT"
"""Tests only: ``CHECK[:REASON]`` turns that check's result into a FAIL after it ran (a broken node, for
the Slurm drain tests). Without the variable, or naming a check not in the run, nothing changes."""
FAULT_ONCE_ENV = "GPUACCEPT_TEST_HEALTH_FAULT_ONCE"
"""Tests only: set (to anything), :data:`FAULT_ENV`'s fault is injected into the first pass only, not a re-run
(a transient fault the ladder's re-run clears)."""


def injected_fault(env: Mapping[str, str], check: str) -> str | None:
    """The injected reason for ``check`` from :data:`FAULT_ENV`, or None."""
    raw = env.get(FAULT_ENV, "")
    name, _, why = raw.partition(":")
    if not raw or name.strip() != check:
        return None
    return f"injected fault ({FAULT_ENV}): {why.strip() or 'test'}"


def with_fault(result: CheckResult, host: str, rerun: bool = False) -> CheckResult:
    """``result``, or the FAIL :data:`FAULT_ENV` injects into it (not into a re-run with :data:`FAULT_ONCE_ENV`)."""
    why = injected_fault(os.environ, result.name)
    if why is None or (rerun and os.environ.get(FAULT_ONCE_ENV)):
        return result
    return CheckResult(result.name, Status.FAIL, why, duration_s=result.duration_s, metrics=result.metrics,
                       details=result.details, host=host)


def budget_end(result: CheckResult, cut: bool) -> CheckResult:
    """``result``, or a SKIP marked ``budget`` when the budget, not the node, ended it: not run for lack of time
    (the runner's "not run" FAIL), never started by the warm process before its limit (the runner's ERROR), or
    timed out at a limit the deadline had ``cut`` below the check's own (or, its clock started late, at the
    deadline itself: ``details.deadline``)."""
    if result.status is Status.FAIL and result.details.get("budget"):
        why = f"{result.reason}; not a fault of the node"
    elif result.status is Status.ERROR and result.details.get("not_started"):  # the warm process's fault
        why = result.reason
    elif result.details.get("timeout") and (cut or result.details.get("deadline")):
        why = (f"stopped at the end of the budget after {result.duration_s:.1f} s (below its own limit): not "
               "judged, not a fault of the node")
    else:
        return result
    return CheckResult(result.name, Status.SKIP, why, duration_s=result.duration_s,
                       details={**result.details, "budget": True}, host=result.host)


MIN_RERUN_S = 2.0
"""Seconds of the deadline a ladder re-run needs left to start."""


class LadderMixin(DeadlineRunner):
    """Re-runs, once, each first-pass failure whose fault says re-run first (:func:`~gpuaccept.health.ladder.
    ladder_reruns`), when the deadline leaves time; a re-run that passes clears the failure from the verdict."""

    _ladder: dict[int, str]

    def ladder_pass(self, already: list[PlannedCheck]) -> list[PlannedCheck]:
        self._ladder = getattr(self, "_ladder", {})
        names = {c.name for c in already}
        planned = {c.name: c for c in self.plan.checks}
        out = []
        for name in ladder_reruns(self.report.checks):
            if name in names or name not in planned or self.deadline - time.monotonic() < MIN_RERUN_S:
                continue
            check = replace(planned[name])
            self._ladder[id(check)] = name
            out.append(check)
        return out

    def ran(self, check: PlannedCheck, result: CheckResult) -> CheckResult:
        """``result`` marked as the ladder's re-run when ``check`` is one."""
        if id(check) not in getattr(self, "_ladder", {}):
            return result
        return ladder_result(result, first_failure(self.report.checks, check.name))

    def run(self) -> NodeReport:
        report = super().run()
        verdict = verdict_after_reruns(report, self.inventory_checks())
        if verdict is not report.verdict:
            report.verdict = verdict
            self._save()
        return report


class BudgetRunner(LadderMixin):
    """The fast plan: a :class:`DeadlineRunner` with :data:`FAULT_ENV`'s injected faults and the ladder's re-runs;
    what the deadline ends is :func:`budget_end`'s SKIP."""

    def second_pass(self) -> list[PlannedCheck]:
        return self.ladder_pass([])

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        cut = check.timeout_s > self.deadline - time.monotonic()
        rerun = id(check) in getattr(self, "_ladder", {})
        return self.ran(check, with_fault(budget_end(super()._run_one(check), cut), self.host, rerun))


class WindowHealthRunner(WindowRunner, LadderMixin):
    """``--budget``: the planned window with its second pass (:class:`~gpuaccept.node.budget_run.WindowRunner`) and
    :data:`FAULT_ENV`'s injected faults. An extra (not one of the four checks) that the window no longer has
    its estimated time for is a SKIP, not a FAIL: the plan chose it, not the node."""

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        if check.name not in CHECKS and id(check) not in self._reruns:
            need = next((k.estimate_s for k in self.budget.kept if k.name == check.name), 0.0)
            left = self.deadline - time.monotonic()
            if need > left:
                return CheckResult(check.name, Status.SKIP, f"left out: ~{fmt_s(need)} estimated, "
                                   f"{fmt_s(left, up=False)} of the budget left (an extra, not a fault)",
                                   details={"budget": True}, host=self.host)
        cut = check.timeout_s > self.deadline - time.monotonic()
        rerun = id(check) in self._reruns or id(check) in getattr(self, "_ladder", {})
        return self.ran(check, with_fault(budget_end(super()._run_one(check), cut), self.host, rerun))

    def second_pass(self) -> list[PlannedCheck]:
        deeper = super().second_pass()
        return deeper + self.ladder_pass(deeper)
