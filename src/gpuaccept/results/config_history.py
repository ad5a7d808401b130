"""Each node's configuration per run in the history (``config`` table, schema v5), and what changed since it
last passed.

Rows come from a node report's ``conformance`` check (:func:`config_rows`): one per item, keyed by host and
part (the GPU's UUID for ``gpu.<i>.*`` items, the NIC's node GUID for ``nic.<dev>.*``, ``node`` for the rest),
and one per part identity (``is_id``). Values are stored as JSON so a bool stays a bool. :func:`changes`
answers ``gpuaccept conformance changes NODE``: the node's latest stored configuration against the one of its
last passing run (or of ``--since RUN|DATE``). Pure where it can be; the queries take an open store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from gpuaccept.errors import InputError, UsageError

if TYPE_CHECKING:
    from gpuaccept.results.store import Store

CONFIG_COLUMNS: Final = ("host", "part", "item", "value", "is_id")
"""The ``config`` table's columns after ``run`` (:mod:`gpuaccept.results.migrations`, v5)."""


def _part_of(item: str, ids: dict[str, Any]) -> str:
    """The part an item belongs to: the GPU UUID or NIC node GUID when known, else ``gpu.3``/``nic.mlx5_0``."""
    parts = item.split(".")
    if parts[0] == "gpu" and len(parts) >= 3:
        return str(ids.get(f"gpu.{parts[1]}.uuid") or f"gpu.{parts[1]}")
    if parts[0] == "nic" and len(parts) >= 3:
        return str(ids.get(f"nic.{parts[1]}.node_guid") or f"nic.{parts[1]}")
    return "node"


def config_rows(host: str, checks: Iterable[tuple[Any, Any]]) -> list[tuple[Any, ...]]:
    """``config`` rows (CONFIG_COLUMNS order) from ``(check name, details)`` of a node report (pure)."""
    for name, details in checks:
        if name != "conformance" or not isinstance(details, dict):
            continue
        conf = details.get("conformance")
        if not isinstance(conf, dict) or not isinstance(conf.get("items"), dict):
            continue
        raw = conf.get("ids")
        ids: dict[str, Any] = raw if isinstance(raw, dict) else {}
        rows = [(host, _part_of(k, ids), k, json.dumps(v), 0) for k, v in sorted(conf["items"].items())]
        rows += [(host, str(v), k, json.dumps(v), 1) for k, v in sorted(ids.items())]
        return rows
    return []


@dataclass
class StoredConfig:
    """One run's configuration of a node: ``items`` and ``ids`` as collected, ``parts`` item -> part."""

    run_id: str
    started: str
    started_ts: float
    verdict: str
    items: dict[str, Any] = field(default_factory=dict)
    ids: dict[str, Any] = field(default_factory=dict)
    parts: dict[str, str] = field(default_factory=dict)

    def head(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "started": self.started, "verdict": self.verdict}


def node_configs(store: Store, host: str) -> list[StoredConfig]:
    """Every stored configuration of ``host``, newest first."""
    rows = store.read_rows(
        "SELECT r.run_id, r.started, r.started_ts, r.verdict, c.part, c.item, c.value, c.is_id, r.id "
        "FROM config c JOIN runs r ON r.id = c.run WHERE c.host = ? ORDER BY r.started_ts DESC, r.id DESC, c.id",
        (host,))
    out: dict[int, StoredConfig] = {}
    for run_id, started, ts, verdict, part, item, value, is_id, pk in rows:
        cfg = out.setdefault(pk, StoredConfig(run_id, started, float(ts), verdict))
        if is_id:
            cfg.ids[item] = json.loads(value)
        else:
            cfg.items[item] = json.loads(value)
            cfg.parts[item] = part
    return list(out.values())


def _diff(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
            if json.dumps(before.get(k)) != json.dumps(after.get(k))]


def changes(store: Store, host: str, since: str | None = None) -> dict[str, Any]:
    """What changed in ``host``'s configuration: its latest stored one against that of its last passing run
    (``since`` None), of run ``since``, or the newest at or before the date ``since``. InputError when the
    history cannot answer (no configuration of the node, no passing run); UsageError for a ``since`` that is
    neither a run of the node nor a date."""
    from gpuaccept.results.timespec import parse_since

    configs = node_configs(store, host)
    if not configs:
        raise InputError(f"{host}: no configuration in the history (runs of this node with the conformance check "
                         f"are stored from gpuaccept's history schema v5 on)")
    latest = configs[0]
    if since is None:
        base = next((c for c in configs if c.verdict == "success"), None)
        if base is None:
            raise InputError(f"{host}: no passing run with a configuration in the history; give --since RUN|DATE")
    else:
        base = next((c for c in configs if c.run_id == since), None)
        if base is None:
            try:
                when = parse_since(since)
            except UsageError:
                raise UsageError(f"--since {since}: not a run of {host} with a configuration, nor a date "
                                 f"(2026-11-01, 7d)") from None
            base = next((c for c in configs if c.started_ts <= when), None)
            if base is None:
                raise InputError(f"--since {since}: {host} has no configuration stored at or before then")
    items = [{"item": k, "part": latest.parts.get(k) or base.parts.get(k), "before": b, "after": a}
             for k, b, a in _diff(base.items, latest.items)]
    parts = [{"item": k, "before": b, "after": a} for k, b, a in _diff(base.ids, latest.ids)]
    return {"host": host, "since": base.head(), "latest": latest.head(), "changes": items, "parts": parts}


def _show(v: Any) -> str:
    if v is None:
        return "(none)"
    return str(v).lower() if isinstance(v, bool) else str(v)


def change_lines(result: dict[str, Any]) -> list[str]:
    """The text view of :func:`changes`."""
    s, latest = result["since"], result["latest"]
    lines = [f"{result['host']}: {len(result['changes'])} item(s) changed, {len(result['parts'])} part(s) replaced "
             f"since run {s['run_id']} ({s['started']}, {s['verdict']}); latest run {latest['run_id']} "
             f"({latest['started']}, {latest['verdict']})"]
    for c in result["changes"]:
        part = f" [{c['part']}]" if c["part"] and c["part"] != "node" else ""
        lines.append(f"  {c['item']}{part}: {_show(c['before'])} -> {_show(c['after'])}")
    lines += [f"  part {c['item']}: {_show(c['before'])} -> {_show(c['after'])}" for c in result["parts"]]
    return lines
