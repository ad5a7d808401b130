"""The runai backend: argv built from the spec (golden), and a recorded fake ``runai`` CLI on PATH.

The fake (``tests/fake_runai.py``) rejects flags that are not in the Run:ai
CLI reference for the workload kind and records every argv. The pod logs it
serves come from running the submitted container command on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import ConfigError, InputError, UsageError
from gpuaccept.launch.pod_script import NODE_SCRIPT
from gpuaccept.launch.runai.backend import RunaiBackend
from gpuaccept.launch.runai.parse import parse_describe
from gpuaccept.launch.runai.plan import MPI_LAUNCHER_VAR, RunaiOptions, build_argv, k8s_literal, runai_toleration
from gpuaccept.launch.spec import JobSpec, Mount, sanitize_name
from gpuaccept.model import Verdict
from tests.fake_runai import SUBMIT_FLAGS, calls, install, k8s_expand
from tests.helpers import gpuaccept
from tests.k8s_support import check_golden, command_spec, need_binary, suite_spec
from tests.test_k8s_scripts import run_container

SUITE = ["--device", "cpu", "--profile", "quick", "--checks", "env"]


def ropts(**values: Any) -> dict[str, Any]:
    return RunaiOptions.from_dict(values).to_dict()


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "runai-state"
    install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return state


def flags_of(argv: list[str]) -> list[str]:
    head = argv[: argv.index("--")] if "--" in argv else argv
    return [a for a in head if a.startswith("-")]


# ---- the argv --------------------------------------------------------------------------------------------------

def run_script(plan: Any, tmp_path: Path, state: Path) -> list[str]:
    """Run the plan's runai-submit.sh with sh and the fake runai on PATH; the argv the fake received."""
    path = tmp_path / "runai-submit.sh"
    path.write_text(plan.files["runai-submit.sh"])
    proc = subprocess.run(["sh", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return calls(state)[-1]


@pytest.mark.parametrize("kind", ["pytorch", "mpi"])
def test_plans_match_golden(kind: str, fake: Path, tmp_path: Path) -> None:
    full = ropts(kind=kind, project="gpu-team", node_pools=["h100", "h100-spot"],
                 tolerations=[runai_toleration("nvidia.com/gpu:NoSchedule")], image_pull_policy="IfNotPresent")
    plan = RunaiBackend().plan(suite_spec(full))
    check_golden(f"runai/{kind}.sh", plan.files["runai-submit.sh"])
    assert run_script(plan, tmp_path, fake) == plan.commands[0][1:]
    plan = RunaiBackend().plan(command_spec(ropts(kind=kind)))
    check_golden(f"runai/{kind}-command.sh", plan.files["runai-submit.sh"])
    assert run_script(plan, tmp_path, fake) == plan.commands[0][1:]


def test_pytorch_argv() -> None:
    spec = suite_spec(ropts(project="gpu-team", node_pools=["a", "b"]), nodes=4)
    argv = build_argv(spec, RunaiOptions.from_dict(spec.options))
    assert argv[:5] == ["runai", "training", "pytorch", "submit", "accept-h100"]
    text = " ".join(argv[: argv.index("--command")])
    for part in ("--project gpu-team", "--image nvcr.io/nvidia/pytorch:25.01-py3", "--workers 4 --no-master",
                 "--gpu-devices-request 8", "--large-shm", "--node-pools a --node-pools b", "-e NCCL_DEBUG=INFO",
                 "--host-path path=/data,mount=/data", "--existing-pvc claimname=datasets,path=/datasets",
                 "-e GPUACCEPT_RESULTS_DIR=/tmp/gpuaccept-results/20260101T000000Z-accept-h100-ab12"):
        assert part in text, part
    assert "readwrite" not in text  # /data is mounted read-only
    i = argv.index("--command")
    assert argv[i + 1: i + 5] == ["--", "sh", "-c", NODE_SCRIPT]
    assert argv[i + 5:] == ["gpuaccept", "python3", "-m", "gpuaccept", "run", "--profile", "quick", "--no-history",
                            "--report-dir", "/tmp/gpuaccept-results/20260101T000000Z-accept-h100-ab12"]
    assert set(flags_of(argv)) <= SUBMIT_FLAGS["pytorch"]


def test_pytorch_distributed_command_runs_under_torchrun() -> None:
    argv = build_argv(command_spec(ropts()), RunaiOptions())
    tail = argv[argv.index("--command") + 5:]
    assert tail[:6] == ["gpuaccept", "python3", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=8"]
    assert tail[-4:] == ["python", "train.py", "--lr", "3e-4"]
    assert "--no-large-shm" not in argv and "--large-shm" in argv
    assert "--large-shm" not in build_argv(command_spec(ropts(large_shm=False)), RunaiOptions(large_shm=False))


def test_mpi_argv_launcher_uses_the_hostfile() -> None:
    spec = command_spec(ropts(kind="mpi"), nodes=3)
    argv = build_argv(spec, RunaiOptions.from_dict(spec.options))
    assert argv[2:4] == ["mpi", "submit"]
    text = " ".join(argv)
    assert "--workers 3" in text and "--slots-per-worker 8" in text and "--no-master" not in text
    assert argv[argv.index("--master-command") + 1] == "sh -c $(GPUACCEPT_MPI_LAUNCHER)"
    env = dict(argv[i + 1].partition("=")[::2] for i, a in enumerate(argv) if a == "--master-environment")
    script = k8s_expand(env["GPUACCEPT_MPI_LAUNCHER"], {})
    assert script.startswith("set -- python train.py --lr 3e-4\n")
    assert "hostfile=/etc/mpi/hostfile" in script and "np=24" in script
    assert 'mpirun --hostfile "$hostfile" -np 24 --map-by ppr:8:node -x NCCL_IB_HCA -x TERM' in script
    assert argv[-4:] == ["--command", "--", "/usr/sbin/sshd", "-De"]
    assert "OMPI_ALLOW_RUN_AS_ROOT=1" in argv and "TERM=dumb" in argv
    assert set(flags_of(argv)) <= SUBMIT_FLAGS["mpi"]



def test_mpi_launcher_survives_kubernetes_expansion_and_runs(fake: Path, tmp_path: Path) -> None:
    """The launcher's script travels in an env variable that --master-command names with $(VAR): what the
    container runs after Kubernetes' expansion is the script itself, whatever it holds ($$, $(...), quotes)."""
    hostile = {"Q": "it's \"quoted\" $$ $(date) $(Q) \\ ,="}
    spec = command_spec(ropts(kind="mpi"), nodes=2, env=hostile)
    argv = build_argv(spec, RunaiOptions.from_dict(spec.options))
    assert run_script(RunaiBackend().plan(spec), tmp_path, fake) == argv[1:]
    master = json.loads((fake / "workloads.json").read_text())[spec.name]["master_command"]
    assert master[:2] == ["sh", "-c"] and len(master) == 3
    assert master[2].startswith("set -- python train.py --lr 3e-4\n# gpuaccept MPIJob launcher")
    assert "-x Q " in master[2]
    # run what the launcher container would run: no hostfile here, so the placement check stops it (97)
    r = subprocess.run(master, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 97 and "/etc/mpi/hostfile is missing" in r.stderr, r.stderr
    assert k8s_expand(k8s_literal(hostile["Q"]), {"Q": "x", "date": "y"}) == hostile["Q"]
    with pytest.raises(ConfigError, match="reserved"):
        build_argv(command_spec(ropts(kind="mpi"), env={MPI_LAUNCHER_VAR: "x"}), RunaiOptions(kind="mpi"))
    for command, words in (("sh -c 'echo hi'", "need quoting"), ("sh -c $(NOPE)", "no --master-environment")):
        r = subprocess.run(["runai", "training", "mpi", "submit", "w", "--image", "i", "--master-command", command],
                           capture_output=True, text=True, check=False)
        assert r.returncode == 1 and words in r.stderr, r.stderr

def test_generated_submit_script_passes_shellcheck(tmp_path: Path) -> None:
    shellcheck = need_binary("shellcheck")
    for kind in ("pytorch", "mpi"):
        plan = RunaiBackend().plan(command_spec(ropts(kind=kind), env={"Q": "it's \"x\"\ny"}))
        path = tmp_path / f"{kind}.sh"
        path.write_text(plan.files["runai-submit.sh"])
        proc = subprocess.run([shellcheck, str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


# ---- hostile inputs --------------------------------------------------------------------------------------------

def test_env_values_and_names_pass_verbatim(fake: Path, tmp_path: Path) -> None:
    spec = command_spec(ropts(), name=sanitize_name("My_Run v2"), env={"Q": "it's \"quoted\"\nnext = line, too"})
    argv = build_argv(spec, RunaiOptions())
    assert argv[4] == "my-run-v2"
    assert argv[argv.index("-e") + 1] == "Q=it's \"quoted\"\nnext = line, too"
    assert run_script(RunaiBackend().plan(spec), tmp_path, fake) == argv[1:]


def test_paths_with_spaces_work_and_commas_are_rejected() -> None:
    argv = build_argv(command_spec(ropts(), mounts=[Mount("/mnt/my data", "/data dir")]), RunaiOptions())
    assert "path=/mnt/my data,mount=/data dir,readwrite" in argv
    with pytest.raises(ConfigError, match="comma-separated"):
        build_argv(command_spec(ropts(), mounts=[Mount("/mnt/a,b", "/data")]), RunaiOptions())
    with pytest.raises(ConfigError, match="drop :ro"):
        build_argv(command_spec(ropts(), mounts=[Mount("claim", "/data", True)]), RunaiOptions())
    with pytest.raises(ConfigError, match="DNS subdomain"):
        build_argv(command_spec(ropts(), mounts=[Mount("My_Claim", "/data")]), RunaiOptions())


@pytest.mark.parametrize("values, message", [
    ({"kind": "tensorflow"}, "must be one of"),
    ({"project": "Team_A"}, "DNS label"),
    ({"node_pools": ["Pool A"]}, "DNS subdomain"),
    ({"image_pull_policy": "Sometimes"}, "Always, IfNotPresent or Never"),
    ({"pod_results_dir": "results"}, "absolute path"),
    ({"bogus": 1}, "unknown runai option"),
    ({"node_pools": 3}, "node_pools.*expected a list, got int"),
])
def test_bad_options(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunaiOptions.from_dict(values)


def test_missing_image_and_flags() -> None:
    with pytest.raises(ConfigError, match="needs a container image"):
        build_argv(command_spec(ropts(), image=None), RunaiOptions())
    parser = argparse.ArgumentParser()
    RunaiBackend.add_arguments(parser)
    o = RunaiBackend.options_from_args(parser.parse_args(
        ["--kind", "mpi", "--project", "team", "--node-pool", "a", "--no-large-shm", "--toleration",
         "gpu=yes:NoSchedule", "--runai-arg=--preemptible"]))
    assert o["tolerations"] == ["operator=Equal,key=gpu,value=yes,effect=NoSchedule"]
    assert o["large_shm"] is False and o["extra_args"] == ["--preemptible"] and o["node_pools"] == ["a"]


def test_describe_parser() -> None:
    assert parse_describe('{"phase": "Running"}') == ("Running", [])
    assert parse_describe('{"general": {"status": "Completed"}, "pods": [{"name": "b"}, {"name": "a"}]}') == (
        "Completed", ["a", "b"])
    for bad in ("not json", "[1]", '{"pods": []}'):
        with pytest.raises(InputError, match="runai describe"):
            parse_describe(bad)


# ---- against the fake runai ------------------------------------------------------------------------------------

def _pod_logs(spec: JobSpec, state: Path, pods: list[str], tmp_path: Path) -> None:
    """Run the submitted container command once per pod here; its output is that pod's log."""
    argv = build_argv(spec, RunaiOptions.from_dict(spec.options))
    command = argv[argv.index("--command") + 2:]
    env = dict(a.split("=", 1) for a, flag in zip(argv[1:], argv[:-1], strict=True) if flag == "-e")
    (state / "logs").mkdir(parents=True, exist_ok=True)
    for pod in pods:
        results = tmp_path / pod
        pod_env = {**env, "GPUACCEPT_HOSTNAME": pod,
                   "GPUACCEPT_RESULTS_DIR": env["GPUACCEPT_RESULTS_DIR"].replace("/tmp/gpuaccept-results",
                                                                                 str(results))}
        cmd = [pod_env["GPUACCEPT_RESULTS_DIR"] if a == env["GPUACCEPT_RESULTS_DIR"] else a for a in command]
        proc = run_container(cmd, pod_env)
        (state / "logs" / f"{pod}.log").write_text(proc.stdout)


def runai_spec(tmp_path: Path, **options: Any) -> JobSpec:
    return JobSpec(name="accept", nodes=2, run_id="r1", results_dir=str(tmp_path / "results"), image="img",
                   gpus_per_node=0, suite_args=list(SUITE), distributed=False, python=sys.executable,
                   options=ropts(project="team", **options))


def test_submit_watch_gather_cancel(fake: Path, tmp_path: Path) -> None:
    spec = runai_spec(tmp_path)
    backend = RunaiBackend()
    plan = backend.plan(spec)
    backend.check_ready(plan, spec)
    sub = backend.submit(plan, spec, tmp_path)
    assert sub.job_id == "team/accept"
    assert calls(fake) == [plan.commands[0][1:]]

    pods = ["accept-worker-0", "accept-worker-1"]
    (fake / "phases.json").write_text(json.dumps(["Pending", "Running", "Completed"]))
    (fake / "pods.json").write_text(json.dumps(pods))
    _pod_logs(spec, fake, pods, tmp_path)
    states = [backend.poll(sub) for _ in range(3)]
    assert [(s.state, s.done, s.ok) for s in states] == [("pending", False, False), ("running", False, False),
                                                         ("completed", True, True)]
    assert calls(fake)[1] == ["training", "pytorch", "describe", "accept", "--project", "team", "--output", "json"]

    reports = backend.gather(sub, spec)
    assert sorted(r.host for r in reports) == pods and all(r.verdict is Verdict.SUCCESS for r in reports)
    log_calls = [c for c in calls(fake) if c[2] == "logs"]
    assert log_calls == [["training", "pytorch", "logs", "accept", "--project", "team", "--pod", p] for p in pods]
    assert (Path(spec.run_results_dir) / "logs" / "accept-worker-1.log").exists()

    backend.cancel(sub)
    assert calls(fake)[-1] == ["training", "pytorch", "delete", "accept", "--project", "team"]
    backend.cancel(sub)  # already gone: recorded, not raised
    assert sub.handle.problems and "exited 1" in sub.handle.problems[-1]


def test_resume_after_detach(fake: Path, tmp_path: Path) -> None:
    spec = runai_spec(tmp_path)
    RunaiBackend().submit(RunaiBackend().plan(spec), spec, tmp_path)
    later = RunaiBackend().resume(spec)
    assert later.job_id == "team/accept"
    (fake / "phases.json").write_text(json.dumps(["Failed"]))
    state = RunaiBackend().poll(later)
    assert (state.state, state.done, state.ok) == ("failed", True, False)
    RunaiBackend().cancel(later)
    assert calls(fake)[-1] == ["training", "pytorch", "delete", "accept", "--project", "team"]


def test_mpi_gather_reads_the_launcher_log(fake: Path, tmp_path: Path) -> None:
    spec = runai_spec(tmp_path, kind="mpi")
    backend = RunaiBackend()
    sub = backend.submit(backend.plan(spec), spec, tmp_path)
    (fake / "pods.json").write_text(json.dumps(["accept-launcher", "accept-worker-0", "accept-worker-1"]))
    (fake / "phases.json").write_text(json.dumps(["Completed"]))
    pspec = runai_spec(tmp_path)  # same suite; its container command makes two real reports
    _pod_logs(pspec, fake, ["w0", "w1"], tmp_path)
    (fake / "logs" / "default.log").write_text((fake / "logs" / "w0.log").read_text()
                                               + (fake / "logs" / "w1.log").read_text())
    reports = backend.gather(sub, spec)
    assert sorted(r.host for r in reports) == ["w0", "w1"]
    assert [c for c in calls(fake) if c[2] == "logs"] == [["training", "mpi", "logs", "accept", "--project", "team"]]


def test_a_failing_describe_does_not_end_the_watch(fake: Path, tmp_path: Path) -> None:
    spec = runai_spec(tmp_path)
    backend = RunaiBackend()
    sub = backend.submit(backend.plan(spec), spec, tmp_path)
    (fake / "fail_describe.txt").write_text("rpc error: code = Unavailable")
    state = backend.poll(sub)
    assert (state.state, state.done) == ("unknown", False) and "code = Unavailable" in state.detail
    for _ in range(3):
        backend.poll(sub)
    with pytest.raises(UsageError, match="5 reads in a row failed"):
        backend.poll(sub)
    with pytest.raises(InputError, match="cannot gather the reports"):
        backend.gather(sub, spec)


def test_submit_errors_are_one_clear_line(fake: Path, tmp_path: Path) -> None:
    spec = runai_spec(tmp_path)
    (fake / "fail_submit.txt").write_text("project 'team' was not found")
    with pytest.raises(UsageError, match=r"submitting accept: runai exited 1: Error: project 'team' was not found"):
        RunaiBackend().submit(RunaiBackend().plan(spec), spec, tmp_path)
    spec = runai_spec(tmp_path, extra_args=["--no-such-flag"])
    (fake / "fail_submit.txt").unlink()
    with pytest.raises(UsageError, match="unknown flag: --no-such-flag"):
        RunaiBackend().submit(RunaiBackend().plan(spec), spec, tmp_path)


def test_missing_runai_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    spec = runai_spec(tmp_path)
    with pytest.raises(UsageError, match=r"runai CLI \(runai\) is not on PATH"):
        RunaiBackend().check_ready(RunaiBackend().plan(spec), spec)


# ---- through the CLI -------------------------------------------------------------------------------------------

def test_cli_dry_run_and_missing_cli(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    proc = gpuaccept("launch", "runai", "--image", "img", "--nodes", "2", "--gpus-per-node", "8", "--project",
                     "team", "--run-id", "r1", "--dry-run", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "runai training pytorch submit gpuaccept --project team --image img --workers 2 --no-master" in proc.stdout
    assert (out / "runai-submit.sh").read_text().startswith("#!/bin/sh\n")
    proc = gpuaccept("launch", "runai", "--image", "img", "--gpus-per-node", "8", "--results-dir", str(tmp_path / "r"),
                     PATH=str(Path(sys.executable).parent) + os.pathsep + "/usr/bin:/bin")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "runai CLI (runai) is not on PATH" in proc.stderr
    proc = gpuaccept("launch", "runai", "--nodes", "2", "--dry-run")
    assert proc.returncode == 2 and "needs a container image" in proc.stderr


def test_cli_launch_runai_with_the_fake(tmp_path: Path) -> None:
    state = tmp_path / "state"
    install(tmp_path / "bin", state)
    spec = runai_spec(tmp_path)
    (state / "phases.json").write_text(json.dumps(["Pending", "Running", "Completed"]))
    (state / "pods.json").write_text(json.dumps(["accept-worker-0", "accept-worker-1"]))
    _pod_logs(spec, state, ["accept-worker-0", "accept-worker-1"], tmp_path)
    proc = gpuaccept("launch", "runai", "--image", "img", "--nodes", "2", "--name", "accept", "--project", "team",
                     "--run-id", "r-e2e", "--results-dir", str(tmp_path / "results"), "--poll-interval", "0.2",
                     "--per-node-only", *SUITE, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cluster = json.loads((tmp_path / "results" / "r-e2e" / "cluster-report.json").read_text())
    assert sorted(n["host"] for n in cluster["nodes"]) == ["accept-worker-0", "accept-worker-1"]
    assert cluster["verdict"] == "success" and cluster["job_id"] == "team/accept"
    submitted = calls(state)[0]
    assert submitted[:4] == ["training", "pytorch", "submit", "accept"]
    job = submitted[submitted.index("--command") + 5:]
    assert job[:5] == ["gpuaccept", "python3", "-m", "gpuaccept", "run"]
    assert job[-3:] == ["--no-history", "--report-dir", "/tmp/gpuaccept-results/r-e2e"]
    assert {(job[i], job[i + 1]) for i in range(5, len(job) - 3, 2)} == {(SUITE[i], SUITE[i + 1]) for i in (0, 2, 4)}


def test_cli_detach_then_gather_reads_the_pod_logs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    install(tmp_path / "bin", state)
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    pods = ["accept-worker-0", "accept-worker-1"]
    (state / "phases.json").write_text(json.dumps(["Completed"]))
    (state / "pods.json").write_text(json.dumps(pods))
    _pod_logs(runai_spec(tmp_path), state, pods, tmp_path)
    results = tmp_path / "results"
    launch = gpuaccept("launch", "runai", "--image", "img", "--nodes", "2", "--name", "accept", "--project", "team",
                       "--run-id", "r-det", "--results-dir", str(results), "--detach", *SUITE, PATH=path)
    assert launch.returncode == 0, launch.stdout + launch.stderr
    assert [c[2] for c in calls(state)] == ["submit"]
    run_dir = results / "r-det"
    assert not (run_dir / "cluster-report.json").exists()

    gather = gpuaccept("gather", str(run_dir), PATH=path)
    assert gather.returncode == 0, gather.stdout + gather.stderr
    cluster = json.loads((run_dir / "cluster-report.json").read_text())
    assert {n["host"]: (n["state"], n["verdict"]) for n in cluster["nodes"]} == {
        p: ("reported", "success") for p in pods}
    assert (cluster["backend"], cluster["job_id"], cluster["verdict"]) == ("runai", "team/accept", "success")
    assert calls(state)[1:] == [["training", "pytorch", "describe", "accept", "--project", "team", "--output", "json"],
                                *(["training", "pytorch", "logs", "accept", "--project", "team", "--pod", p]
                                  for p in pods)]
    assert json.loads((run_dir / "runai" / "accept-worker-1" / "report.json").read_text())["host"] == pods[1]

    # --runai-bin overrides job.json; a CLI that is not there: warned, and the copies gathered above are used
    asked = len(calls(state))
    again = gpuaccept("gather", str(run_dir), "--runai-bin", str(tmp_path / "no-runai"), PATH=path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(calls(state)) == asked
    assert again.stderr.splitlines()[0] == (
        f"[LAUNCH] warning: cannot fetch the reports from the runai job: cannot gather the reports: the runai CLI "
        f"({tmp_path / 'no-runai'}) is not on PATH; using the 2 report(s) already under {run_dir}")
    assert sorted(n["host"] for n in json.loads((run_dir / "cluster-report.json").read_text())["nodes"]) == pods


def test_cli_gather_warns_about_a_pod_without_a_log(tmp_path: Path) -> None:
    state = tmp_path / "state"
    install(tmp_path / "bin", state)
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    (state / "phases.json").write_text(json.dumps(["Failed"]))
    (state / "pods.json").write_text(json.dumps(["accept-worker-0", "accept-worker-1"]))
    _pod_logs(runai_spec(tmp_path), state, ["accept-worker-0"], tmp_path)
    launch = gpuaccept("launch", "runai", "--image", "img", "--nodes", "2", "--name", "accept", "--project", "team",
                       "--run-id", "r-det", "--results-dir", str(tmp_path / "results"), "--detach", *SUITE, PATH=path)
    assert launch.returncode == 0, launch.stderr
    gather = gpuaccept("gather", str(tmp_path / "results" / "r-det"), "--project", "team", PATH=path)
    assert gather.returncode == 1
    assert ("[LAUNCH] warning: accept-worker-1: no log (runai exited 1: Error: pod accept-worker-1 not found)"
            in gather.stderr.splitlines())
    cluster = json.loads((tmp_path / "results" / "r-det" / "cluster-report.json").read_text())
    assert [(n["host"], n["state"]) for n in cluster["nodes"]] == [("accept-worker-0", "reported"),
                                                                   ("missing-1", "missing")]
