"""Robust statistics: median/MAD, robust z with its floor, iterative trimming, grouped medians."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuaccept.results.stats import (
    Z_CONST,
    bound_at_z,
    group_loo_median,
    group_mad,
    group_median,
    group_order,
    mad,
    median,
    robust_z,
    scale,
    trim_outliers,
)


def test_median_and_mad_of_a_known_sample() -> None:
    x = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert median(x) == 3.0
    assert mad(x) == 1.0                 # |x - 3| = 2,1,0,1,97 -> median 1
    assert mad(x, center=0.0) == 3.0
    assert math.isnan(median([])) and math.isnan(mad([]))


def test_robust_z_is_the_iglewicz_hoaglin_score() -> None:
    x = np.array([700.0, 705.0, 710.0, 712.0, 690.0, 560.0, 708.0, 703.0])
    c, m = median(x), mad(x)
    z = robust_z(x, c, m, rel_floor=0.0)
    np.testing.assert_allclose(z, Z_CONST * (x - c) / m)
    assert z[5] < -10 and np.all(np.abs(np.delete(z, 5)) < 3)


def test_mad_floor_keeps_near_identical_values_from_exploding() -> None:
    # Eight GPUs within 0.05 %: the raw MAD is tiny, so a 0.3 % difference would score |z| ~ 20 without a floor.
    x = np.array([745.10, 745.20, 745.15, 745.12, 745.18, 745.14, 745.16, 743.0])
    c, m = median(x), mad(x)
    assert abs(Z_CONST * (x[-1] - c) / m) > 20
    z = robust_z(x[-1], c, m)              # floored at 1 % of the median
    assert -0.3 < float(z) < 0
    assert float(scale(c, m)) == pytest.approx(0.01 * c)


def test_zero_median_and_zero_mad_stay_finite() -> None:
    z = robust_z(np.array([0.0, 0.0, 3.0]), 0.0, 0.0)
    assert np.all(np.isfinite(z)) and z[2] > 1e6 and z[0] == 0


def test_bound_at_z_inverts_robust_z() -> None:
    for c, m, k in ((700.0, 7.0, -5.0), (41.0, 0.3, 4.0), (8.0, 0.0, -3.0)):
        b = bound_at_z(c, m, k)
        assert float(robust_z(b, c, m)) == pytest.approx(k)


def test_trimming_removes_planted_outliers_and_keeps_clean_data() -> None:
    rng = np.random.default_rng(7)
    clean = 700 * (1 + rng.normal(0, 0.01, 500))
    t = trim_outliers(clean)
    assert t.dropped <= 2 and abs(t.center - 700) < 2
    dirty = np.concatenate([clean, [350.0, 360.0, 10.0, 5000.0, math.nan]])
    t = trim_outliers(dirty)
    assert t.center == pytest.approx(np.median(clean), rel=2e-3)
    assert not t.kept[-5:].any()           # the four outliers and the NaN
    assert t.mad == pytest.approx(mad(clean), rel=0.1)


def test_trimming_iterates_until_stable() -> None:
    # A tight core, two moderate values and a far cluster: the far cluster inflates the MAD, so one
    # pass keeps the moderate values; once it is gone the MAD shrinks and exposes them.
    core = np.linspace(99.0, 101.0, 20)
    x = np.concatenate([core, [93.0, 92.5], [10.0] * 12])
    one_pass = np.abs(robust_z(x, median(x), mad(x))) <= 3.5
    assert one_pass[20:22].all() and not one_pass[22:].any()
    t = trim_outliers(x)
    assert t.iterations >= 2 and t.n == 20 and not t.kept[20:].any()


def test_trimming_edge_cases() -> None:
    t = trim_outliers([])
    assert math.isnan(t.center) and t.n == 0
    t = trim_outliers([5.0, 5.0, 5.0])
    assert t.center == 5.0 and t.mad == 0.0 and t.n == 3


@pytest.mark.parametrize("seed", range(5))
def test_group_median_and_mad_match_numpy_per_group(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_groups = 40
    sizes = rng.integers(0, 12, n_groups)     # includes empty groups, odd and even sizes
    groups = np.repeat(np.arange(n_groups), sizes)
    rng.shuffle(groups)
    values = rng.normal(100, 10, groups.size)
    med, counts = group_median(values, groups, n_groups)
    mads = group_mad(values, groups, med)
    for g in range(n_groups):
        sel = values[groups == g]
        assert counts[g] == sel.size
        if sel.size:
            assert med[g] == pytest.approx(np.median(sel))
            assert mads[g] == pytest.approx(np.median(np.abs(sel - np.median(sel))))
        else:
            assert math.isnan(med[g])


def test_group_median_of_nothing() -> None:
    med, counts = group_median(np.zeros(0), np.zeros(0, dtype=np.intp), 3)
    assert med.shape == (3,) and np.isnan(med).all() and counts.tolist() == [0, 0, 0]


@pytest.mark.parametrize("n_groups, size", [(50, 5000), (4096, 20_000), (4097, 20_000), (70_000, 5000)])
def test_group_order_sorts_like_lexsort(n_groups: int, size: int) -> None:
    """Each group sorted on its own (up to FEW_GROUPS groups), or all values at once: the same order."""
    rng = np.random.default_rng(n_groups)
    groups = rng.integers(0, n_groups, size).astype(np.intp)
    values = rng.normal(size=size)
    order = group_order(values, groups, n_groups)
    np.testing.assert_array_equal(order, np.lexsort((values, groups)))


def test_leave_one_out_median_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(30), rng.integers(1, 10, 30)).astype(np.intp)
    values = rng.normal(size=groups.size)
    loo = group_loo_median(values, groups, 30)
    for i in range(values.size):
        others = values[(groups == groups[i]) & (np.arange(values.size) != i)]
        if others.size:
            assert loo[i] == pytest.approx(np.median(others))
        else:
            assert math.isnan(loo[i])
