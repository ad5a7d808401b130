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


def integer(text: str) -> int:
    """Any integer of at most 12 digits (its range is checked where its meaning is known, with a better reason)."""
    if not re.fullmatch(r"-?\d{1,12}", text.strip()):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer of at most 12 digits")
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
_SPAN_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_SPAN_PART = re.compile(r"(\d{1,9}(?:\.\d{1,6})?)([smhdw])")


def parse_duration(text: str, maximum: float = MAX_DURATION_S) -> float:
    """Seconds in ``90s``, ``10m``, ``1h30m``, ``2d``, ``2w`` or a bare number of seconds (``600``); ValueError
    with a one-line reason when the text is not one, is not more than 0 or exceeds ``maximum`` seconds."""
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
    if seconds > maximum:
        raise ValueError(f"{text!r} is longer than the maximum, {fmt_s(maximum)} ({maximum:g} s)")
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
    """argparse converter for :func:`parse_duration`: seconds, at most 7 days. Every flag that takes a span of
    time uses it (or :func:`duration_up_to`, :func:`time_limit`, :func:`go_duration`): one syntax everywhere."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


duration.grammar = "duration"  # type: ignore[attr-defined]


def duration_up_to(maximum: float) -> Callable[[str], float]:
    """:func:`duration` with another maximum (seconds), e.g. a year for a history window."""

    def convert(text: str) -> float:
        try:
            return parse_duration(text, maximum)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = "duration"
    convert.grammar = "duration"  # type: ignore[attr-defined]
    return convert


def whole_seconds(text: str) -> int:
    """:func:`duration` rounded up to whole seconds (for a setting that is an integer number of seconds)."""
    return math.ceil(duration(text) - 1e-9)


whole_seconds.grammar = "duration"  # type: ignore[attr-defined]


def go_duration(text: str) -> str:
    """A :func:`duration` written for a Go program (``time.ParseDuration``): ``90s``, ``10m`` and ``1h30m`` are kept
    as written; ``2d``, ``1w`` and bare seconds (``600``) become seconds with a unit (``172800s``, ``600s``)."""
    seconds = duration(text)
    t = text.strip().lower()
    return t if re.fullmatch(r"(?:\d{1,9}(?:\.\d{1,6})?[smh])+", t) else f"{seconds:g}s"


go_duration.grammar = "duration"  # type: ignore[attr-defined]

MAX_TIME_LIMIT_MIN = 366 * 24 * 60
"""The longest scheduler time limit accepted, in minutes (a year)."""
_SLURM_TIME = re.compile(r"(?:(?P<d>\d{1,3})-(?P<dh>\d{1,4})(?::(?P<dm>\d{1,4})(?::(?P<ds>\d{1,4}))?)?"
                         r"|(?P<a>\d{1,7})(?::(?P<b>\d{1,4})(?::(?P<c>\d{1,4}))?)?)")


def parse_time_limit(text: str) -> int:
    """Whole minutes (rounded up, as Slurm does) in a scheduler time limit: Slurm's own forms ``MM``, ``MM:SS``,
    ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS`` (a bare number is minutes, as for ``sbatch --time``) or a
    duration with units (``90s``, ``1h30m``, ``2d``). ValueError with a one-line reason otherwise."""
    t = text.strip().lower()
    m = _SLURM_TIME.fullmatch(t)
    if m is None:
        try:
            seconds = parse_duration(t, MAX_TIME_LIMIT_MIN * 60.0)
        except ValueError:
            raise ValueError(f"{text[:40]!r} is not a time limit: minutes (30), MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                             "D-HH:MM:SS (Slurm's forms) or a duration such as 90s, 1h30m, 2d") from None
    elif m.group("d") is not None:
        seconds = (int(m.group("d")) * 86400 + int(m.group("dh")) * 3600 + int(m.group("dm") or 0) * 60
                   + int(m.group("ds") or 0))
    elif m.group("c") is not None:
        seconds = int(m.group("a")) * 3600 + int(m.group("b")) * 60 + int(m.group("c"))
    else:
        seconds = int(m.group("a")) * 60 + int(m.group("b") or 0)
    minutes = math.ceil(seconds / 60 - 1e-9)
    if not 1 <= minutes <= MAX_TIME_LIMIT_MIN:
        raise ValueError(f"{text[:40]!r} must be from 1 minute to 366 days")
    return minutes


def time_limit(text: str) -> int:
    """argparse converter for :func:`parse_time_limit` (whole minutes)."""
    try:
        return parse_time_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


time_limit.grammar = "duration"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------- values that name things
# One rule per kind of value, the same when a value is written (a flag, a plan, the environment) as when it
# is read back (a report, a run directory). Each ``check_*`` returns the value or raises ValueError with a
# one-line reason; the converter of the same name is for argparse ``type=``.

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$")
"""A run id names a directory and files: no path separators, no leading dot, printable ASCII, 1-200 chars."""
HOST_PATTERN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252}[A-Za-z0-9_])?$")
"""A host name as gpuaccept writes it into run ids and passes on a command line: letters, digits, ``.``,
``_`` and ``-``; at most 254 characters; no leading dot or dash."""
IMAGE_PATTERN = re.compile(
    r"^(?:(?P<registry>(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::\d{1,5})?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
"""An OCI image reference, ``[registry[:port]/]path[:tag][@sha256:digest]`` (the distribution grammar)."""
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+@=,:/-]*$")


def check_run_id(text: str) -> str:
    if not RUN_ID_PATTERN.match(text):
        raise ValueError(f"{text[:80]!r} is not a run id: letters, digits and ._:@+=- only, no path separator, "
                         "not starting with a dot, at most 200 characters (it names a directory)")
    return text


def check_host(text: str) -> str:
    if not HOST_PATTERN.match(text):
        raise ValueError(f"{text[:80]!r} is not a host name: letters, digits, '.', '_' and '-' only, starting "
                         "with a letter or digit, at most 254 characters")
    return text


def host_part(text: str, limit: int = 253) -> str:
    """``text`` (a host name from the environment) made safe for a run id and a file name: each character
    outside letters, digits, ``.``, ``_`` and ``-`` becomes ``-``; leading dots and dashes go; cut to ``limit``
    characters; ``host`` when nothing is left. ``gpu node#1`` -> ``gpu-node-1``; a valid host name is kept."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", text).lstrip(".-")[:limit].rstrip(".-")
    return safe or "host"


def check_image(text: str) -> str:
    m = IMAGE_PATTERN.match(text)
    registry = m.group("registry") if m else None
    if m and registry is not None and not ("." in registry or ":" in registry or registry == "localhost"):
        m = None if registry != registry.lower() else m  # no dot or port: a path component, lowercase only
    if m is None:
        raise ValueError(f"{text[:120]!r} is not an image reference: [registry[:port]/]name[:tag][@sha256:...], "
                         "the name in lowercase letters, digits and . _ - separators")
    return text


def check_abs_path(text: str) -> str:
    """An absolute path of plain characters (letters, digits, ``._+@=,:-`` and ``/``), no ``..`` part: a path
    that is written into a job for another machine, where no shell metacharacter or space belongs."""
    if not _SAFE_PATH.match(text) or ".." in text.split("/"):
        raise ValueError(f"{text[:120]!r} is not an absolute path of letters, digits, '/', '.', '_', '-', '+', "
                         "'@', '=', ',' and ':' without '..'")
    return text


def count(minimum: int = 0, maximum: int = 1_000_000) -> Callable[[str], int]:
    """A converter accepting whole numbers from ``minimum`` to ``maximum``."""

    def convert(text: str) -> int:
        t = text.strip()
        if not re.fullmatch(r"[+-]?\d{1,19}", t) or not minimum <= int(t) <= maximum:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} must be a whole number from {minimum} to {maximum}")
        return int(t)

    return convert


def _converter(check: Callable[[str], str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = check.__name__.removeprefix("check_")
    return convert


run_id = _converter(check_run_id)
host = _converter(check_host)
image = _converter(check_image)
abs_path = _converter(check_abs_path)
