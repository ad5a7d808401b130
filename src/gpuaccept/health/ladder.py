"""What ``healthcheck`` and ``node-status`` do by the fault's remediation ladder (pure).

Each failed check carries its catalogued fault (:mod:`gpuaccept.faults`): the step to take now (NVML's recovery
action for a GPU whose driver reports one, else the ladder's first rung). Every step but ``rerun`` takes the node
out of service now (drain, taint); a ``rerun``-first fault is run again once in the same window
(:func:`ladder_reruns`) and leaves service only when the re-run fails too (then its ladder's second rung applies);
a re-run that passes clears it (:func:`effective`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuaccept.faults import leaves_service
from gpuaccept.model import CheckResult, NodeReport, Status, Verdict

LADDER_RERUN = "ladder"
"""``details.rerun.why`` of a re-run the ladder asked for (not the budget planner's deeper re-run)."""


def is_ladder_rerun(c: CheckResult) -> bool:
    return c.is_rerun and isinstance(c.details.get("rerun"), dict) and c.details["rerun"].get("why") == LADDER_RERUN


def _action(c: CheckResult) -> str:
    return str((c.fault or {}).get("action", ""))


def ladder_reruns(checks: list[CheckResult]) -> list[str]:
    """First-pass checks that failed with a ``rerun``-first fault and were not re-run yet: the checks to run
    again, each once, in order."""
    rerun = {c.name for c in checks if c.is_rerun}
    return list(dict.fromkeys(c.name for c in checks if not c.is_rerun and c.status.is_failure
                              and _action(c) == "rerun" and c.name not in rerun))


def effective(checks: list[CheckResult]) -> list[CheckResult]:
    """``checks`` without the first-pass failures a re-run cleared (the ladder's, or ``--budget``'s deeper one, passed
    or warned)."""
    cleared = {c.name for c in checks if c.is_rerun and c.status in (Status.PASS, Status.WARN)}
    return [c for c in checks if not (c.name in cleared and not c.is_rerun and c.status.is_failure)]


def verdict_after_reruns(report: NodeReport, inventory: frozenset[str] | set[str]) -> Verdict:
    """The report's verdict over :func:`effective` results (a failure a re-run cleared does not fail the node)."""
    if report.verdict is not Verdict.FAILURE:
        return report.verdict
    return replace(report, checks=effective(report.checks)).decide(inventory)


@dataclass(frozen=True)
class Decision:
    """Whether the node leaves service now, and for which failure: ``check``, ``code``, ``origin`` (node or job),
    ``step`` (the ladder's rung now), ``reason`` (the check's); ``why`` says it in words."""

    leave: bool
    check: str = ""
    code: str = ""
    origin: str = "node"
    step: str = ""
    reason: str = ""
    why: str = ""


def _step(c: CheckResult) -> str:
    """The rung for failure ``c``: its action now; a failed re-run's of a ``rerun``-first fault: the next rung."""
    fault: dict[str, Any] = c.fault or {}
    ladder = [str(s) for s in fault.get("ladder", [])]
    if c.is_rerun and ladder and ladder[0] == "rerun":
        return ladder[1] if len(ladder) > 1 else (ladder[0] if ladder else "drain_for_service")
    return _action(c) or "drain_for_service"


def decide_ladder(checks: list[CheckResult]) -> Decision:
    """The first failure (over :func:`effective` results) whose rung takes the node out of service; else why the
    node stays in (a ``rerun``-first failure not re-run in the window). A failure without a fault (a report from
    before codes) leaves service, as every failure did then."""
    failures = [c for c in effective(checks) if c.status.is_failure]
    rerun_names = {c.name for c in checks if c.is_rerun}
    waiting: list[CheckResult] = []
    for c in failures:
        step = _step(c)
        if not c.is_rerun and step == "rerun" and c.name in rerun_names:
            continue  # its re-run decides
        if leaves_service(step) or not c.fault:
            f = c.fault or {}
            return Decision(True, c.name, str(f.get("code", "")), str(f.get("origin", "node")), step, c.reason,
                            f"{f.get('code', 'no code')}: {step}")
        waiting.append(c)
    if waiting:
        c = waiting[0]
        return Decision(False, c.name, c.code, str((c.fault or {}).get("origin", "node")), "rerun", c.reason,
                        f"{c.code} says re-run first and the window left no time to re-run {c.name}: left in "
                        "service (give a longer --deadline or --budget)")
    return Decision(False)


def ladder_result(result: CheckResult, first: CheckResult | None) -> CheckResult:
    """A ladder re-run's result: ``details.rerun`` says why, its reason says it is the re-run."""
    code = first.code if first is not None else ""
    result.reason = f"re-run ({code} says re-run first): {result.reason}"
    result.details = {**result.details, "rerun": {"name": result.name, "why": LADDER_RERUN, "code": code}}
    return result


def first_failure(checks: list[CheckResult], name: str) -> CheckResult | None:
    return next((c for c in checks if c.name == name and not c.is_rerun and c.status is not Status.PASS), None)
