"""Distributed checks with real processes and real gloo: local spawns, torchrun, mpirun, a killed rank.

Nothing of torch.distributed is mocked. Ranks run on CPU with gloo and tiny
message sizes so the file stays within a few minutes on two cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks.collectives import bus_factor
from tests.dist_support import free_port, gpuaccept_argv, need_binary, rank_env, start_rank
from tests.helpers import (
    ROOT,
    cli_env,
    descendants,
    gpuaccept,
    only_run_dir,
    parent_of,
    process_cmdline,
    validate_report,
)

QUICK = ["--device", "cpu", "--profile", "quick"]


def _checks(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [c for c in report["checks"] if c["name"] == name]


def _assert_busbw_consistent(metrics: list[dict[str, Any]], world: int) -> int:
    """Every row's busbw is algbw times the nccl-tests factor, and algbw is size over time."""
    rows: dict[tuple[Any, ...], dict[str, float]] = {}
    for m in metrics:
        t = m.get("tags", {})
        if "size_bytes" in t and m["name"].split("_")[-2:] != ["large", "gbs"]:
            key = (t["op"], t["dtype"], t["inplace"], t["size_bytes"], t["rank"])
            rows.setdefault(key, {})[m["name"].split("_", 1)[1]] = m["value"]
    for (op, _dtype, _inplace, size, _rank), v in rows.items():
        assert v["algbw_gbs"] == pytest.approx(size / (v["time_us"] / 1e6) / 1e9, rel=1e-6)
        assert v["busbw_gbs"] == pytest.approx(v["algbw_gbs"] * bus_factor(op, world), rel=1e-6)
    return len(rows)


def test_plain_run_spawns_two_gloo_ranks_and_merges_them(tmp_path: Path) -> None:
    r = gpuaccept("run", *QUICK, "--checks", "collectives,ddp_train", "--report-dir", str(tmp_path), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = only_run_dir(tmp_path)
    report = validate_report(run_dir / "report.json")
    coll, = _checks(report, "collectives")
    ddp, = _checks(report, "ddp_train")
    assert coll["status"] == "pass" and ddp["status"] == "pass"
    assert coll["host"] == report["host"] and "rank" not in coll  # one merged result for the node
    assert {m["tags"]["rank"] for m in coll["metrics"]} == {0, 1}
    # rank 0 reports the job's rows (nccl-tests prints one row per size for the job): 8 op/placements x 2 sizes;
    # rank 1 reports its own busbw_large and wrong counts only
    assert _assert_busbw_consistent(coll["metrics"], 2) == 8 * 2
    wrong = [m for m in coll["metrics"] if m["name"].endswith("_wrong")]
    assert len(wrong) == 12 and all(m["value"] == 0 and m["threshold"]["op"] == "<=" for m in wrong)
    rank0 = coll["details"]["ranks"]["0"]
    assert rank0["backend"] == "gloo" and rank0["launcher"] == "local"
    assert len(rank0["rank_time_us"]["allreduce/float32/in/65536"]) == 2
    names = {m["name"] for m in ddp["metrics"]}
    assert {"ddp_loss_drop", "ddp_samples_per_s", "ddp_param_mismatch_ranks", "ddp_step_ms"} <= names
    assert next(m for m in ddp["metrics"] if m["name"] == "ddp_param_mismatch_ranks")["value"] == 0
    assert (run_dir / "logs" / "collectives.rank1.log").read_text().count("busbw") == 8 * 2
    assert "[COLLECTIVES] collectives: NOT JUDGED" in r.stdout  # passed, its busbw has no expectation on CPU


def test_ddp_that_does_not_learn_fails_on_the_global_loss(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  ddp_train:\n    params: {lr: 0.0}\n")
    r = gpuaccept("run", *QUICK, "--checks", "ddp_train", "--config", str(cfg), "--report-dir", str(tmp_path / "r"),
                  timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    ddp, = _checks(validate_report(only_run_dir(tmp_path / "r") / "report.json"), "ddp_train")
    assert ddp["status"] == "fail" and "ddp_loss_drop" in ddp["reason"]
    drop = next(m for m in ddp["metrics"] if m["name"] == "ddp_loss_drop")
    assert abs(drop["value"]) < 0.1 and drop["threshold"]["value"] == 0.3
    assert next(m for m in ddp["metrics"] if m["name"] == "ddp_param_mismatch_ranks")["value"] == 0


def test_four_local_ranks(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  collectives:\n    params: {ops: [allreduce, alltoall, sendrecv], cpu_max_bytes: 4096}\n")
    r = gpuaccept("run", *QUICK, "--checks", "collectives", "--nproc", "4", "--config", str(cfg),
                  "--report-dir", str(tmp_path / "rep"), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    coll, = _checks(validate_report(only_run_dir(tmp_path / "rep") / "report.json"), "collectives")
    assert coll["details"]["world_size"] == 4
    assert {m["tags"]["rank"] for m in coll["metrics"]} == {0, 1, 2, 3}
    assert _assert_busbw_consistent(coll["metrics"], 4) == 3  # rank 0's rows, for the job
    assert len(coll["details"]["ranks"]["0"]["rank_time_us"]["sendrecv/float32/out/4096"]) == 4
    assert all(m["value"] == 0 for m in coll["metrics"] if m["name"].endswith("_wrong"))


def test_fabric_counters_that_rose_during_the_sweep_are_tied_to_their_port(tmp_path: Path) -> None:
    """Local rank 0 reads the RDMA counters before and after the sweep (once for the node); the "after" read
    is pointed at the same node's later tree (test-only variable), where link_downed rose on mlx5_2: a FAIL by
    the fabric check's rule, naming the port and the counter."""
    sysfs = ROOT / "tests" / "data" / "sysfs"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  collectives:\n    params: {ops: [allreduce], placements: [out], cpu_max_bytes: 4096, "
                   f"fabric_root: '{sysfs / 'ndr_4x'}'}}\n")
    r = gpuaccept("run", *QUICK, "--checks", "collectives", "--config", str(cfg), "--report-dir", str(tmp_path / "rep"),
                  timeout=180, GPUACCEPT_TEST_FABRIC_AFTER=str(sysfs / "ndr_4x_later"))
    assert r.returncode == 1, r.stdout + r.stderr
    coll, = _checks(validate_report(only_run_dir(tmp_path / "rep") / "report.json"), "collectives")
    assert coll["status"] == "fail" and "rdma_link_downed_delta on mlx5_2:1 2 > 0 count" in coll["reason"]
    assert "rdma_symbol_error_delta on mlx5_2:1 4,031 > 0 count" in coll["reason"]
    ranks = coll["details"]["ranks"]
    assert ranks["0"]["fabric_counters"]["rising"] == {
        "mlx5_2:1": {"symbol_error": 4031, "link_downed": 2, "port_rcv_errors": 17}}
    assert "fabric_counters" not in ranks["1"]
    rdma = [m for m in coll["metrics"] if m["name"].startswith("rdma_")]
    assert len(rdma) == 4 * 8 and {m["tags"]["rank"] for m in rdma} == {0}
    assert all(m["value"] == 0 for m in coll["metrics"] if m["name"].endswith("_wrong"))


def test_a_rank_with_less_free_memory_shortens_every_ranks_sweep(tmp_path: Path) -> None:
    """Rank 1 is told it has 16 KiB free (a GPU with a leftover process): its own cap would be 4 KiB against
    rank 0's 64 KiB. The ranks agree on the smaller cap, so both run the same rows and finish."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  collectives:\n    params: {ops: [allreduce, allgather], placements: [out], "
                   "min_bytes: 4096, cpu_max_bytes: 65536, step_factor: 16}\n")
    r = gpuaccept("run", *QUICK, "--checks", "collectives", "--config", str(cfg), "--dist-timeout", "20",
                  "--report-dir", str(tmp_path / "rep"), timeout=180, GPUACCEPT_TEST_FREE_BYTES="1=16384")
    assert r.returncode == 0, r.stdout + r.stderr
    coll, = _checks(validate_report(only_run_dir(tmp_path / "rep") / "report.json"), "collectives")
    assert coll["status"] == "pass", coll["reason"]
    ranks = coll["details"]["ranks"]
    assert [ranks[k]["max_bytes"] for k in ("0", "1")] == [4096, 4096]
    assert ranks["0"]["max_bytes_local"] == 65536 and "max_bytes_local" not in ranks["1"]
    assert len(ranks["0"]["rows"]) == 2 and not ranks["1"].get("rows")  # allreduce and allgather at 4 KiB, by rank 0
    # both ranks ran the same rows: rank 0 holds each rank's time of each row
    times = ranks["0"]["rank_time_us"]
    assert len(times) == 2 and all(len(t) == 2 for t in times.values()), times


def test_corrupted_elements_are_detected_and_counted(tmp_path: Path) -> None:
    port = free_port()
    env = cli_env()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.dist_scenarios", "corrupt", str(r), "2", str(port),
                               str(tmp_path / f"{r}.json")], env=env, cwd=ROOT) for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    res = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    for r in res:
        assert r["clean"] and all(v == 0 for v in r["clean"].values()), r["clean"]
    chunk = res[0]["chunk"]
    assert [r["corrupt"]["allreduce_input"] for r in res] == [[1, 5], [1, 5]]  # the sum is wrong everywhere
    assert [r["corrupt"]["allgather_output"] for r in res] == [[1, chunk + 3], [0, None]]
    assert [r["corrupt"]["alltoall_nan"] for r in res] == [[0, None], [1, 1]]  # NaN arrived at rank 1
    assert [r["not_run"] for r in res] == [{"allreduce": 2 * chunk, "allgather": 2 * chunk}] * 2
    assert [r["ddp_mismatch"] for r in res] == [[1], [1]]


def test_two_torchrun_nodes_over_loopback_give_one_merged_report(tmp_path: Path) -> None:
    port = free_port()
    base = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=acceptance",
            "--local-addr=127.0.0.1", "--max-restarts=0"]
    job = ["-m", "gpuaccept", "run", "--distributed", *QUICK, "--checks", "health,collectives,ddp_train",
           "--report-dir", str(tmp_path), "--dist-timeout", "60"]
    agents = []
    for host, is_host in (("nodeA", 1), ("nodeB", 0)):
        with open(tmp_path / f"{host}.log", "wb") as log:
            agents.append(subprocess.Popen([*base, "--rdzv-conf", f"is_host={is_host}", *job], cwd=ROOT,
                                           env=cli_env(GPUACCEPT_HOSTNAME=host), stdout=log,
                                           stderr=subprocess.STDOUT))
    codes = [a.wait(timeout=300) for a in agents]
    logs = "".join((tmp_path / f"{h}.log").read_text() for h in ("nodeA", "nodeB"))
    assert codes == [0, 0], logs
    run_dir = only_run_dir(tmp_path)
    report = validate_report(run_dir / "report.json")
    local_hosts = sorted(c["host"] for c in _checks(report, "health"))
    assert local_hosts == ["nodeA", "nodeB"]  # node-local check once per node, gathered by rank 0
    for name in ("collectives", "ddp_train"):
        results = _checks(report, name)
        assert sorted((c["rank"], c["host"]) for c in results) in (
            [(0, "nodeA"), (1, "nodeB")], [(0, "nodeB"), (1, "nodeA")])
        assert all(c["status"] == "pass" and c["details"]["launcher"] == "torchrun" for c in results)
    assert report["verdict"] == "success"
    assert sorted(p.name for p in run_dir.glob("rank-*.jsonl")) == ["rank-0.jsonl", "rank-1.jsonl"]
    own = [json.loads(line) for line in (run_dir / "rank-1.jsonl").read_text().splitlines()]
    assert [c["name"] for c in own] == ["health", "collectives", "ddp_train"] and {c["rank"] for c in own} == {1}


def test_mpirun_two_ranks_detected_from_ompi_variables(tmp_path: Path) -> None:
    mpirun = need_binary("mpirun")
    port = free_port()
    env = cli_env(MASTER_PORT=str(port))
    argv = [mpirun, "-np", "2", "--allow-run-as-root", "--oversubscribe", "-x", "PYTHONPATH", "-x", "MASTER_PORT",
            "-x", "GPUACCEPT_PLUGINS", *gpuaccept_argv("run", "--distributed", *QUICK, "--checks",
                                                         "health,collectives", "--report-dir", str(tmp_path))]
    r = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(openmpi, rendezvous 127.0.0.1:" in r.stderr
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    assert len(_checks(report, "health")) == 1  # both ranks share this node: local rank 0 runs it
    coll = _checks(report, "collectives")
    assert sorted(c["rank"] for c in coll) == [0, 1]
    assert all(c["status"] == "pass" and c["details"]["launcher"] == "openmpi" for c in coll)


def _start_two_ranks_in_a_slow_sweep(tmp_path: Path, timeout: float) -> list[subprocess.Popen[bytes]]:
    """Two env-launched ranks (hosts nodeA, nodeB) in a long allreduce sweep, returned once both are in it.

    The sweep must outlast the loss detection (the timeout plus its grace) by far, also on a fast or a
    loaded machine, or the parent_hung case sees rank 0 finish its rows before the peer is declared lost.
    """
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("checks:\n  collectives:\n    params: {ops: [allreduce], min_bytes: 4096, cpu_max_bytes: 65536, "
                   "step_factor: 2, warmup: 0, iters: 6000}\n")
    port = free_port()
    args = ["run", "--distributed", *QUICK, "--checks", "health,collectives", "--config", str(cfg),
            "--report-dir", str(tmp_path / "rep"), "--run-id", "fault", "--dist-timeout", str(timeout)]
    procs = [start_rank(args, rank_env(r, 2, port, f"node{'AB'[r]}"), tmp_path / f"rank{r}.log") for r in range(2)]
    logs = [tmp_path / "rep" / "fault" / "logs" / f"rank-{r}" / "collectives.log" for r in range(2)]
    deadline = time.monotonic() + 120
    while not all("busbw" in (log.read_text() if log.exists() else "") for log in logs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            (tmp_path / "rank0.log").read_text() + (tmp_path / "rank1.log").read_text()
        time.sleep(0.05)
    return procs


@pytest.fixture(scope="module")
def slurm() -> Iterator[Any]:
    for name in ("munged", "slurmctld", "slurmd", "srun", "sinfo"):
        need_binary(name)
    from tests.slurm_cluster import LocalSlurm

    with LocalSlurm() as cluster:
        yield cluster


def test_srun_two_nodes_detected_from_slurm_variables(slurm: Any, tmp_path: Path) -> None:
    port = free_port()
    env = {**cli_env(), **slurm.env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    argv = ["srun", "-N2", "-n2", *gpuaccept_argv("run", "--distributed", *QUICK, "--checks", "health,collectives",
                                                  "--report-dir", str(tmp_path))]
    r = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr + slurm.log_tail()
    assert "(slurm, rendezvous 127.0.0.1:" in r.stderr
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    assert sorted(c["rank"] for c in _checks(report, "health")) == [0, 1]  # SLURM_LOCALID 0 on each node
    coll = _checks(report, "collectives")
    assert sorted(c["rank"] for c in coll) == [0, 1]
    assert all(c["status"] == "pass" and c["details"]["launcher"] == "slurm" for c in coll)


@pytest.mark.parametrize("how", ["killed", "hung", "parent_hung"])
def test_a_rank_lost_mid_collective_is_named_and_rank_0_exits_in_time(tmp_path: Path, how: str) -> None:
    timeout = 4.0
    procs = _start_two_ranks_in_a_slow_sweep(tmp_path, timeout)
    if how == "hung":  # a hung rank: its check process (own session) and its gpuaccept process
        child = _child_pid(procs[1].pid, 1)
        assert child is not None
        os.kill(child, signal.SIGSTOP)
    # SIGKILL: the check process follows its parent (PR_SET_PDEATHSIG). parent_hung: rank 1's check process
    # goes on, so rank 0's collective never fails by itself and rank 0 must stop its own check process.
    os.killpg(procs[1].pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    lost_at = time.monotonic()
    try:
        code = procs[0].wait(timeout=60)
        took = time.monotonic() - lost_at
    finally:
        os.killpg(procs[1].pid, signal.SIGKILL)
    log0 = (tmp_path / "rank0.log").read_text()
    assert code == 1, log0
    assert took < 2 * timeout, f"rank 0 took {took:.1f} s after rank 1 was lost: {log0}"
    print(f"rank 0 exited {took:.2f} s after rank 1 was lost ({how})")
    report = validate_report(tmp_path / "rep" / "fault" / "report.json")
    assert report["verdict"] == "failure"
    assert sorted(c["host"] for c in _checks(report, "health")) == ["nodeA", "nodeB"]  # rank 1's earlier result kept
    coll = {c["rank"]: c for c in _checks(report, "collectives")}
    assert coll[1]["status"] == "error" and coll[1]["host"] == "nodeB"
    assert "rank 1 (nodeB) did not report: no heartbeat" in coll[1]["reason"]
    assert coll[0]["status"] == "error" and "rank 1 (nodeB)" in coll[0]["reason"]
    assert "rank 1 (nodeB)" in log0
    rows0 = [m for m in coll[0]["metrics"] if m["name"] == "allreduce_busbw_gbs"]
    if how == "hung":  # the collective timed out by itself: rank 0's rows up to then are in its outcome
        assert "Timed out" in coll[0]["reason"] and rows0
    if how == "parent_hung":  # rank 0's check process was stopped: its last checkpoint is kept
        assert "killed 1 s after a peer was lost" in coll[0]["reason"] and "; kept " in coll[0]["reason"] and rows0


def test_rank_0_killed_mid_collective_leaves_the_survivor_with_its_own_record(tmp_path: Path) -> None:
    timeout = 4.0
    procs = _start_two_ranks_in_a_slow_sweep(tmp_path, timeout)
    os.killpg(procs[0].pid, signal.SIGKILL)  # rank 0 and the store it served
    lost_at = time.monotonic()
    code = procs[1].wait(timeout=60)
    took = time.monotonic() - lost_at
    log1 = (tmp_path / "rank1.log").read_text()
    assert code == 1 and took < 2 * timeout, f"{took:.1f} s: {log1}"
    own = [json.loads(line) for line in (tmp_path / "rep" / "fault" / "rank-1.jsonl").read_text().splitlines()]
    assert [c["name"] for c in own] == ["health", "collectives"]
    assert own[1]["status"] == "error" and own[1]["rank"] == 1 and own[1]["host"] == "nodeB"
    assert "rank 0 (nodeA)" in own[1]["reason"]
    assert "[RESULT] rank 1: FAILURE" in log1


def _child_pid(parent: int, rank: int) -> int | None:
    """The rank process that ``parent`` had forked for ``rank`` by its warm process (its grandchild), known
    by its log (``logs/rank-<r>/`` under --distributed, ``<check>.rank<r>.log`` in a plain run)."""
    for pid in descendants(parent):
        try:
            log = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            continue
        if log.endswith(("/zygote.log", "/health.log")):
            continue
        if f"/rank-{rank}/" in log or log.endswith(f".rank{rank}.log"):
            assert "gpuaccept.node.zygote" in process_cmdline(parent_of(pid)), "not forked by the warm process"
            return pid
    return None


def test_a_local_rank_killed_mid_collective_is_named_in_the_node_report(tmp_path: Path) -> None:
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("checks:\n  collectives:\n    params: {ops: [allreduce], min_bytes: 4096, cpu_max_bytes: 65536, "
                   "step_factor: 2, warmup: 0, iters: 6000}\n")
    with open(tmp_path / "run.log", "wb") as log:
        proc = subprocess.Popen(gpuaccept_argv("run", *QUICK, "--checks", "collectives", "--config", str(cfg),
                                               "--report-dir", str(tmp_path), "--run-id", "local",
                                               "--dist-timeout", "4"),
                                env=cli_env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    victim_log = tmp_path / "local" / "logs" / "collectives.rank1.log"
    deadline = time.monotonic() + 120
    while "busbw" not in (victim_log.read_text() if victim_log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "run.log").read_text()
        time.sleep(0.05)
    pid = _child_pid(proc.pid, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    code = proc.wait(timeout=60)
    assert code == 1 and time.monotonic() - killed_at < 8, (tmp_path / "run.log").read_text()
    coll, = _checks(validate_report(tmp_path / "local" / "report.json"), "collectives")
    assert coll["status"] == "error" and coll["details"]["dead_ranks"] == [1]
    assert coll["reason"].startswith("rank 1 (cpu): check process died (SIGKILL) without a result")
    # what both ranks measured before the loss is kept: rank 0's own outcome, rank 1's last checkpoint
    assert "; kept " in coll["reason"] and coll["details"]["ranks"]["1"]["partial"] is True
    assert {0, 1} <= {m["tags"]["rank"] for m in coll["metrics"] if m["name"] == "allreduce_busbw_gbs"}
    assert not list((tmp_path / "local").glob(".*partial"))


def test_a_rank_that_never_joins_is_reported_and_the_rest_still_measures(tmp_path: Path) -> None:
    port = free_port()
    r = subprocess.run(gpuaccept_argv("run", "--distributed", *QUICK, "--checks", "health,collectives",
                                      "--report-dir", str(tmp_path), "--dist-timeout", "2"),
                       env=rank_env(0, 2, port, "solo"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    local, = _checks(report, "health")
    assert local["status"] in ("pass", "skip") and local["host"] == "solo" and local["rank"] == 0
    coll = {c["rank"]: c for c in _checks(report, "collectives")}
    assert "never joined within 2 s" in coll[1]["reason"] and coll[1]["host"] == "unknown host"
    assert coll[0]["status"] == "error" and coll[0]["reason"].startswith("not run: rank 1")


def test_a_rank_whose_rank_zero_is_absent_gives_up_in_time(tmp_path: Path) -> None:
    port = free_port()
    started = time.monotonic()
    r = subprocess.run(gpuaccept_argv("run", "--distributed", *QUICK, "--checks", "health",
                                      "--report-dir", str(tmp_path), "--dist-timeout", "2"),
                       env=rank_env(1, 2, port, "lonely"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert time.monotonic() - started < 30
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("gpuaccept: error: rank 1: cannot reach rank 0's rendezvous store at 127.0.0.1:")
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(("env", "fragment"), [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "RANK=2 is not below WORLD_SIZE=2"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "5"}, "not an srun step"),
])
def test_bad_environment_exits_2_with_one_line(tmp_path: Path, env: dict[str, str], fragment: str) -> None:
    r = gpuaccept("run", "--distributed", *QUICK, "--checks", "collectives", "--report-dir", str(tmp_path),
                  timeout=120, **env)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuaccept: error: --distributed: ") and fragment in lines[0]
    assert not list(tmp_path.iterdir())  # nothing started


def test_plain_run_as_one_of_several_launcher_processes_is_refused(tmp_path: Path) -> None:
    r = gpuaccept("run", *QUICK, "--checks", "health", "--report-dir", str(tmp_path), LOCAL_WORLD_SIZE="2",
                  LOCAL_RANK="1", RANK="1", WORLD_SIZE="2")
    assert r.returncode == 2 and "LOCAL_WORLD_SIZE=2" in r.stderr and "--distributed" in r.stderr
    r = gpuaccept("run", "--distributed", "--nproc", "2", *QUICK, "--report-dir", str(tmp_path))
    assert r.returncode == 2 and "--nproc is for a plain run" in r.stderr


def test_plan_shows_the_detected_rank() -> None:
    r = gpuaccept("run", "--distributed", "--plan", *QUICK, "--checks", "collectives", SLURM_PROCID="3",
                  SLURM_NTASKS="4", SLURM_STEP_ID="0", SLURM_LOCALID="1", SLURM_NODEID="1", SLURM_NNODES="2",
                  SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_STEP_NODELIST="gpu[07-08]", SLURM_JOB_ID="77")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["distributed"]
    assert (d["rank"], d["local_rank"], d["node_rank"], d["master_addr"], d["master_port"]) == (
        3, 1, 1, "gpu07", 20077)
    plain = json.loads(gpuaccept("run", "--plan", *QUICK, "--checks", "collectives").stdout)
    assert plain["nproc"] == 2


@pytest.mark.gpu
def test_cuda_node_runs_the_distributed_checks_with_nccl_or_skips_with_one_gpu(tmp_path: Path) -> None:
    import torch

    r = gpuaccept("run", "--device", "cuda", "--profile", "quick", "--checks", "collectives,ddp_train",
                  "--report-dir", str(tmp_path), timeout=600)
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    coll, = _checks(report, "collectives")
    if torch.cuda.device_count() < 2:  # both checks skip: nothing measured (exit 5), not a pass
        assert r.returncode == 5 and coll["status"] == "skip" and "needs at least 2 ranks" in coll["reason"], \
            r.stdout + r.stderr
        assert report["verdict"] == "nothing_measured"
        return
    assert r.returncode == 0, r.stdout + r.stderr
    assert coll["status"] == "pass" and coll["details"]["ranks"]["0"]["backend"] == "nccl"
    assert {m["device"] for m in coll["metrics"]} == {f"cuda:{i}" for i in range(torch.cuda.device_count())}
    assert _assert_busbw_consistent(coll["metrics"], torch.cuda.device_count()) > 0


@pytest.mark.gpu
def test_verification_on_cuda_tensors() -> None:
    import torch

    from gpuaccept.checks.collectives import DTYPES, Pattern, count_wrong

    for dtype_name in ("float32", "bfloat16"):
        pat = Pattern(8, DTYPES[dtype_name][1])
        idx = torch.arange(0, 3 << 20, dtype=torch.int64, device="cuda")
        out = pat.reduced_sum(idx).to(getattr(torch, dtype_name))
        assert count_wrong("allreduce", out, 0, pat, out.numel() // 8) == (0, None)
        out[12345] += 1
        assert count_wrong("allreduce", out, 0, pat, out.numel() // 8) == (1, 12345)
