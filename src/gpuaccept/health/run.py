"""The healthcheck's runner: :class:`~gpuaccept.runner.DeadlineRunner`, one deadline for the
whole run. Each check gets what is left of the budget at most; a check the budget leaves no time for
is a FAIL ("not run"), never a silent pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuaccept.model import CheckResult, Status
from gpuaccept.runner import DeadlineRunner
from gpuaccept.suite import PlannedCheck

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


class BudgetRunner(DeadlineRunner):
    """A :class:`DeadlineRunner` with :data:`FAULT_ENV`'s injected faults."""

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        result = super()._run_one(check)
        why = injected_fault(os.environ, check.name)
        if why is not None:
            result = CheckResult(check.name, Status.FAIL, why, duration_s=result.duration_s, metrics=result.metrics,
                                 details=result.details, host=self.host)
        return result
