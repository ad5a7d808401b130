"""Judging a check's outcome against thresholds: pure functions, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuaccept.checks.base import Outcome, ThresholdRule
from gpuaccept.model import Metric, Status, Threshold, is_not_judged, miss_text, worst

MAX_LISTED = 3


WARNED_FOR = "warned_for"
"""The details key of a check whose only WARN is figures without expectation (value :data:`NO_EXPECTATION`):
a deeper ``--budget`` re-run cannot give them one, so it does not make the check suspect."""
NO_EXPECTATION = "no expectation"


@dataclass(frozen=True)
class Judgement:
    status: Status
    reason: str
    metrics: list[Metric]
    only_unjudged: bool = False
    """The WARN comes only from performance figures without expectation (:func:`unjudged_on_gpu`)."""


def _last_bound(rules: Sequence[ThresholdRule], metric: Metric) -> Threshold | None:
    for rule in reversed(rules):
        if rule.matches(metric):
            bound = rule.bound_for(metric)
            if bound is not None:
                return bound
    return None


def _violation(metric: Metric) -> str:
    """``gemm_fp32_tflops on cpu 0.005567 < 100,000 TFLOP/s``: one unit, the bound as written
    (:func:`gpuaccept.model.miss_text`)."""
    where = f" on {metric.device}" if metric.device else ""
    return f"{metric.name}{where} {miss_text(metric)}"


def unjudged_on_gpu(metrics: Sequence[Metric], device: str) -> list[str]:
    """``name on cuda:N`` for each performance figure of a ``cuda`` run that found no expectation (no SKU
    entry, no fabric-derived busbw, no baseline, no rule): each is a WARN. Empty on ``cpu``."""
    if device != "cuda":
        return []
    out = [m.name + (f" on {m.device}" if m.device else "") for m in metrics
           if is_not_judged(m) and m.device != "cpu"]
    return list(dict.fromkeys(out))


def how_to_expect(check: str | None) -> str:
    """How a user gives a figure an expectation: a fleet baseline, or a bound in the config."""
    where = f"checks.{check}.thresholds" if check else "checks.<check>.thresholds"
    return f"give it one with run --baseline FILE or a rule in {where} of --config"


def judge(
    outcome: Outcome,
    defaults: Sequence[ThresholdRule] = (),
    overrides: Sequence[ThresholdRule] = (),
    *,
    require_gpu: bool = False,
    device: str = "cpu",
    check: str | None = None,
) -> Judgement:
    """Apply thresholds to ``outcome``; the result is never better than the check's own status.

    Per metric the bound comes from the last matching user rule (``overrides``),
    else the threshold the check attached itself (e.g. from the SKU table),
    else the last matching built-in rule (``defaults``). A skip caused by the
    absence of a GPU becomes a failure when ``require_gpu`` is set. On ``device`` ``cuda``, a
    performance figure that finds neither bound nor expectation is a WARN naming it
    (:func:`unjudged_on_gpu`) whose reason says how to give it one (:func:`how_to_expect`, naming ``check``);
    on ``cpu`` it stays "measured, not judged".
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
            problems.setdefault(bound.severity, []).append(_violation(metric))
    missing = unjudged_on_gpu(outcome.metrics, device)
    only_unjudged = bool(missing) and worst(*statuses).severity < Status.WARN.severity
    if missing:
        statuses.append(Status.WARN)
        problems[Status.WARN].append(f"no expectation for {', '.join(missing[:MAX_LISTED])}"
                                     + (f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED
                                        else "") + " (no SKU entry, fabric or baseline): not judged; "
                                     + how_to_expect(check))

    status = worst(*statuses)
    listed = problems[Status.FAIL] + problems[Status.WARN]
    if not listed:
        return Judgement(status, outcome.reason, outcome.metrics, only_unjudged)
    text = "; ".join(listed[:MAX_LISTED])
    if len(listed) > MAX_LISTED:
        text += f"; and {len(listed) - MAX_LISTED} more"
    reason = f"{text} ({outcome.reason})" if outcome.reason else text
    return Judgement(status, reason, outcome.metrics, only_unjudged)
