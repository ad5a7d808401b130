"""The bcp backend: argv built from the spec (golden), parsers of NGC's output, and a recorded fake ``ngc`` on PATH.

The fake (``tests/fake_ngc.py``) rejects options that are not ``ngc base-command job run`` flags and checks
their values; the job logs it serves come from running the submitted command line on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import ConfigError, InputError, UsageError
from gpuaccept.launch.bcp.backend import JOB_ID_FILE, BcpBackend
from gpuaccept.launch.bcp.parse import parse_job_id, parse_job_status, status_state
from gpuaccept.launch.bcp.plan import TORCHRUN_NGC, BcpOptions, build_argv, container_argv, launcher_script
from gpuaccept.launch.jobargv import launch_dir
from gpuaccept.launch.pod_script import NODE_SCRIPT
from gpuaccept.launch.spec import JobSpec, Mount
from gpuaccept.model import Verdict
from tests.fake_ngc import RUN_FLAGS, calls, install
from tests.helpers import gpuaccept
from tests.k8s_support import check_golden, command_spec, need_binary, suite_spec
from tests.test_k8s_scripts import run_container

SUITE = ["--device", "cpu", "--profile", "quick", "--checks", "env"]


def bopts(**values: Any) -> dict[str, Any]:
    return BcpOptions.from_dict({"instance": "dgxa100.80g.8.norm", **values}).to_dict()


def ws_spec(make: Any, options: dict[str, Any], **over: Any) -> JobSpec:
    """A k8s_support spec with its mounts as workspaces (Base Command has no host paths)."""
    return make(options, mounts=[Mount("datasets-ws", "/data", True), Mount("scratch", "/scratch")], **over)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "ngc-state"
    install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return state


def run_script(plan: Any, tmp_path: Path, state: Path) -> list[str]:
    path = tmp_path / "bcp-submit.sh"
    path.write_text(plan.files["bcp-submit.sh"])
    proc = subprocess.run(["sh", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return calls(state)[-1]


# ---- the argv --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["mpi", "pytorch", "single"])
def test_plans_match_golden_and_pass_the_fake(case: str, fake: Path, tmp_path: Path) -> None:
    if case == "single":
        spec = ws_spec(command_spec, bopts(ace="nv-us-west-2", org="acme", team="gpu"), nodes=1, time_limit_min=60)
    else:
        spec = ws_spec(suite_spec, bopts(array_type=case.upper(), ace="nv-us-west-2", labels=["accept"],
                                         datasets=["12345:/imagenet"], priority="high"))
    plan = BcpBackend().plan(spec)
    check_golden(f"bcp/{case}.sh", plan.files["bcp-submit.sh"])
    assert run_script(plan, tmp_path, fake) == plan.commands[0][1:]


def test_argv_parts() -> None:
    spec = ws_spec(suite_spec, bopts(ace="ace1"))
    argv = build_argv(spec, BcpOptions.from_dict(spec.options))
    assert argv[:4] == ["ngc", "base-command", "job", "run"]
    text = " ".join(argv[: argv.index("--commandline")])
    for part in ("--name accept-h100", "--image nvcr.io/nvidia/pytorch:25.01-py3", "--instance dgxa100.80g.8.norm",
                 "--ace ace1", "--replicas 4 --array-type MPI", "--result /results", "--preempt RUNONCE",
                 "--total-runtime 1800s", "--workspace datasets-ws:/data:RO", "--workspace scratch:/scratch:RW",
                 "--env-var NCCL_DEBUG:INFO",
                 "--env-var GPUACCEPT_RESULTS_DIR:/results/20260101T000000Z-accept-h100-ab12",
                 "--env-var OMPI_ALLOW_RUN_AS_ROOT:1"):
        assert part in text, part
    assert {a for a in argv[4:-1] if a.startswith("-")} <= RUN_FLAGS
    words = shlex.split(argv[-1])
    assert words[:2] == ["sh", "-c"] and words[3] == "gpuaccept-launcher"
    assert words[4:] == ["python3", "-m", "gpuaccept", "run", "--profile", "quick", "--no-history", "--report-dir",
                         "/results/20260101T000000Z-accept-h100-ab12"]
    assert "hostfile=/etc/mpi/hostfile" in words[2] and "np=4" in words[2]  # the suite: one rank per node


def test_single_node_and_pytorch_command_lines() -> None:
    one = container_argv(command_spec(bopts(), nodes=1), BcpOptions())
    assert one[:4] == ["sh", "-c", NODE_SCRIPT, "gpuaccept"]
    assert one[4:10] == ["python3", "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                         "--nproc-per-node=8"]
    assert "--replicas" not in build_argv(command_spec(bopts(), nodes=1), BcpOptions(instance="i"))
    two = container_argv(command_spec(bopts(array_type="PYTORCH")), BcpOptions(array_type="PYTORCH"))
    assert two[:8] == ["sh", "-c", NODE_SCRIPT, "gpuaccept", "sh", "-c", TORCHRUN_NGC, "python3"]
    assert two[8] == "--nproc-per-node=8" and two[9].startswith("--master-port=")
    assert two[-4:] == ["python", "train.py", "--lr", "3e-4"]
    spec = suite_spec(bopts(array_type="PYTORCH"), mounts=[], workdir="/work dir")
    assert build_argv(spec, BcpOptions.from_dict(spec.options))[-1].startswith("cd '/work dir' && sh -c ")


def test_torchrun_wrapper_reads_the_ngc_variables(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\nprintf "%s\\n" "$0" "$@"\n')
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "NGC_ARRAY_SIZE": "4", "NGC_ARRAY_INDEX": "2", "NGC_JOB_ID": "77"}
    proc = subprocess.run(["sh", "-c", TORCHRUN_NGC, str(python), "--nproc-per-node=8", "job"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == ["-m", "torch.distributed.run", "--nnodes=4", "--node-rank=2",
                                            "--master-addr=launcher-svc-77", "--nproc-per-node=8", "job"]
    proc = subprocess.run(["sh", "-c", TORCHRUN_NGC, str(python)], env={**env, "NGC_MASTER_ADDR": "10.0.0.1"},
                          capture_output=True, text=True)
    assert "--master-addr=10.0.0.1" in proc.stdout.splitlines()
    proc = subprocess.run(["sh", "-c", TORCHRUN_NGC, str(python)], env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "NGC_" in proc.stderr + proc.stdout


def test_generated_scripts_pass_shellcheck(tmp_path: Path) -> None:
    shellcheck = need_binary("shellcheck")
    paths = []
    for kind in ("MPI", "PYTORCH"):
        plan = BcpBackend().plan(command_spec(bopts(array_type=kind), env={"Q": "it's \"x\"\ny"}))
        paths.append(tmp_path / f"{kind}.sh")
        paths[-1].write_text(plan.files["bcp-submit.sh"])
    paths.append(tmp_path / "launcher.sh")
    paths[-1].write_text(launcher_script(2, 8, ["Q", "TERM"]))
    proc = subprocess.run([shellcheck, "-s", "sh", *map(str, paths)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("values, message", [
    ({"array_type": "PARALLEL"}, "must be one of MPI, PYTORCH"),
    ({"preempt": "sometimes"}, "must be one of"),
    ({"priority": "urgent"}, "must be one of"),
    ({"instance": "dgx a100"}, "NGC name"),
    ({"result_mount": "results"}, "absolute path"),
    ({"datasets": ["12345"]}, "ID:/MOUNT"),
    ({"bogus": 1}, "unknown bcp option"),
    ({"labels": {"a": 1}}, "labels.*expected a list, got dict"),
])
def test_bad_options(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BcpOptions.from_dict(values)


def test_what_base_command_cannot_express() -> None:
    with pytest.raises(ConfigError, match="needs a container image"):
        build_argv(command_spec(bopts(), image=None), BcpOptions(instance="i"))
    with pytest.raises(ConfigError, match="needs an instance type"):
        build_argv(command_spec({}), BcpOptions())
    with pytest.raises(ConfigError, match="not host paths"):
        build_argv(command_spec(bopts(), mounts=[Mount("/data", "/data")]), BcpOptions(instance="i"))
    parser = argparse.ArgumentParser()
    BcpBackend.add_arguments(parser)
    o = BcpBackend.options_from_args(parser.parse_args(
        ["--instance", "i", "--array-type", "pytorch", "--label", "a", "--dataset", "9:/d", "--ngc-arg=--order=50"]))
    assert (o["array_type"], o["labels"], o["datasets"], o["extra_args"]) == ("PYTORCH", ["a"], ["9:/d"],
                                                                              ["--order=50"])


# ---- the parsers, on the NGC CLI reference's example output ----------------------------------------------------

RUN_OUTPUT = """\
 Job created.
 ----------------------------------------------------
 Job Information
   Id: 813581
   Name: Test Run
   Job Type: BATCH
 Job Status
   Status: CREATED
   Preempt Class: RUNONCE
 ----------------------------------------------------
"""
INFO_OUTPUT = """\
--------------------------------------------------
  Job Information
    Id: 710135
    Name: TestJobLumetta
    Job Type: BATCH
  Job Status
    Started at: 2019-06-20 20:41:12 UTC
    Ended at: 2019-06-20 20:41:12 UTC
    Status: FINISHED_SUCCESS
    Status Type: OK
    Preempt Class: RUNONCE
--------------------------------------------------
"""


def test_parsers() -> None:
    assert parse_job_id(RUN_OUTPUT) == "813581"
    assert parse_job_id('{"id": 99, "status": "CREATED"}') == "99"
    with pytest.raises(InputError, match="no job id"):
        parse_job_id("Error: quota exceeded")
    assert parse_job_status(INFO_OUTPUT) == ("FINISHED_SUCCESS", "")
    assert parse_job_status('{"jobStatus": {"status": "RUNNING"}}') == ("RUNNING", "")
    failed = "  Status: FAILED\n  Status Details: (100): Container exited with status 1.\n"
    assert parse_job_status(failed) == ("FAILED", "(100): Container exited with status 1.")
    with pytest.raises(InputError, match="no 'Status:'"):
        parse_job_status("Job Information\n  Id: 1\n")
    done = status_state("FINISHED_SUCCESS")
    assert (done.done, done.ok) == (True, True)
    for word in ("FAILED", "KILLED_BY_USER", "FAILED_RUN_LIMIT_EXCEEDED", "TASK_LOST"):
        assert (status_state(word).done, status_state(word).ok) == (True, False)
    for word in ("CREATED", "QUEUED", "STARTING", "RUNNING", "PENDING_TERMINATION", "SOMETHING_NEW"):
        assert not status_state(word).done


# ---- against the fake ngc --------------------------------------------------------------------------------------

def bcp_spec(tmp_path: Path, nodes: int = 1, **options: Any) -> JobSpec:
    return JobSpec(name="accept", nodes=nodes, run_id="r1", results_dir=str(tmp_path / "results"), image="img",
                   suite_args=list(SUITE), distributed=False, python=sys.executable,
                   options=bopts(org="acme", **options))


def _job_results(spec: JobSpec, state: Path, job_id: str, hosts: list[str], tmp_path: Path) -> None:
    """Run the submitted command line here once per replica; its output is that replica's joblog.log."""
    argv = build_argv(spec, BcpOptions.from_dict(spec.options))
    env = dict(a.split(":", 1) for a, flag in zip(argv[1:], argv[:-1], strict=True) if flag == "--env-var")
    words = shlex.split(argv[-1])
    for i, host in enumerate(hosts):
        results = tmp_path / "replica" / host
        local = env["GPUACCEPT_RESULTS_DIR"].replace("/results", str(results))
        cmd = [local if w == env["GPUACCEPT_RESULTS_DIR"] else w for w in words]
        proc = run_container(cmd, {**env, "GPUACCEPT_HOSTNAME": host, "GPUACCEPT_RESULTS_DIR": local})
        out = state / "results" / (job_id if i == 0 else f"{job_id}_{i}")
        out.mkdir(parents=True, exist_ok=True)
        (out / "joblog.log").write_text(proc.stdout)


def test_submit_watch_gather_cancel(fake: Path, tmp_path: Path) -> None:
    spec = bcp_spec(tmp_path)
    backend = BcpBackend()
    plan = backend.plan(spec)
    backend.check_ready(plan, spec)
    workdir = Path(launch_dir(spec))
    workdir.mkdir(parents=True)
    sub = backend.submit(plan, spec, workdir)
    assert sub.job_id == "4242000" and (workdir / JOB_ID_FILE).read_text() == "4242000\n"
    assert calls(fake) == [plan.commands[0][1:]]

    (fake / "statuses.json").write_text('["QUEUED", "RUNNING", "FINISHED_SUCCESS"]')
    _job_results(spec, fake, "4242000", ["dgx-0"], tmp_path)
    states = [backend.poll(sub) for _ in range(3)]
    assert [(s.state, s.done, s.ok) for s in states] == [("queued", False, False), ("running", False, False),
                                                         ("finished_success", True, True)]
    assert calls(fake)[1] == ["base-command", "job", "info", "4242000", "--org", "acme"]

    reports = backend.gather(sub, spec)
    assert [r.host for r in reports] == ["dgx-0"] and reports[0].verdict is Verdict.SUCCESS
    run_dir = Path(spec.run_results_dir)
    assert calls(fake)[-1] == ["base-command", "result", "download", "4242000", "--dest", str(run_dir / "bcp"),
                               "--org", "acme"]
    assert (run_dir / "bcp" / "4242000" / "joblog.log").exists()
    assert (run_dir / "bcp-reports" / "dgx-0" / "report.json").exists()

    backend.cancel(sub)
    assert calls(fake)[-1] == ["base-command", "job", "kill", "4242000", "--org", "acme"]
    backend.cancel(sub)  # already ended: recorded, not raised
    assert "exited 1" in sub.handle.problems[-1]


def test_multi_node_gather_downloads_each_replica(fake: Path, tmp_path: Path) -> None:
    spec = bcp_spec(tmp_path, nodes=2, array_type="PYTORCH")
    backend = BcpBackend()
    Path(launch_dir(spec)).mkdir(parents=True)
    sub = backend.submit(backend.plan(spec), spec, Path(launch_dir(spec)))
    _job_results(spec, fake, str(sub.job_id), ["dgx-0", "dgx-1"], tmp_path)
    reports = backend.gather(sub, spec)
    assert sorted(r.host for r in reports) == ["dgx-0", "dgx-1"]
    downloads = [c[3] for c in calls(fake) if c[:3] == ["base-command", "result", "download"]]
    assert downloads == [str(sub.job_id), f"{sub.job_id}:1"]


def test_failures_are_clear(fake: Path, tmp_path: Path) -> None:
    spec = bcp_spec(tmp_path)
    backend = BcpBackend()
    Path(launch_dir(spec)).mkdir(parents=True)
    (fake / "fail_run.txt").write_text("Invalid instance 'dgxa100.80g.8.norm' for ACE")
    with pytest.raises(UsageError, match=r"submitting accept: ngc exited 1: ngc: error: Invalid instance"):
        backend.submit(backend.plan(spec), spec, Path(launch_dir(spec)))
    (fake / "fail_run.txt").unlink()
    bad = bcp_spec(tmp_path, extra_args=["--no-such-flag=1"])
    with pytest.raises(UsageError, match="unrecognized arguments: --no-such-flag"):
        backend.submit(backend.plan(bad), bad, Path(launch_dir(spec)))
    sub = backend.submit(backend.plan(spec), spec, Path(launch_dir(spec)))
    (fake / "fail_info.txt").write_text("Connection refused")
    assert backend.poll(sub).state == "unknown"
    for _ in range(3):
        backend.poll(sub)
    with pytest.raises(UsageError, match="5 reads in a row failed"):
        backend.poll(sub)
    with pytest.raises(InputError, match=r"cannot gather the reports: .*no result"):
        backend.gather(sub, spec)  # nothing to download


def test_resume_needs_the_job_id(fake: Path, tmp_path: Path) -> None:
    spec = bcp_spec(tmp_path)
    with pytest.raises(InputError, match="cannot find the Base Command job again"):
        BcpBackend().resume(spec)
    Path(launch_dir(spec)).mkdir(parents=True)
    BcpBackend().submit(BcpBackend().plan(spec), spec, Path(launch_dir(spec)))
    later = BcpBackend().resume(spec)
    (fake / "statuses.json").write_text('["KILLED_BY_USER"]')
    state = BcpBackend().poll(later)
    assert (later.job_id, state.done, state.ok) == ("4242000", True, False)


# ---- through the CLI -------------------------------------------------------------------------------------------

def test_cli_dry_run_and_missing_cli(tmp_path: Path) -> None:
    proc = gpuaccept("launch", "bcp", "--image", "img", "--instance", "dgxa100.80g.8.norm", "--nodes", "2",
                     "--gpus-per-node", "8", "--run-id", "r1", "--dry-run", "--output", str(tmp_path / "plan"))
    assert proc.returncode == 0, proc.stderr
    assert "ngc base-command job run --name gpuaccept --image img --instance dgxa100.80g.8.norm --replicas 2 " \
           "--array-type MPI" in proc.stdout
    assert (tmp_path / "plan" / "bcp-submit.sh").read_text().startswith("#!/bin/sh\n")
    proc = gpuaccept("launch", "bcp", "--image", "img", "--instance", "i", "--gpus-per-node", "1",
                     "--results-dir", str(tmp_path / "r"),
                     PATH=str(Path(sys.executable).parent) + os.pathsep + "/usr/bin:/bin")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "ngc CLI (ngc) is not on PATH" in proc.stderr
    proc = gpuaccept("launch", "bcp", "--image", "img", "--dry-run")
    assert proc.returncode == 2 and "needs an instance type" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_launch_and_detached_gather_with_the_fake(tmp_path: Path) -> None:
    state = tmp_path / "state"
    install(tmp_path / "bin", state)
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    (state / "statuses.json").write_text('["STARTING", "RUNNING", "FINISHED_SUCCESS"]')
    _job_results(bcp_spec(tmp_path), state, "4242000", ["dgx-0"], tmp_path)
    common = ["--image", "img", "--instance", "dgxa100.80g.8.norm", "--name", "accept", "--org", "acme",
              "--results-dir", str(tmp_path / "results"), "--per-node-only", *SUITE]
    proc = gpuaccept("launch", "bcp", *common, "--run-id", "r-e2e", "--poll-interval", "0.2", PATH=path,
                     timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cluster = json.loads((tmp_path / "results" / "r-e2e" / "cluster-report.json").read_text())
    assert [n["host"] for n in cluster["nodes"]] == ["dgx-0"]
    assert (cluster["verdict"], cluster["job_id"], cluster["backend"]) == ("success", "4242000", "bcp")
    assert calls(state)[0][:4] == ["base-command", "job", "run", "--name"]

    (state / "results" / "4242001").mkdir(parents=True)
    (state / "results" / "4242001" / "joblog.log").write_text(
        (state / "results" / "4242000" / "joblog.log").read_text())
    proc = gpuaccept("launch", "bcp", *common, "--run-id", "r-det", "--detach", PATH=path)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "results" / "r-det"
    assert (run_dir / "launch" / JOB_ID_FILE).read_text() == "4242001\n"
    gather = gpuaccept("gather", str(run_dir), PATH=path)
    assert gather.returncode == 0, gather.stdout + gather.stderr
    assert calls(state)[-1][:4] == ["base-command", "result", "download", "4242001"]
    assert json.loads((run_dir / "cluster-report.json").read_text())["verdict"] == "success"
