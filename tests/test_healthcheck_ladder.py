"""healthcheck by the ladder and the circuit breaker, pure: which failure drains, re-run first, the reason's
code and origin, gpuaccept's own reasons (acked or not), and the breaker's count of Slurm's reasons."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpuaccept.errors import InputError, UsageError
from gpuaccept.faults import with_fault
from gpuaccept.health import breaker
from gpuaccept.health.ladder import decide_ladder, effective, ladder_reruns, ladder_result, verdict_after_reruns
from gpuaccept.health.plan import Ending, exit_code
from gpuaccept.health.slurm import NodeState, acked, decide, is_acked, is_ours, reason_text, unacked
from gpuaccept.model import CheckResult, NodeReport, Status, Verdict

HELD = "disk_space", "held by a leftover process (pid 4242)"  # GA-GPU-008: a job's, re-run first


def failed(name: str, reason: str, status: Status = Status.FAIL) -> CheckResult:
    return with_fault(CheckResult(name, status, reason))


def rerun_of(first: CheckResult, status: Status, reason: str) -> CheckResult:
    return with_fault(ladder_result(CheckResult(first.name, status, reason), first))


def test_a_fault_whose_ladder_starts_out_of_service_drains_at_once() -> None:
    checks = [with_fault(CheckResult("env", Status.PASS, "ok")),
              failed("health", "cuda:2: XID 79 (GPU has fallen off the bus)")]
    d = decide_ladder(checks)
    assert d.leave and d.code == "GA-XID-079" and d.step == "reboot_node" and d.origin == "node"
    assert reason_text(d.check, d.reason, d.code, d.origin) == (
        "GA-XID-079 gpuaccept:node health: cuda:2: XID 79 (GPU has fallen off the bus)")


def test_a_rerun_first_fault_is_rerun_once_and_stays_in_service_without_one() -> None:
    first = failed(*HELD)
    assert first.code == "GA-GPU-008" and first.fault is not None and first.fault["origin"] == "job"
    assert ladder_reruns([first]) == ["disk_space"]
    d = decide_ladder([first])
    assert not d.leave and "GA-GPU-008 says re-run first" in d.why and "left in service" in d.why


def test_a_rerun_that_passes_clears_the_failure() -> None:
    first = failed(*HELD)
    again = rerun_of(first, Status.PASS, "/tmp 40 GiB free")
    assert again.is_rerun and again.reason.startswith("re-run (GA-GPU-008 says re-run first): ")
    assert ladder_reruns([first, again]) == []  # once only
    assert effective([first, again]) == [again]
    assert not decide_ladder([first, again]).leave
    rep = NodeReport("r", "h", "health", "t", verdict=Verdict.FAILURE, checks=[first, again])
    assert verdict_after_reruns(rep, set()) is Verdict.SUCCESS


def test_a_rerun_that_fails_again_takes_the_next_rung() -> None:
    first = failed(*HELD)
    again = rerun_of(first, Status.FAIL, HELD[1])
    d = decide_ladder([first, again])
    assert d.leave and d.step == "reset_gpu" and d.origin == "job" and d.reason.startswith("re-run (GA-GPU-008")
    assert reason_text(d.check, d.reason, d.code, d.origin).startswith("GA-GPU-008 gpuaccept:job disk_space: re-run")
    rep = NodeReport("r", "h", "health", "t", verdict=Verdict.FAILURE, checks=[first, again])
    assert verdict_after_reruns(rep, set()) is Verdict.FAILURE


def test_a_rerun_that_skips_clears_nothing() -> None:
    first = failed(*HELD)
    assert effective([first, rerun_of(first, Status.SKIP, "no time")])[0] is first


@pytest.mark.parametrize(("reason", "ours", "ack"), [
    ("GA-XID-079 gpuaccept:node health: x", True, False),
    ("GA-GPU-008 gpuaccept:job,ack disk_space: x", True, True),
    ("gpuaccept: compute: old reason of an earlier version", True, False),
    ("gpuaccept: isolated: failed with n2", False, False),
    ("GA-NET-004 gpuaccept: isolated: failed with n2", False, False),
    ("bad DIMM, ticket 4711", False, False),
    ("gpuaccept:nodes are great", False, False),
])
def test_our_reasons_acked_or_not(reason: str, ours: bool, ack: bool) -> None:
    assert is_ours(reason) is ours and is_acked(reason) is ack
    if ours:
        assert is_acked(acked(reason)) and is_ours(acked(reason))
        if "gpuaccept:node" in reason or "gpuaccept:job" in reason:
            assert unacked(acked(reason)) == unacked(reason)
    else:
        assert acked(reason) == reason


def test_an_acked_drain_with_the_same_fault_is_left_as_it_is() -> None:
    reason = "GA-XID-079 gpuaccept:node health: cuda:2: XID 79"
    node = NodeState("n1", ("IDLE", "DRAIN"), acked(reason), "root")
    assert decide(node, False, reason).kind == "none"  # not re-drained: the reset stands
    assert decide(node, True, "").kind == "resume"  # still ours to resume


SINFO = """node1|2026-11-28T10:00:00|GA-XID-079 gpuaccept:node health: cuda:2: XID 79
node2|2026-11-28T10:30:00|bad DIMM, ticket 4711
node3|2026-11-28T10:40:00|GA-DSK-001 gpuaccept:job,ack disk_space: /tmp full
node4|2026-11-28T08:00:00|GA-MEM-001 gpuaccept:node health: cuda:0: 2 volatile uncorrectable ECC error(s)
node5|2026-11-28T10:50:00|gpuaccept: compute: before codes | with a bar
"""
NOW = datetime(2026, 11, 28, 10, 55)


def test_sinfo_reasons_are_parsed_and_only_our_recent_unacked_drains_count() -> None:
    rows = breaker.parse_reasons(SINFO)
    assert rows[4].reason == "gpuaccept: compute: before codes | with a bar"
    assert [d.node for d in breaker.counted(rows, NOW, 3600)] == ["node1", "node5"]
    assert [d.node for d in breaker.counted(rows, NOW, 3600, exclude="node1")] == ["node5"]
    assert [d.node for d in breaker.counted(rows, NOW, 4 * 3600)] == ["node1", "node4", "node5"]
    with pytest.raises(InputError, match="NODE\\|TIME\\|REASON"):
        breaker.parse_reasons("node1 drained\n")
    with pytest.raises(InputError, match="is not a time"):
        breaker.parse_reasons("node1|yesterday|x\n")
    assert breaker.node_count("node1\nnode2\nnode1\n\n") == 2


def test_the_breaker_holds_at_its_limit_and_says_why() -> None:
    rows = breaker.parse_reasons(SINFO)
    v = breaker.decide(breaker.Breaker(limit=2), rows, 10, NOW, "node9")
    assert v.hold and v.nodes == ("node1", "node5")
    assert "2 node(s) drained by gpuaccept in the last 3600 s (node1, node5), limit 2 of 10" in v.why
    assert "gpuaccept healthcheck --breaker reset" in v.why
    assert not breaker.decide(breaker.Breaker(limit=3), rows, 10, NOW, "node9").hold
    # 10 % of 30 nodes: 3; of 5 nodes: still one node may be drained
    assert breaker.Breaker(percent=10).allowed(30) == 3 and breaker.Breaker(percent=10).allowed(5) == 1
    assert breaker.Breaker(limit=5, percent=10).allowed(30) == 3
    assert not breaker.Breaker().enabled
    with pytest.raises(UsageError, match="--breaker-percent 150"):
        breaker.check_breaker(0, 150, 3600)
    with pytest.raises(UsageError, match="--breaker-window 5"):
        breaker.check_breaker(1, 0, 5)


def test_a_held_drain_exits_0_in_prolog_and_epilog_and_1_in_check_mode() -> None:
    end = Ending(Verdict.FAILURE, breaker_held=True)
    assert exit_code("check", end) == 1
    assert exit_code("prolog", end) == 0 and exit_code("epilog", end) == 0
    assert exit_code("prolog", Ending(Verdict.FAILURE)) == 1
