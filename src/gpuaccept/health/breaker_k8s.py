"""The circuit breaker on mass taints in Kubernetes (pure): before ``node-status label --apply --taint`` taints a
node, it counts the nodes gpuaccept tainted within a sliding window and holds back past a limit, as
:mod:`gpuaccept.health.breaker` does for Slurm drains.

The source of truth is the cluster's own Node objects, so that every node's pod sees the same count with no
server of ours: a node counts while it carries our taint (``gpuaccept.io/health=fail:NoSchedule``, exactly), its
``gpuaccept.io/health-checked`` annotation (written in the same patch as the taint) is within the window, and no
person acknowledged it. ``node-status label --breaker reset`` acknowledges the counted nodes: it writes
``gpuaccept.io/breaker-ack`` with the ``health-checked`` time it acknowledges, so the node stays tainted (and
gpuaccept's to clear), and a later taint of the same node (a new ``health-checked``) counts again.
Equivalent by hand: ``kubectl get nodes -o json`` and the nodes whose ``spec.taints`` hold ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpuaccept.health.breaker import Breaker, Verdict
from gpuaccept.health.nodepatch import CHECKED_ANNOTATION, DOMAIN, is_ours

ACK_ANNOTATION = f"{DOMAIN}/breaker-ack"
"""A person's reset: the ``health-checked`` time of the taint it acknowledged."""
HELD_ANNOTATION = f"{DOMAIN}/breaker-held"
"""Written instead of the taint when the breaker held it back: why, in words."""


@dataclass(frozen=True)
class Tainted:
    """A node that carries our taint: when it was tainted (its ``health-checked`` time; None when unreadable),
    the raw annotation, and whether a person acknowledged that taint."""

    node: str
    when: datetime | None
    checked: str
    acked: bool


def _meta(item: Any) -> dict[str, Any]:
    meta = item.get("metadata") if isinstance(item, dict) else None
    return meta if isinstance(meta, dict) else {}


def _time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def node_names(node_list: dict[str, Any]) -> list[str]:
    """The names of the nodes of a ``NodeList`` (``GET /api/v1/nodes``)."""
    return [str(_meta(i).get("name", "")) for i in node_list.get("items") or [] if _meta(i).get("name")]


def tainted(node_list: dict[str, Any]) -> list[Tainted]:
    """The nodes of a ``NodeList`` that carry our taint."""
    out = []
    for item in node_list.get("items") or []:
        spec = item.get("spec") if isinstance(item, dict) else None
        taints = spec.get("taints") if isinstance(spec, dict) else None
        if not isinstance(taints, list) or not any(is_ours(t) for t in taints):
            continue
        notes = _meta(item).get("annotations") or {}
        checked = str(notes.get(CHECKED_ANNOTATION, ""))
        out.append(Tainted(str(_meta(item).get("name", "")), _time(checked) if checked else None, checked,
                           bool(checked) and notes.get(ACK_ANNOTATION) == checked))
    return out


def counted(node_list: dict[str, Any], now: datetime, window_s: float, exclude: str = "") -> list[Tainted]:
    """Our standing taints set within ``window_s`` of ``now`` (timezone-aware), not acknowledged, other than
    ``exclude`` (the node asking: re-tainting it adds none)."""
    since = now - timedelta(seconds=window_s)
    return [t for t in tainted(node_list) if t.node != exclude and not t.acked and t.when is not None
            and t.when >= since]


def decide(breaker: Breaker, node_list: dict[str, Any], now: datetime, node: str) -> Verdict:
    """Whether tainting ``node`` now would pass the breaker's limit."""
    mine = counted(node_list, now, breaker.window_s, exclude=node)
    total = len(node_names(node_list))
    allowed = breaker.allowed(total)
    names = tuple(sorted(t.node for t in mine))
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    if len(mine) >= allowed:
        return Verdict(True, f"circuit breaker open: {len(mine)} node(s) tainted by gpuaccept in the last "
                             f"{breaker.window_s:g} s ({shown}), limit {allowed} of {total} ({breaker.describe()}); "
                             "a person resets it with gpuaccept node-status label --breaker reset", names)
    return Verdict(False, f"circuit breaker closed: {len(mine)} of {allowed} allowed", names)


def ack_patch(t: Tainted) -> list[dict[str, Any]]:
    """The JSON patch that acknowledges ``t``'s taint (its annotations exist: ``health-checked`` is one)."""
    return [{"op": "add", "path": "/metadata/annotations/" + ACK_ANNOTATION.replace("/", "~1"), "value": t.checked}]
