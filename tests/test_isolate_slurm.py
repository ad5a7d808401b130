"""``gpuaccept isolate`` against a real Slurm: a private four-node cluster on this host (tests/slurm_cluster.py).

``--drain --apply`` runs ``scontrol update NodeName=X State=DRAIN Reason="gpuaccept: ..."`` for the bad
node only, and ``scontrol show node`` says so afterwards; the pair tests run as Slurm jobs
(``--nodelist``) with the collectives check on CPU, one node broken by the check's test-only fault hook
(``GPUACCEPT_TEST_FAULT_HOST``, honoured as the Slurm node name the job step runs on).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.isolate.drain import Drained, apply_drain, is_draining, node_state
from gpuaccept.isolate.plan import NodeVerdict, Verdicts, drain_commands
from tests.launch_support import gpuaccept, launch_env, require
from tests.slurm_cluster import DAEMONS, LocalSlurm

NODES = ("node1", "node2", "node3", "node4")


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    require(*DAEMONS, "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
    with LocalSlurm(nodes=len(NODES)) as cluster:
        yield cluster


@pytest.fixture
def cluster(slurm: LocalSlurm) -> Iterator[LocalSlurm]:
    """The cluster with every node back in service after the test (a drained node would take no jobs)."""
    yield slurm
    for node in slurm.nodes:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")


def show_node(cluster: LocalSlurm, node: str) -> str:
    r = cluster.run("scontrol", "show", "node", "-o", node)
    assert r.returncode == 0, r.stderr
    return r.stdout


def reason(cluster: LocalSlurm, node: str) -> str:
    """``Reason=`` of a node (it holds spaces: up to Slurm's `` [user@time]`` suffix); '' when none."""
    m = re.search(r"\bReason=(.*?)(?: \[[^\]]*\])?(?: \w+=|$)", show_node(cluster, node).strip())
    return m.group(1) if m else ""


def test_node_state_is_read_from_scontrol_show_node() -> None:
    line = "NodeName=node3 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Reason=gpuaccept: x [root@t]"
    assert node_state(line) == "IDLE+DRAIN" and node_state("NodeName=n") == ""
    assert all(is_draining(s) for s in ("IDLE+DRAIN", "DRAINED", "MIXED+DRAIN", "DRAINING", "IDLE*+DRAIN"))
    assert not any(is_draining(s) for s in ("IDLE", "ALLOCATED", "DOWN", ""))


def test_an_update_that_slurm_does_not_show_is_not_counted_as_drained() -> None:
    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        out = "" if argv[1] == "update" else "NodeName=n1 State=IDLE Partitions=debug\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    [d] = apply_drain([["scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=gpuaccept: x"]], run=run)
    assert not d.ok and d.state == "IDLE" and "not draining after the update: Slurm shows State=IDLE" in d.error


def test_apply_drain_drains_only_the_named_node_on_a_real_slurm(cluster: LocalSlurm, monkeypatch: pytest.MonkeyPatch,
                                                                 ) -> None:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    bad = NodeVerdict("node3", "bad", evidence=[
        {"round": 1, "partners": ["node1"], "passed": False, "busbw": 1.5, "runs": [1.5], "reason": "x"},
        {"round": 2, "partners": ["node4"], "passed": False, "busbw": None, "runs": [None], "reason": "y"}])
    verdicts = Verdicts([NodeVerdict("node1", "good"), bad, NodeVerdict("node4", "good")], 2, 3)
    commands = drain_commands(verdicts)
    assert commands == [["scontrol", "update", "NodeName=node3", "State=DRAIN",
                         "Reason=gpuaccept: isolated: failed with node1 (1.5 GB/s); node4"]]
    done = apply_drain([*commands, ["scontrol", "update", "NodeName=nosuch", "State=DRAIN", "Reason=gpuaccept: z"]])
    assert done[0] == Drained("node3", tuple(commands[0]), True, done[0].state) and is_draining(done[0].state)
    assert not done[1].ok and "nosuch" not in cluster.nodes and done[1].error
    assert reason(cluster, "node3") == "gpuaccept: isolated: failed with node1 (1.5 GB/s); node4"
    for node in ("node1", "node2", "node4"):
        assert not is_draining(node_state(show_node(cluster, node))), show_node(cluster, node)


def test_isolation_drains_the_broken_node_it_found_and_no_other(cluster: LocalSlurm, tmp_path: Path) -> None:
    """Pair tests through the local launcher under the Slurm node names; the verdict drains node3 with scontrol."""
    env = launch_env(SLURM_CONF=str(cluster.conf), GPUACCEPT_TEST_FAULT_HOST="node3")
    r = gpuaccept("isolate", "--backend", "local", "--nodes", "node[1-4]", "--device", "cpu", "--results-dir",
                  str(tmp_path / "runs"), "--json", str(tmp_path / "v.json"), "--drain", "--apply", env=env,
                  timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["bad"] == ["node3"] and sorted(data["good"]) == ["node1", "node2", "node4"]
    assert [(d["node"], d["ok"]) for d in data["drained"]] == [("node3", True)]
    assert "scontrol update NodeName=node3 State=DRAIN 'Reason=gpuaccept: isolated: failed with" in r.stdout
    assert "[ISOLATE] drained node3 (State=" in r.stdout
    assert is_draining(node_state(show_node(cluster, "node3")))
    assert reason(cluster, "node3").startswith("gpuaccept: isolated: failed with ")
    for node in ("node1", "node2", "node4"):
        assert not is_draining(node_state(show_node(cluster, node)))


def test_the_broken_node_is_found_by_pair_tests_run_as_slurm_jobs(cluster: LocalSlurm, tmp_path: Path) -> None:
    """Every pair test is ``gpuaccept launch slurm --nodes 2 --nodelist A,B --checks collectives``: an sbatch job
    whose two srun tasks meet over torchrun's rendezvous; node2's ranks fail the check (the test-only hook)."""
    env = launch_env(SLURM_CONF=str(cluster.conf), GPUACCEPT_TEST_FAULT_HOST="node2")
    r = gpuaccept("isolate", "--backend", "slurm", "--nodes", "node[1-4]", "--device", "cpu", "--results-dir",
                  str(tmp_path / "runs"), "--json", str(tmp_path / "v.json"), f"--launch-arg=--python={sys.executable}",
                  "--test-timeout", "240", env=env, timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr + cluster.log_tail()
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["bad"] == ["node2"] and sorted(data["good"]) == ["node1", "node3", "node4"], r.stdout
    bad = next(n for n in data["nodes"] if n["node"] == "node2")
    assert len(bad["strikes"]) >= 2
    assert all(not e["passed"] and "injected fault on node2" in e["reason"] for e in bad["evidence"])
    assert len(data["cluster_reports"]) == len(data["tests_run"])
    ran = []
    for path in data["cluster_reports"].values():  # each test ran as its own Slurm job on exactly its two nodes
        report = json.loads(Path(path).read_text())
        hosts = sorted(n["host"] for n in report["nodes"])
        assert report["backend"] == "slurm" and cluster.wait_job(report["job_id"]) in ("COMPLETED", "FAILED")
        script = (Path(path).parent / "launch" / "job.sbatch").read_text()
        assert f"#SBATCH --nodelist={','.join(hosts)}\n" in script or \
            f"#SBATCH --nodelist={','.join(reversed(hosts))}\n" in script
        ran.append(hosts)
    assert sorted(ran) == sorted(sorted(t["nodes"]) for t in data["tests_run"])
    assert re.search(r"\[ISOLATE\] node\d, node\d: slurm job \d+", r.stdout)
