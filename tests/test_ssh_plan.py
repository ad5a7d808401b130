"""The ssh backend's pure side: options, plan (golden files), argv, the node script (shellcheck)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import ConfigError
from gpuaccept.launch.base import Plan
from gpuaccept.launch.hosts import Host
from gpuaccept.launch.registry import backend_class
from gpuaccept.launch.spec import JobSpec, Mount
from gpuaccept.launch.ssh.backend import SshBackend
from gpuaccept.launch.ssh.options import SshOptions
from gpuaccept.launch.ssh.plan import SCRIPT_NAME, kill_command, master_port, run_argv, scp_argv, ssh_argv
from gpuaccept.launch.ssh.preflight import preflight_command
from tests.sshd import need_binary

DATA = Path(__file__).parent / "data" / "ssh"
# GPUACCEPT_UPDATE_GOLDEN=1 re-records, as in the other golden tests; GPUACCEPT_REGEN_GOLDEN=1 is an old alias.
UPDATE = "1" in (os.environ.get("GPUACCEPT_UPDATE_GOLDEN"), os.environ.get("GPUACCEPT_REGEN_GOLDEN"))

HOSTILE_ENV = {
    "NCCL_DEBUG": "INFO",
    "QUOTES": "it's \"quoted\" `and` $(not run) ${HOME} \\ back",
    "MULTI": "line one\nline two\n",
    "SPACES": "  leading and trailing  ",
}


def spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = dict(name="accept", nodes=2, run_id="20260101T000000Z-ssh-abcd",
                                results_dir="/srv/results",
                                options={"hosts": ["gpu-01", "admin@gpu-02:2222 slots=4"]})
    base.update(kw)
    return JobSpec(**base)


def golden(name: str, plan: Plan) -> None:
    path = DATA / name
    text = plan.render()
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing; run with GPUACCEPT_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"plan differs from {path}; if intended, regenerate (see {DATA}/README.md)"


SUITE: dict[str, Any] = dict(
    suite_args=["--profile", "quick", "--device", "cpu"], env=HOSTILE_ENV, workdir="/work dir/it's here",
    distributed=False,
    options={"hosts": ["gpu-01", "admin@gpu-02:2222 slots=4"], "remote_dir": "~/gpuaccept",
             "remote_python": "/opt/py 3/bin/python", "identity": "/keys/id_ed25519",
             "ssh_options": ["ProxyJump=bastion"]})
TORCHRUN: dict[str, Any] = dict(
    command=["python", "-c", "import torch; print('hi')"], gpus_per_node=8, env={"NCCL_IB_HCA": "mlx5"},
    options={"hosts": ["gpu-01", "gpu-02"], "rendezvous": "c10d", "master_addr": "10.0.0.1", "master_port": 29400})
SCRIPT_JOB: dict[str, Any] = dict(command=["train.py", "--lr", "0.1"], options={"hosts": ["gpu-01", "[fd00::2]:2200"]})


@pytest.mark.parametrize(("name", "kw"), [("plan_suite.txt", SUITE), ("plan_torchrun_c10d.txt", TORCHRUN),
                                          ("plan_static_script.txt", SCRIPT_JOB)])
def test_plan_golden_and_deterministic(name: str, kw: dict[str, Any]) -> None:
    plan = SshBackend().plan(spec(**kw))
    assert plan == SshBackend().plan(spec(**kw))
    golden(name, plan)


def test_plan_shape() -> None:
    plan = SshBackend().plan(spec(**SUITE))
    assert plan.backend == "ssh"
    assert list(plan.files) == [SCRIPT_NAME]
    assert plan.expected_hosts == ["gpu-01", "gpu-02"]
    first, second = plan.commands
    assert first[:5] == ["ssh", "-o", "ProxyJump=bastion", "-o", "BatchMode=yes"]  # the user's -o first: first wins
    assert first[-3:] == ["--", "gpu-01", "exec /bin/sh -s -- 0 gpu-01 gpu-01 1"]
    assert ["-p", "2222"] == second[second.index("-p"):second.index("-p") + 2]
    assert ["-l", "admin"] == second[second.index("-l"):second.index("-l") + 2]
    assert second[-1] == "exec /bin/sh -s -- 1 gpu-02 gpu-02 4"  # slots=4: four processes there
    assert all(["-i", "/keys/id_ed25519"] == c[c.index("-i"):c.index("-i") + 2] for c in plan.commands)
    script = script_of(spec(**SUITE))
    assert 'node_dir="$HOME"/gpuaccept/20260101T000000Z-ssh-abcd/$3' in script
    assert '"$py" -m gpuaccept run --profile quick --device cpu --no-history --report-dir "$node_dir"' in script
    assert "torch.distributed.run" not in script


def script_of(s: JobSpec) -> str:
    """The node script with continuation lines joined."""
    return SshBackend().plan(s).files[SCRIPT_NAME].replace(" \\\n        ", " ")


def test_torchrun_rendezvous_forms() -> None:
    static = script_of(spec(command=["./bench", "--x"], options={"hosts": ["a", "b"]}))
    port = master_port(spec(), SshOptions.from_dict({"hosts": ["a"]}))
    assert 29500 <= port < 49500
    for piece in ('"--node-rank=${node_rank}"', "--master-addr=a", f"--master-port={port}", "--no-python ./bench",
                  '"--nproc-per-node=${nproc}"', "--nnodes=2", "--max-restarts=0"):
        assert piece in static
    c10d = script_of(spec(**TORCHRUN))
    assert "--rdzv-backend=c10d --rdzv-endpoint=10.0.0.1:29400 --rdzv-id=20260101T000000Z-ssh-abcd" in c10d
    assert "--node-rank" not in c10d
    script_job = script_of(spec(**SCRIPT_JOB))
    assert "--max-restarts=0 train.py --lr 0.1" in script_job  # a .py runs with the remote Python


def test_generated_scripts_pass_shellcheck(tmp_path: Path) -> None:
    shellcheck = need_binary("shellcheck", "generated scripts must pass shellcheck; apt-get install shellcheck")
    for i, kw in enumerate((SUITE, TORCHRUN, SCRIPT_JOB)):
        path = tmp_path / f"{i}.sh"
        path.write_text(SshBackend().plan(spec(**kw)).files[SCRIPT_NAME])
        res = subprocess.run([shellcheck, "--shell=sh", "--severity=style", str(path)], capture_output=True,
                             text=True)
        assert res.returncode == 0, res.stdout + res.stderr
    for cmd in (kill_command("~/x/run", "gpu-01"), preflight_command(spec(workdir="/a b"), "py 3")):
        inner = shlex.split(cmd)
        assert inner[:3] == ["exec", "/bin/sh", "-c"]
        path = tmp_path / "inner.sh"
        path.write_text("#!/bin/sh\n" + inner[3] + "\n")
        res = subprocess.run([shellcheck, "--shell=sh", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


def test_script_round_trips_hostile_values_through_sh(tmp_path: Path) -> None:
    """Run the node script with a local /bin/sh (no ssh): the job sees the env, argv and cwd verbatim."""
    workdir = tmp_path / "work dir" / "it's \"here\""
    workdir.mkdir(parents=True)
    argv = ["-c", "import json, os, sys; print(json.dumps([dict(os.environ), sys.argv[1:], os.getcwd()]))",
            "arg with space", "it's", "$(echo no)", "new\nline", ""]
    import json
    import sys

    s = spec(command=[sys.executable, *argv], env=HOSTILE_ENV, workdir=str(workdir), distributed=False,
             options={"hosts": ["h1", "h2"], "remote_dir": str(tmp_path / "remote"), "remote_python": sys.executable})
    script = SshBackend().plan(s).files[SCRIPT_NAME]
    # standard input stays open, as ssh keeps it: its end would stop the job
    proc = subprocess.Popen(["/bin/sh", "-s", "--", "1", "h2", "h2", "1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(script)
    proc.stdin.flush()
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    proc.stdin.close()
    env, args, cwd = json.loads(out)
    for k, v in HOSTILE_ENV.items():
        assert env[k] == v
    assert (env["GPUACCEPT_HOSTNAME"], env["NODE_RANK"], env["NNODES"], env["NPROC_PER_NODE"]) == ("h2", "1", "2", "1")
    assert args == argv[2:]
    assert cwd == str(workdir)
    assert not (tmp_path / "remote" / s.run_id / "h2" / "job.pid").exists()  # removed when the job ended


def test_failing_setup_is_reported(tmp_path: Path) -> None:
    s = spec(command=["true"], workdir=str(tmp_path / "missing"), distributed=False,
             options={"hosts": ["h1", "h2"], "remote_dir": str(tmp_path / "r")})
    res = subprocess.run(["/bin/sh", "-s", "--", "0", "h1", "h1", "1"], input=SshBackend().plan(s).files[SCRIPT_NAME],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 97
    assert f"gpuaccept: no working directory {tmp_path / 'missing'} on h1" in res.stderr


def test_argv_builders() -> None:
    opts = SshOptions.from_dict({"hosts": ["a"], "ssh_config": "/cfg", "user": "u", "port": 2200,
                                 "connect_timeout_s": 5, "ssh_options": ["Compression=yes"]})
    own = Host("b", user="v", port=2222, identity="/k")
    assert ssh_argv(opts, Host("a"), "true") == [
        "ssh", "-F", "/cfg", "-o", "Compression=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
        "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-o", "ControlMaster=no", "-p", "2200",
        "-l", "u", "-T", "--", "a",
        "true"]
    argv = ssh_argv(opts, own, "true")
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "v" and "/k" in argv
    scp = scp_argv(opts, Host("::1", port=22), "/r/x", "/l/x")
    assert scp[:3] == ["scp", "-r", "-q"] and scp[-3:] == ["--", "[::1]:/r/x", "/l/x"]
    assert scp[scp.index("-P") + 1] == "22" and "User=u" in scp and "-l" not in scp
    slot_cmd = run_argv(opts, _slot(opts))  # no --gpus-per-node: the host counts its GPUs
    assert shlex.split(slot_cmd[-1]) == ["exec", "/bin/sh", "-s", "--", "0", "a", "a", "gpu"]


def _slot(opts: SshOptions) -> Any:
    from gpuaccept.launch.ssh.plan import layout

    return layout(spec(nodes=1, options={"hosts": ["a"]}), opts)[0]


@pytest.mark.parametrize(("options", "why"), [
    ({}, "no hosts"),
    ({"hosts": ["a", "b"], "colour": 1}, "colour: unknown ssh option"),
    ({"hosts": ["a", "a"]}, "listed twice"),
    ({"hosts": ["a", "b"], "remote_dir": "/tmp/with space"}, "--remote-dir: /tmp/with space: must be absolute"),
    ({"hosts": ["a", "b"], "remote_dir": "relative/dir"}, "must be absolute or start with ~/"),
    ({"hosts": ["a", "b"], "remote_dir": "/tmp/$(x)"}, "must be absolute"),
    ({"hosts": ["a", "b"], "rendezvous": "etcd"}, "must be static or c10d"),
    ({"hosts": ["a", "b"], "ssh_options": ["NoEquals"]}, "expected KEY=VALUE"),
    ({"hosts": ["a", "b"], "ssh_options": "A=b"}, "must be a list"),
    ({"hosts": ["a", "b"], "max_connections": 0}, "--max-connections: 0: must be a whole number from 1"),
    ({"hosts": ["a", "b"], "port": "22"}, "--port: '22': must be a whole number"),
    ({"hosts": ["a", "b"], "fail_fast": "yes"}, "--fail-fast: 'yes': must be true or false"),
    ({"hosts": ["a", "b"], "remote_python": "py\nthon"}, "--remote-python: 'py\\\\nthon': must be a non-empty"),
    ({"hosts": [1, 2]}, "expected host entries"),
    ({"hosts": ["a bogus=1", "b"]}, "expected key=value"),
])
def test_bad_options(options: dict[str, Any], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        SshBackend().plan(spec(options=options))


@pytest.mark.parametrize(("kw", "why"), [
    (dict(nodes=3), r"--nodes: 3: the ssh backend runs one node per host and only 2 host\(s\) were given"),
    (dict(image="nvcr.io/nvidia/pytorch:24.05-py3"), "without a container runtime"),
    (dict(mounts=[Mount("/a", "/b")]), "no container to mount into"),
    (dict(command=["x"], options={"hosts": ["a", "b"], "max_connections": 1}),
     "a distributed job needs all 2 hosts connected at once; raise it to at least 2"),
])
def test_spec_that_does_not_fit(kw: dict[str, Any], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        SshBackend().plan(spec(**kw))


def test_fewer_nodes_than_hosts_takes_the_first() -> None:
    plan = SshBackend().plan(spec(nodes=1, options={"hosts": ["a", "b", "c"]}))
    assert plan.expected_hosts == ["a"] and len(plan.commands) == 1
    assert "1 node(s): the first 1 of the 3 hosts given" in plan.render()


def test_window_allowed_for_independent_jobs() -> None:
    plan = SshBackend().plan(spec(distributed=False, options={"hosts": ["a", "b"], "max_connections": 1}))
    assert len(plan.commands) == 2


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    backend_class("ssh").add_arguments(parser)
    return parser.parse_args(argv)


def test_options_from_flags_hostfile_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config to read
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two\nn3 slots=2\nroot@n4:2201\n")
    config = tmp_path / "cfg"
    config.write_text("Host n1\n  HostName 192.0.2.1\nHost gpu-a gpu-b\n  Port 2222\nHost *\n  User x\n")
    opts = SshBackend.options_from_args(parse(["--hosts", "n1,n2", "--hostfile", str(hostfile), "--ssh-config",
                                               str(config), "--ssh-config-hosts", "gpu-*", "--max-connections",
                                               "4", "--ssh-option", "ProxyJump=bastion", "--rendezvous", "c10d"]))
    assert opts["hosts"] == ["n1", "n2", "n3 slots=2", "root@n4:2201", "gpu-a", "gpu-b"]
    assert opts["master_addr"] == "192.0.2.1"  # the first host's HostName: where the others dial
    assert (opts["ssh_config"], opts["max_connections"], opts["rendezvous"]) == (str(config), 4, "c10d")
    assert opts["ssh_options"] == ["ProxyJump=bastion"]
    parsed = SshOptions.from_dict(opts)
    assert parsed.hosts[2] == Host("n3", slots=2)
    explicit = SshBackend.options_from_args(parse(["--hosts", "n1", "--ssh-config", str(config),
                                                   "--master-addr", "10.9.9.9"]))
    assert explicit["master_addr"] == "10.9.9.9"
    plain = SshBackend.options_from_args(parse(["--hosts", "n1"]))
    assert plain["master_addr"] is None and plain["ssh_config"] is None


@pytest.mark.parametrize(("argv", "why"), [
    ([], "no hosts: give --hosts, --hostfile or --ssh-config-hosts"),
    (["--hostfile", "/nonexistent/hosts"], "--hostfile: /nonexistent/hosts: cannot read"),
    (["--hosts", "a", "--ssh-config", "/nonexistent/cfg"], "--ssh-config: /nonexistent/cfg: cannot read"),
    (["--ssh-config-hosts", "gpu-*"], "no ssh config to read"),
    (["--hosts", "a,b:99999"], "port must be a number"),
    (["--hosts", "a", "--max-connections", "0"], "--max-connections: 0: must be at least 1"),
    (["--hosts", "a", "--remote-dir", "/x y"], "--remote-dir"),
])
def test_bad_flags(argv: list[str], why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=why):
        SshBackend.options_from_args(parse(argv))


def test_default_ssh_config_is_read_for_aliases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host rack1-*\n  User ops\nHost rack1-a rack1-b\n"
                                              "  HostName %h.dc\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    opts = SshBackend.options_from_args(parse(["--ssh-config-hosts", "rack1-*"]))
    assert opts["hosts"] == ["rack1-a", "rack1-b"]
    assert opts["ssh_config"] is None  # ssh reads its default config itself
    assert opts["master_addr"] == "rack1-a.dc"


def test_an_unparsable_default_ssh_config_does_not_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host a\n  Port twenty\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert SshBackend.options_from_args(parse(["--hosts", "a"]))["master_addr"] is None
    with pytest.raises(ConfigError, match="Port must be a number"):
        SshBackend.options_from_args(parse(["--ssh-config-hosts", "a"]))
    with pytest.raises(ConfigError, match="Port must be a number"):
        SshBackend.options_from_args(parse(["--hosts", "a", "--ssh-config", str(tmp_path / ".ssh" / "config")]))
