"""The mpi backend: real mpirun jobs on this machine (2 ranks) and across two hosts (node-a and node-b, ssh
config aliases of the loopback sshd of tests/sshd.py, reached by mpirun's own ssh with ``plm_rsh_agent``),
the plan (golden), and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.errors import ConfigError
from gpuaccept.launch.mpi.backend import _NAME_RANK, MpiBackend, open_mpi_major
from gpuaccept.launch.spec import JobSpec
from tests.launch_support import check_golden, cluster_report, gpuaccept, one_error_line, require, shellcheck
from tests.sshd import Sshd, start_sshd


def _mpi(tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    require("mpirun")
    return gpuaccept("launch", "mpi", "--python", sys.executable, "--results-dir", str(tmp_path), "--run-id", "run",
                     "--poll-interval", "0.2", *args, timeout=timeout)


def test_two_ranks_on_this_machine_get_the_environment_and_their_host_name(tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    code = ("import os, pathlib; e = os.environ; pathlib.Path(" + repr(str(out)) + ", e['OMPI_COMM_WORLD_RANK'])"
            ".write_text('|'.join([e['OMPI_COMM_WORLD_SIZE'], e['GPUACCEPT_HOSTNAME'], e['GREETING']]))")
    r = _mpi(tmp_path, "--hosts", "localhost", "--procs-per-node", "2", "--oversubscribe", "--transport", "tcp",
             "--env", "GREETING=it's \"quoted\"", "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = {p.name: p.read_text().split("|") for p in out.iterdir()}
    assert ranks == {"0": ["2", "localhost", "it's \"quoted\""], "1": ["2", "localhost", "it's \"quoted\""]}
    hostfile = (tmp_path / "run" / "launch" / "hostfile").read_text()
    assert hostfile.splitlines()[-1] == "localhost slots=2"


def test_the_suite_through_mpirun_gives_a_cluster_report(tmp_path: Path) -> None:
    r = _mpi(tmp_path, "--device", "cpu", "--checks", "steady")
    assert r.returncode == 0, r.stdout + r.stderr
    report = cluster_report(tmp_path / "run")
    assert [(n["host"], n["verdict"]) for n in report["nodes"]] == [("localhost", "success")]
    assert report["backend"] == "mpi"


def test_a_failing_mpi_program_exits_1(tmp_path: Path) -> None:
    r = _mpi(tmp_path, "--procs-per-node", "2", "--oversubscribe", "--", "sh", "-c",
             'echo "rank $OMPI_COMM_WORLD_RANK"; exit "$OMPI_COMM_WORLD_RANK"')
    assert r.returncode == 1
    assert "[RESULT] FAILURE: the mpi job ended FAILED (mpirun exit" in r.stdout
    assert "rank 1" in r.stderr


def _spec(**over: object) -> JobSpec:
    base: dict[str, object] = {"name": "nccl", "nodes": 2, "gpus_per_node": 8, "run_id": "20260101T000000Z-nccl-0000",
                               "results_dir": "/shared/r", "command": ["/opt/nccl-tests/all_reduce_perf", "-b", "8",
                                                                       "-e", "8G", "-f", "2", "-g", "1"],
                               "env": {"NCCL_DEBUG": "INFO"},
                               "options": {"hosts": ["gpu01", "gpu02", "gpu03"], "slots": [8, 8, None],
                                           "transport": "ucx", "ib_devices": "mlx5_0:1", "net_if": "eth0",
                                           "mca": [["coll_hcoll_enable", "0"]], "forward_env": ["LD_LIBRARY_PATH"],
                                           "allow_run_as_root": True}}
    base.update(over)
    return JobSpec(**base)  # type: ignore[arg-type]


def test_plan_matches_the_golden_file() -> None:
    plan = MpiBackend().plan(_spec())
    assert MpiBackend().plan(_spec()).render() == plan.render()
    check_golden("mpi/nccl-tests-2-nodes.txt", plan.render())
    argv = plan.commands[0]
    assert argv[argv.index("-np") + 1] == "16" and argv[argv.index("--map-by") + 1] == "ppr:8:node"
    assert "--allow-run-as-root" in argv
    assert argv[argv.index("pml") - 1:argv.index("pml") + 2] == ["--mca", "pml", "ucx"]
    assert "UCX_NET_DEVICES=mlx5_0:1" in argv and "LD_LIBRARY_PATH" in argv
    assert plan.expected_hosts == ["gpu01", "gpu02"]


def test_suite_plan_runs_one_rank_per_host() -> None:
    plan = MpiBackend().plan(_spec(command=None, suite_args=["--profile", "quick"], distributed=False))
    argv = plan.commands[0]
    assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("--map-by") + 1] == "ppr:1:node"
    assert argv[argv.index("gpuaccept-rank") + 1:] == [
        "python3", "-m", "gpuaccept", "run", "--profile", "quick", "--no-history",
        "--report-dir", "/shared/r/20260101T000000Z-nccl-0000"]


def test_the_rank_naming_snippet_passes_shellcheck(tmp_path: Path) -> None:
    script = tmp_path / "name-rank.sh"
    script.write_text("#!/bin/sh\n" + _NAME_RANK + "\n")
    shellcheck(script)


@pytest.mark.parametrize(("over", "words"), [
    ({"nodes": 4}, "only 3 host(s) given"),
    ({"options": {"hosts": ["a"], "slots": [4]}, "nodes": 1}, "has slots=4 but the job runs 8 rank(s)"),
    ({"options": {"transport": "carrier-pigeon"}, "nodes": 1}, "transport must be one of"),
    ({"options": {"bogus": 1}}, "bogus: unknown option"),
    ({"image": "img", "nodes": 1, "options": {}}, "runs no containers"),
])
def test_bad_plans_raise(over: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        MpiBackend().plan(_spec(**over))
    assert words in str(info.value)


@pytest.mark.parametrize(("args", "words"), [
    (["--hosts", "admin@gpu01"], "set User, Port and IdentityFile in ~/.ssh/config"),
    (["--hosts", "a,b", "--nodes", "3"], "only 2 host(s) given"),
    (["--mca", "nokey"], "expected an MCA parameter KEY=VALUE"),
    (["--hosts", "a,a"], "listed twice"),
    (["--mpirun", "/nonexistent/mpirun"], "/nonexistent/mpirun not found"),
    (["--hostfile", "/nonexistent/hosts"], "cannot read"),
])
def test_bad_mpi_input_exits_2(tmp_path: Path, args: list[str], words: str) -> None:
    r = gpuaccept("launch", "mpi", "--device", "cpu", "--checks", "steady", "--results-dir", str(tmp_path / "r"),
                  *args)
    assert words in one_error_line(r)
    assert not (tmp_path / "r").exists()


def test_hostfile_slots_are_read(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# rack 1\ngpu01 slots=8\ngpu02 slots=8\n")
    r = gpuaccept("launch", "mpi", "--hostfile", str(hosts), "--gpus-per-node", "8", "--results-dir", "/r",
                  "--run-id", "h", "--dry-run", "--", "all_reduce_perf")
    assert r.returncode == 0, r.stderr
    assert "gpu01 slots=8\ngpu02 slots=8\n" in r.stdout and "-np 16" in r.stdout


def test_distributed_ranks_get_master_addr_and_port_of_the_first_host() -> None:
    plan = MpiBackend().plan(_spec(command=None, suite_args=["--distributed"], distributed=True))
    argv = plan.commands[0]
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert "MASTER_ADDR=gpu01" in pairs
    port = [p for p in pairs if p.startswith("MASTER_PORT=")]
    assert len(port) == 1 and 29500 <= int(port[0].split("=")[1]) < 49500
    assert pairs.count("PATH") == 1 and pairs.count("LD_LIBRARY_PATH") == 1
    own = MpiBackend().plan(_spec(env={"MASTER_ADDR": "10.0.0.1"}, distributed=True)).commands[0]
    assert [a for a in own if a.startswith("MASTER_ADDR=")] == ["MASTER_ADDR=10.0.0.1"]


def test_master_addr_and_port_options_for_hosts_that_are_ssh_aliases(tmp_path: Path) -> None:
    r = gpuaccept("launch", "mpi", "--hosts", "node-a,node-b", "--nodes", "2", "--procs-per-node", "1",
                  "--master-addr", "10.1.2.3",
                  "--master-port", "31000", "--results-dir", "/r", "--run-id", "m", "--dry-run", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "-x MASTER_ADDR=10.1.2.3 -x MASTER_PORT=31000" in r.stdout
    for flag, value in (("--master-addr", "a b"), ("--master-port", "70000")):
        bad = gpuaccept("launch", "mpi", "--hosts", "node-a", flag, value, "--dry-run", "--", "true")
        assert bad.returncode == 2 and "--master-" in one_error_line(bad)
    with pytest.raises(ConfigError, match="not a host name"):
        MpiBackend().plan(_spec(nodes=1, options={"hosts": ["gpu01"], "master_addr": "x;y"}))


def test_per_node_suite_plan_has_no_master_address() -> None:
    argv = MpiBackend().plan(_spec(command=None, suite_args=[], distributed=False)).commands[0]
    assert not [a for a in argv if a.startswith("MASTER_")]


@pytest.mark.parametrize(("major", "btl"), [(None, "tcp,self,vader"), (4, "tcp,self,vader"), (5, "tcp,self,sm")])
def test_tcp_transport_names_the_shared_memory_btl_of_the_open_mpi_version(major: int | None, btl: str) -> None:
    opts = {"hosts": ["gpu01", "gpu02"], "transport": "tcp", "ompi_major": major}
    argv = MpiBackend().plan(_spec(options=opts)).commands[0]
    assert argv[argv.index("btl") + 1] == btl


def test_open_mpi_version_is_read_from_mpirun() -> None:
    assert open_mpi_major("mpirun (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/\n") == 5
    assert open_mpi_major("mpirun (Open MPI) 4.1.4") == 4
    assert open_mpi_major("HYDRA build details:") is None
    require("mpirun")
    r = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, check=False)
    assert open_mpi_major(r.stdout + r.stderr) is not None, r.stdout


def test_a_command_under_mpirun_sees_master_addr_and_port(tmp_path: Path) -> None:
    out = tmp_path / "env"
    code = ("import os, pathlib; e = os.environ; pathlib.Path(" + repr(str(out)) + ").write_text("
            "' '.join([e['MASTER_ADDR'], e['MASTER_PORT'], str('PATH' in e)]))")
    r = _mpi(tmp_path, "--hosts", "localhost", "--transport", "tcp", "--procs-per-node", "1", "--", sys.executable,
             "-c", code)
    assert r.returncode == 0, r.stdout + r.stderr
    addr, port, has_path = out.read_text().split(" ")
    assert (addr, has_path) == ("localhost", "True") and port.isdigit()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from start_sshd(tmp_path_factory.mktemp("sshd"))


def _over_ssh(sshd: Sshd) -> list[str]:
    """mpirun starts its daemons on node-a and node-b (ssh config aliases of the loopback sshd) with ssh -F."""
    return ["--hosts", "node-a,node-b", "--nodes", "2", "--mca", f"plm_rsh_agent=ssh -F {sshd.ssh_config}",
            "--forward-env", "PYTHONPATH,GPUACCEPT_PLUGINS"]


def test_ranks_on_two_hosts_reached_by_ssh_get_master_addr_and_port(sshd: Sshd, tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    code = ("import os, pathlib; e = os.environ; pathlib.Path(" + repr(str(out)) + ", e['OMPI_COMM_WORLD_RANK'])"
            ".write_text(' '.join([e['OMPI_MCA_orte_num_nodes'], e['GPUACCEPT_HOSTNAME'], e['MASTER_ADDR'], "
            "e['MASTER_PORT'], str(bool(e.get('SSH_CONNECTION')))]))")
    r = _mpi(tmp_path, *_over_ssh(sshd), "--procs-per-node", "1", "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = {p.name: p.read_text().split(" ") for p in out.iterdir()}
    assert sorted(ranks) == ["0", "1"]
    port = ranks["0"][3]
    # two Open MPI nodes, each rank started under an ssh session, all meeting at the first host
    assert ranks == {"0": ["2", "node-a", "node-a", port, "True"], "1": ["2", "node-b", "node-a", port, "True"]}


def test_distributed_suite_across_two_hosts_reports_the_cross_node_result(sshd: Sshd, tmp_path: Path) -> None:
    """The suite with its collectives on CPU (gloo) across two Open MPI nodes: no rank can default MASTER_ADDR
    (the ranks are on different nodes), so each needs the -x MASTER_ADDR/MASTER_PORT of the plan. node-a is an
    ssh alias that no resolver here knows, so the address is overridden with --env (as an operator whose host
    list names ssh aliases does); MASTER_PORT is the plan's."""
    r = _mpi(tmp_path, *_over_ssh(sshd), "--master-addr", "127.0.0.1", "--device", "cpu", "--profile", "quick",
             "--checks", "steady,collectives", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = cluster_report(tmp_path / "run")
    assert report["verdict"] == "success"
    assert [(n["host"], n["verdict"]) for n in report["nodes"]] == [("node-a", "success"), ("node-b", "success")]
    for node in report["nodes"]:
        assert sorted((c["name"], c["status"], c["host"]) for c in node["report"]["checks"]) == [
            ("collectives", "pass", node["host"]), ("steady", "pass", node["host"])]
    fabric = report["analysis"]["cross_node"]
    assert (fabric["verdict"], fabric["ranks"], fabric["hosts"]) == ("success", 2, ["node-a", "node-b"])
    assert fabric["checks"] == {"collectives": {"status": "pass", "ranks": 2, "failed_ranks": [], "reason": ""}}
    assert "[FABRIC] cross-node: SUCCESS - collectives pass over 2 rank(s) on 2 node(s)" in r.stdout.splitlines()
    job = json.loads((tmp_path / "run" / "launch" / "job.json").read_text())
    assert job["spec"]["distributed"] is True and job["spec"]["suite_args"][-1] == "--distributed"
