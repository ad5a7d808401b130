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

from gpuaccept.health.plan import CHECKS
from gpuaccept.model import CheckResult, Status
from gpuaccept.node.budget import fmt_s
from gpuaccept.node.budget_run import WindowRunner
from gpuaccept.node.runner import DeadlineRunner
from gpuaccept.node.suite import PlannedCheck

FAULT_ENV = "GPUACCEPT_TEST_HEALTH_FAULT"
"""Tests only: ``CHECK[:REASON]`` turns that check's result into a FAIL after it ran (a broken node, for
the Slurm drain tests). Without the variable, or naming a check not in the run, nothing changes."""


def injected_fault(env: Mapping[str, str], check: str) -> str | None:
    """The injected reason for ``check`` from :data:`FAULT_ENV`, or None."""
    raw = env.get(FAULT_ENV, "")
    name, _, why = raw.partition(":")
    if not raw or name.strip() != check:
        return None
    return f"injected fault ({FAULT_ENV}): {why.strip() or 'test'}"


def with_fault(result: CheckResult, host: str) -> CheckResult:
    """``result``, or the FAIL :data:`FAULT_ENV` injects into it."""
    why = injected_fault(os.environ, result.name)
    if why is None:
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


class BudgetRunner(DeadlineRunner):
    """The fast plan: a :class:`DeadlineRunner` with :data:`FAULT_ENV`'s injected faults; what the deadline ends
    is :func:`budget_end`'s SKIP."""

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        cut = check.timeout_s > self.deadline - time.monotonic()
        return with_fault(budget_end(super()._run_one(check), cut), self.host)


class WindowHealthRunner(WindowRunner):
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
        return with_fault(budget_end(super()._run_one(check), cut), self.host)
