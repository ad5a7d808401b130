"""Pure parts of the distributed checks: busbw arithmetic, sweeps, exact patterns, outcomes, merging, run dirs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gpuaccept.checks.base import Outcome
from gpuaccept.checks.collectives import (
    DTYPES,
    OPS,
    CollectivesCheck,
    Pattern,
    Row,
    alg_bandwidth_gbs,
    bus_bandwidth_gbs,
    bus_factor,
    element_count,
    placements_for,
    rank_table,
    rows_to_outcome,
    sweep_sizes,
)
from gpuaccept.checks.ddp import global_loss_drop, mismatched_ranks
from gpuaccept.distributed.gather import merge_rank_outcomes, missing_rank_result, order_results, read_run_dir
from gpuaccept.distributed.group import RankContext, first_line
from gpuaccept.errors import InputError
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Verdict
from gpuaccept.node.judge import judge


def _rc(rank: int = 0, world: int = 2, device_index: int | None = None, num_nodes: int = 1) -> RankContext:
    return RankContext(rank=rank, world_size=world, local_rank=rank, local_world_size=world, node_rank=0,
                       num_nodes=num_nodes, hosts=tuple(f"h{r}" for r in range(world)), store_host="127.0.0.1",
                       store_port=1, prefix="p/", timeout_s=5.0, device_index=device_index)


# ---------------------------------------------------------------- nccl-tests arithmetic


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor("allreduce", 8) == pytest.approx(1.75)
    assert bus_factor("allreduce", 2) == pytest.approx(1.0)
    assert bus_factor("allgather", 4) == pytest.approx(0.75)
    assert bus_factor("reducescatter", 2) == pytest.approx(0.5)
    assert bus_factor("alltoall", 16) == pytest.approx(15 / 16)
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("sendrecv", 8) == 1.0
    with pytest.raises(ValueError):
        bus_factor("reduce", 2)


def test_bandwidth_by_hand() -> None:
    # 1 GiB all-reduced in 10 ms by 8 ranks: algbw 107.374 GB/s, busbw x 2*7/8 = 187.905 GB/s
    assert alg_bandwidth_gbs(1 << 30, 0.010) == pytest.approx(107.3741824)
    assert bus_bandwidth_gbs("allreduce", 1 << 30, 0.010, 8) == pytest.approx(187.9048192)
    # 64 MiB gathered in 1 ms by 4 ranks: algbw 67.109, busbw x 3/4 = 50.332
    assert bus_bandwidth_gbs("allgather", 64 << 20, 0.001, 4) == pytest.approx(50.331648)
    # broadcast and sendrecv: busbw == algbw
    assert bus_bandwidth_gbs("broadcast", 10**9, 0.1, 8) == pytest.approx(10.0)
    assert bus_bandwidth_gbs("sendrecv", 10**9, 0.5, 2) == pytest.approx(2.0)


def test_sweep_sizes_like_nccl_tests() -> None:
    assert sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert sweep_sizes(4096, 256 << 20, 16) == [4096, 65536, 1 << 20, 16 << 20, 256 << 20]
    assert sweep_sizes(1000, 1500, 2) == [1000]
    for bad in ((0, 8, 2), (16, 8, 2), (8, 64, 1)):
        with pytest.raises(ValueError):
            sweep_sizes(*bad)


def test_element_counts_round_down_to_the_world_size() -> None:
    assert element_count("allreduce", 4096, 4, 3) == 1024
    assert element_count("allgather", 4096, 4, 3) == 1023
    assert element_count("alltoall", 100, 2, 8) == 48
    assert element_count("reducescatter", 8, 4, 4) == 0


def test_placements() -> None:
    assert placements_for("allreduce", ["out", "in"]) == ("in",)
    assert placements_for("allgather", ["out", "in"]) == ("out", "in")
    assert placements_for("allgather", ["in"]) == ("in",)
    assert placements_for("alltoall", ["in"]) == ("out",)  # the only one torch has


# ---------------------------------------------------------------- exact patterns


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("world", [2, 3, 8, 130, 300])
def test_reduced_sums_are_exact_in_every_dtype(dtype_name: str, world: int) -> None:
    """Summed in the dtype itself, rank after rank, the ranks' inputs give exactly the expected value."""
    _elem, limit = DTYPES[dtype_name]
    pat = Pattern(world, limit)
    dtype = getattr(torch, dtype_name)
    idx = torch.arange(0, 4 * world + 517, dtype=torch.int64)
    acc = torch.zeros(idx.numel(), dtype=dtype)
    for r in range(world):
        vals = pat.reduce_values(r, idx)
        assert int(vals.min()) >= 0 and int(vals.max()) <= limit
        assert torch.equal(vals.to(dtype).to(torch.float64), vals.to(torch.float64))  # representable
        acc += vals.to(dtype)
    assert torch.equal(acc.to(torch.float64), pat.reduced_sum(idx).to(torch.float64))
    # every element is owned by one rank: removing any rank's contribution changes the sum
    assert bool((pat.reduce_values(world - 1, idx) > 0).all()) or pat.base == 0


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_copy_values_are_exact_and_differ_between_ranks(dtype_name: str) -> None:
    _elem, limit = DTYPES[dtype_name]
    pat = Pattern(64, limit)
    idx = torch.arange(0, 1000, dtype=torch.int64)
    rows = torch.stack([pat.copy_values(r, idx) for r in range(64)])
    assert int(rows.min()) >= 1 and int(rows.max()) <= limit
    dtype = getattr(torch, dtype_name)
    assert torch.equal(rows.to(dtype).to(torch.float64), rows.to(torch.float64))
    # at each position no two ranks send the same value, so a misrouted chunk shows
    assert all(len(set(rows[:, i].tolist())) == 64 for i in range(0, 1000, 97))


# ---------------------------------------------------------------- outcomes


def _row(op: str, size: int, t_us: float, wrong: int | None = 0, n: int = 2, inplace: bool = False) -> Row:
    return Row(op, "float32", inplace, size, size // 4, t_us, alg_bandwidth_gbs(size, t_us / 1e6),
               bus_bandwidth_gbs(op, size, t_us / 1e6, n), wrong)


def test_outcome_metrics_and_pass_without_expectation() -> None:
    rows = [_row("allreduce", 4096, 100.0), _row("allreduce", 65536, 400.0, inplace=True),
            _row("broadcast", 65536, 200.0, inplace=True)]
    out = rows_to_outcome(rows, _rc(0))
    assert out.status is Status.PASS and "not judged" in out.reason
    m = {(x.name, x.tags.get("size_bytes")): x for x in out.metrics}
    assert m[("allreduce_busbw_gbs", 65536)].value == pytest.approx(65536 / 400e-6 / 1e9 * 1.0)
    assert m[("allreduce_time_us", 4096)].value == 100.0 and m[("allreduce_time_us", 4096)].unit == "us"
    large = m[("allreduce_busbw_large_gbs", 65536)]
    assert large.threshold is None and large.tags["rank"] == 0 and large.device == "cpu"
    assert m[("allreduce_wrong", None)].value == 0.0
    assert judge(out, CollectivesCheck.thresholds).status is Status.PASS
    assert out.details["rows"][0][:4] == ["allreduce", "float32", "out", 4096]
    # the summary busbw of a modelled op (broadcast too) is a performance figure, measured but not judged here;
    # the per-size rows are supporting figures
    assert [x.name for x in out.metrics if x.performance] == ["allreduce_busbw_large_gbs", "broadcast_busbw_large_gbs"]


def test_only_rank_0_reports_the_job_rows() -> None:
    """Issue #27: the per-size rows are the job's (nccl-tests prints one per size); another rank reports only its
    own judged figures, unless it failed or saw wrong elements (then its rows are the evidence)."""
    rows = [_row("allreduce", 4096, 100.0), _row("allreduce", 65536, 400.0), _row("broadcast", 65536, 200.0)]
    other = rows_to_outcome(rows, _rc(1))
    assert other.status is Status.PASS
    assert sorted(x.name for x in other.metrics) == ["allreduce_busbw_large_gbs", "allreduce_wrong",
                                                     "broadcast_busbw_large_gbs", "broadcast_wrong"]
    assert all(x.tags["rank"] == 1 for x in other.metrics) and "rows" not in other.details
    lead = rows_to_outcome(rows, _rc(0))
    assert len([x for x in lead.metrics if x.name.endswith("_time_us")]) == 3 and len(lead.details["rows"]) == 3
    assert judge(other, CollectivesCheck.thresholds).status is Status.PASS
    # a planned row the sweep lacks is still an error on every rank, though only rank 0 keeps the rows
    short = rows_to_outcome(rows[:1], _rc(1), planned=[("allreduce", "float32", False, 4096),
                                                        ("allreduce", "float32", False, 65536)])
    assert short.status is Status.ERROR and "missing metrics" in short.reason
    bad = rows_to_outcome([_row("allreduce", 4096, 100.0, wrong=1)], _rc(1))
    assert bad.status is Status.FAIL and any(x.name == "allreduce_time_us" for x in bad.metrics)
    failed = rows_to_outcome(rows, _rc(1), failure="boom")
    assert failed.status is Status.ERROR and len(failed.details["rows"]) == 3


def test_a_wrong_element_fails_the_check_and_the_threshold() -> None:
    rows = [_row("allreduce", 4096, 100.0), _row("allgather", 4096, 50.0, wrong=1),
            _row("allgather", 65536, 50.0, wrong=2)]
    out = rows_to_outcome(rows, _rc(0))
    assert out.status is Status.FAIL
    assert "allgather float32 out-of-place 4 KiB: 1 wrong" in out.reason and "rank 0 (h0, cpu)" in out.reason
    wrong = next(x for x in out.metrics if x.name == "allgather_wrong")
    assert wrong.value == 3.0 and wrong.unit == "count"
    verdict = judge(out, CollectivesCheck.thresholds)
    assert verdict.status is Status.FAIL and "allgather_wrong on cpu 3 > 0" in verdict.reason


def test_busbw_is_judged_at_the_largest_size_only() -> None:
    rows = [_row("allreduce", 4096, 1000.0), _row("allreduce", 1 << 20, 50.0)]  # small size is very slow
    out = rows_to_outcome(rows, _rc(0), min_busbw_gbs=15.0)
    large = next(x for x in out.metrics if x.name == "allreduce_busbw_large_gbs")
    assert large.tags["size_bytes"] == 1 << 20 and large.value == pytest.approx((1 << 20) / 50e-6 / 1e9)
    assert large.threshold is not None and large.threshold.source == "param:min_busbw_gbs"
    assert judge(out, CollectivesCheck.thresholds).status is Status.PASS  # 20.97 >= 15 despite the slow 4 KiB
    slow = rows_to_outcome([_row("allreduce", 1 << 20, 100.0)], _rc(0), min_busbw_gbs=15.0)
    assert judge(slow, CollectivesCheck.thresholds).status is Status.FAIL
    # judge_min_bytes widens the judged range: the lowest busbw there counts
    wide = rows_to_outcome(rows, _rc(0), min_busbw_gbs=15.0, judge_min_bytes=4096)
    assert next(x for x in wide.metrics if x.name == "allreduce_busbw_large_gbs").tags["size_bytes"] == 4096


def test_fabric_expectation_applies_to_the_modelled_ops() -> None:
    from gpuaccept.hw.fabric_expect import Expectation

    nvl = Expectation(450.0, 0.75, "nvlink", "fabric: NVLink4 18 links x 25 GB/s per GPU")
    rows = [_row("allreduce", 256 << 20, 2000.0, n=8), _row("sendrecv", 256 << 20, 2000.0, n=8)]
    out = rows_to_outcome(rows, _rc(0, 8, device_index=0), fabric={"allreduce": nvl})
    ar = next(x for x in out.metrics if x.name == "allreduce_busbw_large_gbs")
    sr = next(x for x in out.metrics if x.name == "sendrecv_busbw_large_gbs")
    assert ar.expected == 337.5 and ar.expected_source == nvl.source
    assert ar.threshold is not None and ar.threshold.value == pytest.approx(270.0)
    assert ar.threshold.source == "fabric:nvlink x 0.8" and ar.device == "cuda:0"
    assert sr.threshold is None and sr.expected is None
    assert judge(out, CollectivesCheck.thresholds).status is Status.FAIL  # 234.9 GB/s < 270


def test_a_failure_mid_sweep_keeps_the_rows_measured() -> None:
    out = rows_to_outcome([_row("allreduce", 4096, 100.0)], _rc(1), failure="allgather float32 failed: boom")
    assert out.status is Status.ERROR and "rank 1 (h1, cpu): allgather float32 failed: boom" in out.reason
    assert any(m.name == "allreduce_busbw_gbs" for m in out.metrics)


def test_rank_table_shows_the_slow_rank() -> None:
    rows = [_row("allreduce", 4096, 100.0), _row("allreduce", 65536, 400.0)]
    times = [[100.0, 400.0], [110.0, 420.0], [105.0, 1600.0]]
    wrongs = [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    t = rank_table(rows, times, wrongs, 3, ["a", "b", "c"])
    assert t["rank_time_us"]["allreduce/float32/out/65536"] == [400.0, 420.0, 1600.0]
    assert t["slowest_rank"]["allreduce"] == {"rank": 2, "host": "c", "time_us": 1600.0, "vs_median": 3.81,
                                               "size_bytes": 65536}
    avg = (400 + 420 + 1600) / 3
    assert t["table"][1][4] == pytest.approx(round(avg, 3))
    assert t["table"][1][6] == pytest.approx(round(65536 / (avg / 1e6) / 1e9 * 4 / 3, 4))
    assert t["table"][1][7] == 1


# ---------------------------------------------------------------- ddp helpers


def test_ddp_helpers() -> None:
    assert mismatched_ranks([b"a", b"a", b"b", b"a", b"c"]) == [2, 4]
    first, last, drop = global_loss_drop([4.0, 4.0, 3.0, 2.0, 2.0], 2)
    assert (first, last, drop) == (4.0, 2.0, pytest.approx(0.5))
    assert math.isnan(global_loss_drop([1.0, math.nan, 0.5], 1)[2])


# ---------------------------------------------------------------- merging and run directories


def test_merge_rank_outcomes() -> None:
    good = Outcome(Status.PASS, "fine", [Metric("x_busbw_gbs", 1.0, "GB/s", "cuda:0")], {"a": 1})
    bad = Outcome(Status.ERROR, "connection closed", [Metric("x_busbw_gbs", 0.5, "GB/s", "cuda:1")])
    merged = merge_rank_outcomes({1: bad, 0: good}, {0: "cuda:0", 1: "cuda:1"})
    assert merged.status is Status.ERROR and merged.reason == "rank 1 (cuda:1): connection closed"
    assert [m.tags["rank"] for m in merged.metrics] == [0, 1]
    assert merged.details["ranks"]["0"] == {"a": 1} and merged.details["world_size"] == 2
    died = Outcome(Status.ERROR, "rank 2 (cuda:2): check process died (SIGKILL) without a result")
    led = merge_rank_outcomes({0: bad, 1: good, 2: died}, lead=[2])
    assert led.reason.startswith("rank 2 (cuda:2): check process died") and "; rank 0: connection" in led.reason
    both = merge_rank_outcomes({0: good, 1: Outcome(Status.PASS, "also fine")})
    assert both.status is Status.PASS and both.reason == "fine"
    skipped = merge_rank_outcomes({0: Outcome.skip("no", needs_gpu=True), 1: Outcome.skip("no", needs_gpu=True)})
    assert skipped.status is Status.SKIP and skipped.needs_gpu


def test_order_and_missing_results() -> None:
    rs = [CheckResult("ddp_train", Status.PASS, "", rank=1), CheckResult("collectives", Status.PASS, "", rank=1),
          CheckResult("env", Status.PASS, "", rank=0), CheckResult("collectives", Status.PASS, "", rank=0)]
    ordered = order_results(rs, ["env", "collectives", "ddp_train"])
    assert [(c.name, c.rank) for c in ordered] == [("env", 0), ("collectives", 0), ("collectives", 1),
                                                  ("ddp_train", 1)]
    gone = missing_rank_result("collectives", 3, "node4", "no heartbeat for 5.0 s")
    assert gone.status is Status.ERROR and gone.rank == 3 and gone.host == "node4"
    assert gone.reason == "rank 3 (node4) did not report: no heartbeat for 5.0 s"


def test_read_run_dir_completes_the_report_from_rank_files(tmp_path: Path) -> None:
    report = NodeReport("r1", "a", "quick", "2026-01-01T00:00:00Z", verdict=Verdict.FAILURE,
                        checks=[CheckResult("collectives", Status.PASS, "ok", rank=0, host="a")])
    (tmp_path / "report.json").write_text(json.dumps(report.to_dict()))
    lines = [CheckResult("collectives", Status.PASS, "ok", rank=0, host="a").to_dict(),
             CheckResult("env", Status.PASS, "ok", rank=1, host="b").to_dict()]
    (tmp_path / "rank-0.jsonl").write_text(json.dumps(lines[0]) + "\n")
    (tmp_path / "rank-1.jsonl").write_text(json.dumps(lines[1]) + "\n" + '{"name": "collec')  # cut by a kill
    merged = read_run_dir(tmp_path)
    assert sorted((c.name, c.rank, c.host) for c in merged.checks) == [("collectives", 0, "a"), ("env", 1, "b")]
    (tmp_path / "report.json").unlink()
    alone = read_run_dir(tmp_path)
    assert alone.verdict is Verdict.INTERRUPTED and len(alone.checks) == 2
    (tmp_path / "rank-1.jsonl").write_text("garbage\n" + json.dumps(lines[1]) + "\n")
    with pytest.raises(InputError, match=r"rank-1\.jsonl: line 1"):
        read_run_dir(tmp_path)
    with pytest.raises(InputError, match=r"neither report\.json"):
        read_run_dir(tmp_path / "nothing-here")


def test_first_line_of_backend_errors() -> None:
    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                        "[127.0.0.1]:5282: Connection reset by peer. This is typically caused by a remote worker "
                        "hanging or bugs in the application.\nmore")
    assert first_line(gloo) == "RuntimeError: Read error [127.0.0.1]:5282: Connection reset by peer."
    assert first_line(ValueError()) == "ValueError"
    assert len(first_line(RuntimeError("x" * 1000))) < 230


def test_ops_are_all_declared() -> None:
    ops = CollectivesCheck.param("ops")
    assert ops is not None and set(ops.default) == set(OPS)
