"""Judging a check's outcome against thresholds: pure functions, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuaccept.checks.base import Outcome, ThresholdRule
from gpuaccept.model import Metric, Status, Threshold, worst

MAX_LISTED = 3


@dataclass(frozen=True)
class Judgement:
    status: Status
    reason: str
    metrics: list[Metric]


def _last_bound(rules: Sequence[ThresholdRule], metric: Metric) -> Threshold | None:
    for rule in reversed(rules):
        if rule.matches(metric):
            bound = rule.bound_for(metric)
            if bound is not None:
                return bound
    return None


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _violation(metric: Metric, bound: Threshold) -> str:
    where = f" on {metric.device}" if metric.device else ""
    rel = "<" if bound.op == ">=" else ">"
    return f"{metric.name}{where} {_fmt(metric.value)} {rel} {_fmt(bound.value)} {metric.unit}".rstrip()


def judge(
    outcome: Outcome,
    defaults: Sequence[ThresholdRule] = (),
    overrides: Sequence[ThresholdRule] = (),
    *,
    require_gpu: bool = False,
) -> Judgement:
    """Apply thresholds to ``outcome``; the result is never better than the check's own status.

    Per metric the bound comes from the last matching user rule (``overrides``),
    else the threshold the check attached itself (e.g. from the SKU table),
    else the last matching built-in rule (``defaults``). A skip caused by the
    absence of a GPU becomes a failure when ``require_gpu`` is set.
    """
    if outcome.status is Status.SKIP:
        if require_gpu and outcome.needs_gpu:
            return Judgement(Status.FAIL, f"GPU required (--require-gpu): {outcome.reason}", outcome.metrics)
        return Judgement(Status.SKIP, outcome.reason, outcome.metrics)

    statuses: list[Status] = [outcome.status]
    problems: dict[Status, list[str]] = {Status.FAIL: [], Status.WARN: []}
    for metric in outcome.metrics:
        bound = _last_bound(overrides, metric) or metric.threshold or _last_bound(defaults, metric)
        metric.threshold = bound
        if bound is not None and not bound.met_by(metric.value):
            statuses.append(bound.severity)
            problems.setdefault(bound.severity, []).append(_violation(metric, bound))

    status = worst(*statuses)
    listed = problems[Status.FAIL] + problems[Status.WARN]
    if not listed:
        return Judgement(status, outcome.reason, outcome.metrics)
    text = "; ".join(listed[:MAX_LISTED])
    if len(listed) > MAX_LISTED:
        text += f"; and {len(listed) - MAX_LISTED} more"
    reason = f"{text} ({outcome.reason})" if outcome.reason else text
    return Judgement(status, reason, outcome.metrics)
