"""``gpuaccept launch`` through the local backend (real processes), the shared launch CLI, spec files and gather."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch_support import check_golden, cluster_report, gpuaccept, launch_env, one_error_line


def _local(tmp_path: Path, *args: str, run_id: str = "run") -> subprocess.CompletedProcess[str]:
    return gpuaccept("launch", "local", "--results-dir", str(tmp_path), "--run-id", run_id, "--poll-interval", "0.2",
                     *args)


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(proc.name))
    return pids


def test_two_local_nodes_test_the_fabric_by_default_and_report_one_cross_node_result(tmp_path: Path) -> None:
    r = _local(tmp_path, "--nodes", "2", "--device", "cpu", "--profile", "quick", "--checks", "steady,collectives")
    assert r.returncode == 0, r.stdout + r.stderr
    report = cluster_report(tmp_path / "run")
    assert report["verdict"] == "success"
    for node in report["nodes"]:  # per node: the node check once, and this node's rank of the collectives
        assert sorted((c["name"], c["status"], c["host"]) for c in node["report"]["checks"]) == [
            ("collectives", "pass", node["host"]), ("steady", "pass", node["host"])]
    fabric = report["analysis"]["cross_node"]
    assert (fabric["verdict"], fabric["ranks"], fabric["hosts"]) == ("success", 2, ["local-0", "local-1"])
    assert fabric["checks"] == {"collectives": {"status": "pass", "ranks": 2, "failed_ranks": [], "reason": ""}}
    assert "[FABRIC] cross-node: SUCCESS - collectives pass over 2 rank(s) on 2 node(s)" in r.stdout.splitlines()
    job = json.loads((tmp_path / "run" / "launch" / "job.json").read_text())
    assert job["spec"]["distributed"] is True and job["spec"]["suite_args"][-1] == "--distributed"


def test_two_local_nodes_run_the_suite_and_merge_into_a_cluster_report(tmp_path: Path) -> None:
    r = _local(tmp_path, "--nodes", "2", "--device", "cpu", "--checks", "steady", "--per-node-only")
    assert r.returncode == 0, r.stdout + r.stderr
    report = cluster_report(tmp_path / "run")
    assert report["verdict"] == "success" and report["backend"] == "local"
    assert [(n["host"], n["node_rank"], n["verdict"]) for n in report["nodes"]] == [
        ("local-0", 0, "success"), ("local-1", 1, "success")]
    for node in report["nodes"]:
        metric = node["report"]["checks"][0]["metrics"][0]
        assert (metric["name"], metric["value"], metric["unit"]) == ("steady_value", 10.0, "GB/s")
    assert r.stdout.splitlines()[-2] == "[RESULT] SUCCESS (CPU only on 2 of 2 node(s): local-0, local-1)"
    pages = sorted((tmp_path / "run").glob("*/report.html"))  # each node's page beside its report.json
    assert [p.parent for p in pages] == sorted(p.parent for p in (tmp_path / "run").glob("*/report.json"))
    assert len(pages) == 2 and all(p.read_text().startswith("<!DOCTYPE html>") for p in pages)
    job = json.loads((tmp_path / "run" / "launch" / "job.json").read_text())
    assert job["expected_hosts"] == ["local-0", "local-1"]
    assert job["spec"]["suite_args"] == ["--checks", "steady", "--device", "cpu"]
    assert "cross_node" not in report["analysis"] and "[FABRIC]" not in r.stdout


def test_a_node_that_fails_makes_the_cluster_fail_and_is_named(tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text("checks:\n  failon:\n    params: {host: local-1}\n")
    r = _local(tmp_path, "--nodes", "3", "--device", "cpu", "--checks", "steady,failon", "--config", str(config),
               "--per-node-only")
    assert r.returncode == 1, r.stdout + r.stderr
    report = cluster_report(tmp_path / "run")
    assert [n["verdict"] for n in report["nodes"]] == ["success", "failure", "success"]
    assert report["nodes"][1]["report"]["checks"][1]["reason"] == "forced failure on local-1"
    assert "[RESULT] FAILURE: local-1" in r.stdout
    assert r.stdout.splitlines()[-2] == "[RESULT] FAILURE: local-1"  # then the cluster report's path
    assert report["analysis"]["job"]["detail"] == "local-1 exit 1"


def test_a_command_runs_under_torchrun_with_one_agent_per_node(tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    code = ("import os, pathlib; e = os.environ; pathlib.Path(" + repr(str(out)) + ", e['RANK']).write_text("
            "' '.join([e['WORLD_SIZE'], e['GROUP_RANK'], e['GPUACCEPT_HOSTNAME'], os.getcwd()]))")
    r = gpuaccept("launch", "local", "--results-dir", str(tmp_path), "--run-id", "run", "--poll-interval", "0.2",
                  "--nodes", "2", "--procs-per-node", "1", "--", sys.executable, "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = {p.name: p.read_text().split(" ") for p in out.iterdir()}
    assert ranks == {"0": ["2", "0", "local-0", str(tmp_path)], "1": ["2", "1", "local-1", str(tmp_path)]}
    assert "[RESULT] SUCCESS" in r.stdout


def test_a_failing_command_exits_1_and_shows_its_output(tmp_path: Path) -> None:
    r = _local(tmp_path, "--nodes", "2", "--no-torchrun", "--", "sh", "-c",
               'echo "about to fail on $GPUACCEPT_HOSTNAME"; [ "$NODE_RANK" = 0 ]')
    assert r.returncode == 1
    assert "[local-1] about to fail on local-1" in r.stderr
    assert "[RESULT] FAILURE: the local job ended FAILED (local-1 exit 1)" in r.stdout


def _nap_config(tmp_path: Path) -> Path:
    config = tmp_path / "nap.yaml"
    config.write_text("checks:\n  nap:\n    params: {seconds: 120}\n")
    return config


def test_timeout_stops_every_node_and_keeps_what_was_measured(tmp_path: Path) -> None:
    # 10 s: the first check waits for the node's warm process to import torch (seconds on a loaded 2-core machine)
    r = _local(tmp_path, "--nodes", "2", "--device", "cpu", "--checks", "steady,nap", "--config",
               str(_nap_config(tmp_path)), "--timeout", "10", "--per-node-only")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "timed out after" in r.stdout
    report = cluster_report(tmp_path / "run")
    assert report["analysis"]["job"]["timed_out"] is True
    for node in report["nodes"]:
        assert node["verdict"] == "interrupted" and [c["name"] for c in node["report"]["checks"]] == ["steady"]
    assert _processes_mentioning(str(tmp_path)) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_cancels_the_nodes_and_exits_130(tmp_path: Path, signum: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuaccept", "launch", "local", "--results-dir", str(tmp_path), "--run-id", "run",
         "--poll-interval", "0.2", "--nodes", "2", "--device", "cpu", "--checks", "steady,nap", "--config",
         str(_nap_config(tmp_path)), "--per-node-only"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=launch_env())
    deadline = time.monotonic() + 180
    while True:  # the event: both nodes finished "steady" (and are in the long "nap")
        results = list((tmp_path / "run").glob("*/results.jsonl"))
        if len(results) == 2 and all(p.read_text().strip() for p in results):
            break
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the nodes did not finish steady within 180 s"
        time.sleep(0.2)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "interrupted: cancelling local job" in out
    report = cluster_report(tmp_path / "run")
    assert [n["verdict"] for n in report["nodes"]] == ["interrupted", "interrupted"]
    assert _processes_mentioning(str(tmp_path)) == []


def test_detached_local_run_can_be_gathered_later(tmp_path: Path) -> None:
    r = _local(tmp_path, "--nodes", "2", "--device", "cpu", "--checks", "steady", "--detach", "--per-node-only")
    assert r.returncode == 0 and "gpuaccept gather" in r.stdout
    deadline = time.monotonic() + 60
    while len(list((tmp_path / "run").glob("*/report.json"))) < 2 or any(
            json.loads(p.read_text())["verdict"] == "running" for p in (tmp_path / "run").glob("*/report.json")):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    g = gpuaccept("gather", str(tmp_path / "run"))
    assert g.returncode == 0, g.stdout + g.stderr
    assert [n["host"] for n in cluster_report(tmp_path / "run")["nodes"]] == ["local-0", "local-1"]


# ------------------------------------------------------------------ plans and the CLI

def test_dry_run_is_deterministic_and_matches_the_golden_plan(tmp_path: Path) -> None:
    args = ["launch", "local", "--nodes", "2", "--device", "cpu", "--profile", "quick", "--checks", "env,compute",
            "--python", "python3", "--results-dir", "/shared/gpuaccept", "--run-id", "golden", "--env", "A=x y",
            "--show-env", "--dry-run"]
    r1, r2 = gpuaccept(*args), gpuaccept(*args)
    assert r1.returncode == 0, r1.stderr
    assert r1.stdout == r2.stdout
    check_golden("local/suite-2-nodes.txt", r1.stdout)
    r = gpuaccept("launch", "local", "--nodes", "2", "--python", "python3", "--results-dir", "/shared/gpuaccept",
                  "--run-id", "golden", "--workdir", "/work", "--dry-run", "--", "python", "train.py", "--epochs", "1")
    assert r.returncode == 0, r.stderr
    check_golden("local/torchrun-command.txt", r.stdout)


def test_launch_side_never_imports_torch_or_unused_backends(tmp_path: Path) -> None:
    code = (
        "import sys, contextlib, io\n"
        "from gpuaccept.cli import build_parser, main\n"
        "build_parser()\n"
        "assert not [m for m in sys.modules if m.startswith('gpuaccept.launch.') and m not in "
        "('gpuaccept.launch.cli', 'gpuaccept.launch.collect', 'gpuaccept.launch.registry', 'gpuaccept.launch.base', "
        "'gpuaccept.launch.spec', 'gpuaccept.isolate.cli', 'gpuaccept.health.nodestatus_cli')], "
        "sorted(sys.modules)\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['launch', 'slurm', '--nodes', '2', '--device', 'cpu', '--results-dir', {str(tmp_path)!r}, "
        "'--dry-run'])\n"
        "assert rc == 0, rc\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=launch_env(), check=False)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--nodes", "2", "--profile", "quick", "--", "hostname"], "--profile is a suite option"),
    (["--distributed", "--", "hostname"], "--distributed is for the suite"),
    (["--no-torchrun"], "--no-torchrun applies to a command"),
    (["--per-node-only", "--", "hostname"], "--per-node-only is for the suite"),
    (["--distributed", "--per-node-only"], "contradict each other"),
    (["--run-id", "../escape"], "--run-id '../escape'"),
    (["--name", "___"], "a job name needs letters or digits"),
    (["--image", "ubuntu"], "runs no containers"),
    (["--timeout", "0"], "argument --timeout: '0' must be more than 0 seconds"),
    (["--timeout", "5x"], "argument --timeout: '5x' is not a duration such as 90s"),
    (["--mount", "relative"], "--mount: relative: a mount is SOURCE:TARGET"),
])
def test_bad_launch_input_exits_2_with_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    base = ["launch", "local"]
    if "--results-dir" not in args:
        base += ["--results-dir", str(tmp_path / "res")]
    r = gpuaccept(*base, *args)
    assert words in one_error_line(r)
    assert not (tmp_path / "res").exists()


def test_unknown_backend_and_missing_backend_exit_2() -> None:
    assert "invalid choice: 'nosuch'" in one_error_line(gpuaccept("launch", "nosuch"))
    assert "launch needs a backend" in one_error_line(gpuaccept("launch"))


# ------------------------------------------------------------------ spec files

SPEC = """\
name: Nightly_Acceptance
nodes: 2
env: {NCCL_DEBUG: INFO, FLAG: true}
suite:
  profile: quick
  checks: [steady]
  device: cpu
local:
  master-port: 29999
slurm: {partition: gpu}      # another backend's section: allowed, not used here
"""


def test_spec_file_sets_the_job_and_flags_override_it(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    r = gpuaccept("launch", "local", "--spec", str(spec), "--python", "python3", "--results-dir", "/r",
                  "--run-id", "s", "--dry-run", "--show-env")
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("env ")]
    assert len(lines) == 2
    assert lines[0] == ("env GPUACCEPT_HOSTNAME=local-0 NODE_RANK=0 NCCL_DEBUG=INFO FLAG=true python3 -m "
                        "torch.distributed.run --nnodes=2 --nproc-per-node=1 --node-rank=0 --master-addr=127.0.0.1 "
                        "--master-port=29999 --no-python python3 -m gpuaccept run --profile quick --checks steady "
                        "--device cpu --distributed --no-history --report-dir /r/s")
    spec.write_text(SPEC + "per_node_only: true\n")
    r = gpuaccept("launch", "local", "--spec", str(spec), "--python", "python3", "--results-dir", "/r",
                  "--run-id", "s", "--dry-run", "--show-env")
    lines = [x for x in r.stdout.splitlines() if x.startswith("env ")]
    assert lines[0] == ("env GPUACCEPT_HOSTNAME=local-0 NODE_RANK=0 NCCL_DEBUG=INFO FLAG=true python3 -m gpuaccept "
                        "run --profile quick --checks steady --device cpu --no-history --report-dir /r/s")
    r = gpuaccept("launch", "local", "--spec", str(spec), "--nodes", "1", "--checks", "steady,failon",
                  "--env", "NCCL_DEBUG=WARN", "--results-dir", "/r", "--run-id", "s", "--dry-run")
    lines = [x for x in r.stdout.splitlines() if x.startswith("env ")]
    assert len(lines) == 1 and "--checks steady,failon" in lines[0] and "NCCL_DEBUG=WARN" in lines[0]


def test_spec_file_runs_for_real(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    r = _local(tmp_path, "--spec", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(cluster_report(tmp_path / "run")["nodes"]) == 2


@pytest.mark.parametrize(("text", "words"), [
    ("nodes: two\n", "nodes: 'two' is not an integer"),
    ("nodez: 2\n", "nodez: unknown key"),
    ("suite: {profile: fast}\n", "suite.profile: 'fast' is not one of quick, standard, full"),
    ("suite: {check: [env]}\n", "suite.check: unknown suite option"),
    ("local: {partition: gpu}\n", "local.partition: unknown local option"),
    ("backend: slurm\n", "backend: the spec is for 'slurm'"),
    ("env: [1, 2]\n", "--env: 1: expected NAME=VALUE"),
    ("env: {A: {b: 1}}\n", "env.A: expected a string"),
    ("mounts: [{source: /a}]\n", "mounts[0]"),
    ("command: {a: 1}\n", "command: expected a list of strings"),
    ("[1, 2]\n", "a job spec is a mapping"),
    ("nodes: [\n", "invalid YAML"),
    ("no_torchrun: maybe\n", "no_torchrun: expected true or false"),
])
def test_bad_spec_files_exit_2_naming_file_and_key(tmp_path: Path, text: str, words: str) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    line = one_error_line(gpuaccept("launch", "local", "--spec", str(spec), "--results-dir", str(tmp_path / "r"),
                                    "--dry-run"))
    assert words in line
    if "--env" not in words:
        assert str(spec) in line


def test_missing_spec_file_exits_2(tmp_path: Path) -> None:
    line = one_error_line(gpuaccept("launch", "local", "--spec", str(tmp_path / "nope.yaml"), "--dry-run"))
    assert "cannot read the spec file" in line


# ------------------------------------------------------------------ gather

def test_gather_lists_missing_nodes_and_keeps_readable_reports(tmp_path: Path) -> None:
    r = _local(tmp_path, "--nodes", "1", "--device", "cpu", "--checks", "steady")
    assert r.returncode == 0, r.stdout + r.stderr
    broken = tmp_path / "run" / "garbage" / "report.json"
    broken.parent.mkdir()
    broken.write_text("{not json")
    g = gpuaccept("gather", str(tmp_path / "run"), "--nodes", "3", "--cluster-report", str(tmp_path / "c.json"))
    assert g.returncode == 1
    assert f"warning: {broken}: not a gpuaccept report" in g.stderr
    report = json.loads((tmp_path / "c.json").read_text())
    assert [(n["host"], n["state"]) for n in report["nodes"]] == [
        ("local-0", "reported"), ("missing-1", "missing"), ("missing-2", "missing")]
    assert "[RESULT] FAILURE: missing-1, missing-2" in g.stdout


def test_gather_of_a_missing_directory_exits_2(tmp_path: Path) -> None:
    assert "no such run directory" in one_error_line(gpuaccept("gather", str(tmp_path / "nope")))


def test_a_run_id_is_not_reused(tmp_path: Path) -> None:
    assert _local(tmp_path, "--device", "cpu", "--checks", "steady").returncode == 0
    line = one_error_line(_local(tmp_path, "--device", "cpu", "--checks", "steady"))
    assert "already exists" in line
    assert os.path.exists(tmp_path / "run" / "cluster-report.json")


def test_a_launch_is_analysed_and_stored_in_the_history_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'history.db'}"
    r = _local(tmp_path, "--nodes", "2", "--device", "cpu", "--checks", "steady", "--db", db)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stored cluster run run (2 nodes)" in r.stderr
    report = cluster_report(tmp_path / "run")
    assert report["analysis"]["outliers"] == [] and "stats" in report["analysis"]
    h = gpuaccept("history", "--db", db, "--json", "--all-nodes")
    assert h.returncode == 0, h.stderr
    runs = json.loads(h.stdout)
    assert [x["run_id"] for x in runs if x["kind"] == "cluster"] == ["run"]
    nodes = [x for x in runs if x["kind"] == "node"]
    assert sorted(x["host"] for x in nodes) == ["local-0", "local-1"]
    assert all(x["parent_run_id"] == "run" for x in nodes)


def test_no_history_stores_nothing(tmp_path: Path) -> None:
    r = _local(tmp_path, "--nodes", "1", "--device", "cpu", "--checks", "steady", "--db",
               f"sqlite:///{tmp_path / 'h.db'}", "--no-history")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "h.db").exists() and "stored" not in r.stderr
