"""The slurm backend: parsers on recorded outputs, golden sbatch scripts (shellchecked), bad input,
and real jobs on a private two-node Slurm cluster started by the test (tests/slurm_cluster.py)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.errors import ConfigError, InputError
from gpuaccept.launch.base import Submission
from gpuaccept.launch.slurm.backend import SlurmBackend, _Watch
from gpuaccept.launch.slurm.options import SlurmOptions
from gpuaccept.launch.slurm.parse import (
    expand_hostlist,
    parse_sacct,
    parse_sbatch,
    parse_scontrol_job,
    parse_squeue,
    sacct_unavailable,
    squeue_says_unknown_job,
)
from gpuaccept.launch.slurm.script import pyxis_image, render_script
from gpuaccept.launch.spec import JobSpec, Mount
from tests.launch_support import (
    SLURM_DATA,
    check_golden,
    cluster_report,
    gpuaccept,
    launch_env,
    one_error_line,
    require,
    shellcheck,
)
from tests.slurm_cluster import DAEMONS, LocalSlurm


def _data(name: str) -> str:
    return (SLURM_DATA / name).read_text()


# ------------------------------------------------------------------ parsers (recorded outputs)

def test_sbatch_job_id_from_parsable_and_plain_output() -> None:
    assert parse_sbatch(_data("sbatch_parsable.txt")) == "1"
    assert parse_sbatch(_data("sbatch_plain.txt")) == "2"
    assert parse_sbatch("77;cluster2\n") == "77"
    with pytest.raises(InputError, match="no job id"):
        parse_sbatch(_data("sbatch_invalid_partition.stderr.txt"))


def test_squeue_states_and_a_job_that_left_the_queue() -> None:
    pending = parse_squeue(_data("squeue_pending.txt"), "1")
    assert pending is not None and pending.state == "PENDING" and pending.reason == "JobHeldUser"
    assert not pending.done and pending.hosts == []
    running = parse_squeue(_data("squeue_running.txt"), "1")
    assert running is not None and running.state == "RUNNING" and running.hosts == ["node1", "node2"]
    assert parse_squeue(_data("squeue_left.txt"), "2") is None
    assert parse_squeue(_data("squeue_running.txt"), "5") is None
    assert squeue_says_unknown_job(_data("squeue_invalid_job.stderr.txt"))


@pytest.mark.parametrize(("name", "state", "ok", "exit_code"), [
    ("scontrol_job_pending.txt", "PENDING", False, "0:0"),
    ("scontrol_job_running.txt", "RUNNING", False, "0:0"),
    ("scontrol_job_completed.txt", "COMPLETED", True, "0:0"),
    ("scontrol_job_failed.txt", "FAILED", False, "3:0"),
    ("scontrol_job_cancelled.txt", "CANCELLED", False, "0:15"),
])
def test_scontrol_show_job_one_line_and_multi_line(name: str, state: str, ok: bool, exit_code: str) -> None:
    text = _data(name)
    job_id = text.split()[0].split("=")[1]
    job = parse_scontrol_job(text, job_id)
    assert job is not None and (job.state, job.ok, job.exit_code) == (state, ok, exit_code)
    assert job.done == (state not in ("PENDING", "RUNNING"))
    assert job.hosts == ([] if state == "PENDING" else ["node1", "node2"])
    assert parse_scontrol_job(text, "999") is None


@pytest.mark.parametrize(("name", "job_id", "state", "ok", "hosts"), [
    ("sacct_completed.txt", "57", "COMPLETED", True, ["node1", "node2"]),
    ("sacct_failed.txt", "58", "FAILED", False, ["node1", "node2"]),
    ("sacct_cancelled.txt", "59", "CANCELLED", False, ["node1", "node2"]),
    ("sacct_running.txt", "60", "RUNNING", False, ["gpu-a001", "gpu-a002", "gpu-b017"]),
    ("sacct_steps.txt", "61", "TIMEOUT", False, ["node1", "node2"]),
    ("sacct_pending.txt", "62", "PENDING", False, []),
])
def test_sacct_allocation_line(name: str, job_id: str, state: str, ok: bool, hosts: list[str]) -> None:
    job = parse_sacct(_data(name), job_id)
    assert job is not None and (job.state, job.ok, job.hosts) == (state, ok, hosts)
    assert parse_sacct(_data(name), "1") is None


def test_sacct_without_accounting_is_recognised() -> None:
    assert sacct_unavailable(_data("sacct_no_accounting.stderr.txt"))
    assert not sacct_unavailable("sacct: error: Invalid user id: 5")


def test_hostlist_expansion_matches_scontrol_show_hostnames() -> None:
    assert expand_hostlist("node[1-2]") == _data("scontrol_hostnames.txt").split()
    assert expand_hostlist("gpu[008-010,12],login1,r[1-2]n[1-2]") == [
        "gpu008", "gpu009", "gpu010", "gpu12", "login1", "r1n1", "r1n2", "r2n1", "r2n2"]
    for bad in ("node[1-", "node[3-1]", "node[a-b]"):
        with pytest.raises(InputError, match="host list"):
            expand_hostlist(bad)


def _fake_tools(tmp_path: Path, **outputs: tuple[int, str, str]) -> str:
    """A PATH with stand-ins printing recorded text: ``name=(exit code, stdout file, stderr file)``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cat = shutil.which("cat") or "/bin/cat"
    for name, (code, out, err) in outputs.items():
        tool = bin_dir / name
        lines = ["#!/bin/sh", f"echo \"$*\" >> {bin_dir}/{name}.calls"]
        if out:
            lines.append(f"{cat} {SLURM_DATA / out}")
        if err:
            lines.append(f"{cat} {SLURM_DATA / err} >&2")
        lines.append(f"exit {code}")
        tool.write_text("\n".join(lines) + "\n")
        tool.chmod(0o755)
    return str(bin_dir)


def test_poll_reads_sacct_when_the_cluster_has_accounting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sacct is on a cluster with slurmdbd, which no machine here runs: stand-ins print recorded text."""
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, sacct=(0, "sacct_completed.txt", ""),
                                           squeue=(1, "", "squeue_invalid_job.stderr.txt")))
    backend = SlurmBackend()
    sub = Submission(backend="slurm", job_id="57", handle=_Watch())
    state = backend.poll(sub)
    assert (state.state, state.done, state.ok) == ("COMPLETED", True, True)
    assert sub.hosts == ["node1", "node2"]
    assert (tmp_path / "bin" / "sacct.calls").read_text().split() == [
        "-j", "57", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList"]
    assert not (tmp_path / "bin" / "squeue.calls").exists()


def test_poll_falls_back_to_squeue_then_scontrol_without_accounting(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = _fake_tools(tmp_path, sacct=(1, "", "sacct_no_accounting.stderr.txt"),
                       squeue=(0, "squeue_running.txt", ""), scontrol=(0, "scontrol_job_failed.txt", ""))
    monkeypatch.setenv("PATH", path)
    backend = SlurmBackend()
    sub = Submission(backend="slurm", job_id="1", handle=_Watch())
    state = backend.poll(sub)
    assert (state.state, state.done) == ("RUNNING", False) and sub.hosts == ["node1", "node2"]
    assert sub.handle.use_sacct is False and "sacct unavailable" in sub.handle.notes[0]
    (tmp_path / "bin" / "squeue").write_text("#!/bin/sh\nexit 0\n")  # the job left the queue
    sub.job_id = "3"
    state = backend.poll(sub)
    assert (state.state, state.done, state.ok, state.detail) == ("FAILED", True, False, "exit 3:0 on node[1-2]")
    assert (tmp_path / "bin" / "sacct.calls").read_text().count("\n") == 1  # not asked again


# ------------------------------------------------------------------ plans (pure, golden, shellcheck)

def _suite_spec(**over: object) -> JobSpec:
    base: dict[str, object] = {"name": "acceptance", "nodes": 2, "run_id": "20260101T000000Z-acceptance-0000",
                               "results_dir": "/shared/gpuaccept", "suite_args": ["--profile", "quick"],
                               "distributed": False}
    base.update(over)
    return JobSpec(**base)  # type: ignore[arg-type]


GOLDEN_SPECS: dict[str, JobSpec] = {
    "suite.sbatch": _suite_spec(),
    "suite-partition-exclusive.sbatch": _suite_spec(
        nodes=64, gpus_per_node=8, time_limit_min=30,
        options={"partition": "gpu", "account": "ml-infra", "qos": "high", "exclusive": True,
                 "exclude": "gpu[017,033]", "cpus_per_task": 96, "sbatch_lines": ["--reservation=acceptance"]}),
    "torchrun-pyxis.sbatch": JobSpec(
        name="train", nodes=4, gpus_per_node=8, run_id="20260101T000000Z-train-0000", results_dir="/lustre/runs",
        command=["python", "train.py", "--lr", "3e-4"], image="nvcr.io/nvidia/pytorch:24.05-py3",
        env={"NCCL_DEBUG": "INFO", "QUOTED": "it's \"fine\"\nreally"}, mounts=[Mount("/data", "/data", True)],
        time_limit_min=120, workdir="/workspace",
        options={"container_mount_home": False, "container_env": ["HF_TOKEN"], "srun_args": ["--mpi=pmix"]}),
    "suite-distributed-paths.sbatch": _suite_spec(
        nodes=2, gpus_per_node=2, distributed=True, results_dir="/shared/results with space",
        suite_args=["--profile", "quick", "--distributed"], python="/opt/venv/bin/python",
        options={"nodelist": "node[1-2]"}),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_SPECS))
def test_sbatch_scripts_match_golden_files_and_pass_shellcheck(name: str, tmp_path: Path) -> None:
    spec = GOLDEN_SPECS[name]
    plan = SlurmBackend().plan(spec)
    script = plan.files["job.sbatch"]
    assert SlurmBackend().plan(spec).files == plan.files  # deterministic
    check_golden(f"slurm/{name}", script)
    assert plan.commands == [["sbatch", "--parsable", "job.sbatch"]]
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    shellcheck(path)


def test_torchrun_script_has_rendezvous_on_the_first_node_and_escaped_image() -> None:
    script = SlurmBackend().plan(GOLDEN_SPECS["torchrun-pyxis.sbatch"]).files["job.sbatch"]
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    assert "rdzv_port=$(( 20000 + SLURM_JOB_ID % 20000 ))" in script
    assert '--rdzv-backend=c10d --rdzv-endpoint="$head_addr:$rdzv_port"' in script
    assert "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'" in script
    assert "--container-mounts=/data:/data:ro,/lustre/runs:/lustre/runs" in script
    assert "--container-env=NCCL_DEBUG,QUOTED,HF_TOKEN" in script
    assert "--kill-on-bad-exit=1" in script
    assert "--no-python python train.py --lr 3e-4" in script.replace(" \\\n  ", " ")


@pytest.mark.parametrize(("image", "expected"), [
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io#nvidia/pytorch:24.05-py3"),
    ("docker://registry.local:5000/team/img:1", "registry.local:5000#team/img:1"),
    ("localhost/img", "localhost#img"),
    ("ubuntu:22.04", "ubuntu:22.04"),
    ("library/ubuntu", "library/ubuntu"),
    ("nvcr.io#nvidia/pytorch:24.05-py3", "nvcr.io#nvidia/pytorch:24.05-py3"),
    ("/images/pytorch.sqsh", "/images/pytorch.sqsh"),
])
def test_pyxis_image_separates_the_registry_with_a_hash(image: str, expected: str) -> None:
    assert pyxis_image(image) == expected


@pytest.mark.parametrize(("spec_over", "options", "words"), [
    ({"mounts": [Mount("/data", "/data")]}, {}, "bind mounts need a container image"),
    ({}, {"container_workdir": "/w"}, "--container-workdir: is a Pyxis option"),
    ({}, {"container_mount_home": False}, "--no-container-mount-home"),
    ({"image": "img", "mounts": [Mount("/a,b", "/c")]}, {}, "commas or whitespace"),
    ({}, {"partition": "gpu; rm -rf /"}, "not a valid --partition"),
    ({}, {"sbatch_lines": ["--x\n#SBATCH --y"]}, "one sbatch option"),
    ({}, {"nosuch": 1}, "nosuch: unknown option"),
    ({"workdir": 'a"b'}, {}, "double quotes"),
])
def test_bad_spec_or_options_raise_config_errors(spec_over: dict[str, object], options: dict[str, object],
                                                 words: str) -> None:
    spec = _suite_spec(options=options, **spec_over)
    with pytest.raises(ConfigError) as info:
        render_script(spec, SlurmOptions.from_dict(spec.options))
    assert words in str(info.value)


def test_dry_run_prints_the_script_and_writes_files_without_sbatch(tmp_path: Path) -> None:
    args = ["launch", "slurm", "--nodes", "2", "--device", "cpu", "--profile", "quick", "--checks", "env",
            "--results-dir", str(tmp_path / "res"), "--run-id", "dry1", "--partition", "debug", "--dry-run",
            "--output", str(tmp_path / "plan")]
    env = launch_env(PATH="/nonexistent")
    env["PATH"] = str(Path(sys.executable).parent)  # no Slurm binaries: a dry run needs none
    r1, r2 = gpuaccept(*args, env=env), gpuaccept(*args, env=env)
    assert r1.returncode == 0, r1.stderr
    assert r1.stdout == r2.stdout  # same spec, same plan
    assert "#SBATCH --partition=debug" in r1.stdout and "sbatch --parsable job.sbatch" in r1.stdout
    assert f"--report-dir {tmp_path}/res/dry1" in r1.stdout.replace(" \\\n  ", " ")
    assert (tmp_path / "plan" / "job.sbatch").read_text() in r1.stdout
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize(("args", "words"), [
    (["--nodes", "0"], "--nodes: must be at least 1, got 0"),
    (["--partitoin", "gpu"], "unrecognized arguments: --partitoin"),
    (["--mount", "/data:/data"], "bind mounts need a container image: give --image"),
    (["--container-mounts", "/data:/data,/x:/x"], "bind mounts need a container image: give --image"),
    (["--checks", "nosuch"], "--checks: unknown check 'nosuch'"),
    (["--exclude", "node[1-"], "Slurm host list"),
    (["--env", "1BAD=x"], "--env: 1BAD"),
    (["--", ], "nothing after --"),
])
def test_bad_input_exits_2_with_one_line_and_submits_nothing(tmp_path: Path, args: list[str], words: str) -> None:
    r = gpuaccept("launch", "slurm", "--device", "cpu", "--results-dir", str(tmp_path / "res"), *args)
    assert words in one_error_line(r)
    assert not (tmp_path / "res").exists()


SLURM_SPEC = """\
name: GPU_Acceptance
nodes: 16
gpus-per-node: 8
time: 45
image: nvcr.io/nvidia/pytorch:24.05-py3
mounts: [/data:/data:ro, {source: /scratch, target: /scratch}]
env: {NCCL_DEBUG: INFO}
suite: {profile: quick, checks: [env, compute]}
slurm:
  partition: gpu
  exclusive: true
  sbatch-line: [--reservation=acceptance]
  no-container-mount-home: true
k8s: {kind: pytorchjob}
"""


def test_spec_file_with_a_slurm_section(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SLURM_SPEC)
    r = gpuaccept("launch", "slurm", "--spec", str(spec), "--account", "ml", "--results-dir", "/shared/r",
                  "--run-id", "y", "--dry-run")
    assert r.returncode == 0, r.stderr
    for line in ("#SBATCH --job-name=gpu-acceptance", "#SBATCH --nodes=16", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --time=45", "#SBATCH --partition=gpu", "#SBATCH --account=ml", "#SBATCH --exclusive",
                 "#SBATCH --reservation=acceptance", "  --no-container-mount-home",
                 "  '--container-mounts=/data:/data:ro,/scratch:/scratch,/shared/r:/shared/r'"):
        assert line in r.stdout.splitlines(), line
    assert "--profile quick --checks env,compute" in r.stdout.replace(" \\\n  ", " ")
    bad = tmp_path / "bad.yaml"
    bad.write_text("slurm: {partition: gpu, reservation: x}\n")
    line = one_error_line(gpuaccept("launch", "slurm", "--spec", str(bad), "--dry-run"))
    assert f"{bad}: slurm.reservation: unknown slurm option" in line


def test_missing_sbatch_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    env = launch_env()
    env["PATH"] = str(Path(sys.executable).parent)
    r = gpuaccept("launch", "slurm", "--device", "cpu", "--checks", "env", "--results-dir", str(tmp_path / "res"),
                  env=env)
    assert "sbatch not found on PATH" in one_error_line(r)
    assert not (tmp_path / "res").exists()


# ------------------------------------------------------------------ a real cluster

@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    require(*DAEMONS, "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
    with LocalSlurm() as cluster:
        yield cluster


def _env(cluster: LocalSlurm) -> dict[str, str]:
    return launch_env(SLURM_CONF=str(cluster.conf))


def _launch(cluster: LocalSlurm, tmp_path: Path, *args: str, run_id: str = "run") -> subprocess.CompletedProcess[str]:
    return gpuaccept("launch", "slurm", "--python", sys.executable, "--results-dir", str(tmp_path),
                     "--run-id", run_id, "--poll-interval", "0.5", *args, env=_env(cluster), timeout=240)


def test_suite_runs_on_both_nodes_through_sbatch_and_srun(slurm: LocalSlurm, tmp_path: Path) -> None:
    r = _launch(slurm, tmp_path, "--nodes", "2", "--device", "cpu", "--profile", "quick", "--checks", "env,compute",
                "--cluster-report", str(tmp_path / "copy.json"))
    assert r.returncode == 0, r.stdout + r.stderr + slurm.log_tail()
    report = cluster_report(tmp_path / "run")
    assert report["verdict"] == "success" and report["backend"] == "slurm" and report["expected_nodes"] == 2
    assert [n["host"] for n in report["nodes"]] == ["node1", "node2"]
    for node in report["nodes"]:
        assert node["state"] == "reported" and node["verdict"] == "success"
        assert [c["name"] for c in node["report"]["checks"]] == ["env", "compute"]
        assert all(c["status"] == "pass" and c["host"] == node["host"] for c in node["report"]["checks"])
        assert any(m["name"] == "gemm_fp32_tflops" for m in node["report"]["checks"][1]["metrics"])
    assert report["analysis"]["job"]["state"] == "COMPLETED"
    assert json.loads((tmp_path / "copy.json").read_text()) == report
    assert "[NODE] node1: SUCCESS" in r.stdout and r.stdout.rstrip().endswith("cluster-report.json")
    assert slurm.wait_job(report["job_id"]) == "COMPLETED"
    log = next((tmp_path / "run" / "launch").glob("slurm-*.out")).read_text()
    # 2 nodes: one run over both by default (rank 0 writes the report), on nodes the job has to itself
    assert log.count("[RESULT] SUCCESS") == 1 and ": rendezvous " in log
    script = (tmp_path / "run" / "launch" / "job.sbatch").read_text()
    assert "#SBATCH --exclusive\n#SBATCH --mem=0\n" in script


def test_a_check_failing_on_one_node_is_reported_failed_not_lost(slurm: LocalSlurm, tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text("checks:\n  failon:\n    params: {host: node2}\n")
    r = _launch(slurm, tmp_path, "--nodes", "2", "--device", "cpu", "--checks", "steady,failon",
                "--config", str(config))
    assert r.returncode == 1, r.stdout + r.stderr
    report = cluster_report(tmp_path / "run")
    by = {n["host"]: n for n in report["nodes"]}
    assert by["node1"]["verdict"] == "success"
    assert by["node2"]["verdict"] == "failure" and by["node2"]["reason"] == "failed: failon"
    assert report["verdict"] == "failure" and report["analysis"]["job"]["state"] == "FAILED"
    assert "[RESULT] FAILURE: node2" in r.stdout


def test_a_node_that_never_reports_is_listed_missing(slurm: LocalSlurm, tmp_path: Path) -> None:
    script = ('if [ "$GPUACCEPT_HOSTNAME" = node1 ]; then exec "$0" -m gpuaccept run --device cpu --checks steady '
              f'--report-dir {tmp_path}/run; fi; exit 3')
    r = _launch(slurm, tmp_path, "--nodes", "2", "--no-torchrun", "--", "sh", "-c", script, sys.executable)
    assert r.returncode == 1, r.stdout + r.stderr
    report = cluster_report(tmp_path / "run")
    assert [(n["host"], n["state"]) for n in report["nodes"]] == [("node1", "reported"), ("node2", "missing")]
    assert "[NODE] node2: MISSING" in r.stdout


def test_command_under_torchrun_rendezvous_across_both_nodes(slurm: LocalSlurm, tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    code = ("import os, pathlib; e = os.environ; pathlib.Path(" + repr(str(out)) + ", e['RANK']).write_text("
            "' '.join([e['WORLD_SIZE'], e['LOCAL_RANK'], e['GPUACCEPT_HOSTNAME'], e['GREETING']]))")
    r = _launch(slurm, tmp_path, "--nodes", "2", "--procs-per-node", "1", "--env", "GREETING=hello world", "--",
                sys.executable, "-c", code)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = {p.name: p.read_text().split(" ", 3) for p in out.iterdir()}
    assert sorted(ranks) == ["0", "1"]
    assert sorted(v[2] for v in ranks.values()) == ["node1", "node2"]
    assert all(v[0] == "2" and v[1] == "0" and v[3] == "hello world" for v in ranks.values())
    assert not (tmp_path / "run" / "cluster-report.json").exists()  # a command without reports: the job decides


def test_without_a_gpu_count_each_node_starts_one_rank_per_gpu_it_is_given(slurm: LocalSlurm,
                                                                           tmp_path: Path) -> None:
    """No --gpus-per-node: each node counts its GPUs (here CUDA_VISIBLE_DEVICES=0,1) and starts that many ranks;
    with none visible, the job fails with a line saying so instead of running one rank."""
    out = tmp_path / "ranks"
    out.mkdir()
    code = ("import os, pathlib; e = os.environ; pathlib.Path(" + repr(str(out)) + ", e['RANK']).write_text("
            "' '.join([e['WORLD_SIZE'], e['LOCAL_WORLD_SIZE'], e['GPUACCEPT_HOSTNAME']]))")
    r = _launch(slurm, tmp_path, "--nodes", "2", "--env", "CUDA_VISIBLE_DEVICES=0,1", "--", sys.executable, "-c",
                code)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = {p.name: p.read_text().split(" ") for p in out.iterdir()}
    assert sorted(ranks) == ["0", "1", "2", "3"]
    assert all(v[:2] == ["4", "2"] for v in ranks.values())
    assert sorted(v[2] for v in ranks.values()) == ["node1", "node1", "node2", "node2"]
    none = _launch(slurm, tmp_path, "--nodes", "2", "--env", "CUDA_VISIBLE_DEVICES=", "--", sys.executable, "-c",
                   code, run_id="none")
    assert none.returncode == 1, none.stdout + none.stderr
    log = next((tmp_path / "none" / "launch").glob("slurm-*.out")).read_text()
    assert "no GPU found on this node" in log and "--gpus-per-node" in log


def test_distributed_suite_splits_rank0s_report_by_host(slurm: LocalSlurm, tmp_path: Path) -> None:
    """torchrun per node, `gpuaccept run --distributed`: rank 0 writes one report; the cluster report has 2 nodes."""
    r = _launch(slurm, tmp_path, "--nodes", "2", "--distributed", "--device", "cpu", "--checks", "steady")
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(list((tmp_path / "run").glob("*/report.json"))) == 1
    report = cluster_report(tmp_path / "run")
    assert [(n["host"], n["verdict"]) for n in report["nodes"]] == [("node1", "success"), ("node2", "success")]
    for node in report["nodes"]:
        assert [(c["name"], c["host"]) for c in node["report"]["checks"]] == [("steady", node["host"])]


def test_timeout_cancels_the_job_with_scancel(slurm: LocalSlurm, tmp_path: Path) -> None:
    r = _launch(slurm, tmp_path, "--nodes", "1", "--timeout", "2", "--no-torchrun", "--", "sleep", "120")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "timed out" in r.stdout
    job_id = json.loads((tmp_path / "run" / "launch" / "job.json").read_text())["job_id"]
    assert slurm.wait_job(job_id, timeout=30) == "CANCELLED"


def test_ctrl_c_cancels_the_job_and_gathers_what_came_back(slurm: LocalSlurm, tmp_path: Path) -> None:
    """Per-node mechanics (each node writes its own report), as the local backend's Ctrl-C test."""
    config = tmp_path / "nap.yaml"
    config.write_text("checks:\n  nap:\n    params: {seconds: 120}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuaccept", "launch", "slurm", "--python", sys.executable, "--results-dir",
         str(tmp_path), "--run-id", "run", "--poll-interval", "0.5", "--nodes", "2", "--device", "cpu",
         "--checks", "steady,nap", "--config", str(config), "--per-node-only"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(slurm))
    deadline = time.monotonic() + 180
    while True:  # the event: both nodes finished "steady" and are in the long "nap"
        results = list((tmp_path / "run").glob("*/results.jsonl"))
        if len(results) == 2 and all(p.read_text().strip() for p in results):
            break
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the nodes did not finish steady within 180 s"
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert "interrupted: cancelling slurm job" in out
    report = cluster_report(tmp_path / "run")
    assert report["analysis"]["job"]["interrupted"] is True
    assert report["verdict"] == "failure"
    job_id = report["job_id"]
    assert slurm.wait_job(job_id, timeout=30) == "CANCELLED"
    assert [n["state"] for n in report["nodes"]] == ["reported", "reported"]
    for node in report["nodes"]:  # what each node measured before the cancel is kept
        assert node["verdict"] == "interrupted" and node["report"]["checks"][0]["name"] == "steady"


def test_detach_then_gather(slurm: LocalSlurm, tmp_path: Path) -> None:
    r = _launch(slurm, tmp_path, "--nodes", "2", "--device", "cpu", "--checks", "steady", "--detach")
    assert r.returncode == 0, r.stderr
    assert f"gpuaccept gather {tmp_path}/run" in r.stdout
    job_id = json.loads((tmp_path / "run" / "launch" / "job.json").read_text())["job_id"]
    assert slurm.wait_job(job_id) == "COMPLETED"
    g = gpuaccept("gather", str(tmp_path / "run"), env=_env(slurm))
    assert g.returncode == 0, g.stdout + g.stderr
    report = cluster_report(tmp_path / "run")
    assert sorted(n["host"] for n in report["nodes"]) == ["node1", "node2"] and report["job_id"] == job_id


def test_sbatch_refusal_exits_2_with_its_reason(slurm: LocalSlurm, tmp_path: Path) -> None:
    before = slurm.queued_jobs()
    r = _launch(slurm, tmp_path, "--nodes", "2", "--device", "cpu", "--checks", "steady", "--partition", "nosuch")
    line = one_error_line(r)
    assert "sbatch refused the job" in line and "nosuch" in line
    assert slurm.queued_jobs() == before


def _dry(tmp_path: Path, *args: str) -> str:
    r = gpuaccept("launch", "slurm", "--results-dir", str(tmp_path / "res"), "--run-id", "d", "--dry-run", *args,
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_nodes_are_exclusive_with_all_their_memory_unless_told_otherwise(tmp_path: Path) -> None:
    default = _dry(tmp_path, "--nodes", "2", "--device", "cpu")
    assert "#SBATCH --exclusive\n#SBATCH --mem=0\n" in default
    shared = _dry(tmp_path, "--nodes", "2", "--device", "cpu", "--no-exclusive", "--mem", "64g")
    assert "--exclusive" not in shared and "#SBATCH --mem=64G\n" in shared
    site = _dry(tmp_path, "--nodes", "2", "--device", "cpu", "--mem", "none")
    assert "--mem" not in site
    assert "--mem: '1.5G' is not a memory size" in one_error_line(
        gpuaccept("launch", "slurm", "--mem", "1.5G", "--dry-run"))


def test_a_command_in_a_pyxis_container_starts_in_the_submit_directory(tmp_path: Path) -> None:
    script = _dry(tmp_path, "--nodes", "2", "--image", "nvcr.io/nvidia/pytorch:24.05-py3", "--", "python", "train.py")
    here = str(tmp_path)
    assert f"{here}:{here}" in script.split("--container-mounts=")[1].split("'")[0]
    assert f"--container-workdir={here}" in script
    suite = _dry(tmp_path, "--nodes", "2", "--image", "img:1", "--device", "cpu")
    assert "--container-workdir" not in suite


def test_gather_on_a_running_job_says_so_and_writes_nothing(slurm: LocalSlurm, tmp_path: Path) -> None:
    config = tmp_path / "nap.yaml"
    config.write_text("checks:\n  nap:\n    params: {seconds: 120}\n")
    r = _launch(slurm, tmp_path, "--nodes", "1", "--device", "cpu", "--checks", "nap", "--config", str(config),
                "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = json.loads((tmp_path / "run" / "launch" / "job.json").read_text())["job_id"]
    try:
        g = gpuaccept("gather", str(tmp_path / "run"), env=_env(slurm))
        assert g.returncode == 3, g.stdout + g.stderr
        assert f"[RESULT] STILL RUNNING: the slurm job {job_id} is " in g.stdout
        assert not (tmp_path / "run" / "cluster-report.json").exists()
    finally:
        subprocess.run(["scancel", job_id], env=_env(slurm), check=False)
    assert slurm.wait_job(job_id) == "CANCELLED"
    done = gpuaccept("gather", str(tmp_path / "run"), env=_env(slurm))
    assert done.returncode == 1 and (tmp_path / "run" / "cluster-report.json").exists()
