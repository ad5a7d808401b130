"""argparse ``type=`` converters shared by every subcommand: a bad value is one clear line, exit 2."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable


def csv(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [t.strip() for t in text.split(",") if t.strip()]


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value


def nonneg_float(text: str) -> float:
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def nonneg_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def int_at_least(minimum: int) -> Callable[[str], int]:
    """A converter accepting integers >= ``minimum``."""

    def convert(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= {minimum}")
        return int(text)

    return convert


MAX_DURATION_S = 7 * 24 * 3600.0
"""The longest ``duration`` accepted (a week)."""
_SPAN_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SPAN_PART = re.compile(r"(\d{1,9}(?:\.\d{1,6})?)([smhd])")


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``10m``, ``1h30m``, ``2d`` or a bare number of seconds (``600``); ValueError with a
    one-line reason when the text is not one, is not more than 0 or exceeds :data:`MAX_DURATION_S`."""
    t = text.strip().lower()
    if re.fullmatch(r"-(?:\d|\.\d).*", t):
        raise ValueError(f"{text!r} must be more than 0 seconds")
    if re.fullmatch(r"\d{1,9}(?:\.\d{1,6})?", t):
        seconds = float(t)
    elif re.fullmatch(f"(?:{_SPAN_PART.pattern})+", t):
        seconds = sum(float(n) * _SPAN_S[u] for n, u in _SPAN_PART.findall(t))
    else:
        raise ValueError(f"{text!r} is not a duration such as 90s, 10m, 1h30m or 2d")
    if not seconds > 0:
        raise ValueError(f"{text!r} must be more than 0 seconds")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than the maximum, 7d ({MAX_DURATION_S:g} s)")
    return seconds


def fmt_s(seconds: float, up: bool = True) -> str:
    """``45s``, ``6m12s``, ``1h30m``, ``2d3h``: whole seconds, rounded up (a need), or down (``up=False``:
    what is left)."""
    s = max(0, math.ceil(seconds - 1e-9) if up else math.floor(seconds + 1e-9))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size}{unit}" + (f"{rest}{sub}" if rest else "")
    return f"{s}s"


def duration(text: str) -> float:
    """argparse converter for :func:`parse_duration`."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
