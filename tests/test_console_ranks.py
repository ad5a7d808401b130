"""The console summary of a distributed run names each rank's result by rank and node, not the bare check name
(was ``FAILURE: collectives, collectives``)."""

from __future__ import annotations

import io

from gpuaccept.model import CheckResult, NodeReport, Status, Verdict
from gpuaccept.report.console import PlainConsole, result_line


def _report() -> NodeReport:
    checks = [CheckResult("env", Status.PASS, "2 GPUs"),
              CheckResult("collectives", Status.PASS, "ok", rank=0, host="gpu01"),
              CheckResult("collectives", Status.FAIL, "slow all_reduce", rank=1, host="gpu02"),
              CheckResult("collectives", Status.ERROR, "timed out", rank=3, host="gpu02"),
              CheckResult("ddp_train", Status.FAIL, "mismatch", rank=2)]
    return NodeReport("20260101T000000Z-gpu01-abcd", "gpu01", "quick", "2026-01-01T00:00:00Z",
                      verdict=Verdict.FAILURE, checks=checks)


def test_the_verdict_line_names_the_rank_and_node_of_each_failure() -> None:
    assert result_line(_report()) == ("[RESULT] FAILURE: collectives (rank 1 on gpu02), collectives (rank 3 on "
                                      "gpu02), ddp_train (rank 2)")


def test_a_node_run_keeps_the_bare_names() -> None:
    rep = _report()
    rep.checks = [CheckResult("compute", Status.FAIL, "slow"), CheckResult("memory", Status.FAIL, "slow")]
    assert result_line(rep) == "[RESULT] FAILURE: compute, memory"


def test_the_table_rows_name_each_rank() -> None:
    out = io.StringIO()
    PlainConsole(out, {}).summary(_report(), {})
    rows = [line for line in out.getvalue().splitlines() if line.startswith("[RESULT] collectives")]
    assert [r.split(")")[0] + ")" for r in rows] == ["[RESULT] collectives (rank 0 on gpu01)",
                                                     "[RESULT] collectives (rank 1 on gpu02)",
                                                     "[RESULT] collectives (rank 3 on gpu02)"]
