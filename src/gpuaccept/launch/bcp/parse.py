"""Pure parsers of the NGC CLI's output: the job id of ``job run``, the status of ``job info``.

Both read the CLI's default (ascii) output, whose shape is shown in the NGC CLI reference examples::

    Job Information
      Id: 813581
    ...
    Job Status
      Status: FINISHED_SUCCESS

and also accept ``--format_type json`` output (an ``id`` and a ``status``, at the top level or under
``jobStatus``), whose exact shape the reference does not show.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpuaccept.errors import InputError
from gpuaccept.launch.base import JobState

OK = frozenset({"FINISHED_SUCCESS"})
"""The one status of a job that ran to the end with exit status 0."""
FAILED = frozenset({
    "CANCELED", "FAILED", "FAILED_RUN_LIMIT_EXCEEDED", "IM_INTERNAL_ERROR", "INFINITY_POOL_MISSING",
    "KILLED_BY_ADMIN", "KILLED_BY_SYSTEM", "KILLED_BY_USER", "PREEMPTED", "PREEMPTED_BY_ADMIN",
    "RESOURCE_GRANT_DENIED", "RESOURCE_LIMIT_EXCEEDED", "TASK_LOST",
})
"""Terminal statuses other than success, from the status list of ``ngc base-command job list --status``.
PREEMPTED is terminal for the RUNONCE preempt class this backend submits with."""

_ID = re.compile(r"^\s*Id:\s*(\d+)\s*$", re.MULTILINE)
_STATUS = re.compile(r"^\s*Status:\s*([A-Z_]+)\s*$", re.MULTILINE)
_DETAILS = re.compile(r"^\s*Status Details:\s*(.+?)\s*$", re.MULTILINE)


def _json(text: str) -> dict[str, Any] | None:
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        data = json.loads(stripped)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_job_id(text: str) -> str:
    """The job id printed by ``ngc base-command job run``. InputError when there is none."""
    data = _json(text)
    if data is not None:
        for scope in (data, data.get("job"), data.get("jobInformation")):
            if isinstance(scope, dict) and str(scope.get("id", "")).isdigit():
                return str(scope["id"])
    found = _ID.search(text)
    if found is None:
        raise InputError(f"ngc job run: no job id in the output: {text.strip()[:200]!r}")
    return found.group(1)


def parse_job_status(text: str) -> tuple[str, str]:
    """(status, details) from ``ngc base-command job info ID``. InputError when there is no status."""
    data = _json(text)
    if data is not None:
        for scope in (data.get("jobStatus"), data):
            if isinstance(scope, dict) and isinstance(scope.get("status"), str):
                details = scope.get("statusDetails") or scope.get("statusType") or ""
                return scope["status"].strip().upper(), str(details)
        raise InputError("ngc job info: no status in the JSON output")
    found = _STATUS.search(text)
    if found is None:
        raise InputError(f"ngc job info: no 'Status:' line in the output: {text.strip()[:200]!r}")
    details = _DETAILS.search(text)
    return found.group(1), details.group(1) if details else ""


def status_state(status: str, details: str = "") -> JobState:
    """The job's state: FINISHED_SUCCESS is done and ok, the other terminal statuses done and failed; anything
    else (CREATED, QUEUED, STARTING, RUNNING, PENDING_TERMINATION, an unknown word) is not done yet."""
    low = status.lower()
    if status in OK:
        return JobState(low, done=True, ok=True)
    if status in FAILED:
        return JobState(low, done=True, ok=False, detail=f"Base Command job {status}" + (f": {details}"
                                                                                          if details else ""))
    return JobState(low or "unknown", done=False, detail=details)
