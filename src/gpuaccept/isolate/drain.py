"""``gpuaccept isolate --drain [--apply]``: the ``scontrol update ... State=DRAIN`` of each bad node, run.

The commands are built by :func:`gpuaccept.isolate.plan.drain_commands` (pure: printed by ``--drain``).
:func:`apply_drain` runs them one at a time (an argv, no shell) and then reads the node back with
``scontrol show node -o``: a node is drained only when Slurm says ``DRAIN`` (or ``DRAINED``,
``DRAINING``) in its state afterwards. A failure to drain one node does not stop the others.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class Drained:
    """What happened to one node: ``ok`` when Slurm shows it draining afterwards; else ``error`` says why."""

    node: str
    argv: tuple[str, ...]
    ok: bool
    state: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "argv": list(self.argv), "ok": self.ok, "state": self.state, "error": self.error}


def node_state(show_node: str) -> str:
    """``State=`` of one ``scontrol show node -o`` line (``IDLE+DRAIN``); '' when absent (pure)."""
    for word in show_node.split():
        if word.startswith("State="):
            return word.split("=", 1)[1]
    return ""


def is_draining(state: str) -> bool:
    """``IDLE+DRAIN``, ``DRAINED``, ``MIXED+DRAIN``, ``DRAINING``: the node takes no new jobs (pure)."""
    return any(part.startswith("DRAIN") for part in state.upper().replace("*", "").split("+"))


def _run(run: Runner, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    try:
        done = run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return done.returncode, (done.stdout or "") + (done.stderr or "")


def apply_drain(commands: Sequence[Sequence[str]], *, run: Runner = subprocess.run,
                timeout_s: float = 60.0) -> list[Drained]:
    """Run each ``scontrol update NodeName=N State=DRAIN Reason=...`` and read the node's state back."""
    out: list[Drained] = []
    for argv in commands:
        node = next((a.split("=", 1)[1] for a in argv if a.startswith("NodeName=")), "?")
        code, text = _run(run, argv, timeout_s)
        if code != 0:
            out.append(Drained(node, tuple(argv), False, error=text.strip() or f"{argv[0]} exited {code}"))
            continue
        code, text = _run(run, [argv[0], "show", "node", "-o", node], timeout_s)
        state = node_state(text) if code == 0 else ""
        if is_draining(state):
            out.append(Drained(node, tuple(argv), True, state))
        else:
            why = f"Slurm shows State={state}" if state else (text.strip() or "scontrol show node failed")
            out.append(Drained(node, tuple(argv), False, state, f"not draining after the update: {why}"))
    return out
