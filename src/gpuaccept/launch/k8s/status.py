"""Job state from Kubernetes objects as the API returns them (JSON dicts). Pure functions.

Terminal conditions per kind: Job ``Complete``/``Failed``; JobSet
``Completed``/``Failed``; PyTorchJob and MPIJob ``Succeeded``/``Failed``;
TrainJob ``Complete``/``Failed``. Pod phases and waiting reasons (an image
that cannot be pulled, a pod that cannot be scheduled) go into the detail.
:func:`on_nodes` names the physical node in reports that came from pods.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpuaccept.launch.base import JobState
from gpuaccept.model import NodeReport

_TERMINAL = {
    "Job": ("Complete", "Failed"),
    "JobSet": ("Completed", "Failed"),
    "PyTorchJob": ("Succeeded", "Failed"),
    "MPIJob": ("Succeeded", "Failed"),
    "TrainJob": ("Complete", "Failed"),
}
_STUCK = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
          "CreateContainerError", "CrashLoopBackOff", "RunContainerError")


def _true(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    for cond in conditions:
        if cond.get("type") == kind and str(cond.get("status")) == "True":
            return cond
    return None


def job_state(obj: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> JobState:
    """State of a Job, JobSet, PyTorchJob, MPIJob or TrainJob from its ``status``; ``pods`` add detail."""
    kind = str(obj.get("kind", "Job"))
    ok_type, fail_type = _TERMINAL.get(kind, ("Complete", "Failed"))
    status = obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    pods_text = pod_summary(pods or [])
    failed = _true(conditions, fail_type)
    if failed is not None:
        why = ": ".join(x for x in (failed.get("reason"), failed.get("message")) if x)
        return JobState("failed", done=True, ok=False, detail="; ".join(x for x in (why, pods_text) if x))
    if _true(conditions, ok_type) is not None:
        return JobState("succeeded", done=True, ok=True, detail=pods_text)
    if _true(conditions, "Suspended") is not None:
        return JobState("suspended", done=False, detail=pods_text or "suspended (waiting for a queue?)")
    running = any(p.get("status", {}).get("phase") == "Running" for p in pods or [])
    active = status.get("active") or status.get("replicaStatuses") or running
    return JobState("running" if active else "pending", done=False, detail=pods_text)


def pod_summary(pods: list[dict[str, Any]]) -> str:
    """``"2 Running, 1 Pending (node-1: ImagePullBackOff)"``; empty for no pods."""
    if not pods:
        return ""
    phases = Counter(str(p.get("status", {}).get("phase", "Unknown")) for p in pods)
    text = ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items()))
    problems = [f"{p.get('metadata', {}).get('name', '?')}: {why}" for p in pods if (why := pod_problem(p))]
    return text + (f" ({'; '.join(problems[:3])})" if problems else "")


def pod_problem(pod: dict[str, Any]) -> str:
    """Why a pod is not getting anywhere (cannot pull its image, cannot be scheduled), or ``""``."""
    status = pod.get("status") or {}
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _STUCK:
            msg = str(waiting.get("message", ""))[:160]
            return f"{waiting['reason']}" + (f" {msg}" if msg else "")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
            return f"{cond['reason']}: {str(cond.get('message', ''))[:160]}".rstrip(": ")
    return ""


def pod_rows(pods: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``(pod name, node name, phase)`` sorted by pod name."""
    rows = [(str(p.get("metadata", {}).get("name", "")), str(p.get("spec", {}).get("nodeName") or ""),
             str(p.get("status", {}).get("phase", "Unknown"))) for p in pods]
    return sorted(rows)


def on_nodes(reports: list[NodeReport], pod_nodes: dict[str, str], source_pod: str | None = None) -> None:
    """Name the Kubernetes node in each report (in place), keeping the pod in ``report.pod``.

    A report whose ``host`` is a pod of the run (an MPI rank started through sshd in a worker pod sees the pod's
    hostname, which the MPI operator sets to the pod name) gets that pod's node; per-rank check hosts likewise.
    Otherwise the report came from ``source_pod``, whose container already named its node (``spec.nodeName``).
    """
    for report in reports:
        if pod_nodes.get(report.host):
            report.pod = report.host
            report.host = pod_nodes[report.host]
        elif source_pod is not None and report.pod is None:
            report.pod = source_pod
        for check in report.checks:
            if check.host and pod_nodes.get(check.host):
                check.host = pod_nodes[check.host]
