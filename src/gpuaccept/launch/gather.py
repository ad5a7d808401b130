"""Merge per-node reports into one ClusterReport; a node that never reported is listed as missing.

Results are attributed to a node by ``CheckResult.host``, falling back to
``NodeReport.host``: under ``gpuaccept run --distributed`` rank 0 may write
one report holding every rank's results, and several ranks of one node may
each write their own. Either way the cluster report has one entry per host.
The checks that ran over every rank (``details["distributed"]``, set by
``gpuaccept run --distributed``) are also summed up once for the whole run, as
the cluster's cross-node result (``analysis["cross_node"]``): the fabric
between the nodes passed only when every rank of every such check did.
Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuaccept.model import (
    CheckResult,
    ClusterReport,
    NodeEntry,
    NodeReport,
    NodeState,
    Status,
    Verdict,
    not_judged_note,
    worst,
)


def _node_verdict(sources: list[NodeReport], checks: list[CheckResult]) -> Verdict:
    if any(r.verdict is Verdict.RUNNING for r in sources):
        return Verdict.RUNNING
    if any(r.verdict is Verdict.INTERRUPTED for r in sources):
        return Verdict.INTERRUPTED
    return Verdict.FAILURE if any(c.status.is_failure for c in checks) else Verdict.SUCCESS


def split_by_host(reports: Iterable[NodeReport]) -> dict[str, NodeReport]:
    """One NodeReport per host, in order of first appearance.

    A report whose checks all belong to its own host is kept as it is;
    otherwise each host gets the checks attributed to it, the metadata of its
    first source report, and a verdict recomputed from those checks (a report
    still ``running`` or ``interrupted`` passes that on).
    """
    sources: dict[str, list[NodeReport]] = {}
    checks: dict[str, list[CheckResult]] = {}
    for report in reports:
        hosts_here = [report.host] if not report.checks else []
        for c in report.checks:
            host = c.host or report.host
            checks.setdefault(host, []).append(c)
            if host not in hosts_here:
                hosts_here.append(host)
        for host in hosts_here:
            sources.setdefault(host, []).append(report)
            checks.setdefault(host, [])
    merged: dict[str, NodeReport] = {}
    for host, srcs in sources.items():
        mine = checks[host]
        if len(srcs) == 1 and srcs[0].host == host and len(mine) == len(srcs[0].checks):
            merged[host] = srcs[0]
            continue
        first = srcs[0]
        finished = [r.finished for r in srcs if r.finished]
        merged[host] = NodeReport(
            run_id=first.run_id, host=host, profile=first.profile, started=min(r.started for r in srcs),
            finished=max(finished) if len(finished) == len(srcs) else None,
            verdict=_node_verdict(srcs, mine), checks=list(mine), device=first.device, argv=list(first.argv),
            version=first.version,
        )
    return merged


def entry_reason(report: NodeReport) -> str:
    if report.verdict is Verdict.RUNNING:
        done = len(report.checks)
        return f"the report never finished ({done} check(s) done): the node stopped during the run"
    if report.verdict is Verdict.INTERRUPTED:
        return "the run was interrupted"
    failed = report.failed_checks()
    return "failed: " + ", ".join(failed) if failed else ""


class CrossNode:
    """:func:`cross_node` fed one report at a time (a fleet's reports are never held together): per check,
    the first result of each rank, in the order the reports come."""

    def __init__(self) -> None:
        self.per_check: dict[str, dict[int | None, tuple[Status, str, str | None]]] = {}

    @staticmethod
    def items(report: NodeReport) -> list[tuple[str, int | None, Status, str, str | None]]:
        """What :meth:`add` takes of ``report``: (check, rank, status, reason, host) of each cross-node result."""
        return [(c.name, c.rank, c.status, c.reason, c.host) for c in report.checks if c.details.get("distributed")]

    def add(self, report: NodeReport) -> None:
        self.add_items(self.items(report))

    def add_items(self, items: Iterable[tuple[str, int | None, Status, str, str | None]]) -> None:
        for name, rank, status, reason, host in items:  # one result per rank, even when a report and a rank
            self.per_check.setdefault(name, {}).setdefault(rank, (status, reason, host))  # file both hold it

    def result(self, expected_nodes: int = 0) -> dict[str, Any] | None:
        """:func:`cross_node` of the reports added."""
        if not self.per_check:
            return None
        checks: dict[str, dict[str, Any]] = {}
        ranks: set[int] = set()
        hosts: list[str] = []
        for name, seen in self.per_check.items():
            failed = [(rank, reason) for rank, (status, reason, _h) in seen.items() if status.is_failure]
            status = worst(*(s for s, _r, _h in seen.values()))
            checks[name] = {"status": status.value, "ranks": len(seen),
                            "failed_ranks": sorted(rank for rank, _r in failed if rank is not None),
                            "reason": failed[0][1] if failed else ""}
            ranks.update(r for r in seen if r is not None)
            hosts.extend(h for _s, _r, h in seen.values() if h and h not in hosts)
        ok = all(not Status(v["status"]).is_failure for v in checks.values()) and len(hosts) >= expected_nodes
        return {"verdict": (Verdict.SUCCESS if ok else Verdict.FAILURE).value, "ranks": len(ranks), "hosts": hosts,
                "expected_nodes": expected_nodes, "checks": checks}


def cross_node(reports: Iterable[NodeReport], expected_nodes: int = 0) -> dict[str, Any] | None:
    """One result for the checks that ran across nodes (collectives, ddp_train over every rank); None when the
    run had none (a per-node run).

    ``{"verdict", "ranks", "hosts", "expected_nodes", "checks": {name: {"status", "ranks", "failed_ranks",
    "reason"}}}``: a check's status is the worst of its ranks', its reason the first failing rank's. The verdict
    is a failure when any check failed, or when fewer hosts took part than ``expected_nodes``.
    """
    acc = CrossNode()
    for report in reports:
        acc.add(report)
    return acc.result(expected_nodes)


def cross_node_line(summary: dict[str, Any]) -> str:
    """``[FABRIC] cross-node: SUCCESS - collectives pass, ddp_train pass over 4 rank(s) on 2 node(s)``."""
    checks = ", ".join(f"{name} {v['status']}" + (f" (ranks {', '.join(map(str, v['failed_ranks']))})"
                                                  if v["failed_ranks"] else "")
                       for name, v in summary["checks"].items())
    hosts = len(summary["hosts"])
    short = (f"; {hosts} of {summary['expected_nodes']} node(s) took part"
             if hosts < summary.get("expected_nodes", 0) else "")
    return (f"[FABRIC] cross-node: {str(summary['verdict']).upper()} - {checks} over {summary['ranks']} rank(s) "
            f"on {hosts} node(s){short}")


def merge_reports(reports: Iterable[NodeReport], *, run_id: str, backend: str, started: str,
                  finished: str | None = None, expected_hosts: Iterable[str] = (), expected_nodes: int = 0,
                  job_id: str | None = None) -> ClusterReport:
    """The cluster report of a run.

    Entries follow ``expected_hosts`` (their index is the node rank), then
    any other reporting host in name order. Expected hosts without a report
    are MISSING; when fewer hosts are known than ``expected_nodes``, the
    shortfall is listed as ``missing-K`` placeholders, so nothing is silently
    dropped.
    """
    reports = list(reports)
    by_host = split_by_host(reports)
    expected = list(dict.fromkeys(expected_hosts))
    entries: list[NodeEntry] = []
    for rank, host in enumerate(expected):
        report = by_host.get(host)
        if report is None:
            entries.append(NodeEntry(host, NodeState.MISSING, node_rank=rank,
                                     reason="no report: the node never ran the job or its report did not come back"))
        else:
            entries.append(NodeEntry(host, NodeState.REPORTED, report=report, node_rank=rank,
                                     reason=entry_reason(report)))
    extra = sorted(h for h in by_host if h not in expected)
    for host in extra:
        report = by_host[host]
        note = "not in the expected host list" if expected else ""
        reason = "; ".join(x for x in (entry_reason(report), note) if x)
        entries.append(NodeEntry(host, NodeState.REPORTED, report=report, reason=reason))
    for k in range(len(entries), expected_nodes):
        entries.append(NodeEntry(f"missing-{k}", NodeState.MISSING,
                                 reason=f"{expected_nodes} node(s) expected; no report from this one "
                                        "(its name is unknown)"))
    cluster = ClusterReport(run_id=run_id, backend=backend, started=started, finished=finished,
                            expected_nodes=max(expected_nodes, len(expected)), nodes=entries, job_id=job_id)
    cluster.analysis["gather"] = {
        "reported": sum(e.state is NodeState.REPORTED for e in entries),
        "missing": [e.host for e in entries if e.state is NodeState.MISSING],
        "failed": cluster.failed_nodes(),
        "unexpected": extra if expected else [],
    }
    fabric = cross_node(reports, expected_nodes=max(expected_nodes, len(expected)))
    if fabric is not None:
        cluster.analysis["cross_node"] = fabric
    return cluster


@dataclass(frozen=True)
class NodeLine:
    """What the summary says of one node entry (kept instead of its report when a fleet is streamed)."""

    host: str
    state: NodeState
    verdict: Verdict
    reason: str
    checks: int = 0
    unjudged: int = 0
    cpu_only: str = ""
    not_judged: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, e: NodeEntry) -> NodeLine:
        if e.report is None:
            return cls(e.host, e.state, e.verdict, e.reason)
        r = e.report
        figures = [(c, c.not_judged) for c in r.checks]  # each check's once (r.state_counts, r.not_judged)
        unjudged = sum(1 for c, names in figures if names and c.status is Status.PASS)
        return cls(e.host, e.state, e.verdict, e.reason, len(r.checks), unjudged, r.cpu_only or "",
                   tuple(dict.fromkeys((c.name, n) for c, names in figures for n in names)))


def cluster_verdict(nodes: Sequence[NodeLine], expected_nodes: int) -> Verdict:
    """:attr:`ClusterReport.verdict` of these node lines."""
    if len(nodes) < expected_nodes or any(n.verdict is not Verdict.SUCCESS for n in nodes):
        return Verdict.FAILURE
    return Verdict.SUCCESS if nodes else Verdict.FAILURE


def summary_lines(cluster: ClusterReport) -> list[str]:
    """Plain, greppable lines: one per node, then the verdict (``[RESULT] SUCCESS`` or ``FAILURE: hosts``)."""
    return summary_of(cluster.run_id, cluster.backend, cluster.job_id, cluster.expected_nodes,
                      [NodeLine.of(e) for e in cluster.nodes], cluster.analysis)


def summary_of(run_id: str, backend: str, job_id: str | None, expected_nodes: int, nodes: Sequence[NodeLine],
               analysis: dict[str, Any]) -> list[str]:
    """:func:`summary_lines` of a cluster given as its node lines."""
    reported = sum(e.state is NodeState.REPORTED for e in nodes)
    job = f" ({backend} job {job_id})" if job_id else f" ({backend})"
    lines = [f"[CLUSTER] run {run_id}{job}: {reported}/{expected_nodes or len(nodes)} node(s) reported"]
    for e in nodes:
        if e.state is NodeState.MISSING:
            lines.append(f"[NODE] {e.host}: MISSING - {e.reason}")
            continue
        detail = e.reason or f"{e.checks} check(s)" + (f", {e.unjudged} not judged" if e.unjudged else "")
        cpu = f" (CPU only: {e.cpu_only})" if e.cpu_only else ""
        lines.append(f"[NODE] {e.host}: {e.verdict.value.upper()}{cpu} - {detail}")
    fabric = analysis.get("cross_node")
    if isinstance(fabric, dict) and fabric.get("checks"):
        lines.append(cross_node_line(fabric))
    figures = list(dict.fromkeys(f for e in nodes for f in e.not_judged))
    notes = [n for n in (not_judged_note(figures),) if n]
    verdict = cluster_verdict(nodes, expected_nodes)
    cpu_only = [e.host for e in nodes if e.cpu_only]
    if cpu_only and verdict is Verdict.SUCCESS:
        notes.insert(0, f"CPU only on {len(cpu_only)} of {len(nodes)} node(s): "
                        f"{', '.join(cpu_only[:8])}{', ...' if len(cpu_only) > 8 else ''}")
    tail = f" ({'; '.join(notes)})" if notes else ""
    if verdict is Verdict.SUCCESS:
        lines.append("[RESULT] SUCCESS" + tail)
    else:
        failed = [e.host for e in nodes if e.verdict is not Verdict.SUCCESS]
        lines.append("[RESULT] FAILURE: " + (", ".join(failed) or "no node reported") + tail)
    return lines
