"""Slurm side of ``gpuaccept healthcheck``, pure: this node's name, what ``scontrol show node`` says,
the drain or resume to do, and the ``scontrol`` argv that does it. Nothing here runs a command.

The parser is tested on outputs recorded from the local Slurm 22.05 cluster
(``tests/data/slurm/scontrol_node_*.txt``, see the README there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuaccept.errors import InputError, UsageError

REASON_PREFIX = "gpuaccept:"
"""Drain reasons that start with this, after the fault code, are gpuaccept's own; healthcheck resumes only those."""
ACK = "ack"
"""The word ``healthcheck --breaker reset`` puts after the prefix of the drains it counted: a person has seen them
(still gpuaccept's to resume; no longer counted by the circuit breaker)."""
_OURS = re.compile(r"^(?P<code>GA-[A-Z]{2,5}-\d{3} )?gpuaccept:(?P<origin>node|job)?(?P<ack>,ack)?(?= |$)")
NOT_OURS_TO_RESUME = ("gpuaccept: isolated",)
"""gpuaccept reasons healthcheck still leaves alone: ``gpuaccept isolate --drain --apply`` drained the node
after a fabric test this fast check does not repeat (an operator's decision, resumed by hand)."""
MAX_REASON = 120
"""Characters of the Reason kept (Slurm accepts more; ``sinfo -R`` shows about this many)."""

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def valid_node_name(name: str) -> bool:
    """A plain Slurm node name (no list, no spaces, no ``=``): what ``NodeName=`` of one node may hold."""
    return bool(_NODE_NAME.match(name))


def this_node(flag: str | None, env: Mapping[str, str], hostname: str) -> tuple[str, str]:
    """(name, where it came from): ``--node``, else ``SLURMD_NODENAME`` (slurmd sets it for
    HealthCheckProgram, Prolog and Epilog), else the short host name. UsageError for a name that is
    not one plain node name."""
    for value, source in ((flag, "--node"), (env.get("SLURMD_NODENAME"), "SLURMD_NODENAME"),
                          (hostname.split(".")[0], "the host name")):
        if value:
            if not valid_node_name(value):
                raise UsageError(f"{source} {value!r} is not a Slurm node name (letters, digits, '.', '_', '-')")
            return value, source
    raise UsageError("no node name: give --node NAME (SLURMD_NODENAME is unset and the host has no name)")


@dataclass(frozen=True)
class NodeState:
    """One node as ``scontrol show node -o NAME`` prints it.

    ``states`` are the words of ``State=`` (``IDLE+DRAIN`` -> ``("IDLE", "DRAIN")``); ``reason`` is the
    text of ``Reason=`` without Slurm's ``[user@time]`` suffix ("" when there is none); ``reason_by`` that
    suffix's user.
    """

    name: str
    states: tuple[str, ...]
    reason: str = ""
    reason_by: str = ""

    @property
    def drained(self) -> bool:
        """Draining or drained (``DRAIN`` flag, or the ``DRAINED``/``DRAINING`` names sinfo uses)."""
        return any(s in ("DRAIN", "DRAINED", "DRAINING") for s in self.states)

    @property
    def ours(self) -> bool:
        """Whether the drain reason is one healthcheck set (and may therefore lift)."""
        return is_ours(self.reason)


def is_ours(reason: str) -> bool:
    """``GA-XID-079 gpuaccept:node health: ...`` (and the code-less ``gpuaccept: ...`` of earlier versions):
    a reason healthcheck set; never ``isolate``'s (:data:`NOT_OURS_TO_RESUME`)."""
    m = _OURS.match(reason)
    return m is not None and not reason[m.end("code") if m.group("code") else 0:].startswith(NOT_OURS_TO_RESUME)


def is_acked(reason: str) -> bool:
    """Whether a person reset the circuit breaker over this drain (``gpuaccept:node,ack``)."""
    m = _OURS.match(reason)
    return m is not None and bool(m.group("ack"))


def acked(reason: str) -> str:
    """``reason`` marked as seen by a person (``gpuaccept:node`` -> ``gpuaccept:node,ack``)."""
    m = _OURS.match(reason)
    if m is None or m.group("ack") or not is_ours(reason):
        return reason
    return reason[:m.end()] + ",ack" + reason[m.end():] if m.group("origin") else \
        reason[:m.end()] + "node,ack" + reason[m.end():]


def unacked(reason: str) -> str:
    """``reason`` without the breaker reset's mark."""
    m = _OURS.match(reason)
    return reason[:m.start("ack")] + reason[m.end("ack"):] if m is not None and m.group("ack") else reason


_REASON = re.compile(r"\bReason=(?P<text>.*?)(?: \[(?P<by>[^\]@]*)@[^\]]*\])?\s*$", re.S)


def parse_scontrol_node(text: str, name: str) -> NodeState:
    """Parse ``scontrol show node [-o] NAME``; InputError when it is not that node's record.

    ``Reason=`` is the last field and holds spaces; everything before it is ``key=value`` words.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("NodeName="):
        shown = lines[0][:120] if lines else "nothing"
        raise InputError(f"scontrol show node {name}: expected a NodeName= record, got {shown!r}")
    flat = " ".join(lines)
    head, sep, _ = flat.partition(" Reason=")
    fields = dict(w.split("=", 1) for w in head.split() if "=" in w)
    if fields.get("NodeName") != name:
        raise InputError(f"scontrol show node {name}: the record is for {fields.get('NodeName')!r}")
    state = fields.get("State")
    if not state:
        raise InputError(f"scontrol show node {name}: no State= field")
    reason = by = ""
    if sep:
        m = _REASON.search(flat[len(head) + 1:])
        if m:
            reason, by = m.group("text").strip(), (m.group("by") or "")
    if reason in ("(null)", "none"):
        reason = ""
    return NodeState(name, tuple(s for s in state.split("+") if s), reason, by)


def reason_text(check: str, why: str, code: str = "", origin: str = "") -> str:
    """``GA-XID-079 gpuaccept:node <check>: <why>`` (the fault code first, so ``sinfo -R`` shows it; ``node`` or
    ``job``: whose fault) on one line of printable ASCII, quotes removed, cut to MAX_REASON. Without a code:
    ``gpuaccept: <check>: <why>``."""
    head = (f"{code} " if code else "") + REASON_PREFIX + (origin if origin in ("node", "job") else "")
    raw = f"{head} {check}: {why}" if check else f"{head} {why}"
    text = "".join(c if (c.isascii() and c.isprintable() and c not in "\"'\\") else " " for c in raw)
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3].rstrip() + "..."


def drain_argv(node: str, reason: str, scontrol: str = "scontrol") -> list[str]:
    """``scontrol update NodeName=N State=DRAIN Reason=...`` as an argv (no shell: the reason is one word)."""
    return [scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]


def resume_argv(node: str, scontrol: str = "scontrol") -> list[str]:
    return [scontrol, "update", f"NodeName={node}", "State=RESUME"]


def show_argv(node: str, scontrol: str = "scontrol") -> list[str]:
    return [scontrol, "show", "node", "-o", node]


@dataclass(frozen=True)
class Action:
    """What to do to the node: ``drain``, ``resume`` or ``none``, with the argv and why (one line)."""

    kind: str
    argv: tuple[str, ...]
    why: str


def decide(node: NodeState, healthy: bool, reason: str, scontrol: str = "scontrol") -> Action:
    """The drain or resume that NHC semantics call for (pure).

    - unhealthy: drain with ``reason``, unless a drain not ours is in place (an admin's: left as it is)
      or ours already says exactly that;
    - healthy: resume only a drain whose reason is ours; never an admin's drain.
    """
    if not healthy:
        if node.drained and not node.ours:
            return Action("none", (), f"already drained by someone else ({node.reason or 'no reason'}); left as is")
        if node.drained and unacked(node.reason) == reason:
            return Action("none", (), "already drained with this reason")
        return Action("drain", tuple(drain_argv(node.name, reason, scontrol)), f"drained: {reason}")
    if not node.drained:
        return Action("none", (), "in service")
    if not node.ours:
        return Action("none", (), f"drained by someone else ({node.reason or 'no reason'}); left drained")
    return Action("resume", tuple(resume_argv(node.name, scontrol)), f"resumed (was: {node.reason})")
