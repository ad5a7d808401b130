"""The healthcheck's runner: the ordinary :class:`~gpuaccept.runner.Runner` with one deadline for the
whole run. Each check gets what is left of the budget at most; a check the budget leaves no time for
is a FAIL ("not run"), never a silent pass.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuaccept.model import CheckResult, Status
from gpuaccept.runner import Runner
from gpuaccept.suite import PlannedCheck, SuitePlan

FAULT_ENV = "GPUACCEPT_TEST_HEALTH_FAULT"
"""Tests only: ``CHECK[:REASON]`` turns that check's result into a FAIL after it ran (a broken node, for
the Slurm drain tests). Without the variable, or naming a check not in the run, nothing changes."""
MIN_SLICE_S = 1.0
"""A check is not started with less than this left of the budget."""


def injected_fault(env: Mapping[str, str], check: str) -> str | None:
    """The injected reason for ``check`` from :data:`FAULT_ENV`, or None."""
    raw = env.get(FAULT_ENV, "")
    name, _, why = raw.partition(":")
    if not raw or name.strip() != check:
        return None
    return f"injected fault ({FAULT_ENV}): {why.strip() or 'test'}"


class BudgetRunner(Runner):
    """A :class:`Runner` whose checks all end by ``deadline`` (a ``time.monotonic()`` value)."""

    def __init__(self, plan: SuitePlan, report_dir: Path, *, deadline: float, **kwargs: Any) -> None:
        super().__init__(plan, report_dir, **kwargs)
        self.deadline = deadline

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        left = self.deadline - time.monotonic()
        if left < MIN_SLICE_S:
            return CheckResult(check.name, Status.FAIL, f"not run: the budget was spent ({left:.1f} s left)",
                               details={"budget": True}, host=self.host)
        if check.timeout_s > left:
            check = replace(check, timeout_s=round(left, 1))
        result = super()._run_one(check)
        why = injected_fault(os.environ, check.name)
        if why is not None:
            result = CheckResult(check.name, Status.FAIL, why, duration_s=result.duration_s, metrics=result.metrics,
                                 details=result.details, host=self.host)
        return result
