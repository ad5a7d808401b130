"""The container entrypoints of the k8s/runai plans, run for real on this machine, and the log parser.

- The node entrypoint of a Job manifest runs the real suite and prints its
  report; the report is read back from the captured output as from
  ``kubectl logs``.
- Two "pods" of a distributed Job run the real torchrun, which takes its
  rendezvous from the PET_* variables of the manifest.
- The MPIJob launcher script runs under the real mpirun with two "workers":
  mpirun's ssh agent is replaced by a script that starts each worker's
  processes in their own UTS and mount namespaces (hostname node-a/node-b,
  a private results directory), so rank placement, the placement check and
  the per-host report collection are exercised as on a cluster.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.launch.k8s.manifests import build_manifests
from gpuaccept.launch.k8s.options import K8sOptions
from gpuaccept.launch.log_reports import reports_from_log
from gpuaccept.launch.pod_script import EXIT_PLACEMENT, REPORT_BEGIN, REPORT_END
from gpuaccept.launch.spec import JobSpec
from gpuaccept.model import NodeReport, Verdict
from tests.helpers import cli_env
from tests.k8s_support import need_binary

SUITE = ["--device", "cpu", "--profile", "quick", "--checks", "env"]


def container_env(container: dict[str, Any], **fields: str) -> dict[str, str]:
    """The container's env as the kubelet would set it; ``fields`` stand in for valueFrom entries."""
    env = {}
    for e in container["env"]:
        env[e["name"]] = e["value"] if "value" in e else fields[e["name"]]
    return env


def run_container(command: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a container command here, stdout and stderr merged as in a container log."""
    full = cli_env(**env)
    full.pop("GPUACCEPT_PLUGINS", None)
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full,
                          timeout=timeout)


def spec_for(kind: str, results: Path, **over: Any) -> JobSpec:
    values: dict[str, Any] = dict(
        name="accept", nodes=1, run_id="r1", results_dir="/unused", image="img", suite_args=list(SUITE),
        gpus_per_node=0,
        distributed=False, python=sys.executable, env={"QUOTED": "it's \"fine\"\nreally"},
        options=K8sOptions.from_dict({"kind": kind, "pod_results_dir": str(results)}).to_dict())
    values.update(over)
    return JobSpec(**values)


# ---- the node entrypoint ---------------------------------------------------------------------------------------

def test_job_pod_runs_the_suite_and_prints_its_report(tmp_path: Path) -> None:
    results = tmp_path / "pod results"  # a space on purpose
    spec = spec_for("job", results)
    _svc, job = build_manifests(spec, K8sOptions.from_dict(spec.options))
    c = job["spec"]["template"]["spec"]["containers"][0]
    proc = run_container(c["command"], container_env(c, GPUACCEPT_HOSTNAME="gpu-node-7"))
    assert proc.returncode == 0, proc.stdout
    found = reports_from_log(proc.stdout, "accept-0")
    assert found.problems == []
    assert len(found.reports) == 1
    report = found.reports[0]
    assert report.host == "gpu-node-7" and report.verdict is Verdict.SUCCESS
    assert [ch.name for ch in report.checks] == ["env"]
    assert (results / "r1").is_dir()


def test_node_entrypoint_keeps_the_job_exit_status(tmp_path: Path) -> None:
    spec = spec_for("job", tmp_path, command=["sh", "-c", "echo failing; exit 3"])
    _svc, job = build_manifests(spec, K8sOptions.from_dict(spec.options))
    c = job["spec"]["template"]["spec"]["containers"][0]
    proc = run_container(c["command"], container_env(c, GPUACCEPT_HOSTNAME="n"))
    assert proc.returncode == 3 and "failing" in proc.stdout
    assert REPORT_BEGIN not in proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_distributed_job_pods_rendezvous_through_pet_variables(tmp_path: Path) -> None:
    """torchrun reads PET_NODE_RANK/PET_MASTER_ADDR/PET_MASTER_PORT: two pods form one world of 4 ranks."""
    probe = ("import os; e = os.environ; "
             "os.write(1, f\"RANKINFO {e['RANK']} {e['WORLD_SIZE']} {e['GROUP_RANK']}\\n\".encode())")
    spec = spec_for("job", tmp_path, nodes=2, procs_per_node=2, distributed=True,
                    command=[sys.executable, "-c", probe])
    _svc, job = build_manifests(spec, K8sOptions.from_dict(spec.options))
    c = job["spec"]["template"]["spec"]["containers"][0]
    port = str(_free_port())
    procs = []
    for index in ("0", "1"):
        env = container_env(c, GPUACCEPT_HOSTNAME=f"node-{index}", PET_NODE_RANK=index)
        assert env["PET_MASTER_ADDR"] == "accept-0.accept"
        env.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=port)  # no cluster DNS here
        full = cli_env(**env)
        procs.append(subprocess.Popen(c["command"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=full))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n=====\n".join(outs)
    seen = sorted(list(m) for out in outs for m in re.findall(r"RANKINFO (\d+) (\d+) (\d+)", out))
    assert seen == [["0", "4", "0"], ["1", "4", "0"], ["2", "4", "1"], ["3", "4", "1"]], "\n=====\n".join(outs)


# ---- the MPIJob launcher under the real mpirun -----------------------------------------------------------------

AGENT = """#!/bin/sh
# Stands in for ssh: the worker's processes get their own hostname and results directory.
host=$1
shift
exec unshare --uts --mount sh -c 'hostname "$1"; mkdir -p "$GA_ROOT/hosts/$1";
mount --bind "$GA_ROOT/hosts/$1" "$GA_ROOT/results"; shift; exec sh -c "$*"' agent "$host" "$@"
"""


@pytest.fixture
def mpi_world(tmp_path: Path) -> dict[str, Any]:
    need_binary("mpirun")
    need_binary("unshare")
    if os.geteuid() != 0:
        message = "the fake workers need root (UTS and mount namespaces)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI runs as root")
        pytest.skip(message)
    (tmp_path / "results").mkdir()
    agent = tmp_path / "agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    env = {"GA_ROOT": str(tmp_path), "OMPI_MCA_plm_rsh_agent": str(agent), "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
           "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}
    return {"root": tmp_path, "env": env}


def run_launcher(world: dict[str, Any], spec: JobSpec, hostfile: str) -> subprocess.CompletedProcess[str]:
    root: Path = world["root"]
    job = build_manifests(spec, K8sOptions.from_dict(spec.options))[0]
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    command = list(launcher["command"])
    assert "hostfile=/etc/mpi/hostfile\n" in command[2]
    (root / "hostfile").write_text(hostfile)
    command[2] = command[2].replace("hostfile=/etc/mpi/hostfile\n", f"hostfile={root / 'hostfile'}\n")
    env = container_env(launcher)
    env.update(world["env"])
    return run_container(["unshare", "--uts", "sh", "-c", 'hostname launcher; exec "$@"', "pod", *command], env,
                         timeout=240)


def test_mpijob_launcher_runs_ranks_on_the_workers_and_collects_reports(mpi_world: dict[str, Any]) -> None:
    root: Path = mpi_world["root"]
    spec = spec_for("mpijob", root / "results", nodes=2, gpus_per_node=2)
    proc = run_launcher(mpi_world, spec, "node-a slots=2\nnode-b slots=2\n")
    assert proc.returncode == 0, proc.stdout
    found = reports_from_log(proc.stdout, "accept-launcher")
    assert found.problems == []
    assert sorted(r.host for r in found.reports) == ["node-a", "node-b"]
    assert "\x1b[" not in proc.stdout  # TERM=dumb reached the ranks: no live progress in the log
    assert all(r.verdict is Verdict.SUCCESS for r in found.reports)
    # Each worker's results stayed on that worker; the launcher's directory is empty.
    assert sorted(p.parent.parent.parent.name for p in (root / "hosts").glob("*/r1/*/report.json")) == \
        ["node-a", "node-b"]
    assert list((root / "results").iterdir()) == []


def test_mpijob_launcher_fails_when_ranks_land_on_the_launcher(mpi_world: dict[str, Any]) -> None:
    """What OpenMPI 5 does when it ignores the operator's ORTE variables: every rank on the launcher."""
    spec = spec_for("mpijob", mpi_world["root"] / "results", nodes=1, gpus_per_node=2, command=["true"])
    proc = run_launcher(mpi_world, spec, "launcher slots=2\n")
    assert proc.returncode == EXIT_PLACEMENT, proc.stdout
    assert "ranks ran on the launcher launcher" in proc.stdout


def test_mpijob_launcher_checks_the_hostfile(mpi_world: dict[str, Any]) -> None:
    spec = spec_for("mpijob", mpi_world["root"] / "results", nodes=2, gpus_per_node=1, command=["true"])
    proc = run_launcher(mpi_world, spec, "node-a slots=1\n")
    assert proc.returncode == EXIT_PLACEMENT
    assert "lists 1 hosts, expected 2" in proc.stdout


# ---- the log parser --------------------------------------------------------------------------------------------

def _report(host: str) -> str:
    rep = NodeReport(run_id="r1", host=host, profile="quick", started="2026-01-01T00:00:00Z",
                     finished="2026-01-01T00:01:00Z", verdict=Verdict.SUCCESS)
    import json

    return json.dumps(rep.to_dict(), indent=2)


def test_log_parser_reads_marked_reports_among_other_output() -> None:
    log = (f"[ENV] env: PASS\nsome stderr line\n\n{REPORT_BEGIN} /r/a/report.json\n{_report('a')}\n{REPORT_END}\n"
           f"{REPORT_BEGIN} /r/b/report.json\n{_report('b')}\n{REPORT_END}\n")
    found = reports_from_log(log, "pod-0")
    assert [r.host for r in found.reports] == ["a", "b"] and found.problems == []


def test_log_parser_reports_cut_and_corrupt_blocks() -> None:
    cut = f"{REPORT_BEGIN} /r/a/report.json\n{_report('a')[:40]}"
    corrupt = f"{REPORT_BEGIN} /r/b/report.json\n{{\"run_id\": 1}}\n{REPORT_END}\n"
    good = f"{REPORT_BEGIN} /r/c/report.json\n{_report('c')}\n{REPORT_END}\n"
    found = reports_from_log(cut + "\n" + corrupt + good, "pod-1")
    assert [r.host for r in found.reports] == ["c"]
    assert len(found.problems) == 2
    assert "pod-1: report /r/a/report.json is cut short" in found.problems[0]
    assert found.problems[1].startswith("pod-1: /r/b/report.json: not a gpuaccept report")


def test_log_parser_falls_back_to_json_printed_by_run_json_dash() -> None:
    log = "[ENV] env: PASS\n" + _report("node-9") + "\n{not json}\n{\"other\": 1}\n"
    found = reports_from_log(log)
    assert [r.host for r in found.reports] == ["node-9"]
    assert reports_from_log("no reports here\n").reports == []
