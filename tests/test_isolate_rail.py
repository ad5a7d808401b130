"""Per-rail narrowing of a bad node (isolate/rail_plan.py, pure, and isolate/rails.py): the plan of
per-rail tests as ``isolate --rails-of ... --dry-run`` prints it (each line parsed by the launch command
itself), and the rail named from recorded data: nccl-tests output (tests/data/nccl-tests) judged by the real
parser and judge, and RDMA port counters read from recorded sysfs trees (tests/data/sysfs/ndr_4x, then
ndr_4x_later where mlx5_2's error counters rose), through the collectives check's own counter watch and the
cluster report it lands in. The run on CPU, with a rail fault injected, is in test_isolate_local.py."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from gpuaccept.checks.base import Outcome
from gpuaccept.checks.collectives_expect import FAULT_HOST_ENV, injected_fault
from gpuaccept.checks.fabric_watch import AFTER_ROOT_ENV, FabricWatch
from gpuaccept.errors import UsageError
from gpuaccept.hw.rdma import diff, locality, read_inventory, read_snapshot
from gpuaccept.isolate.nccl import run_from_output
from gpuaccept.isolate.plan import NodeVerdict, Run, Verdicts, drain_commands
from gpuaccept.isolate.rail_plan import (
    PortCounters,
    Rail,
    counters_from_cluster,
    judge_rails,
    merge_counters,
    pick_partner,
    ports_from_cluster,
    rail_summary,
    rail_tests,
    rails,
    split_plan,
)
from gpuaccept.isolate.rails import worst
from gpuaccept.model import Status
from tests.helpers import ROOT
from tests.launch_support import gpuaccept, one_error_line

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
    assert rails(2, []) == [Rail(0, None), Rail(1, None)]  # ports unknown: GPU i, NCCL picks its NIC
    assert [r.name for r in rails(2, [])] == ["GPU 0", "GPU 1"] and eight[2].name == "GPU 2 / mlx5_2:1"
    for count in (0, 65):
        with pytest.raises(UsageError, match="1 to 64 GPUs per node"):
            rails(count, ports)


def _rail_dry_run(*args: str) -> list[list[str]]:
    r = gpuaccept("isolate", "--rails-of", "gpu07=gpu03", "--results-dir", "/r", "--dry-run", *args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# gpuaccept isolate: the rails of gpu07, each with gpu03, one test after the other")
    return [shlex.split(line) for line in lines[1:]]


def _launch_dry_run(argv: list[str]) -> str:
    """The launch command of a plan line, run with --dry-run: what it would submit."""
    cut = argv.index("--") if "--" in argv else len(argv)
    r = gpuaccept(*argv[1:cut], "--dry-run", *argv[cut:])
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_nccl_tests_rail_plan_is_one_launch_mpi_per_rail_pinned_to_its_gpu_and_port() -> None:
    plan = _rail_dry_run("--backend", "mpi", "--pair-test", "nccl-tests", "--gpus-per-node", "4",
                         "--rail-ports", "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1", "--nccl-tests-bin", "/opt/nt/arp",
                         "--min-busbw", "150")
    assert len(plan) == 4
    assert plan[2] == ["gpuaccept", "launch", "mpi", "--nodes", "2", "--hosts", "gpu07,gpu03", "--report-dir", "/r",
                       "--run-id", "dry-run-rail-gpu07-gpu2-0", "--name", "isolate", "--env",
                       "CUDA_VISIBLE_DEVICES=2", "--env", "NCCL_IB_HCA==mlx5_2:1", "--gpus-per-node", "1",
                       "--procs-per-node", "1", "--", "/opt/nt/arp", "-b", "8M", "-e", "1G", "-f", "2", "-g", "1"]
    out = _launch_dry_run(plan[2])
    words = shlex.split(out.split("mpirun", 1)[1].split("\n")[0]) if "mpirun" in out else []
    assert "-x" in words and "NCCL_IB_HCA==mlx5_2:1" in words and "CUDA_VISIBLE_DEVICES=2" in words, out
    split = split_plan("gpu07", "gpu03", 8)
    assert "NCCL_TESTS_SPLIT=MOD 8" in split and split[split.index("--procs-per-node") + 1] == "8"


def test_the_collectives_rail_plan_puts_one_rank_per_node_on_gpu_i() -> None:
    plan = _rail_dry_run("--backend", "slurm", "--gpus-per-node", "2", "--launch-arg=--partition=gpu")
    assert [p[p.index("--gpus") + 1] for p in plan] == ["0", "1"]
    assert all(p[p.index("--procs-per-node") + 1] == "1" and "NCCL_IB_HCA" not in " ".join(p) for p in plan)
    assert plan[1][:7] == ["gpuaccept", "launch", "slurm", "--nodes", "2", "--nodelist", "gpu07,gpu03"]
    out = _launch_dry_run(plan[1])
    assert "--gpus 1" in out and "--checks collectives" in out and "#SBATCH --partition=gpu" in out, out
    pinned = _rail_dry_run("--backend", "ssh", "--gpus-per-node", "2", "--rail-ports", "mlx5_1:1,mlx5_0:1")
    assert [p[p.index("--env") + 1] for p in pinned] == ["NCCL_IB_HCA==mlx5_0:1", "NCCL_IB_HCA==mlx5_1:1"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--backend", "mpi", "--rails-of", "a"], "--rails-of: 'a' is not NODE=PARTNER"),
    (["--backend", "mpi", "--rails-of", "a=a"], "cannot be its own partner"),
    (["--backend", "mpi", "--rails-of", "a=b", "--nodes", "a,b,c"], "--nodes does not apply to --rails-of"),
    (["--backend", "mpi", "--rails-of", "a=b", "--drain"], "--drain does not apply to --rails-of"),
    (["--backend", "slurm", "--rails-of", "a=b", "--pair-test", "nccl-tests"], "run over mpi only"),
    (["--backend", "slurm", "--nodes", "a,b", "--per-rail", "--pair-test", "nccl-tests"], "run over mpi only"),
    (["--backend", "mpi", "--rails-of", "a=b", "--rail-ports", "mlx5_0"], "'mlx5_0' is not DEVICE:PORT"),
    (["--backend", "mpi", "--rails-of", "a=b", "--rail-ports", "m:1,m:1"], "a port is named twice"),
    (["--backend", "mpi", "--rails-of", "a=b", "--gpus-per-node", "1", "--rail-ports", "m:1,n:1"],
     "names 2 ports for 1 GPUs per node"),
    (["--backend", "mpi", "--nodes", "a,b", "--rail-ports", "m:1"], "--rail-ports is for --per-rail or --rails-of"),
    (["--backend", "mpi", "--rails-of", "a=b", "--gpus-per-node", "65"], "1 to 64 GPUs per node"),
    (["--simulate", "--nodes", "8", "--per-rail"], "drop --per-rail/--rails-of"),
])
def test_bad_rail_options_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    assert needle in one_error_line(gpuaccept("isolate", *args, "--dry-run"))


def test_a_rail_fault_fails_the_whole_node_and_that_rail_only() -> None:
    env = {FAULT_HOST_ENV: "gpu07:3,gpu09"}
    assert injected_fault(env, "gpu07") == f"injected fault on gpu07 rail 3 ({FAULT_HOST_ENV})"  # whole node
    assert injected_fault(env, "gpu07", 3) is not None and injected_fault(env, "gpu07", 2) is None
    assert injected_fault(env, "gpu09", 5) == f"injected fault on gpu09 ({FAULT_HOST_ENV})"  # the whole node broken
    assert injected_fault(env, "gpu08") is None and injected_fault({}, "gpu07") is None


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


def _cluster_with_watch(node: str) -> dict[str, Any]:
    """A cluster report whose ``node`` ran the collectives check with the counters watched by the check's own
    FabricWatch: before on ndr_4x, after on ndr_4x_later (mlx5_2's errors rose), as a rail test's report holds."""
    watch = FabricWatch.start(str(SYSFS / "ndr_4x"), clock=lambda: 0.0)
    assert watch is not None
    outcome = watch.finish(Outcome(Status.PASS, "ok", []), env={AFTER_ROOT_ENV: str(SYSFS / "ndr_4x_later")})
    check = {"name": "collectives", "status": "pass", "details": outcome.details}
    other = {"name": "collectives", "status": "pass", "details": {"rank": 1}}  # a rank that read no counters
    return {"nodes": [{"host": "gpu03", "report": {"checks": [other]}},
                      {"host": node, "report": {"checks": [other, check]}}]}


def test_the_rail_whose_port_counters_rose_in_its_own_test_is_named_from_the_cluster_report() -> None:
    cluster = _cluster_with_watch("gpu07")
    assert ports_from_cluster(cluster, "gpu07") == [f"mlx5_{i}:1" for i in range(4)]
    assert ports_from_cluster(cluster, "gpu03") == [] and ports_from_cluster({}, "gpu07") == []
    seen = counters_from_cluster(cluster, "gpu07")
    assert seen["mlx5_2:1"].rising() == {"link_downed": 2, "port_rcv_errors": 17, "symbol_error": 4031}
    assert seen["mlx5_0:1"].rising() == {} and not seen["mlx5_0:1"].vanished
    node_rails = rails(4, ports_from_cluster(cluster, "gpu07"))
    # each rail's own test saw the counters; only rail 2's port rose in its test
    by_gpu = {r.gpu: seen[r.port] if r.gpu == 2 else PortCounters(str(r.port)) for r in node_rails}
    verdicts = judge_rails(node_rails, {i: Run(True, 40.0) for i in range(4)}, by_gpu)
    assert [v.bad for v in verdicts] == [False, False, True, False]
    assert verdicts[2].evidence == ["mlx5_2:1 error counters rose: link_downed +2, port_rcv_errors +17, "
                                    "symbol_error +4031"]
    twice = merge_counters([seen, {"mlx5_2:1": PortCounters("mlx5_2:1", {"link_downed": 1}, vanished=True)}])
    assert twice["mlx5_2:1"].rose["link_downed"] == 3 and twice["mlx5_2:1"].vanished


def test_partner_worst_run_and_drain_reason_of_a_rail() -> None:
    v = Verdicts([NodeVerdict("gpu07", "bad", strikes=["gpu05", "gpu02"],
                              evidence=[{"round": 1, "partners": ["gpu05"], "passed": False, "busbw": 3.0}]),
                  NodeVerdict("gpu02", "good"), NodeVerdict("gpu05", "suspect"), NodeVerdict("gpu01", "good")],
                 rounds=2, tests=3)
    assert pick_partner("gpu07", v) == "gpu02"  # a partner it failed with that is good, before gpu01
    assert pick_partner("gpu07", Verdicts([NodeVerdict("gpu07", "bad")], 1, 1)) is None
    assert worst([Run(True, 5.0), Run(True, 3.0)]) == Run(True, 3.0)
    assert worst([Run(True, 5.0), Run(False, None, "x"), Run(False, 1.0, "y")]) == Run(False, None, "x")
    cmd, = drain_commands(v, {"gpu07": ["GPU 3 / mlx5_3:1"]})
    assert cmd[-1] == "Reason=gpuaccept: isolated: bad rail GPU 3 / mlx5_3:1; failed with gpu05 (3 GB/s)"
    assert drain_commands(v)[0][-1] == "Reason=gpuaccept: isolated: failed with gpu05 (3 GB/s)"
    tests = rail_tests("gpu07", "gpu02", rails(2, []), "collectives")
    assert [t.flags for t in tests] == [("--procs-per-node", "1", "--gpus", "0"),
                                        ("--procs-per-node", "1", "--gpus", "1")]
    assert {t.test.nodes for t in tests} == {("gpu07", "gpu02")} and tests[0].test.kind == "rail"
    with pytest.raises(UsageError, match="its own partner"):
        rail_tests("gpu07", "gpu07", rails(1, []), "collectives")
