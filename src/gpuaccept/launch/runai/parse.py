"""Pure parsers of the Run:ai CLI's output: ``describe -o json`` and workload phases."""

from __future__ import annotations

import json

from gpuaccept.errors import InputError
from gpuaccept.launch.base import JobState

_OK = ("completed", "succeeded", "success")
_FAILED = ("failed", "error", "stopped", "deleted", "timeout")


def parse_describe(text: str) -> tuple[str, list[str]]:
    """(phase, pod names) from ``runai training <kind> describe NAME -o json``. InputError when unreadable."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"runai describe: not JSON ({exc}): {text.strip()[:200]!r}") from None
    if not isinstance(data, dict):
        raise InputError("runai describe: expected a JSON object")
    phase = ""
    for scope in (data, data.get("general"), data.get("General"), data.get("workload")):
        if isinstance(scope, dict):
            for key in ("phase", "status", "Phase", "Status"):
                if isinstance(scope.get(key), str):
                    phase = scope[key]
                    break
        if phase:
            break
    if not phase:
        raise InputError("runai describe: no phase or status in the output")
    pods: list[str] = []
    for item in data.get("pods") or data.get("Pods") or []:
        if isinstance(item, dict):
            name = item.get("name") or item.get("Name") or item.get("podName")
            if isinstance(name, str) and name:
                pods.append(name)
    return phase, sorted(pods)


def phase_state(phase: str) -> JobState:
    low = phase.strip().lower()
    if low in _OK:
        return JobState(low, done=True, ok=True)
    if low in _FAILED:
        return JobState(low, done=True, ok=False, detail=f"Run:ai workload {phase}")
    return JobState(low or "unknown", done=False)
