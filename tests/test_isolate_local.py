"""``gpuaccept isolate`` for real: pair tests through the local launcher (CPU gloo collectives over loopback),
one node broken by the collectives check's test-only fault hook; a broken rail of it named by ``--per-rail``
(the hook's ``HOST:RAIL`` form fails the whole-node tests and that rail's test only, a CPU stand-in for a bad
GPU/NIC pair); and the command's bad-input lines."""

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


def test_per_rail_names_the_broken_rail_of_the_bad_node(tmp_path: Path) -> None:
    env = launch_env(GPUACCEPT_TEST_FAULT_HOST="node2:1")
    r = gpuaccept("isolate", "--backend", "local", "--nodes", "4", "--device", "cpu", "--per-rail", "--gpus-per-node",
                  "2", "--results-dir", str(tmp_path / "runs"), "--json", str(tmp_path / "v.json"), "--drain",
                  env=env, timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["bad"] == ["node2"]
    rails = data["rails"]["node2"]
    assert rails["partner"] in data["good"] and rails["bad_rails"] == ["GPU 1"]
    assert [(x["gpu"], x["bad"]) for x in rails["rails"]] == [(0, False), (1, True)]
    assert rails["rails"][1]["evidence"] == ["all_reduce failed: injected fault on node2 rail 1 "
                                             "(GPUACCEPT_TEST_FAULT_HOST)"]
    assert rails["ports_from"] == "unknown: NCCL's choice"  # no RDMA port on this machine
    for test in rails["tests_run"]:  # each rail test ran alone, on the two nodes, one rank each on its GPU
        rid = next(k for k in data["cluster_reports"] if k.endswith(f"-rail-node2-gpu{test['gpu']}-0"))
        cluster = json.loads(Path(data["cluster_reports"][rid]).read_text())
        assert sorted(n["host"] for n in cluster["nodes"]) == sorted(["node2", rails["partner"]])
        assert all(len([c for c in n["report"]["checks"] if c["name"] == "collectives"]) == 1
                   for n in cluster["nodes"])
        for n in cluster["nodes"]:
            argv = n["report"]["argv"]
            assert argv[argv.index("--gpus") + 1] == str(test["gpu"])
    assert "[RAIL] node2: bad rail GPU 1 (all_reduce failed: injected fault on node2 rail 1" in r.stdout
    assert "'Reason=gpuaccept: isolated: bad rail GPU 1; failed with" in r.stdout


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
    (["--simulate", "--nodes", "100000"], "--nodes: 100000 nodes is more than isolate takes (4096)"),
    (["--backend", "ssh", "--nodes", "gpu[1-5000]"], "--nodes: 5000 nodes is more than isolate takes"),
    (["--backend", "local", "--nodes", "4097"], "more than isolate takes"),
    (["--simulate", "--nodes", "1000"], "--simulate --nodes 1000 --trials 100: more work than a simulation takes"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    assert needle in one_error_line(gpuaccept("isolate", *args, timeout=60))


def test_simulate_prints_rounds_and_accuracy_as_json() -> None:
    r = gpuaccept("isolate", "--simulate", "--nodes", "64", "--bad", "1", "--trials", "20", "--seed", "3",
                  "--json", "-")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["nodes"], d["trials"], d["bad_found"], d["good_accused"]) == (64, 20, 20, 0)
    assert d["rounds_max"] <= 3 and "rounds: mean" in r.stderr
