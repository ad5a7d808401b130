"""Merging node reports into a cluster report: attribution, missing nodes, verdicts, summary lines."""

from __future__ import annotations

import json

from gpuaccept.launch.gather import merge_reports, split_by_host, summary_lines
from gpuaccept.model import CheckResult, ClusterReport, NodeReport, NodeState, Status, Verdict


def _report(host: str, *checks: CheckResult, verdict: Verdict | None = None) -> NodeReport:
    r = NodeReport(run_id=f"r-{host}", host=host, profile="quick", started="2026-01-01T00:00:00Z",
                   finished="2026-01-01T00:01:00Z", checks=list(checks))
    r.verdict = verdict if verdict is not None else r.decide()
    return r


def _ok(name: str, host: str | None = None, rank: int | None = None) -> CheckResult:
    return CheckResult(name, Status.PASS, "fine", host=host, rank=rank)


def _bad(name: str, host: str | None = None) -> CheckResult:
    return CheckResult(name, Status.FAIL, "broken", host=host)


def _merge(reports: list[NodeReport], hosts: list[str], nodes: int = 0) -> ClusterReport:
    return merge_reports(reports, run_id="run1", backend="slurm", started="2026-01-01T00:00:00Z",
                         expected_hosts=hosts, expected_nodes=nodes or len(hosts), job_id="42")


def test_every_node_reporting_success_gives_a_successful_cluster() -> None:
    c = _merge([_report("node2", _ok("env")), _report("node1", _ok("env"))], ["node1", "node2"])
    assert c.verdict is Verdict.SUCCESS
    assert [(n.host, n.node_rank, n.state) for n in c.nodes] == [("node1", 0, NodeState.REPORTED),
                                                                ("node2", 1, NodeState.REPORTED)]
    assert c.analysis["gather"] == {"reported": 2, "missing": [], "failed": [], "unexpected": []}


def test_a_node_without_a_report_is_listed_missing_and_fails_the_cluster() -> None:
    c = _merge([_report("node1", _ok("env"))], ["node1", "node2"])
    assert c.verdict is Verdict.FAILURE
    missing = c.nodes[1]
    assert missing.host == "node2" and missing.state is NodeState.MISSING and "no report" in missing.reason
    assert c.failed_nodes() == ["node2"]


def test_unknown_names_still_show_the_shortfall() -> None:
    c = _merge([_report("a", _ok("env"))], [], nodes=3)
    assert [n.host for n in c.nodes] == ["a", "missing-1", "missing-2"]
    assert c.verdict is Verdict.FAILURE and c.expected_nodes == 3


def test_rank0_report_holding_every_ranks_results_is_split_by_check_host() -> None:
    combined = _report("node1", _ok("nccl", "node1", 0), _ok("nccl", "node1", 1), _bad("nccl", "node2"),
                       _ok("env", None))
    c = _merge([combined], ["node1", "node2"])
    by = {n.host: n for n in c.nodes}
    assert by["node1"].report is not None and by["node2"].report is not None
    assert [x.rank for x in by["node1"].report.checks] == [0, 1, None]  # env has no host: the report's
    assert by["node1"].verdict is Verdict.SUCCESS
    assert by["node2"].verdict is Verdict.FAILURE and by["node2"].reason == "failed: nccl"
    assert c.verdict is Verdict.FAILURE and c.failed_nodes() == ["node2"]


def test_several_reports_of_one_host_merge_into_one_entry() -> None:
    merged = split_by_host([_report("n1", _ok("a")), _report("n1", _bad("b"))])
    assert list(merged) == ["n1"]
    assert [c.name for c in merged["n1"].checks] == ["a", "b"] and merged["n1"].verdict is Verdict.FAILURE


def test_a_report_that_never_finished_fails_with_a_reason() -> None:
    c = _merge([_report("n1", _ok("a"), verdict=Verdict.RUNNING)], ["n1"])
    assert c.nodes[0].verdict is Verdict.RUNNING and "never finished" in c.nodes[0].reason
    assert c.verdict is Verdict.FAILURE


def test_an_unexpected_host_is_kept_and_named() -> None:
    c = _merge([_report("n1", _ok("a")), _report("stray", _ok("a"))], ["n1"])
    assert [n.host for n in c.nodes] == ["n1", "stray"]
    assert "not in the expected host list" in c.nodes[1].reason
    assert c.analysis["gather"]["unexpected"] == ["stray"]


def test_cluster_report_round_trips_through_json() -> None:
    c = _merge([_report("node1", _ok("env"))], ["node1", "node2"])
    again = ClusterReport.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again.to_dict() == c.to_dict()
    assert again.verdict is Verdict.FAILURE


def test_summary_lines_name_each_node_and_the_verdict() -> None:
    c = _merge([_report("node1", _ok("env")), _report("node2", _bad("compute"))], ["node1", "node2", "node3"])
    lines = summary_lines(c)
    assert lines[0] == "[CLUSTER] run run1 (slurm job 42): 2/3 node(s) reported"
    assert "[NODE] node1: SUCCESS - 1 check(s)" in lines
    assert "[NODE] node2: FAILURE - failed: compute" in lines
    assert any(x.startswith("[NODE] node3: MISSING") for x in lines)
    assert lines[-1] == "[RESULT] FAILURE: node2, node3"


def _rank(name: str, host: str, rank: int, status: Status = Status.PASS, reason: str = "fine") -> CheckResult:
    return CheckResult(name, status, reason, host=host, rank=rank, details={"distributed": True})


def test_cross_node_checks_give_one_result_for_the_run() -> None:
    rank0 = _report("a", _ok("env", "a", 0), _rank("collectives", "a", 0), _rank("collectives", "a", 1),
                    _rank("collectives", "b", 2), _rank("collectives", "b", 3, Status.FAIL, "allreduce 3 GB/s"),
                    _ok("env", "b", 2))
    cluster = _merge([rank0], ["a", "b"])
    fabric = cluster.analysis["cross_node"]
    assert (fabric["verdict"], fabric["ranks"], fabric["hosts"]) == ("failure", 4, ["a", "b"])
    assert fabric["checks"] == {"collectives": {"status": "fail", "ranks": 4, "failed_ranks": [3],
                                                "reason": "allreduce 3 GB/s"}}
    assert [(e.host, e.verdict) for e in cluster.nodes] == [("a", Verdict.SUCCESS), ("b", Verdict.FAILURE)]
    lines = summary_lines(cluster)
    assert lines[-2:] == ["[FABRIC] cross-node: FAILURE - collectives fail (ranks 3) over 4 rank(s) on 2 node(s)",
                          "[RESULT] FAILURE: b"]


def test_cross_node_result_counts_the_nodes_that_took_part() -> None:
    ok = _merge([_report("a", _rank("ddp_train", "a", 0))], ["a", "b"])
    assert ok.analysis["cross_node"]["verdict"] == "failure"
    assert "1 of 2 node(s) took part" in summary_lines(ok)[-2]


def test_a_per_node_run_has_no_cross_node_result() -> None:
    cluster = _merge([_report("a", _ok("env", "a")), _report("b", _ok("env", "b"))], ["a", "b"])
    assert "cross_node" not in cluster.analysis
    assert not any(line.startswith("[FABRIC]") for line in summary_lines(cluster))
