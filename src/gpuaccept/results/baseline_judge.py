"""Judging against a fleet baseline: expectations and bounds set on a check's metrics, a report re-judged."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold, Verdict, miss_text, worst
from gpuaccept.results.baseline import Baseline, BaselineEntry, BaselineRule, rounded
from gpuaccept.results.baseline_curves import judge_curves
from gpuaccept.results.samples import SkuResolver, clamp_to_domain, direction


@dataclass(frozen=True)
class Overlaid:
    """What :func:`overlay_baseline` did to one metric: the entry and the bound it set (if any)."""

    metric: Metric
    entry: BaselineEntry | None
    bound: Threshold | None


def _label(baseline: Baseline) -> str:
    return Path(baseline.path).name if baseline.path else "baseline"


def overlay_baseline(check: CheckResult, node: NodeReport, baseline: Baseline,
                     rules: Sequence[BaselineRule] | None = None) -> list[Overlaid]:
    """Set ``expected`` and ``threshold`` of ``check``'s metrics from ``baseline``, in place.

    ``node`` supplies the SKUs (its env check, or the check's own details).
    For each judged metric with a baseline entry, ``expected`` becomes the
    baseline value; the last matching rule that yields a bound replaces
    ``threshold`` (source ``baseline:<file>:<rule>``). A bound outside the
    values the metric can take (:func:`~gpuaccept.results.samples.domain`: a
    bandwidth's ``max_z`` bound below 0 when the spread is wide) is moved to
    the domain's edge and marked ``clamped``. Metrics without an entry only
    get absolute (``min``/``max``) rules. A reference_train result is also compared with the baseline's
    curves (:func:`~gpuaccept.results.baseline_curves.judge_curves`). Returns what changed.
    """
    resolver = SkuResolver(node)
    active = baseline.rules(rules)
    label = _label(baseline)
    changed: list[Overlaid] = []
    for m in check.metrics:
        if direction(m.name, m.unit) is None:
            continue
        sku = resolver.for_device(check, m.device, m)
        entry = baseline.lookup(sku, m)
        bound: Threshold | None = None
        for rule in reversed(active):
            if not rule.matches(m, sku):
                continue
            b = rule.bound(m, entry)
            if b is not None:
                value, clamped = clamp_to_domain(b[0], b[1], m.name, m.unit)
                bound = Threshold(b[0], rounded(value), rule.severity,
                                  f"baseline:{label}:{rule.bound_key}={rule.bound_value:g}",
                                  clamped=clamped and value != b[1])
                break
        if entry is None and bound is None:
            continue
        if entry is not None:
            m.expected = entry.value
            m.expected_source = f"baseline:{label}"
        if bound is not None:
            m.threshold = bound
        changed.append(Overlaid(m, entry, bound))
    for m in judge_curves(check, baseline.curves, label):
        changed.append(Overlaid(m, None, m.threshold))
    return changed


def _violation(m: Metric, t: Threshold) -> str:
    """``stream_copy_gbs on cpu 24.77 < 26.0667 GB/s (baseline:...)``: one unit, as every rendering shows a miss
    (:func:`gpuaccept.model.miss_text`); ``t`` is ``m.threshold``."""
    where = f" on {m.device}" if m.device else ""
    return f"{m.name}{where} {miss_text(m)} ({t.source})"


def apply_baseline(report: NodeReport, baseline: Baseline, rules: Sequence[BaselineRule] | None = None,
                   ) -> NodeReport:
    """A copy of ``report`` judged against ``baseline`` as well; ``report`` is not modified.

    Each metric with a baseline entry gets ``expected`` = the baseline value
    and the bound of the last matching rule (:func:`overlay_baseline`). A
    violated baseline bound lowers the check's status to the rule's severity
    and is listed first in its reason; ``details.baseline`` records the file,
    how many metrics matched, and the violations. Applied after the fact, a
    baseline can only make a status worse: a metric that failed its run-time
    bound (e.g. the SKU spec) keeps that bound and its failure, listed under
    ``details.baseline.not_excused`` when the baseline alone would pass it --
    give the baseline to ``gpuaccept run`` to judge by it instead of the spec.
    Skipped and errored checks are left as they are. The verdict of a finished
    report is decided again.
    """
    out = copy.deepcopy(report)
    for check in out.checks:
        if check.status in (Status.SKIP, Status.ERROR) or not check.metrics:
            continue
        before = {id(m): (m.expected, m.expected_source, m.threshold) for m in check.metrics}
        changes = overlay_baseline(check, out, baseline, rules)
        if not changes:
            continue
        violations: list[tuple[Status, str]] = []
        not_excused: list[str] = []
        for ch in changes:
            m, bound = ch.metric, ch.bound
            old_expected, old_source, old_threshold = before.get(id(m), (None, None, None))
            if bound is None:
                continue
            if old_threshold is not None and not old_threshold.met_by(m.value) and bound.met_by(m.value) \
                    and old_threshold.severity.severity >= Status.WARN.severity:
                m.expected, m.expected_source, m.threshold = old_expected, old_source, old_threshold
                not_excused.append(_violation(m, old_threshold))
            elif not bound.met_by(m.value):
                violations.append((bound.severity, _violation(m, bound)))
        violations.sort(key=lambda v: -v[0].severity)
        check.details = dict(check.details)
        check.details["baseline"] = {
            "file": baseline.path, "matched": sum(1 for c in changes if c.entry is not None),
            "violations": [text for _, text in violations],
            **({"not_excused": not_excused} if not_excused else {}),
        }
        if violations:
            check.status = worst(check.status, *(s for s, _ in violations))
            listed = "; ".join(text for _, text in violations[:3])
            if len(violations) > 3:
                listed += f"; and {len(violations) - 3} more"
            check.reason = f"{listed} ({check.reason})" if check.reason else listed
    if out.verdict in (Verdict.SUCCESS, Verdict.FAILURE):
        out.verdict = out.decide()
    return out
