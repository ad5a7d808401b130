"""Times in the history: report timestamps to epoch seconds, and ``--since`` values.

Every time is UTC. A report's ``started`` is ISO 8601 (``2026-11-22T10:15:00Z``);
one without a zone is taken as UTC.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone

from gpuaccept.errors import InputError, UsageError

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)$", re.IGNORECASE)
_UNIT_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _parse_iso(text: str) -> datetime:
    t = text.strip()
    if t.endswith(("Z", "z")):
        t = t[:-1] + "+00:00"
    dt = datetime.fromisoformat(t)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt


def iso_to_epoch(text: str, what: str = "time") -> float:
    """Epoch seconds (UTC) of an ISO 8601 timestamp; InputError naming ``what`` when it is not one."""
    try:
        return _parse_iso(text).timestamp()
    except (ValueError, TypeError, AttributeError):
        raise InputError(f"{what}: {text!r} is not an ISO 8601 time such as 2026-11-22T10:15:00Z") from None


def epoch_to_iso(ts: float) -> str:
    """``2026-11-22T10:15:00Z`` for epoch seconds ``ts``."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_since(text: str, now: float | None = None, source: str = "--since") -> float:
    """Epoch seconds for a ``--since`` value.

    Accepts an ISO date or time (``2026-11-01``, ``2026-11-01T08:00``, ``...Z``;
    UTC when no zone is given), a span back from now (``90m``, ``12h``, ``7d``,
    ``2w``), ``today`` or ``yesterday`` (UTC midnight). UsageError otherwise.
    """
    now = time.time() if now is None else now
    t = text.strip()
    low = t.lower()
    if low in ("today", "yesterday"):
        midnight = datetime.fromtimestamp(now, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        return (midnight - timedelta(days=1 if low == "yesterday" else 0)).timestamp()
    m = _RELATIVE.match(t)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2).lower()]
    try:
        return _parse_iso(t).timestamp()
    except ValueError:
        raise UsageError(f"{source}: {text!r} is not a date (2026-11-01, 2026-11-01T08:00Z) "
                         "or a span back from now (12h, 7d, 2w)") from None
