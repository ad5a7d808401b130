"""Per-rail narrowing of a bad node (results/isolate_rail.py, pure): the plan of per-rail and split tests,
and the rail named from recorded data: nccl-tests output (tests/data/nccl-tests) judged by the real parser
and judge, and RDMA port counters read from recorded sysfs trees (tests/data/sysfs/ndr_4x, then
ndr_4x_later where mlx5_2's error counters rose). Verified only as a plan: no GPU or NIC here runs it."""

from __future__ import annotations

import shlex

import pytest

from gpuaccept.errors import UsageError
from gpuaccept.hw.rdma import diff, locality, read_inventory, read_snapshot
from gpuaccept.launch.isolate_nccl import run_from_output
from gpuaccept.results.isolate import Run
from gpuaccept.results.isolate_rail import Rail, judge_rails, rail_plan, rail_summary, rails, split_plan
from tests.helpers import ROOT
from tests.launch_support import gpuaccept

SYSFS = ROOT / "tests" / "data" / "sysfs"
NCCL = ROOT / "tests" / "data" / "nccl-tests"


def _ports(name: str) -> list[str]:
    return [p.key for p in read_inventory(SYSFS / name).ports]


def test_rails_pair_gpu_i_with_port_i_or_with_the_ports_of_its_numa_node() -> None:
    ports = _ports("ndr_4x")
    assert rails(4, ports) == [Rail(i, f"mlx5_{i}:1") for i in range(4)]
    inv = read_inventory(SYSFS / "ndr_4x")
    eight = rails(8, ports, locality(inv))  # 4 GPUs known by NUMA node, 4 more without: spread over all ports
    assert [r.port for r in eight[:4]] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    assert len({r.port for r in eight}) == 4
    with pytest.raises(UsageError, match="need GPUs and RDMA ports"):
        rails(8, [])


def test_the_per_rail_plan_is_a_launch_mpi_command_per_rail_that_parses() -> None:
    plan = rail_plan("gpu07", "gpu03", rails(4, _ports("ndr_4x")))
    assert len(plan) == 4
    assert plan[2] == ["gpuaccept", "launch", "mpi", "--nodes", "2", "--hosts", "gpu07,gpu03", "--procs-per-node",
                       "1", "--gpus-per-node", "1", "--run-id", "rail-gpu07-gpu2", "--env", "CUDA_VISIBLE_DEVICES=2",
                       "--env", "NCCL_IB_HCA==mlx5_2:1", "--", "all_reduce_perf", "-b", "8M", "-e", "1G", "-f", "2",
                       "-g", "1"]
    argv = plan[2][1:]
    cut = argv.index("--")
    r = gpuaccept(*argv[:cut], "--results-dir", "/r", "--dry-run", *argv[cut:])
    assert r.returncode == 0, r.stderr
    words = shlex.split(r.stdout.split("mpirun", 1)[1].split("\n")[0]) if "mpirun" in r.stdout else []
    assert "-x" in words and "NCCL_IB_HCA==mlx5_2:1" in words and "CUDA_VISIBLE_DEVICES=2" in words, r.stdout
    split = split_plan("gpu07", "gpu03", 8)
    assert "NCCL_TESTS_SPLIT=MOD 8" in split and split[split.index("--procs-per-node") + 1] == "8"


def test_the_rail_whose_counters_rose_is_named_from_recorded_sysfs() -> None:
    deltas = diff(read_snapshot(SYSFS / "ndr_4x", clock=lambda: 0.0),
                  read_snapshot(SYSFS / "ndr_4x_later", clock=lambda: 5.0))
    node_rails = rails(4, _ports("ndr_4x"))
    good = run_from_output((NCCL / "current_2hosts_h100.txt").read_text(), 2, 8)
    verdicts = judge_rails(node_rails, {i: good for i in range(4)}, deltas)
    assert [v.bad for v in verdicts] == [False, False, True, False]
    assert verdicts[2].evidence == ["mlx5_2:1 error counters rose: link_downed +2, port_rcv_errors +17, "
                                    "symbol_error +4031"]
    assert rail_summary("gpu07", verdicts).startswith("gpu07: bad rail GPU 2 / mlx5_2:1 (")


def test_a_failing_or_slow_rail_test_names_its_rail_without_counters() -> None:
    node_rails = rails(4, _ports("ndr_4x"))
    wrong = run_from_output((NCCL / "wrong_failed.txt").read_text(), 1, 1)
    assert not wrong.ok
    runs = {0: Run(True, 48.0), 1: wrong, 2: Run(True, 47.0), 3: Run(True, 20.0)}
    verdicts = judge_rails(node_rails, runs)
    assert [v.bad for v in verdicts] == [False, True, False, True]
    assert verdicts[1].evidence[0].startswith("all_reduce failed: ") and "#wrong > 0" in verdicts[1].evidence[0]
    assert verdicts[3].evidence == ["busbw 20 GB/s, below 0.8 x the median rail (47 GB/s)"]
    fine = judge_rails(node_rails, {i: Run(True, 48.0) for i in range(4)})
    assert not any(v.bad for v in fine) and "every rail passes alone" in rail_summary("gpu07", fine)
    assert judge_rails(node_rails, {})[0].evidence == ["not tested"]
