"""The one judging path for busbw at the large sizes: the ``collectives`` check, the ``nccl_tests``
check and ``gpuaccept nccl-tests`` all take their expectation and bound from :func:`busbw_reference`.

Precedence (first that applies):

1. a fleet baseline: ``gpuaccept run --baseline`` overlays its value and bound on the metric after
   the check (:func:`gpuaccept.results.baseline_judge.overlay_baseline`); ``baseline`` here is the
   same for callers that hold one;
2. an explicit bound: ``min_busbw_gbs`` of either check, ``--min-busbw`` of the CLI;
3. the fabric-derived expectation (:mod:`gpuaccept.hw.fabric_expect`) x :data:`FABRIC_TOLERANCE`,
   with the expectation's severity (WARN over PCIe, else FAIL).

The fabric figure is the metric's ``expected`` (``expected_source`` its label, ``fabric: ...``)
whenever it is known and no baseline replaced it, so every report shows it next to the measured
busbw. Equivalent by hand: the last row's busbw of ``all_reduce_perf -b 8 -e 8G -f 2 -g 8`` >=
expected x 0.8.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuaccept.hw.fabric_expect import Expectation
from gpuaccept.model import Status, Threshold

FABRIC_TOLERANCE = 0.8
"""The share of the fabric-derived expectation a run must reach at the large sizes."""


@dataclass(frozen=True)
class Reference:
    """What a busbw metric is judged against: ``expected`` (GB/s) and its label, and the bound."""

    expected: float | None = None
    expected_source: str | None = None
    threshold: Threshold | None = None


def busbw_reference(fabric: Expectation | None = None, *, min_busbw_gbs: float | None = None,
                    min_source: str = "param:min_busbw_gbs", baseline: Reference | None = None) -> Reference:
    """The expectation and bound of one op's ``<op>_busbw_large_gbs`` metric (see the module doc)."""
    if baseline is not None and (baseline.threshold is not None or baseline.expected is not None):
        return baseline
    expected = fabric.gbs if fabric is not None else None
    source = fabric.source if fabric is not None else None
    if min_busbw_gbs:
        return Reference(expected, source, Threshold(">=", float(min_busbw_gbs), Status.FAIL, min_source))
    if fabric is None:
        return Reference()
    bound = Threshold(">=", round(fabric.gbs * FABRIC_TOLERANCE, 3), fabric.severity,
                      f"fabric:{fabric.path} x {FABRIC_TOLERANCE:g}")
    return Reference(expected, source, bound)


def busbw_verdict(value: float, ref: Reference) -> Status:
    """PASS when ``value`` meets the bound (or there is none), else the bound's severity."""
    if ref.threshold is None or ref.threshold.met_by(value):
        return Status.PASS
    return ref.threshold.severity


def describe(ref: Reference) -> str:
    """``expected 337.5 GB/s (fabric: ...), bound >= 270 GB/s (fabric:nvlink x 0.8)``; "" without either."""
    parts = []
    if ref.expected is not None:
        parts.append(f"expected {ref.expected:.4g} GB/s ({ref.expected_source})")
    if ref.threshold is not None:
        parts.append(f"bound {ref.threshold.op} {ref.threshold.value:.4g} GB/s ({ref.threshold.source})")
    return ", ".join(parts)
