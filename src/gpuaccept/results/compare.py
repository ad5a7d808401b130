"""Per-metric differences between two runs. Pure functions.

Metrics are matched on check, metric name, device and tags (and host when
either run is a cluster run; two node runs are compared across hosts, so
node A can be held against node B). ``delta`` is ``B - A`` in the metric's
unit, ``change`` is ``B/A - 1``; ``verdict`` is ``worse`` or ``better`` in
the metric's direction (lower throughput, higher time or error count) only
when ``|delta|`` exceeds the metric's run-to-run noise floor ``noise``
(:mod:`gpuaccept.results.noise`; ``noise_from`` says where it came from), else
``same``; ``worse`` is ``verdict == "worse"``.
Each run's first pass is compared: a ``run --budget`` deeper re-run is left out
(it ran at another depth, and on one side only).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.errors import UsageError
from gpuaccept.inputs import did_you_mean
from gpuaccept.model import ClusterReport, Metric, NodeReport
from gpuaccept.results.noise import FAMILIES, HISTORY_SIGMAS, HISTORY_WINDOW, MIN_HISTORY, NoisePolicy, judge
from gpuaccept.results.rows import finite, tags_json
from gpuaccept.results.trend import VOLATILE_TAGS, higher_is_better

Report = NodeReport | ClusterReport
Key = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class Delta:
    """One metric in both runs. ``a``/``b`` are None where the report had NaN."""

    host: str
    check: str
    metric: str
    device: str | None
    tags: dict[str, Any]
    unit: str
    a: float | None
    b: float | None
    delta: float | None
    change: float | None
    worse: bool
    noise: float | None = None
    noise_from: str = ""
    verdict: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    """Deltas for metrics in both runs, and the keys (host, check, metric, device, tags) found in one only."""

    run_a: str
    run_b: str
    by_host: bool
    deltas: list[Delta] = field(default_factory=list)
    only_a: list[dict[str, Any]] = field(default_factory=list)
    only_b: list[dict[str, Any]] = field(default_factory=list)

    noise_pct: float | None = None

    def counts(self) -> dict[str, int]:
        """How many deltas are worse, better, same (within noise) and without a value (``n/a``)."""
        out = {"worse": 0, "better": 0, "same": 0, "n/a": 0}
        for d in self.deltas:
            out[d.verdict or "n/a"] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"run_a": self.run_a, "run_b": self.run_b, "by_host": self.by_host, "counts": self.counts(),
                "noise": noise_description(self.noise_pct),
                "deltas": [d.to_dict() for d in self.deltas], "only_a": self.only_a, "only_b": self.only_b}


def noise_description(override_pct: float | None) -> dict[str, Any]:
    """The noise rule of a comparison, as data (the JSON's ``noise``)."""
    return {"override_pct": override_pct,
            "history": {"min_runs": MIN_HISTORY, "window": HISTORY_WINDOW, "sigmas": HISTORY_SIGMAS},
            "defaults": {f.name: {"rel": f.rel, "abs": f.abs} for f in FAMILIES}}


def _node_reports(report: Report) -> Iterator[NodeReport]:
    if isinstance(report, NodeReport):
        yield report
        return
    for entry in report.nodes:
        if entry.report is not None:
            yield entry.report


def _metrics(report: Report, by_host: bool) -> dict[Key, tuple[str, Metric]]:
    out: dict[Key, tuple[str, Metric]] = {}
    for node in _node_reports(report):
        for check in node.checks:
            if check.is_rerun:
                continue
            host = check.host or node.host
            for m in check.metrics:
                tags = {k: v for k, v in m.tags.items() if k not in VOLATILE_TAGS}
                key = (host if by_host else "", check.name, m.name, m.device or "", tags_json(tags))
                out[key] = (host, m)
    return out


def _key_dict(key: Key, host: str, unit: str) -> dict[str, Any]:
    return {"host": host, "check": key[1], "metric": key[2], "device": key[3] or None, "tags": json.loads(key[4]),
            "unit": unit}


def _check_filters(keys: set[Key], check: str | None, metric: str | None) -> None:
    checks, metrics = sorted({k[1] for k in keys}), sorted({k[2] for k in keys})
    if check is not None and check not in checks:
        raise UsageError(f"--check {check!r}: neither run has this check{did_you_mean(check, checks)}; "
                         f"checks: {', '.join(checks) or 'none'}")
    if metric is not None and metric not in metrics:
        raise UsageError(f"--metric {metric!r}: neither run has this metric{did_you_mean(metric, metrics)}")
    if check is not None and metric is not None:
        owners = sorted({k[1] for k in keys if k[2] == metric})
        if check not in owners:
            raise UsageError(f"--metric {metric!r} is not a metric of check {check} in these runs but of "
                             f"{', '.join(owners)}")


def compare_reports(a: Report, b: Report, check: str | None = None, metric: str | None = None,
                    host: str | None = None, noise: NoisePolicy | None = None) -> Comparison:
    """Deltas from run ``a`` to run ``b``, optionally only for one check, metric or host; differences within
    ``noise`` (default: each metric family's default floor) are "same".

    UsageError (with a "did you mean") when ``check`` or ``metric`` is in neither run, or ``metric`` is
    not one of ``check``'s: a filter that matches nothing is a typo, not "no metric in both runs".
    """
    noise = noise or NoisePolicy()
    by_host = isinstance(a, ClusterReport) or isinstance(b, ClusterReport)
    ma, mb = _metrics(a, by_host), _metrics(b, by_host)
    _check_filters(set(ma) | set(mb), check, metric)
    cmp = Comparison(run_a=a.run_id, run_b=b.run_id, by_host=by_host, noise_pct=noise.override_pct)
    for key in sorted(set(ma) | set(mb), key=lambda k: (k[1], k[2], k[0], k[3], k[4])):
        in_a, in_b = ma.get(key), mb.get(key)
        hosts = {x[0] for x in (in_a, in_b) if x is not None}
        if (check is not None and key[1] != check) or (metric is not None and key[2] != metric) or \
                (host is not None and host not in hosts):
            continue
        if in_a is None or in_b is None:
            present = in_a if in_a is not None else in_b
            assert present is not None
            (cmp.only_a if in_b is None else cmp.only_b).append(_key_dict(key, present[0], present[1].unit))
            continue
        (host_a, m_a), (host_b, m_b) = in_a, in_b
        va, vb = finite(m_a.value), finite(m_b.value)
        delta = vb - va if va is not None and vb is not None else None
        change = vb / va - 1.0 if va and vb is not None else None
        threshold = m_b.threshold or m_a.threshold
        hib = higher_is_better(m_b.name, m_b.unit, threshold.op if threshold else None)
        floor, source = noise.floor((host_a, host_b), key[1:], m_b.unit, va)
        verdict = judge(delta, floor, hib)
        cmp.deltas.append(Delta(host=host_a if host_a == host_b else f"{host_a} -> {host_b}", check=key[1],
                                metric=key[2], device=key[3] or None, tags=json.loads(key[4]), unit=m_b.unit,
                                a=va, b=vb, delta=delta, change=change, worse=verdict == "worse",
                                noise=floor if delta is not None else None, noise_from=source, verdict=verdict))
    return cmp


def hosts_of(report: Report) -> set[str]:
    """The hosts whose metrics a report holds."""
    return {c.host or n.host for n in _node_reports(report) for c in n.checks} | \
        {n.host for n in _node_reports(report)}


def run_ids_of(report: Report) -> set[str]:
    """The run ids of a report and of the node reports in it (as the history stores them)."""
    return {report.run_id} | {n.run_id for n in _node_reports(report)}
