"""``gpuaccept isolate`` for real: pair tests through the local launcher (CPU gloo collectives over loopback),
one node broken by the collectives check's test-only fault hook; and the command's bad-input lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launch_support import gpuaccept, launch_env, one_error_line


def test_the_broken_node_among_four_local_nodes_is_found_with_its_evidence(tmp_path: Path) -> None:
    env = launch_env(GPUACCEPT_TEST_FAULT_HOST="node2")
    r = gpuaccept("isolate", "--backend", "local", "--nodes", "4", "--device", "cpu", "--results-dir",
                  str(tmp_path / "runs"), "--json", str(tmp_path / "v.json"), "--drain", env=env, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["bad"] == ["node2"] and sorted(data["good"]) == ["node0", "node1", "node3"] and data["suspect"] == []
    assert data["rounds"] <= 3
    bad = next(n for n in data["nodes"] if n["node"] == "node2")
    assert len(bad["strikes"]) >= 2
    assert all(not e["passed"] and "injected fault on node2" in e["reason"] for e in bad["evidence"])
    for path in data["cluster_reports"].values():  # every test left its cluster report, under the node names
        hosts = {n["host"] for n in json.loads(Path(path).read_text())["nodes"]}
        assert hosts <= {"node0", "node1", "node2", "node3"} and len(hosts) == 2
    assert "[RESULT] 3 good, 0 suspect, 1 bad after" in r.stdout
    assert "scontrol update NodeName=node2 State=DRAIN 'Reason=gpuaccept: isolated: failed with" in r.stdout


def test_healthy_local_nodes_are_all_good(tmp_path: Path) -> None:
    r = gpuaccept("isolate", "--backend", "local", "--nodes", "2", "--device", "cpu", "--results-dir",
                  str(tmp_path), "--json", "-", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert sorted(data["good"]) == ["node0", "node1"] and data["rounds"] == 1


@pytest.mark.parametrize(("args", "needle"), [
    (["--backend", "local", "--nodes", "1"], "at least 2 nodes"),
    (["--backend", "ssh", "--nodes", "gpu01"], "at least 2 nodes"),
    (["--backend", "local", "--nodes", "4", "--min-busbw", "fast"], "'fast' is not a number"),
    (["--backend", "k8s", "--nodes", "a,b"], "invalid choice: 'k8s'"),
    (["--nodes", "a,b"], "--backend is required"),
    (["--backend", "slurm", "--nodes", "a,b", "--apply"], "give --drain too"),
    (["--backend", "slurm", "--nodes", "a,b", "--racks", "a"], "not NODE=RACK"),
    (["--simulate", "--nodes", "x"], "needs --nodes N"),
    (["--simulate", "--nodes", "1"], "at least 2 nodes"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    assert needle in one_error_line(gpuaccept("isolate", *args))


def test_simulate_prints_rounds_and_accuracy_as_json() -> None:
    r = gpuaccept("isolate", "--simulate", "--nodes", "64", "--bad", "1", "--trials", "20", "--seed", "3",
                  "--json", "-")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["nodes"], d["trials"], d["bad_found"], d["good_accused"]) == (64, 20, 20, 0)
    assert d["rounds_max"] <= 3 and "rounds: mean" in r.stderr
