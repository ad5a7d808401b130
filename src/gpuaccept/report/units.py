"""Display units: every figure shown with one to four digits before the point, in every rendering.

Reports store metrics in fixed units (``TFLOP/s``, ``GB/s``, ``ms`` ...); the
console, Markdown and HTML show them through :func:`fmt_value`, which keeps
the stored unit when the value has one to four integer digits there and
otherwise moves to the prefix that gives one to three (``0.001263 TFLOP/s`` ->
``1.26 GFLOP/s``, ``0.05 ms`` -> ``50 µs``). Units outside the families below
(counts, fractions, W, C) are shown as stored.
"""

from __future__ import annotations

import math

from gpuaccept.model import BARE_UNITS

# Each family: (display unit, size in the family's base unit), smallest first.
_SI = (("n", 1e-9), ("µ", 1e-6), ("m", 1e-3), ("", 1.0), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12),
       ("P", 1e15), ("E", 1e18))
_FAMILIES: list[tuple[tuple[str, float], ...]] = [
    tuple((f"{p}FLOP/s", s) for p, s in _SI[3:]),
    tuple((f"{p}B/s", s) for p, s in _SI[3:9]),
    tuple((f"{p}b/s", s) for p, s in _SI[3:9]),
    tuple((f"{p}bit/s", s) for p, s in _SI[3:9]),
    (("B/s", 1.0), ("KiB/s", 2.0**10), ("MiB/s", 2.0**20), ("GiB/s", 2.0**30), ("TiB/s", 2.0**40)),
    (("bytes", 1.0), ("KiB", 2.0**10), ("MiB", 2.0**20), ("GiB", 2.0**30), ("TiB", 2.0**40)),
    (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)),
]
_ALIASES = {"us": "µs", "B": "bytes"}
_BY_UNIT: dict[str, tuple[tuple[tuple[str, float], ...], float]] = {}
for _fam in _FAMILIES:
    for _name, _size in _fam:
        _BY_UNIT.setdefault(_name, (_fam, _size))
for _alias, _name in _ALIASES.items():
    _BY_UNIT[_alias] = _BY_UNIT[_name]
_BARE = BARE_UNITS


def display_unit(value: float | None, unit: str) -> tuple[float, str]:
    """``(factor, shown unit)`` for ``value`` stored in ``unit``: ``value * factor`` is what to print.

    The stored unit stays when ``1 <= |value| < 10000`` in it (or the value is
    0, NaN, or not in a known family); otherwise the family member giving
    ``1 <= |shown| < 1000``, the largest or smallest member at the ends.
    """
    entry = _BY_UNIT.get(unit)
    if entry is None:
        return 1.0, unit
    family, size = entry
    shown = _ALIASES.get(unit, unit)
    if value is None or not math.isfinite(value) or value == 0 or 1 <= abs(value) < 10000:
        return 1.0, shown
    base = abs(value) * size
    pick = family[0]
    for name, s in family:
        if base >= s:
            pick = (name, s)
    return size / pick[1], pick[0]


def fmt_number(x: float | None) -> str:
    """A short human form of a number: 3 significant digits below 100, one decimal below 1000, integers above."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    if abs(x) >= 1e15:  # never a 300-digit number
        return f"{x:.3g}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.3g}"


def fmt_value(x: float | None, unit: str, like: float | None = None) -> str:
    """``612 TFLOP/s``, ``1.26 GFLOP/s``, ``50 µs``: ``x`` in the unit chosen for ``like`` (default ``x``).

    Pass the headline value as ``like`` to show its threshold and spec in the same unit.
    Counts and unitless values are shown without a unit.
    """
    if x is None or not math.isfinite(x):
        return "n/a"
    factor, shown = display_unit(x if like is None else like, unit)
    text = fmt_number(x * factor)
    return text if unit in _BARE else f"{text} {shown}"
