"""Fleet conformance without a manifest: the majority configuration per node model is the reference (pure).

Each node's configuration is the ``details.conformance.items`` of its ``conformance`` check
(:mod:`gpuaccept.hw.conformance`). Nodes are grouped by model (GPU name and count); in a group of at
least ``min_nodes`` nodes, an item's reference is the value more than half of them have, and every node
that differs is named with the items (``node07: nic.mlx5_4.fw_ver 28.41.1000, majority 28.39.1002 (7 of 8)``).
An item with no majority is listed as split, not blamed on anyone.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

ABSENT = "(absent)"


def config_of_report(report: Any) -> dict[str, Any] | None:
    """The conformance items of a node report (None when it has no conformance check with items)."""
    for c in getattr(report, "checks", []):
        if c.name == "conformance" and isinstance(c.details, dict):
            items = (c.details.get("conformance") or {}).get("items")
            if isinstance(items, dict):
                return dict(items)
    return None


def configs_of_reports(reports: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """``host -> items`` over node and cluster reports (a cluster report's nodes one by one; the last
    report of a host wins)."""
    out: dict[str, dict[str, Any]] = {}
    for rep in reports:
        nodes = [n.report for n in rep.nodes if n.report is not None] if hasattr(rep, "nodes") else [rep]
        for node in nodes:
            items = config_of_report(node)
            if items is not None:
                out[node.host] = items
    return out


def node_model(items: Mapping[str, Any]) -> str:
    """``8x NVIDIA H100 80GB HBM3`` (the first GPU's name and the count), or ``no GPU``."""
    name, count = items.get("gpu.0.name"), items.get("gpu_count")
    return f"{count}x {name}" if name and count else "no GPU"


def fleet_drift(configs: Mapping[str, Mapping[str, Any]], min_nodes: int = 3) -> dict[str, Any]:
    """The odd nodes per model: ``{"groups": [...], "odd": [{"host", "model", "items": [{"item", "value",
    "majority", "count", "of"}]}], "split": [{"model", "item", "values"}]}``; groups smaller than
    ``min_nodes`` are listed with ``compared: false``."""
    by_model: dict[str, list[str]] = defaultdict(list)
    for host in sorted(configs):
        by_model[node_model(configs[host])].append(host)
    groups: list[dict[str, Any]] = []
    odd: dict[str, dict[str, Any]] = {}
    split: list[dict[str, Any]] = []
    for model, hosts in sorted(by_model.items()):
        compared = len(hosts) >= min_nodes
        groups.append({"model": model, "nodes": len(hosts), "compared": compared})
        if not compared:
            continue
        names = sorted({k for h in hosts for k in configs[h]})
        for item in names:
            values = {h: configs[h].get(item, ABSENT) for h in hosts}
            counts = Counter(repr(v) for v in values.values())
            top, n = counts.most_common(1)[0]
            if n == len(hosts):
                continue
            if 2 * n <= len(hosts):
                split.append({"model": model, "item": item, "values": dict(sorted(counts.items()))})
                continue
            majority = next(v for v in values.values() if repr(v) == top)
            for h, v in values.items():
                if repr(v) != top:
                    entry = odd.setdefault(h, {"host": h, "model": model, "items": []})
                    entry["items"].append({"item": item, "value": v, "majority": majority, "count": n,
                                           "of": len(hosts)})
    return {"groups": groups, "odd": [odd[h] for h in sorted(odd)], "split": split}


def show_value(v: Any) -> str:
    """A value as the manifest writes it: ``true``/``false``, ``16`` for 16.0, text as is."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def drift_lines(drift: Mapping[str, Any]) -> list[str]:
    """The text view: one line per odd node, then the split items (nothing when every node agrees)."""
    lines = []
    for node in drift["odd"]:
        shown = "; ".join(f"{i['item']} {show_value(i['value'])}, majority {show_value(i['majority'])} "
                          f"({i['count']} of {i['of']})"
                          for i in node["items"])
        lines.append(f"{node['host']} ({node['model']}): {shown}")
    for s in drift["split"]:
        lines.append(f"{s['model']}: {s['item']} has no majority: {', '.join(s['values'])}")
    return lines


def drift_summary(drift: Mapping[str, Any]) -> str:
    """``conformance: 1 of 8 node(s) differ from the majority of their model`` (or why nothing was compared)."""
    compared = [g for g in drift["groups"] if g["compared"]]
    if not drift["groups"]:
        return "conformance: no report has a conformance check"
    if not compared:
        return "conformance: not compared (fewer nodes of a model than needed for a majority)"
    total = sum(g["nodes"] for g in compared)
    return f"conformance: {len(drift['odd'])} of {total} node(s) differ from the majority of their model"


def ids_of_report(report: Any) -> dict[str, Any]:
    """The part identities (GPU UUIDs, NIC GUIDs) of a node report's conformance check (empty when none)."""
    for c in getattr(report, "checks", []):
        if c.name == "conformance" and isinstance(c.details, dict):
            ids = (c.details.get("conformance") or {}).get("ids")
            if isinstance(ids, dict):
                return dict(ids)
    return {}


def config_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What changed between two configurations of one node, item by item in name order (``before``/``after``
    is :data:`ABSENT` where the item is new or gone). Pure."""
    out = []
    for item in sorted(set(before) | set(after)):
        old, new = before.get(item, ABSENT), after.get(item, ABSENT)
        if repr(old) != repr(new):
            out.append({"item": item, "before": old, "after": new})
    return out
