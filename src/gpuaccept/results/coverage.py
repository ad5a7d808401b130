"""What the outlier analysis compared, and what it could not: per SKU/metric group and in one line.

A group (one SKU, one metric key) is compared in up to two ways
(:mod:`gpuaccept.results.analysis`): ``node``, each GPU against its siblings
(GPU metrics only; needs ``min_siblings`` GPUs in a node) and ``cluster``,
against the other nodes of the SKU (needs ``min_nodes`` nodes). Each stats
entry of an analysis carries::

    "compared": ["node", "cluster"]       # the comparisons that ran (may be empty)
    "not_compared": {"cluster": "fewer than 3 nodes"}   # those that apply but could not run, and why

and the analysis carries a summary, ``coverage``::

    {"groups": 140, "compared": 100, "fully": 0, "partly": {"within nodes only (fewer than 3 nodes)": 100},
     "not_compared": {"fewer than 3 nodes": 40}}

``compared`` counts the groups with any comparison; ``partly`` the groups
compared one way only, by what was left out; ``not_compared`` the groups not
compared at all, by why. A run where nothing was compared never reads as a
clean result: :func:`outlier_line` says so. Analyses stored before these
fields existed are summed up from each group's ``nodes`` and the policy's
``min_nodes`` (only the comparison across nodes is known then: ``unknown``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_PARTLY = {"cluster": "within nodes only", "node": "across nodes only"}


def coverage_of_group(nodes: int, most_gpus: int | None, min_nodes: int, min_siblings: int) -> dict[str, Any]:
    """``compared`` and ``not_compared`` of one group: on ``nodes`` nodes, at most ``most_gpus`` GPUs in one
    node (None: not a GPU metric, so no within-node comparison applies)."""
    compared: list[str] = []
    missing: dict[str, str] = {}
    if most_gpus is not None:
        if most_gpus >= min_siblings:
            compared.append("node")
        else:
            missing["node"] = f"fewer than {min_siblings} GPUs in any node"
    if nodes >= min_nodes:
        compared.append("cluster")
    else:
        missing["cluster"] = f"fewer than {min_nodes} nodes"
    return {"compared": compared, "not_compared": missing}


def _count(d: dict[str, int], key: str) -> None:
    d[key] = d.get(key, 0) + 1


def coverage_summary(stats: Iterable[Mapping[str, Any]], min_nodes: int = 3) -> dict[str, Any]:
    """The ``coverage`` dict (module docstring) of an analysis's stats entries. An entry without
    ``compared`` (stored before it existed) with fewer than ``min_nodes`` nodes is counted in ``unknown``:
    it was not compared across nodes, and whether it was within nodes is not recorded."""
    out: dict[str, Any] = {"groups": 0, "compared": 0, "fully": 0, "partly": {}, "not_compared": {}}
    unknown = 0
    for g in stats:
        out["groups"] += 1
        if "compared" not in g:
            nodes = g.get("nodes")
            if isinstance(nodes, int) and nodes >= min_nodes:
                out["compared"] += 1
                out["fully"] += 1
            else:
                unknown += 1
            continue
        compared, missing = list(g.get("compared") or []), dict(g.get("not_compared") or {})
        why = " and ".join(str(missing[k]) for k in ("cluster", "node") if k in missing)
        if not compared:
            _count(out["not_compared"], why or "unknown")
            continue
        out["compared"] += 1
        if missing:
            scope = next(k for k in ("cluster", "node") if k in missing)
            _count(out["partly"], f"{_PARTLY[scope]} ({why})")
        else:
            out["fully"] += 1
    if unknown:
        out["unknown"] = {f"fewer than {min_nodes} nodes": unknown}
    return out


def coverage_of(analysis: Mapping[str, Any] | None) -> dict[str, Any]:
    """The analysis's ``coverage``, or one summed up from its stats (an analysis stored before it existed)."""
    analysis = analysis or {}
    cov = analysis.get("coverage")
    if isinstance(cov, dict) and isinstance(cov.get("groups"), int):
        return cov
    stats = analysis.get("stats")
    policy = analysis.get("policy")
    min_nodes = policy.get("min_nodes", 3) if isinstance(policy, dict) else 3
    entries = [g for g in stats.values() if isinstance(g, dict)] if isinstance(stats, dict) else []
    return coverage_summary(entries, min_nodes if isinstance(min_nodes, int) else 3)


def coverage_line(analysis: Mapping[str, Any] | None) -> str:
    """``140 SKU/metric group(s): 100 compared within nodes only (fewer than 3 nodes), 40 not compared
    (fewer than 3 nodes)``; ``..., all compared`` when nothing was left out."""
    cov = coverage_of(analysis)
    n = cov["groups"]
    head = f"{n} SKU/metric group(s)"
    if n and cov["fully"] == n:
        return f"{head}, all compared"
    parts = [f"{cov['fully']} compared"] if cov["fully"] else []
    for phrase, count in sorted(cov["partly"].items(), key=lambda kv: -kv[1]):
        parts.append(f"{count} compared {phrase}")
    for why, count in sorted(cov["not_compared"].items(), key=lambda kv: -kv[1]):
        parts.append(f"{count} not compared ({why})")
    for why, count in (cov.get("unknown") or {}).items():
        parts.append(f"{count} not compared across nodes ({why}; whether within nodes is not recorded)")
    return f"{head}: {', '.join(parts)}" if parts else head


def not_compared_count(analysis: Mapping[str, Any] | None) -> int:
    """Groups not compared at all."""
    return int(sum(coverage_of(analysis)["not_compared"].values()))


def outlier_line(analysis: Mapping[str, Any] | None, n_outliers: int, max_z: float | None = None) -> str:
    """``3 outlier(s) at |z| >= 5 in the 100 compared group(s) of 140``; never a bare "0 outliers" when a
    group was left out, and ``nothing was compared: no outlier can be found`` when none was compared."""
    cov = coverage_of(analysis)
    at = f" at |z| >= {max_z:g}" if max_z is not None else ""
    if not cov["groups"]:
        return "no values to compare: no outlier can be found"
    if not cov["compared"]:
        if cov.get("unknown"):
            return f"{n_outliers} outlier(s){at}: nothing was compared across nodes (within nodes: not recorded)"
        return "nothing was compared: no outlier can be found"
    where = "" if cov["fully"] == cov["groups"] else f" in the {cov['compared']} compared group(s) of {cov['groups']}"
    if where and cov["partly"]:
        where += " (some compared one way only)"
    return f"{n_outliers} outlier(s){at}{where}"
