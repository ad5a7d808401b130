"""Which check produces which metric: name checks for threshold rules and metric filters. Pure functions.

Each check declares the names of the metrics it can produce (:attr:`gpuaccept.checks.base.Check.metrics`,
fnmatch patterns allowed). A rule names metrics with a glob; :func:`globs_overlap` says whether some
name matches both a rule's glob and a declared pattern, so ``gemm_*_tflops`` is a metric of ``compute``
and ``gemm_fp32_tflop`` is of no check. :func:`rule_problem` turns that into the one line a user sees
(``no check produces ...; did you mean gemm_fp32_tflops?``) or into a note for the plan.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from gpuaccept.inputs import did_you_mean

if TYPE_CHECKING:
    from gpuaccept.checks.base import Check

_Token = tuple[str, str]  # ("*", ""), ("?", ""), ("[", class text), ("c", one literal character)


def _tokens(pattern: str) -> tuple[_Token, ...]:
    """An fnmatch pattern as tokens; an unclosed ``[`` is a literal, as fnmatch reads it."""
    out: list[_Token] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if not out or out[-1][0] != "*":
                out.append(("*", ""))
        elif c == "?":
            out.append(("?", ""))
        elif c == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] in "!^":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                j += 1
            if j >= len(pattern):
                out.append(("c", "["))
            else:
                out.append(("[", pattern[i + 1:j]))
                i = j
        else:
            out.append(("c", c))
        i += 1
    return tuple(out)


def _class_chars(body: str) -> tuple[bool, set[str]]:
    """(negated, the characters) of a ``[...]`` body, ranges expanded."""
    negated = body[:1] in ("!", "^")
    body = body[1:] if negated else body
    chars: set[str] = set()
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            chars.update(chr(x) for x in range(ord(body[i]), ord(body[i + 2]) + 1))
            i += 3
        else:
            chars.add(body[i])
            i += 1
    return negated, chars


def _one_char_overlap(a: _Token, b: _Token) -> bool:
    """Whether one character can match both single-character tokens."""
    if a[0] == "?" or b[0] == "?":
        return True
    if a[0] == "c" and b[0] == "c":
        return a[1] == b[1]
    if a[0] == "c" or b[0] == "c":
        lit, cls = (a, b) if a[0] == "c" else (b, a)
        negated, chars = _class_chars(cls[1])
        return (lit[1] in chars) != negated
    (na, ca), (nb, cb) = _class_chars(a[1]), _class_chars(b[1])
    if na and nb:
        return True
    if na or nb:
        return bool((cb - ca) if na else (ca - cb))
    return bool(ca & cb)


@lru_cache(maxsize=4096)
def globs_overlap(a: str, b: str) -> bool:
    """Whether some name matches both fnmatch patterns ``a`` and ``b`` (case-sensitive, as ``fnmatchcase``)."""
    ta, tb = _tokens(a), _tokens(b)
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        i, j = todo.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(ta) and j == len(tb):
            return True
        star_a = i < len(ta) and ta[i][0] == "*"
        star_b = j < len(tb) and tb[j][0] == "*"
        if star_a:
            todo.append((i + 1, j))
            if j < len(tb) and not star_b:
                todo.append((i, j + 1))
        if star_b:
            todo.append((i, j + 1))
            if i < len(ta) and not star_a:
                todo.append((i + 1, j))
        if i < len(ta) and j < len(tb) and not star_a and not star_b and _one_char_overlap(ta[i], tb[j]):
            todo.append((i + 1, j + 1))
    return False


def produces(cls: type[Check], metric: str) -> bool | None:
    """Whether ``cls`` declares a metric matching the glob ``metric``; None when it declares none (a plugin)."""
    declared = getattr(cls, "metrics", None)
    if declared is None:
        return None
    return any(globs_overlap(metric, p) for p in declared)


def _names(checks: Iterable[type[Check]]) -> list[str]:
    return [p for c in checks for p in (getattr(c, "metrics", None) or ())]


@dataclass(frozen=True)
class Finding:
    """What a rule's metric glob names: ``error`` (the rule can never apply: exit 2), or a ``note`` for
    the plan (it applies to no selected check, or cannot be verified); both None when all is well."""

    error: str | None = None
    note: str | None = None


def rule_finding(metric: str, registry: Mapping[str, type[Check]], selected: Collection[str],
                 owner: str | None = None) -> Finding:
    """Judge a rule on ``metric`` (a glob) against what the checks declare.

    ``owner`` is the check a config rule sits under (``checks.<owner>.thresholds``); None for a rule
    that applies to every check (a baseline threshold). ``selected`` are the checks the run plans.
    """
    if owner is not None:
        cls = registry[owner]
        own = produces(cls, metric)
        if own is None:
            return Finding(note=f"check {owner} declares no metrics: its rule on {metric!r} is not verified")
        if own:
            return Finding(note=None if owner in selected else
                           f"check {owner} is not selected: its rule on {metric!r} applies to nothing")
        others = [n for n, c in registry.items() if n != owner and produces(c, metric)]
        if others:
            where = ", ".join(f"{n}{'' if n in selected else ' (not selected)'}" for n in others)
            return Finding(error=f"{metric!r} is not a metric of check {owner} but of {where}; "
                                 f"move the rule to checks.{others[0]}.thresholds")
        own_names = _names([cls])
        hint = did_you_mean(metric, own_names) or did_you_mean(metric, _names(registry.values()))
        return Finding(error=f"check {owner} produces no metric {metric!r}{hint}; its metrics: "
                             f"{_shown(own_names)}")
    if any(produces(registry[n], metric) for n in selected if n in registry):
        return Finding()
    owners = [n for n, c in registry.items() if produces(c, metric)]
    if owners:
        return Finding(note=f"{metric!r} names metrics of {', '.join(owners)}, not selected: the rule applies "
                            "to nothing in this run")
    unverified = [n for n in selected if n in registry and produces(registry[n], metric) is None]
    if unverified:
        return Finding(note=f"{metric!r} is of no check that declares its metrics; not verified "
                            f"(declare none: {', '.join(unverified)})")
    return Finding(error=f"no check produces a metric {metric!r}{did_you_mean(metric, _names(registry.values()))}")


def _shown(names: list[str], most: int = 12) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "") or "none"


RATE_UNITS = ("ms", "us", "MHz")
"""Units of a time or frequency figure; with every unit ending in ``/s`` they make a figure rate-like."""


def rate_like(unit: str) -> bool:
    """Whether a figure in ``unit`` is a rate, a bandwidth or a time (``GB/s``, ``IO/s``, ``ms``...)."""
    return unit.endswith("/s") or unit in RATE_UNITS


NOT_PERFORMANCE: dict[str, str] = {
    "stress_tflops_start": "part of stress_throughput_drop, judged by max_drop (stress_tflops is the figure)",
    "stress_tflops_end": "part of stress_throughput_drop, judged by max_drop (stress_tflops is the figure)",
    "stress_sm_clock_mhz": "telemetry; throttling is judged by stress_throttle_fraction",
    "memtest_gbs": "the speed of the verification loop, not of the memory (d2d_copy_gbs judges that)",
    "*_time_us": "one row of the size sweep; the large-message busbw is the judged figure",
    "*_algbw_gbs": "one row of the size sweep; the large-message busbw is the judged figure",
    "*_busbw_gbs": "one row of the size sweep; the large-message busbw is the judged figure",
    "*_avg_busbw_gbs": "nccl-tests' average over every size, latency-bound ones included: set by the size range",
    "p2p_latency_us": "the time of one small peer copy, shown for diagnosis; the pair's copy rate is judged",
    "rdma_port_rate_gbps": "the negotiated link rate read from sysfs, judged by fabric against the expected rate",
    "rdma_*_peak_gbps": "perftest's best interval, shown for diagnosis; the average (rdma_<test>_gbps) is judged",
}
"""Rate-like figures (:func:`rate_like`) that are not performance figures, by name glob, and why. Every
other rate-like figure a check reports carries ``Metric.performance`` and must find an expectation on a GPU
node (the SKU table, the fabric model, a baseline or a rule), else its check WARNs naming it."""


def performance_expected(name: str, unit: str) -> bool:
    """Whether a figure ``name`` in ``unit`` must be flagged a performance figure: rate-like and not in
    :data:`NOT_PERFORMANCE`."""
    return rate_like(unit) and not any(fnmatch.fnmatchcase(name, p) for p in NOT_PERFORMANCE)
