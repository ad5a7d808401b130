"""Node reports read back from container logs (``kubectl logs``, ``runai ... logs``).

A container started with :data:`gpuaccept.launch.pod_script.NODE_SCRIPT`
prints each ``report.json`` between marker lines after its job. Logs without
markers are searched for a report printed by ``gpuaccept run --json -``.
Pure functions: text in, reports and problems out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.launch.pod_script import REPORT_BEGIN, REPORT_END
from gpuaccept.model import NodeReport

_REPORT_KEYS = ("run_id", "host", "checks", "verdict")


@dataclass
class LogReports:
    """What one log held: the reports, and why any block was unreadable (one line each)."""

    reports: list[NodeReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def reports_from_log(text: str, source: str = "log") -> LogReports:
    """Every node report in ``text``; ``source`` (a pod name) prefixes the problem lines."""
    out = LogReports()
    lines = text.splitlines()
    found_marker = False
    i = 0
    while i < len(lines):
        if not lines[i].startswith(REPORT_BEGIN):
            i += 1
            continue
        found_marker = True
        path = lines[i][len(REPORT_BEGIN):].strip() or "report.json"
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i] != REPORT_END and not lines[i].startswith(REPORT_BEGIN):
            body.append(lines[i])
            i += 1
        if i >= len(lines) or lines[i] != REPORT_END:
            out.problems.append(f"{source}: report {path} is cut short (no end marker)")
            continue
        i += 1
        _add(out, "\n".join(body), f"{source}: {path}")
    if not found_marker:
        for obj in _bare_json_objects(text):
            if all(k in obj for k in _REPORT_KEYS):
                _add(out, obj, f"{source}: report printed by --json -")
    return out


def _add(out: LogReports, body: str | dict[str, Any], where: str) -> None:
    try:
        data = json.loads(body) if isinstance(body, str) else body
        out.reports.append(NodeReport.from_dict(data))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        out.problems.append(f"{where}: not a gpuaccept report ({type(exc).__name__}: {exc})")


def _bare_json_objects(text: str) -> list[dict[str, Any]]:
    """JSON objects that start at the beginning of a line, as ``gpuaccept run --json -`` prints them."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    pos = 0
    while True:
        start = text.find("{", pos)
        if start < 0:
            return found
        if start > 0 and text[start - 1] != "\n":
            pos = start + 1
            continue
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            pos = start + 1
            continue
        if isinstance(obj, dict):
            found.append(obj)
        pos = end
