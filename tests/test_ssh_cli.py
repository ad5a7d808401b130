"""``gpuaccept launch ssh`` end to end through the CLI, against a real sshd on loopback (tests/sshd.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli_env, gpuaccept
from tests.sshd import Sshd, free_port, start_sshd

PY = sys.executable


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from start_sshd(tmp_path_factory.mktemp("sshd"))


def base(sshd: Sshd, tmp: Path) -> list[str]:
    return ["launch", "ssh", "--ssh-config", str(sshd.ssh_config), "--remote-python", PY,
            "--remote-dir", str(tmp / "remote"), "--results-dir", str(tmp / "local"), "--connect-timeout", "5"]


def test_launch_ssh_runs_the_suite_on_two_hosts(sshd: Sshd, tmp_path: Path) -> None:
    res = gpuaccept(*base(sshd, tmp_path), "--hosts", "node-a,node-b", "--run-id", "cli-suite",
                    "--device", "cpu", "--profile", "quick", "--checks", "env", timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout.splitlines()
    assert any(line.startswith("[node-a] ") and "env: PASS" in line for line in out), res.stdout
    # two hosts: one distributed run by default; node-b is rank 1, rank 0 on node-a reports for both
    assert any(line.startswith("[node-b] [RESULT] rank 1: SUCCESS") for line in out), res.stdout
    assert "[RESULT] SUCCESS" in out
    cluster = json.loads((tmp_path / "local" / "cli-suite" / "cluster-report.json").read_text())
    assert cluster["backend"] == "ssh" and cluster["verdict"] == "success" and cluster["expected_nodes"] == 2
    assert [(n["host"], n["state"], n["verdict"]) for n in cluster["nodes"]] == [
        ("node-a", "reported", "success"), ("node-b", "reported", "success")]
    # the plan's script and each host's output are kept in the launch directory
    launch = tmp_path / "local" / "cli-suite" / "launch"
    assert (launch / "ssh-node.sh").is_file() and "rank 1: SUCCESS" in (launch / "node-b.log").read_text()


def test_launch_ssh_command_failing_on_one_host(sshd: Sshd, tmp_path: Path) -> None:
    cmd = 'echo "hello from $GPUACCEPT_HOSTNAME rank $NODE_RANK"; [ "$GPUACCEPT_HOSTNAME" = node-a ]'
    res = gpuaccept(*base(sshd, tmp_path), "--hosts", "node-a,node-b", "--no-torchrun", "--workdir", str(tmp_path),
                    "--", "/bin/sh", "-c", cmd, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[node-a] hello from node-a rank 0" in res.stdout.splitlines()
    assert "[node-b] hello from node-b rank 1" in res.stdout.splitlines()
    assert "the ssh job ended FAILED (node-b: exit 1)" in res.stdout


def test_unreachable_host_exits_2_with_one_line(sshd: Sshd, tmp_path: Path) -> None:
    closed = free_port()
    res = gpuaccept(*base(sshd, tmp_path), "--hosts", f"node-a,127.0.0.1:{closed}", "--run-id", "cli-down",
                    "--device", "cpu", "--checks", "env", timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "gpuaccept: error: ssh preflight failed on 1 of 2 host(s), nothing was started: "
        f"127.0.0.1: ssh: connect to host 127.0.0.1 port {closed}: Connection refused"]
    assert "[LAUNCH]" not in res.stdout
    assert not (tmp_path / "local" / "cli-down").exists() and not (tmp_path / "remote").exists()


def test_dry_run_prints_the_plan_and_contacts_nobody(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu-01 slots=8\nadmin@gpu-02:2222 slots=8\n")
    res = gpuaccept("launch", "ssh", "--hostfile", str(hostfile), "--gpus-per-node", "8", "--run-id", "dry",
                    "--results-dir", str(tmp_path / "local"), "--dry-run", "--", "python", "train.py", timeout=60)
    assert res.returncode == 0, res.stderr
    assert "# ---- ssh-node.sh ----" in res.stdout
    assert "-m torch.distributed.run --nnodes=2" in res.stdout and "--master-addr=gpu-01" in res.stdout
    assert "-p 2222 -l admin -T -- gpu-02 'exec /bin/sh -s -- 1 gpu-02 gpu-02 8'" in res.stdout
    assert not (tmp_path / "local").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--hosts", "a,-oProxyCommand=x"], "gpuaccept: error: --hosts: -oProxyCommand=x: bad host name"),
    (["--hosts", "a,a"], "gpuaccept: error: --hosts: a: listed twice"),
    (["--hosts", "a", "--remote-dir", "/tmp/has space"], "gpuaccept: error: --remote-dir: /tmp/has space: must be"),
    (["--hosts", "a,b", "--nodes", "3"], "gpuaccept: error: --nodes: 3: the ssh backend runs one node per host"),
    (["--hosts", "a", "--image", "nvcr.io/nvidia/pytorch:24.05-py3"], "without a container runtime"),
    (["--hostfile", "/nonexistent/hosts"], "gpuaccept: error: --hostfile: /nonexistent/hosts: cannot read"),
    ([], "gpuaccept: error: launch ssh: no hosts: give --hosts, --hostfile or --ssh-config-hosts"),
    (["--hosts", "a", "--detach"], "gpuaccept: error: --detach: the ssh backend holds one connection per host"),
])
def test_bad_input_exits_2_with_one_line(argv: list[str], message: str, tmp_path: Path) -> None:
    res = gpuaccept("launch", "ssh", *argv, "--results-dir", str(tmp_path), "--device", "cpu", timeout=60,
                    HOME=str(tmp_path))
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_ctrl_c_cancels_and_leaves_no_remote_process(sshd: Sshd, tmp_path: Path) -> None:
    """SIGINT to the launcher (what Ctrl-C sends): exit 130, and the remote jobs are gone."""
    (tmp_path / "pids").mkdir()
    cmd = f'echo $$ > {tmp_path}/pids/"$GPUACCEPT_HOSTNAME"; exec sleep 300'
    proc = subprocess.Popen([PY, "-m", "gpuaccept", *base(sshd, tmp_path), "--hosts", "node-a,node-b",
                             "--no-torchrun", "--workdir", str(tmp_path), "--", "/bin/sh", "-c", cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT)
    try:
        files = [tmp_path / "pids" / h for h in ("node-a", "node-b")]
        end = time.monotonic() + 60
        while not all(f.is_file() and f.read_text().strip() for f in files):
            assert time.monotonic() < end and proc.poll() is None, "the remote jobs did not start"
            time.sleep(0.1)
        remote = [int(f.read_text()) for f in files]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    end = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{p}") for p in remote):
        assert time.monotonic() < end, f"remote processes {remote} still running after Ctrl-C"
        time.sleep(0.1)


def test_secret_env_values_reach_the_hosts_but_no_stored_file(sshd: Sshd, tmp_path: Path) -> None:
    import hashlib

    secret = "aws-S3cret-0b9d"
    code = ("import hashlib, os; "
            "print('digest', hashlib.sha256(os.environ['AWS_SECRET_ACCESS_KEY'].encode()).hexdigest())")
    res = gpuaccept(*base(sshd, tmp_path), "--hosts", "node-a,node-b", "--no-torchrun", "--run-id", "cli-secret",
                    "--env", f"AWS_SECRET_ACCESS_KEY={secret}", "--env", "NCCL_DEBUG=INFO", "--no-history",
                    "--", PY, "-c", code, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert f"[node-a] digest {digest}" in res.stdout and f"[node-b] digest {digest}" in res.stdout
    stored = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert stored == []  # neither the launch directory nor the hosts' directories keep it
    launch = tmp_path / "local" / "cli-secret" / "launch"
    assert "export AWS_SECRET_ACCESS_KEY='<redacted>'" in (launch / "ssh-node.sh").read_text()
    assert "export NCCL_DEBUG=INFO" in (launch / "ssh-node.sh").read_text()
    assert json.loads((launch / "job.json").read_text())["spec"]["env"] == {
        "AWS_SECRET_ACCESS_KEY": "<redacted>", "NCCL_DEBUG": "INFO"}
