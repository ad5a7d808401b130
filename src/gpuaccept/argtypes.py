"""argparse ``type=`` converters shared by every subcommand: a bad value is one clear line, exit 2."""

from __future__ import annotations

import argparse
import math
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
