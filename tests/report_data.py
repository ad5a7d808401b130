"""Sample reports for the report-rendering tests (see tests/data/reports/README.md) and variants of them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gpuaccept.model import ClusterReport, NodeEntry, NodeReport, NodeState, Status
from gpuaccept.results.load import load_file

DATA = Path(__file__).resolve().parent / "data" / "reports"
CLUSTER = DATA / "cluster-h100.json"
NODE_CPU = DATA / "node-cpu.json"
NODE_COLLECTIVES = DATA / "node-cpu-collectives.json"
NODE_BUDGET = DATA / "node-cpu-budget.json"

HOSTILE_REASON = 'rate "low" | <script>console.error("injected")</script> & <b>bold</b>'
HOSTILE_HOST = 'gpu-node-99"><img src=x onerror="console.error(1)">'


def cluster() -> ClusterReport:
    rep = load_file(CLUSTER)
    assert isinstance(rep, ClusterReport)
    return rep


def node_cpu() -> NodeReport:
    rep = load_file(NODE_CPU)
    assert isinstance(rep, NodeReport)
    return rep


def node_budget() -> NodeReport:
    """A real ``run --budget`` (see the README): ``stress`` left out, ``train`` run again deeper."""
    rep = load_file(NODE_BUDGET)
    assert isinstance(rep, NodeReport)
    return rep


def hostile_cluster() -> ClusterReport:
    """The sample cluster with a missing node whose name and reason are markup, and a check reason with markup."""
    rep = cluster()
    node3 = rep.nodes[2].report
    assert node3 is not None
    compute = next(c for c in node3.checks if c.name == "compute")
    compute.reason = HOSTILE_REASON + " " + compute.reason
    rep.nodes.append(NodeEntry(HOSTILE_HOST, NodeState.MISSING, None, node_rank=4,
                               reason="no report: <i>sbatch</i> node NODE_FAIL"))
    rep.expected_nodes = 5
    return rep


def big_cluster(n: int) -> ClusterReport:
    """``n`` nodes made from the sample's four (hosts renamed), keeping its analysis for the originals."""
    base = cluster()
    nodes = []
    for i in range(n):
        src = base.nodes[i % len(base.nodes)]
        entry = copy.deepcopy(src)
        if i >= len(base.nodes):
            entry.host = f"gpu-node-{i + 1:03d}"
            assert entry.report is not None
            entry.report.host = entry.host
            for c in entry.report.checks:
                c.host = entry.host
                if c.status is not Status.SKIP:
                    c.status = Status.PASS
            entry.report.verdict = entry.report.decide()
        entry.node_rank = i
        nodes.append(entry)
    base.nodes = nodes
    base.expected_nodes = n
    return base


def write_json(path: Path, report: NodeReport | ClusterReport) -> Path:
    path.write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    return path
