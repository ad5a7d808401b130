"""``gpuaccept isolate`` over the ssh and mpi launchers for real: four ssh config aliases (node-a ... node-d) of
the loopback sshd of tests/sshd.py play four hosts; each pair test runs the collectives check on CPU (gloo)
across its two hosts, and node-c's ranks fail it by the check's test-only hook (``GPUACCEPT_TEST_FAULT_HOST``,
matched against the host label each launcher gives its ranks)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.launch_support import gpuaccept, launch_env, require
from tests.sshd import Sshd, start_sshd

HOSTS = ("node-a", "node-b", "node-c", "node-d")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from start_sshd(tmp_path_factory.mktemp("sshd"), aliases=HOSTS)


def _isolate(backend: str, tmp_path: Path, *launch_args: str) -> dict[str, Any]:
    r = gpuaccept("isolate", "--backend", backend, "--nodes", ",".join(HOSTS), "--device", "cpu", "--results-dir",
                  str(tmp_path / "runs"), "--json", str(tmp_path / "v.json"), "--test-timeout", "240",
                  *(f"--launch-arg={a}" for a in launch_args), env=launch_env(GPUACCEPT_TEST_FAULT_HOST="node-c"),
                  timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    data: dict[str, Any] = json.loads((tmp_path / "v.json").read_text())
    assert data["bad"] == ["node-c"] and sorted(data["good"]) == ["node-a", "node-b", "node-d"], r.stdout
    bad = next(n for n in data["nodes"] if n["node"] == "node-c")
    assert len(bad["strikes"]) >= 2
    assert all(not e["passed"] and "injected fault on node-c" in e["reason"] for e in bad["evidence"])
    for path in data["cluster_reports"].values():  # each test ran on its two hosts, which both reported
        report = json.loads(Path(path).read_text())
        assert report["backend"] == backend
        assert len({n["host"] for n in report["nodes"]}) == 2 and all(n["state"] == "reported"
                                                                       for n in report["nodes"])
    return data


def test_the_broken_host_is_found_by_pair_tests_over_ssh(sshd: Sshd, tmp_path: Path) -> None:
    _isolate("ssh", tmp_path, f"--ssh-config={sshd.ssh_config}", f"--remote-python={sys.executable}",
             f"--remote-dir={tmp_path / 'remote'}", "--master-addr=127.0.0.1", "--connect-timeout=5",
             "--env=GPUACCEPT_TEST_FAULT_HOST=node-c")


def test_the_broken_host_is_found_by_pair_tests_under_mpirun(sshd: Sshd, tmp_path: Path) -> None:
    """mpirun reaches the hosts with its own ssh (``plm_rsh_agent``); node-a ... are aliases no resolver knows,
    so the ranks meet at ``--master-addr 127.0.0.1``."""
    require("mpirun")
    _isolate("mpi", tmp_path, f"--python={sys.executable}", f"--mca=plm_rsh_agent=ssh -F {sshd.ssh_config}",
             "--master-addr=127.0.0.1", "--forward-env=PYTHONPATH,GPUACCEPT_PLUGINS,GPUACCEPT_TEST_FAULT_HOST")
