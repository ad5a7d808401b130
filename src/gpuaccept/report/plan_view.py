"""``gpuaccept run --plan`` for a person: one row per check (depth, expected seconds, timeout) and the totals.

Reads the plan as the JSON ``--plan`` prints (:meth:`gpuaccept.node.run.Prepared.to_dict`): the report side
imports nothing of the node engine.
"""

from __future__ import annotations

from typing import Any

from gpuaccept.argtypes import fmt_s

MAX_PARAMS = 60
"""Characters of a check's parameters shown in its row (the JSON has them all)."""


def _params(params: dict[str, Any]) -> str:
    text = " ".join(f"{k}={_value(v)}" for k, v in params.items())
    return text if len(text) <= MAX_PARAMS else text[:MAX_PARAMS - 3] + "..."


def _value(v: Any) -> str:
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """The table and the lines under it: what the run expects to take, and at most (the timeouts)."""
    rows = [("check", "depth / parameters", "expected", "timeout")]
    unknown = []
    for c in plan["checks"]:
        expected = c.get("expected_s")
        if expected is None:
            unknown.append(c["name"])
        rows.append((c["name"], _params(c.get("params", {})) or "-",
                     f"~{fmt_s(expected)}" if expected is not None else "unknown", fmt_s(c["timeout_s"])))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}".rstrip() for r in rows]
    device = plan.get("device", "")
    total = plan.get("expected_total_s")
    timeouts = sum(float(c["timeout_s"]) for c in plan["checks"])
    head = f"profile {plan.get('profile')} on {device}, {len(plan['checks'])} checks"
    lines.insert(0, head + (" (CPU only: no GPU is tested)" if device == "cpu" else ""))
    if total is not None:
        note = f" ({len(unknown)} without an estimate: {', '.join(unknown)})" if unknown else ""
        lines.append(f"expected: about {fmt_s(total)} here, the run's start included{note}; "
                     f"at most {fmt_s(timeouts)} (every check to its timeout)")
    profile = plan.get("profile_expected")
    if isinstance(profile, dict):
        lines.append(f"profile {plan.get('profile')}: about {fmt_s(profile['expected_s'])} on a node with "
                     f"{profile['gpus']} GPUs, built-in estimates ({profile['dcgm']})")
    lines += [f"note: {n}" for n in plan.get("notes", [])]
    return lines
