"""``gpuaccept sweep``: the plan on recorded Slurm outputs, the Kubernetes manifests, and a real sweep of the
local Slurm cluster whose result reaches the history."""

from __future__ import annotations

import json
import sqlite3
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuaccept.sweep.k8s import CronSweep, manifests
from gpuaccept.sweep.plan import (
    JOB_NAME,
    NodeState,
    SweepOptions,
    decide,
    job_script,
    parse_sinfo,
    parse_squeue,
    sbatch_options,
)
from tests.k8s_strict import errors as k8s_errors
from tests.launch_support import gpuaccept, launch_env, one_error_line, require
from tests.slurm_cluster import DAEMONS, LocalSlurm

DATA = Path(__file__).resolve().parent / "data" / "slurm"


# ------------------------------------------------------------------ the plan, on recorded outputs

def test_only_idle_nodes_without_a_sweep_job_are_chosen_from_recorded_sinfo() -> None:
    nodes = parse_sinfo((DATA / "sinfo_sweep_mixed.txt").read_text())
    states = {n.name: n.state for n in nodes}
    assert states["node1"] == "idle" and states["node2"] == "allocated"
    assert states["node3"] == "drained" and states["node4"].startswith("draining")
    decisions = {d.node: d for d in decide(nodes, {})}
    assert [n for n, d in decisions.items() if d.submit] == ["node1"]
    assert decisions["node2"].why == "not idle (allocated)" and "drain" in decisions["node3"].why
    everyone = decide(parse_sinfo((DATA / "sinfo_sweep_all_idle.txt").read_text()), {})
    assert [d.node for d in everyone if d.submit] == ["node1", "node2", "node3", "node4"]


def test_a_node_with_a_queued_sweep_job_is_not_swept_twice() -> None:
    queued = parse_squeue((DATA / "squeue_sweep.txt").read_text())
    assert sorted(queued) == ["node1", "node2"]  # pending jobs: the node each asked for
    nodes = parse_sinfo((DATA / "sinfo_sweep_all_idle.txt").read_text())
    decisions = {d.node: d for d in decide(nodes, queued, max_nodes=1)}
    assert decisions["node1"].why.startswith("sweep job ") and not decisions["node1"].submit
    assert decisions["node3"].submit and decisions["node4"].why == "over --max-nodes 1"


@pytest.mark.parametrize("state", ["idle~", "idle*", "idle#", "idle!", "idle%", "idle$", "idle@", "mixed",
                                   "completing", "down*", "planned", "reserved"])
def test_every_state_flag_means_not_idle(state: str) -> None:
    (d,) = decide([NodeState("gpu01", state, "gpu")], {})
    assert not d.submit and state in d.why


def test_a_node_name_that_is_not_a_host_name_is_never_submitted_to() -> None:
    (d,) = decide([NodeState("../etc", "idle", "gpu")], {})
    assert not d.submit and d.why == "not a valid node name"
    with pytest.raises(ValueError):
        parse_sinfo("node1 idle gpu\n")


def test_the_job_asks_for_one_exclusive_low_priority_node_and_runs_the_suite_into_the_history() -> None:
    opts = SweepOptions(python="/opt/venv/bin/python", results_dir="/shared/sweeps", db="postgresql://g@db/g",
                        partition="gpu", qos="scavenger", nice=5000, time_min=20, deadline_min=45,
                        gpus_per_node=8, run_args=("--profile", "quick", "--checks", "env,compute"))
    assert sbatch_options("gpu07", opts) == [
        f"--job-name={JOB_NAME}", "--nodelist=gpu07", "--nodes=1", "--ntasks=1", "--exclusive", "--nice=5000",
        "--no-requeue", "--time=20", "--output=/shared/sweeps/gpu07-%j.out", f"--comment={JOB_NAME}",
        "--deadline=now+45minutes", "--partition=gpu", "--qos=scavenger", "--gpus-per-node=8"]
    script = job_script("gpu07", opts)
    assert script.startswith("#!/bin/sh\n") and "#SBATCH --no-requeue\n" in script
    assert script.rstrip().splitlines()[-1] == (
        "exec /opt/venv/bin/python -m gpuaccept run --profile quick --checks env,compute "
        "--db postgresql://g@db/g --report-dir /shared/sweeps")
    with pytest.raises(ValueError):
        job_script("a b", opts)


# ------------------------------------------------------------------ command line

def test_bad_input_is_exit_2_with_one_line(tmp_path: Path) -> None:
    line = one_error_line(gpuaccept("sweep", "slurm", "--report-dir", "relative/dir", "--dry-run"))
    assert "not an absolute path" in line
    line = one_error_line(gpuaccept("sweep", "slurm", "--report-dir", str(tmp_path), "--db",
                                    "postgresql://u:secret@db/g", "--dry-run"))
    assert "password" in line and "secret" not in line
    line = one_error_line(gpuaccept("sweep", "slurm", "--report-dir", str(tmp_path), "--qos", "a;b"))
    assert "--qos" in line
    env = launch_env()
    env["PATH"] = str(Path(sys.executable).parent)
    r = gpuaccept("sweep", "slurm", "--report-dir", str(tmp_path / "r"), env=env)
    assert "sinfo not found on PATH" in one_error_line(r) and not (tmp_path / "r").exists()


def test_k8s_manifests_pass_strict_validation_and_yield_to_real_work(tmp_path: Path) -> None:
    r = gpuaccept("sweep", "k8s", "--image", "ghcr.io/example/gpuaccept:1.0", "--db-secret", "gpuaccept-db",
                  "--nodes", "3", "--gpus-per-node", "4", "--node-selector", "pool=h100", "--time", "20m")
    assert r.returncode == 0, r.stderr
    pc, cron = list(yaml.safe_load_all(r.stdout))
    assert k8s_errors(pc) == [] and k8s_errors(cron) == []
    assert pc["value"] < 0 and pc["preemptionPolicy"] == "Never"
    job = cron["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    assert job["parallelism"] == 3 and pod["priorityClassName"] == pc["metadata"]["name"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"  # one pod per node
    (c,) = pod["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4"}  # a whole node's GPUs: only an idle node fits
    assert {"name": "GPUACCEPT_DB", "valueFrom": {"secretKeyRef": {"name": "gpuaccept-db", "key": "url"}}} in c["env"]
    ignore = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert ignore in job["podFailurePolicy"]["rules"]
    assert pod["activeDeadlineSeconds"] == 1200 and pod["nodeSelector"] == {"pool": "h100"}
    with pytest.raises(Exception, match="negative"):
        manifests(CronSweep(image="ghcr.io/x/y:1", priority=5))
    assert "schedule" in one_error_line(gpuaccept("sweep", "k8s", "--image", "ghcr.io/x/y:1", "--schedule", "hourly"))


# ------------------------------------------------------------------ a real cluster

@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    require(*DAEMONS, "sbatch", "squeue", "scontrol", "scancel", "sinfo")
    with LocalSlurm() as cluster:
        yield cluster


def _wait_running(cluster: LocalSlurm, job: str, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING":
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job} did not start: {cluster.log_tail()}")


def test_a_sweep_tests_only_the_idle_node_and_its_result_reaches_the_history(slurm: LocalSlurm,
                                                                             tmp_path: Path) -> None:
    busy = slurm.run("sbatch", "--parsable", "-w", "node2", "--exclusive", "--wrap", "sleep 300").stdout.strip()
    try:
        _wait_running(slurm, busy)
        db = tmp_path / "history.db"
        env = launch_env(SLURM_CONF=str(slurm.conf))
        args = ("sweep", "slurm", "--report-dir", str(tmp_path / "sweeps"), "--db", f"sqlite:///{db}",
                "--python", sys.executable, "--device", "cpu", "--time", "5m")
        run_args = ("--", "--checks", "env")
        plan = gpuaccept(*args, "--dry-run", *run_args, env=env)
        assert plan.returncode == 0, plan.stderr
        assert "[SWEEP] node1: submit (idle)" in plan.stdout
        assert "[SWEEP] node2: skip (not idle (allocated))" in plan.stdout
        assert not (tmp_path / "sweeps").exists()  # a dry run writes nothing
        r = gpuaccept(*args, *run_args, env=env)
        assert r.returncode == 0, r.stdout + r.stderr + slurm.log_tail()
        assert "[RESULT] 1 sweep job(s) submitted, 1 node(s) skipped" in r.stdout
        job = next(line.split()[3] for line in r.stdout.splitlines() if line.startswith("[SWEEP] node1: job "))
        again = gpuaccept(*args, "--dry-run", *run_args, env=env)  # while node1's job is queued or running
        assert f"node1: skip (sweep job {job} already queued)" in again.stdout or \
               "node1: skip (not idle" in again.stdout, again.stdout
        assert slurm.wait_job(job) == "COMPLETED", slurm.log_tail()
        info = slurm.run("scontrol", "show", "job", "-o", job).stdout
        assert "Nice=10000" in info and "Requeue=0" in info and "NodeList=node1" in info
        (sweep_dir,) = (tmp_path / "sweeps").glob("sweep-*")
        assert sorted(p.name for p in sweep_dir.iterdir()) == [f"node1-{job}.out", "node1.sbatch"]
        assert stat.S_IMODE(sweep_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((sweep_dir / "node1.sbatch").stat().st_mode) == 0o700
        assert "[RESULT] SUCCESS" in (sweep_dir / f"node1-{job}.out").read_text()
        (report_file,) = (tmp_path / "sweeps").glob("*-node1-*/report.json")
        report = json.loads(report_file.read_text())
        assert report["host"] == "node1" and report["verdict"] == "success"
        with sqlite3.connect(db) as con:
            hosts = [row[0] for row in con.execute("SELECT host FROM runs")]
        assert hosts == ["node1"]
        hist = gpuaccept("history", "--db", f"sqlite:///{db}", "--json", env=env)
        assert hist.returncode == 0 and "node1" in hist.stdout
    finally:
        slurm.run("scancel", busy)


# ------------------------------------------------------------------ flagging the node that degrades

def test_flag_names_the_node_whose_gemm_rate_falls_and_not_the_steady_ones(tmp_path: Path) -> None:
    from gpuaccept.results.history import open_store
    from tests.store_reports import T0, node_report

    db = f"sqlite:///{tmp_path / 'h.db'}"
    with open_store(db) as store:
        for i in range(9):
            for host, tflops in (("gpu01", 600.0), ("gpu02", 600.0 if i < 6 else 540.0), ("gpu03", 601.0)):
                store.add_node_report(node_report(host, f"r{i}-{host}", T0 + 3600 * i,
                                                  tflops=tflops + (i % 3) * 0.5))
    r = gpuaccept("sweep", "flag", "--db", db, "--metric", "gemm_bf16_tflops")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("REGRESSION: ")]
    assert lines and all(line.startswith("REGRESSION: gpu02: compute gemm_bf16_tflops cuda:") for line in lines)
    assert "[RESULT] 2 regressed series on 1 node(s): gpu02" in r.stdout
    whole = gpuaccept("sweep", "flag", "--db", db, "--json")
    found = json.loads(whole.stdout)
    assert whole.returncode == 1 and {f["host"] for f in found["regressions"]} == {"gpu02"}
    assert found["series_judged"] > 6
    steady = gpuaccept("sweep", "flag", "--db", db, "--metric", "gemm_bf16_tflops", "--since", "2026-01-01",
                       "--min-drop-pct", "20")
    assert steady.returncode == 0 and "[RESULT] 0 regressed series on 0 node(s)" in steady.stdout
    assert "no metric 'gemm_bf16_tflopz'" in one_error_line(gpuaccept("sweep", "flag", "--db", db, "--metric",
                                                                      "gemm_bf16_tflopz"))


def test_flag_says_not_judged_when_no_series_has_enough_history(tmp_path: Path) -> None:
    from gpuaccept.results.history import open_store
    from tests.store_reports import T0, node_report

    db = f"sqlite:///{tmp_path / 'h.db'}"
    with open_store(db) as store:
        pass
    assert "holds no metric values" in one_error_line(gpuaccept("sweep", "flag", "--db", db))
    with open_store(db) as store:
        for i in range(3):
            store.add_node_report(node_report("gpu01", f"r{i}", T0 + 3600 * i, tflops=600.0 - 100 * i))
    r = gpuaccept("sweep", "flag", "--db", db)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[RESULT] NOT JUDGED: no series has enough history (a series is judged once it holds 6 runs" in r.stdout
    assert "regressed series" not in r.stdout
    j = json.loads(gpuaccept("sweep", "flag", "--db", db, "--json").stdout)
    assert j["verdict"] == "not_judged" and j["series_judged"] == 0
