"""Robust statistics: median, MAD, robust z-scores, iterative trimming, grouped medians.

The robust z-score of a value ``x`` against a sample is
``0.6745 * (x - median) / MAD`` (Iglewicz and Hoaglin): for normally
distributed data it matches the ordinary z-score, yet one bad GPU cannot
drag the median or the MAD (median absolute deviation) along with it.

Near-identical values (eight GPUs at 745.1 TFLOP/s) have a MAD near zero, so
every MAD goes through :func:`scale`, which floors it at ``rel_floor`` of the
median's magnitude (1 % by default) and at ``abs_floor``: a 0.2 % wobble is
then never an outlier. All functions take and return plain floats or numpy
arrays, are pure, and do no I/O. ``group_median``/``group_mad`` compute one
median per group label in a single sort (no Python loop per group).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Z_CONST = 0.6745
"""Quantile of the standard normal at 0.75: MAD / 0.6745 estimates sigma."""

DEFAULT_REL_FLOOR = 0.01
"""The MAD is never taken below this fraction of |median| (1 %)."""

DEFAULT_ABS_FLOOR = 1e-9
"""The MAD is never taken below this (in the metric's unit), so a median of 0 with a MAD of 0 stays finite."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


def _array(values: Sequence[float] | FloatArray) -> FloatArray:
    return np.asarray(values, dtype=np.float64)


def median(values: Sequence[float] | FloatArray) -> float:
    """The median of ``values`` (NaN for none)."""
    x = _array(values)
    return float(np.median(x)) if x.size else float("nan")


def mad(values: Sequence[float] | FloatArray, center: float | None = None) -> float:
    """Median absolute deviation from ``center`` (default: the median); unscaled, in the values' unit."""
    x = _array(values)
    if not x.size:
        return float("nan")
    c = float(np.median(x)) if center is None else center
    return float(np.median(np.abs(x - c)))


def scale(center: float | FloatArray, mad_value: float | FloatArray, *, rel_floor: float = DEFAULT_REL_FLOOR,
          abs_floor: float = DEFAULT_ABS_FLOOR) -> FloatArray:
    """The MAD used as a z-score's denominator: ``max(mad, rel_floor * |center|, abs_floor)`` (elementwise)."""
    m = np.nan_to_num(np.asarray(mad_value, dtype=np.float64), nan=0.0)
    floor = np.maximum(rel_floor * np.abs(np.asarray(center, dtype=np.float64)), abs_floor)
    return np.maximum(m, floor)


def robust_z(values: float | Sequence[float] | FloatArray, center: float | FloatArray, mad_value: float | FloatArray,
             *, rel_floor: float = DEFAULT_REL_FLOOR, abs_floor: float = DEFAULT_ABS_FLOOR) -> FloatArray:
    """``0.6745 * (x - center) / scale(center, mad)``: signed, negative below the centre."""
    x = np.asarray(values, dtype=np.float64)
    return Z_CONST * (x - center) / scale(center, mad_value, rel_floor=rel_floor, abs_floor=abs_floor)


def bound_at_z(center: float, mad_value: float, z: float, *, rel_floor: float = DEFAULT_REL_FLOOR,
               abs_floor: float = DEFAULT_ABS_FLOOR) -> float:
    """The value whose robust z-score is ``z`` (negative ``z``: below the centre)."""
    s = float(scale(center, mad_value, rel_floor=rel_floor, abs_floor=abs_floor))
    return center + z * s / Z_CONST


@dataclass(frozen=True)
class Trimmed:
    """The result of :func:`trim_outliers`: robust centre and spread of the values kept.

    ``kept`` is a boolean mask over the input; ``iterations`` counts the passes.
    """

    center: float
    mad: float
    kept: npt.NDArray[np.bool_]
    iterations: int

    @property
    def n(self) -> int:
        return int(self.kept.sum())

    @property
    def dropped(self) -> int:
        return int(self.kept.size - self.kept.sum())


def trim_outliers(values: Sequence[float] | FloatArray, *, max_z: float = 3.5, max_iter: int = 20,
                  rel_floor: float = DEFAULT_REL_FLOOR, abs_floor: float = DEFAULT_ABS_FLOOR) -> Trimmed:
    """Drop values with |robust z| > ``max_z`` and recompute until none is dropped (at most ``max_iter`` passes).

    Non-finite values are dropped first. An empty input gives NaN centre and MAD.
    """
    x = _array(values)
    kept = np.isfinite(x)
    iterations = 0
    while iterations < max_iter and kept.any():
        iterations += 1
        sample = x[kept]
        c = float(np.median(sample))
        m = float(np.median(np.abs(sample - c)))
        z = robust_z(x, c, m, rel_floor=rel_floor, abs_floor=abs_floor)
        now = kept & (np.abs(z) <= max_z)
        if not now.any() or np.array_equal(now, kept):
            break
        kept = now
    if not kept.any():
        return Trimmed(float("nan"), float("nan"), kept, iterations)
    sample = x[kept]
    c = float(np.median(sample))
    return Trimmed(c, float(np.median(np.abs(sample - c))), kept, iterations)


FEW_GROUPS = 4096
"""Up to this many groups, :func:`group_order` sorts each group's values on its own."""


def group_order(values: FloatArray, groups: IntArray, n_groups: int) -> IntArray:
    """Indices that sort by group, then by value within a group (like ``np.lexsort((values, groups))``, faster).

    Few groups (a fleet's metrics): a stable radix sort of the labels, then each group's values sorted on their
    own (each fits in the CPU's cache; at 2.8 M samples 2.5x faster than one sort of them all). Many: one sort of
    the values, then a stable sort of the labels: a radix sort when the labels fit in 16 bits, else a sort of
    ``group * n + rank``.
    """
    if n_groups <= FEW_GROUPS and values.size > 4 * n_groups:
        by_group = np.argsort(groups.astype(np.uint16), kind="stable")
        ordered = values[by_group]
        start = 0
        for end in np.cumsum(np.bincount(groups, minlength=n_groups)).tolist():
            if end - start > 1:
                by_group[start:end] = by_group[start:end][np.argsort(ordered[start:end])]
            start = end
        return by_group
    by_value = np.argsort(values)
    if n_groups <= np.iinfo(np.uint16).max:
        return by_value[np.argsort(groups[by_value].astype(np.uint16), kind="stable")]
    rank = np.empty(values.size, dtype=np.int64)
    rank[by_value] = np.arange(values.size)
    return np.argsort(groups.astype(np.int64) * values.size + rank)


def group_median(values: FloatArray, groups: IntArray, n_groups: int | None = None) -> tuple[FloatArray, IntArray]:
    """Median of ``values`` per group label (labels 0..n_groups-1) and the count per group.

    One ``lexsort`` for all groups; an empty group's median is NaN.
    """
    n = int(groups.max()) + 1 if n_groups is None and groups.size else (n_groups or 0)
    counts = np.bincount(groups, minlength=n).astype(np.intp)
    if not values.size:
        return np.full(n, np.nan), counts
    order = group_order(values, groups, n)
    ordered = values[order]
    starts = np.cumsum(counts) - counts
    nonempty = counts > 0
    lo = starts + np.maximum(counts - 1, 0) // 2
    hi = starts + counts // 2
    lo = np.where(nonempty, lo, 0)
    hi = np.where(nonempty, np.minimum(hi, values.size - 1), 0)
    med = 0.5 * ordered[lo] + 0.5 * ordered[hi]  # no overflow at the float range's ends
    return np.where(nonempty, med, np.nan), counts


def group_loo_median(values: FloatArray, groups: IntArray, n_groups: int | None = None) -> FloatArray:
    """Per value, the median of the *other* values of its group (leave-one-out; NaN when it is alone).

    Comparing a GPU with the median of its siblings rather than of the whole
    node keeps the GPU out of its own reference: with eight values, the two
    middle ones otherwise sit almost on "their" median and bias the spread low.
    """
    n = int(groups.max()) + 1 if n_groups is None and groups.size else (n_groups or 0)
    out = np.full(values.size, np.nan)
    if not values.size:
        return out
    counts = np.bincount(groups, minlength=n).astype(np.intp)
    order = group_order(values, groups, n)
    ordered = values[order]
    starts = (np.cumsum(counts) - counts)[groups[order]]
    size = counts[groups[order]]
    rank = np.arange(values.size) - starts
    k = size - 1                                   # values left when one is taken out
    lo, hi = (k - 1) // 2, k // 2                  # median positions among the rest (equal when k is odd)
    lo_pos = starts + lo + (lo >= rank)            # skip over the value taken out
    hi_pos = starts + hi + (hi >= rank)
    ok = k >= 1
    lo_pos = np.where(ok, lo_pos, 0)
    hi_pos = np.where(ok, hi_pos, 0)
    med = np.where(ok, 0.5 * (ordered[lo_pos] + ordered[hi_pos]), np.nan)
    out[order] = med
    return out


def group_mad(values: FloatArray, groups: IntArray, medians: FloatArray) -> FloatArray:
    """MAD of ``values`` per group around the given per-group ``medians``."""
    dev = np.abs(values - medians[groups])
    out, _ = group_median(dev, groups, medians.size)
    return out
