"""What ``gpuaccept node-status`` changes on a Kubernetes node for a verdict: pure functions, no I/O.

A verdict is ``pass`` or ``fail`` (from a node report: :func:`verdict_from_report`). The node gets:

- the label ``gpuaccept.io/health=pass|fail``;
- the annotations ``gpuaccept.io/health-checked`` (UTC time of the verdict),
  ``gpuaccept.io/health-reason`` (why, one line) and ``gpuaccept.io/health-run-id``;
- on a failure, ``gpuaccept.io/health-code``: the fault code (``GA-XID-079``, docs: reference/fault-codes) and
  ``gpuaccept.io/health-origin``: ``node`` or ``job`` (a job or its leftovers caused it);
- with ``--taint`` on a failure whose fault's remediation ladder takes the node out of service now
  (:mod:`gpuaccept.health.ladder`: every step but a re-run), the taint ``gpuaccept.io/health=fail:NoSchedule``.
  A pass removes that taint (exactly that key, value and effect: ours); a failure without ``--taint``, or one
  whose ladder says re-run first (not re-run in the run), leaves the taints as they are. No other label,
  annotation or taint is ever touched.

The change is sent as one RFC 6902 JSON patch (:func:`json_patch`), computed against the node as read:
labels and annotations as ``add`` of single keys (an existing key is replaced, the others stay), and,
when the taints change, a ``test`` of the whole taint list as read followed by its replacement, so a
taint someone else adds or removes between the read and the patch makes the API server refuse the
patch (HTTP 422) instead of being lost; the caller reads the node again and retries. A strategic merge
patch cannot do this: ``spec.taints`` has no merge key, so a patch of it replaces the whole list.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.errors import InputError
from gpuaccept.health.ladder import decide_ladder, effective
from gpuaccept.model import ClusterReport, NodeReport, Verdict

DOMAIN = "gpuaccept.io"
HEALTH_LABEL = f"{DOMAIN}/health"
CHECKED_ANNOTATION = f"{DOMAIN}/health-checked"
REASON_ANNOTATION = f"{DOMAIN}/health-reason"
RUN_ANNOTATION = f"{DOMAIN}/health-run-id"
CODE_ANNOTATION = f"{DOMAIN}/health-code"
ORIGIN_ANNOTATION = f"{DOMAIN}/health-origin"
TAINT: dict[str, str] = {"key": HEALTH_LABEL, "value": "fail", "effect": "NoSchedule"}
"""Our taint. Only a taint equal to it in key, value and effect is ever removed."""
MAX_REASON = 1024
PASS, FAIL = "pass", "fail"


class NoVerdict(InputError):
    """The report holds no pass/fail verdict (still running, interrupted, or nothing measured)."""

    def __init__(self, message: str, verdict: Verdict) -> None:
        self.verdict = verdict
        super().__init__(message)


@dataclass(frozen=True)
class NodeVerdict:
    """A node's health verdict: ``health`` is ``pass`` or ``fail``."""

    node: str
    health: str
    reason: str
    run_id: str
    checked: str  # UTC, ISO 8601 with Z
    code: str = ""
    """The fault code of the failure the ladder acts on ("" on a pass, or a report without codes)."""
    origin: str = ""
    leave: bool = True
    """Whether the fault's ladder takes the node out of service now (a ``--taint`` taints only then)."""

    def to_dict(self) -> dict[str, str]:
        d = {"node": self.node, "health": self.health, "reason": self.reason, "run_id": self.run_id,
             "checked": self.checked}
        if self.health == FAIL:
            d.update(code=self.code, origin=self.origin, leaves_service=str(self.leave).lower())
        return d


@dataclass(frozen=True)
class NodeChange:
    """The desired state of our keys on a node. ``taint`` is ``add``, ``remove`` or ``keep`` (leave the
    taints as they are)."""

    node: str
    labels: dict[str, str]
    annotations: dict[str, str]
    taint: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "labels": dict(self.labels), "annotations": dict(self.annotations),
                "taint": {"action": self.taint, **TAINT}}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def same_host(a: str, b: str) -> bool:
    """Whether two host names name one machine: equal, or equal up to the domain (``gpu01`` and
    ``gpu01.cluster.local``; the runner records the short host name)."""
    return a == b or _short(a) == _short(b)


def node_report_for(report: NodeReport | ClusterReport, node: str, *, any_host: bool = False) -> NodeReport:
    """The node report of ``node``: the report itself (InputError when it names another host, unless
    ``any_host``), or the entry of ``node`` in a cluster report."""
    if isinstance(report, NodeReport):
        if not any_host and not same_host(report.host, node):
            raise InputError(f"the report (run {report.run_id}) is from host {report.host}, not node {node}: "
                             "pass --node for the node it is from, or --any-host to use it for this node")
        return report
    for entry in report.nodes:
        if same_host(entry.host, node):
            if entry.report is None:
                raise InputError(f"node {node} did not report in cluster run {report.run_id}: "
                                 f"{entry.reason or 'missing'}")
            return entry.report
    hosts = ", ".join(e.host for e in report.nodes[:8])
    raise InputError(f"node {node} is not part of cluster run {report.run_id} (hosts: {hosts or 'none'})")


def verdict_from_report(report: NodeReport, node: str, checked: str) -> NodeVerdict:
    """``pass`` for a successful run, ``fail`` for a failed one (the reason names the checks that failed or
    errored; a CPU-only run's reason starts with ``CPU only: <why>``, as its ``[RESULT]`` line does). NoVerdict
    for a report that decides nothing: still ``running``, ``interrupted``, or ``nothing_measured`` (every check
    skipped: the node was not tested, which is neither)."""
    if report.verdict is Verdict.SUCCESS:
        passed = sum(1 for c in report.checks if c.status.value in ("pass", "warn"))
        reason = f"{passed} of {len(report.checks)} checks passed ({report.profile} profile)"
        if report.cpu_only:  # the reason annotation says it first: no GPU was accepted
            reason = f"CPU only: {report.cpu_only}; {reason}"
        return NodeVerdict(node, PASS, reason, report.run_id, checked)
    if report.verdict is Verdict.FAILURE:
        failed = [c for c in effective(report.checks) if c.status.is_failure]
        parts = [f"{c.code + ' ' if c.code else ''}{c.name}: {c.status.value}: {_one_line(c.reason)}" for c in failed]
        reason = "; ".join(parts) or "the run failed"
        if len(reason) > MAX_REASON:
            reason = reason[:MAX_REASON - 3] + "..."
        ladder = decide_ladder(report.checks)
        return NodeVerdict(node, FAIL, reason, report.run_id, checked, code=ladder.code, origin=ladder.origin,
                           leave=ladder.leave or not ladder.check)
    why = {Verdict.RUNNING: "is still running (or was killed): no verdict yet",
           Verdict.INTERRUPTED: "was interrupted: no verdict",
           Verdict.NOTHING_MEASURED: "measured nothing (every check skipped): the node was not tested"}
    raise NoVerdict(f"run {report.run_id} {why.get(report.verdict, report.verdict.value)}; the node is left "
                    "as it is", report.verdict)


def desired_change(verdict: NodeVerdict, *, taint: bool) -> NodeChange:
    """Our label and annotations for ``verdict``; the taint is added on a failure with ``taint``, removed on a
    pass, and left as it is otherwise."""
    if verdict.health not in (PASS, FAIL):
        raise ValueError(f"health must be {PASS} or {FAIL}, not {verdict.health!r}")
    action = "remove" if verdict.health == PASS else ("add" if taint and verdict.leave else "keep")
    annotations = {CHECKED_ANNOTATION: verdict.checked, REASON_ANNOTATION: verdict.reason,
                   RUN_ANNOTATION: verdict.run_id}
    notes = []
    if verdict.health == FAIL and verdict.code:
        annotations.update({CODE_ANNOTATION: verdict.code, ORIGIN_ANNOTATION: verdict.origin})
        if taint and not verdict.leave:
            notes.append(f"not tainted: {verdict.code} says re-run first, and the run did not re-run it")
    return NodeChange(verdict.node, {HEALTH_LABEL: verdict.health}, annotations, action, notes)


def is_ours(taint: Any) -> bool:
    return isinstance(taint, dict) and all(taint.get(k) == v for k, v in TAINT.items())


def new_taints(taints: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    """The node's taint list after ``action``; the others' taints keep their order and content.

    ``add`` appends ours unless a taint with our key and effect is there already (the API server allows
    one taint per key and effect; a foreign one with our key is left alone); ``remove`` drops ours only.
    """
    out = [copy.deepcopy(t) for t in taints]
    if action == "add":
        if not any(isinstance(t, dict) and t.get("key") == TAINT["key"] and t.get("effect") == TAINT["effect"]
                   for t in out):
            out.append(dict(TAINT))
    elif action == "remove":
        out = [t for t in out if not is_ours(t)]
    elif action != "keep":
        raise ValueError(f"taint action must be add, remove or keep, not {action!r}")
    return out


def _pointer(*parts: str) -> str:
    """An RFC 6901 JSON pointer (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def json_patch(node: dict[str, Any], change: NodeChange) -> list[dict[str, Any]]:
    """The RFC 6902 patch that takes ``node`` (as read from the API) to ``change``. Only our keys are
    written (the time stamp always: a fresh one shows the checks still run); the taints are tested as
    read before they are replaced, and left out when they need no change."""
    meta = node.get("metadata") or {}
    ops: list[dict[str, Any]] = []
    for section, wanted in (("labels", change.labels), ("annotations", change.annotations)):
        have = meta.get(section)
        if not isinstance(have, dict):
            ops.append({"op": "add", "path": _pointer("metadata", section), "value": dict(wanted)})
            continue
        ops += [{"op": "add", "path": _pointer("metadata", section, k), "value": v}
                for k, v in wanted.items() if have.get(k) != v]
    spec = node.get("spec") or {}
    taints = spec.get("taints")
    current = list(taints) if isinstance(taints, list) else []
    after = new_taints(current, change.taint)
    if after != current:
        if isinstance(taints, list):
            ops.append({"op": "test", "path": "/spec/taints", "value": copy.deepcopy(taints)})
            ops.append({"op": "replace", "path": "/spec/taints", "value": after})
        else:
            ops.append({"op": "add", "path": "/spec/taints", "value": after})
    return ops


def kubectl_equivalent(change: NodeChange) -> list[list[str]]:
    """kubectl commands for about the same change, for a reader of the dry run (``kubectl taint ...-``
    removes a taint by key and effect whatever its value; node-status removes only ours)."""
    node = change.node
    label = ",".join(f"{k}={v}" for k, v in change.labels.items())
    cmds = [["kubectl", "label", "node", node, "--overwrite", label],
            ["kubectl", "annotate", "node", node, "--overwrite",
             *(f"{k}={v}" for k, v in change.annotations.items())]]
    taint = f"{TAINT['key']}={TAINT['value']}:{TAINT['effect']}"
    if change.taint == "add":
        cmds.append(["kubectl", "taint", "node", node, "--overwrite", taint])
    elif change.taint == "remove":
        cmds.append(["kubectl", "taint", "node", node, f"{taint}-"])
    return cmds


def merge_patch(change: NodeChange) -> dict[str, Any]:
    """The label and annotations as a JSON merge patch (``kubectl patch node --type merge``): the same
    whatever the node holds. The taint is not in it (a merge patch of ``spec.taints`` replaces the whole
    list); :func:`json_patch` handles it against the node as read."""
    return {"metadata": {"labels": dict(change.labels), "annotations": dict(change.annotations)}}
