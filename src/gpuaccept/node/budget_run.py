"""``gpuaccept run --budget``'s runner: the first pass under one deadline, then deeper re-runs of what was
suspect (:func:`gpuaccept.node.budget.plan_reruns`) with what is left of the window.

A re-run is a second result under the check's name, after the first pass's; its ``details.rerun`` says
at which level, why, and how the first pass ended, and its reason starts with ``deeper re-run``. The
report's ``budget`` holds the plan, what was left out and the second pass's choices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuaccept.checks.base import Check
from gpuaccept.model import CheckResult
from gpuaccept.node.budget import BudgetPlan, Candidate, Rerun, fmt_s, plan_reruns, timeout_for
from gpuaccept.node.config import Config
from gpuaccept.node.runner import DeadlineRunner
from gpuaccept.node.suite import PlannedCheck, SuitePlan

MARGIN_S = 1.0
"""Seconds of the window the second pass leaves unplanned (writing the report)."""


class WindowRunner(DeadlineRunner):
    """A :class:`DeadlineRunner` for ``run --budget``: the report records the plan, and a second pass runs
    suspect checks again, deeper, within the window. ``say`` shows one line (the console's)."""

    def __init__(self, plan: SuitePlan, report_dir: Path, *, deadline: float, budget: BudgetPlan,
                 candidates: Sequence[Candidate], registry: dict[str, type[Check]], config: Config,
                 timeout_scale: float = 1.0, say: Callable[[str], None] = lambda line: None, **kwargs: Any) -> None:
        super().__init__(plan, report_dir, deadline=deadline, **kwargs)
        self.budget = budget
        self.candidates = list(candidates)
        self.registry = registry
        self.config = config
        self.timeout_scale = timeout_scale
        self.say = say
        self._reruns: dict[int, Rerun] = {}
        self.report.budget = budget.to_dict()

    def second_pass(self) -> list[PlannedCheck]:
        left = self.deadline - time.monotonic() - MARGIN_S
        reruns, notes = plan_reruns(self.candidates, self.budget.kept, self.report.checks, left)
        self.budget.reruns = [r.to_dict() for r in reruns] + notes
        self.report.budget = self.budget.to_dict()
        self._save()
        for note in notes:
            self.say(f"{note['name']}: suspect ({note['why']}), not re-run: {note['not_rerun']}")
        planned = {c.name: c for c in self.plan.checks}
        out = []
        for r in reruns:
            self.say(f"{r.name}: deeper re-run at the {r.depth}, ~{fmt_s(r.estimate_s)} ({r.why})")
            check = replace(planned[r.name], params=r.params,
                            timeout_s=timeout_for(self.registry[r.name], r.level, r.params, self.config,
                                                  self.timeout_scale))
            self._reruns[id(check)] = r
            out.append(check)
        return out

    def _run_one(self, check: PlannedCheck) -> CheckResult:
        result = super()._run_one(check)
        rerun = self._reruns.get(id(check))
        if rerun is not None:
            result.reason = f"deeper re-run at the {rerun.depth}: {result.reason}"
            result.details = {**result.details, "rerun": rerun.to_dict()}
        return result
