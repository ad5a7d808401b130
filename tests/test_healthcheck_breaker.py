"""The circuit breaker and the ladder's re-run on the real local Slurm 22.05 cluster (tests/slurm_cluster.py):
with ``--breaker-limit 1`` the second failing node is not drained and says so; ``--breaker reset`` marks the
counted drain seen and the next one drains; a re-run-first fault that clears on its re-run drains nothing.

The healthcheck is run by hand here (as an admin, or the Prolog, would), one node at a time, so the order of the
drains is the test's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.health.run import FAULT_ENV, FAULT_ONCE_ENV
from gpuaccept.health.slurm import NodeState, parse_scontrol_node
from tests.launch_support import require
from tests.slurm_cluster import DAEMONS, LocalSlurm

BREAKER = ("--breaker-limit", "1", "--breaker-window", "1h")


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    require(*DAEMONS, "scontrol", "sinfo")
    with LocalSlurm(nodes=3) as cluster:
        yield cluster


def _node(c: LocalSlurm, name: str) -> NodeState:
    r = c.run("scontrol", "show", "node", "-o", name)
    assert r.returncode == 0, r.stderr
    return parse_scontrol_node(r.stdout, name)


def _hc(c: LocalSlurm, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**c.env(), "GPUACCEPT_PLUGINS": "", **env}
    return subprocess.run([sys.executable, "-m", "gpuaccept", "healthcheck", "--device", "cpu", "--skip",
                           "env,compute,health", "--report-dir", str(tmp_path / "rep"), *args],
                          capture_output=True, text=True, env=full, timeout=120, check=False)


@pytest.fixture
def clean(slurm: LocalSlurm) -> Iterator[LocalSlurm]:
    yield slurm
    for n in slurm.nodes:
        if _node(slurm, n).drained:
            slurm.run("scontrol", "update", f"NodeName={n}", "State=RESUME")


def test_with_a_limit_of_1_the_second_failing_node_is_not_drained(clean: LocalSlurm, tmp_path: Path) -> None:
    c = clean
    fault = {FAULT_ENV: "disk_space:no room on /scratch"}
    r = _hc(c, tmp_path, "--slurm", "drain", "--node", "node1", *BREAKER, **fault)
    assert r.returncode == 1, (r.stdout, r.stderr)
    n1 = _node(c, "node1")
    assert n1.drained and n1.reason.startswith("GA-DSK-001 gpuaccept:job disk_space: injected fault"), n1
    # the second failing node: held back, and it says what it would have done and why
    r = _hc(c, tmp_path, "--slurm", "drain", "--node", "node2", *BREAKER, **fault)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert not _node(c, "node2").drained
    assert "node2 NOT drained (circuit breaker open: 1 node(s) drained by gpuaccept in the last 3600 s (node1), " \
           "limit 1 of 3" in r.stdout, r.stdout
    assert "would have run: " in r.stderr and "scontrol update NodeName=node2 State=DRAIN Reason=GA-DSK-001 " \
        "gpuaccept:job" in r.stderr, r.stderr
    # as the Prolog: exit 0, so that Slurm does not drain what the breaker held back
    r = _hc(c, tmp_path, "--slurm", "drain", "--node", "node2", "--mode", "prolog", *BREAKER, **fault)
    assert r.returncode == 0 and not _node(c, "node2").drained, (r.stdout, r.stderr)
    # an admin's drain is not gpuaccept's: it does not count
    c.run("scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=bad DIMM")
    # a person resets the breaker: node1's reason is marked seen, it stays drained and ours
    r = _hc(c, tmp_path, "--breaker", "reset")
    assert r.returncode == 0 and "1 drain(s) of the last 3600 s marked seen (node1)" in r.stdout, (r.stdout, r.stderr)
    n1 = _node(c, "node1")
    assert n1.drained and n1.ours and n1.reason.startswith("GA-DSK-001 gpuaccept:job,ack disk_space:"), n1
    r = _hc(c, tmp_path, "--slurm", "drain", "--node", "node2", *BREAKER, **fault)
    assert _node(c, "node2").drained, (r.stdout, r.stderr)
    # node1 still faulty: its seen drain is left as it is (not counted again); healthy: resumed, as ours
    r = _hc(c, tmp_path, "--slurm", "drain", "--node", "node1", *BREAKER, **fault)
    assert "already drained with this reason" in r.stdout and _node(c, "node1").reason.startswith("GA-DSK-001 "
                                                                                                   "gpuaccept:job,ack")
    r = _hc(c, tmp_path, "--slurm", "drain", "--node", "node1", *BREAKER)
    assert r.returncode == 0 and not _node(c, "node1").drained, (r.stdout, r.stderr)
    assert _node(c, "node3").reason == "bad DIMM"


def test_a_rerun_first_fault_that_clears_on_its_rerun_drains_nothing(clean: LocalSlurm, tmp_path: Path) -> None:
    c = clean
    held = {FAULT_ENV: "disk_space:GPU held by a leftover process"}  # GA-GPU-008: re-run first
    r = _hc(c, tmp_path, "--slurm", "drain", "--node", "node1", **held, **{FAULT_ONCE_ENV: "1"})
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.startswith("[HEALTHCHECK] HEALTHY") and "disk_space (re-run) PASS" in r.stdout, r.stdout
    assert not _node(c, "node1").drained
    # the fault stays on the re-run: the ladder's next rung (reset_gpu) takes the node out, as the job's fault
    r = _hc(c, tmp_path, "--slurm", "drain", "--node", "node1", **held)
    assert r.returncode == 1, (r.stdout, r.stderr)
    n1 = _node(c, "node1")
    assert n1.drained and n1.reason.startswith("GA-GPU-008 gpuaccept:job disk_space: re-run (GA-GPU-008 says "
                                               "re-run first)"), n1
