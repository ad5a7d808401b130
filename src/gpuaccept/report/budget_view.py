"""A ``run --budget`` plan as the report renderings show it: one row per check kept, left out, re-run deeper or
suspect but not re-run (:mod:`gpuaccept.node.budget` writes the plan into ``NodeReport.budget``). Pure functions,
read defensively: a report is input, and a malformed entry is left out rather than failing a rendering.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuaccept.argtypes import fmt_s
from gpuaccept.model import NodeReport
from gpuaccept.report.views import NodeView


@dataclass(frozen=True)
class BudgetRow:
    """One check of a ``run --budget`` plan as the renderings show it.

    ``state``: ``kept`` (ran in the first pass), ``left out`` (did not fit), ``re-run`` (run again deeper)
    or ``not re-run`` (suspect, but no deeper level fitted); ``level`` the depth it ran at (empty when it
    did not run); ``planned`` the run's profile's level (for a re-run: the first pass's level);
    ``estimate_s`` the planner's seconds (for a check left out: what it needed at its shallowest); ``why``
    the planner's own words.
    """

    name: str
    state: str
    level: str
    planned: str
    estimate_s: float | None
    why: str

    @property
    def level_text(self) -> str:
        """``quick (planned standard)``, ``standard``; for a re-run ``standard (first pass quick)``."""
        if self.state == "re-run":
            return f"{self.level} (first pass {self.planned})" if self.planned else self.level
        return self.level + (f" (planned {self.planned})" if self.planned and self.planned != self.level else "")

    @property
    def estimate_text(self) -> str:
        """``~5s``; for a check left out ``needs ~16s``; empty without an estimate."""
        if self.estimate_s is None:
            return ""
        return ("needs " if self.state == "left out" else "") + f"~{fmt_s(self.estimate_s)}"


@dataclass(frozen=True)
class BudgetView:
    """A node's ``run --budget`` plan (``NodeReport.budget``), read defensively: malformed entries are left out."""

    host: str
    budget_s: float
    estimate_s: float | None
    rows: tuple[BudgetRow, ...]

    def by_state(self, state: str) -> list[BudgetRow]:
        return [r for r in self.rows if r.state == state]

    def summary(self) -> str:
        """``budget 30s: 5 of 6 checks kept (~23s estimated), 1 left out (stress), 1 re-run deeper (train)``."""
        kept, out = self.by_state("kept"), self.by_state("left out")
        text = f"budget {fmt_s(self.budget_s)}: {len(kept)} of {len(kept) + len(out)} checks kept"
        if self.estimate_s is not None:
            text += f" (~{fmt_s(self.estimate_s)} estimated)"
        for state, words in (("left out", "left out"), ("re-run", "re-run deeper"),
                             ("not re-run", "suspect, not re-run")):
            rows = self.by_state(state)
            if rows:
                text += f", {len(rows)} {words} ({', '.join(r.name for r in rows)})"
        return text


def _text(x: Any) -> str:
    return x if isinstance(x, str) else ""


def _seconds(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _items(d: dict[str, Any], key: str) -> list[Any]:
    value = d.get(key)
    return value if isinstance(value, list) else []


def budget_view(report: NodeReport) -> BudgetView | None:
    """The report's budget as rows: kept checks in suite order, then those left out, then the second pass;
    None for a run without ``--budget``."""
    b = report.budget
    if not isinstance(b, dict) or _seconds(b.get("budget_s")) is None:
        return None
    rows: list[BudgetRow] = []
    for item in _items(b, "kept"):
        if isinstance(item, dict) and _text(item.get("name")):
            level = _text(item.get("level"))
            rows.append(BudgetRow(item["name"], "kept", level, _text(item.get("planned_level")) or level,
                                  _seconds(item.get("estimate_s")), _text(item.get("why"))))
    for item in _items(b, "left_out"):
        if isinstance(item, dict) and _text(item.get("name")):
            rows.append(BudgetRow(item["name"], "left out", "", "", _seconds(item.get("needs_s")),
                                  _text(item.get("why"))))
    for item in _items(b, "reruns"):
        if not isinstance(item, dict) or not _text(item.get("name")):
            continue
        first = item.get("first")
        first = first if isinstance(first, dict) else {}
        if "not_rerun" in item:
            rows.append(BudgetRow(item["name"], "not re-run", "", "", None,
                                  f"{_text(item.get('why'))}; not re-run: {_text(item.get('not_rerun'))}"))
        else:
            depth = _text(item.get("depth")) or _text(item.get("level"))
            rows.append(BudgetRow(item["name"], "re-run", _text(item.get("level")), _text(first.get("level")),
                                  _seconds(item.get("estimate_s")),
                                  f"{depth}: {_text(item.get('why'))}" if depth else _text(item.get("why"))))
    return BudgetView(report.host, float(b["budget_s"]), _seconds(b.get("estimate_s")), tuple(rows))


def budget_views(nodes: Sequence[NodeView]) -> list[BudgetView]:
    """The budget of every node report that has one, in node order."""
    return [v for n in nodes if n.report is not None and (v := budget_view(n.report)) is not None]
