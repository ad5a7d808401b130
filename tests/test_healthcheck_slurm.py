"""``gpuaccept healthcheck --slurm drain`` on the real local Slurm 22.05 cluster (tests/slurm_cluster.py).

slurmd itself runs the check: ``HealthCheckProgram`` is a wrapper script in the cluster's directory that
execs this checkout's gpuaccept (slurmd runs it as SlurmdUser with an environment of nothing but
``SLURMD_NODENAME``), every few seconds on every node (``HealthCheckNodeState=ANY``). A fault is injected
per node by a file the wrapper turns into ``GPUACCEPT_TEST_HEALTH_FAULT``. On the CPU of this machine
the wrapper leaves out ``env`` and ``compute`` (torch start-up on two cores would make every round slow);
the drain logic is the same for every check.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.health.run import FAULT_ENV
from gpuaccept.health.slurm import NodeState, parse_scontrol_node
from tests.launch_support import one_error_line, require
from tests.slurm_cluster import DAEMONS, LocalSlurm

INTERVAL_S = 3
WAIT_S = 90.0
HC_ARGS = "--device cpu --skip env,compute --deadline 20 --slurm drain"


def _wrapper(base: Path) -> str:
    conf = base / "slurm.conf"
    return "\n".join([
        "#!/bin/sh",
        "# HealthCheckProgram of the test cluster: slurmd passes no arguments and no PATH",
        "export PATH=/usr/sbin:/usr/bin:/bin",
        f"export SLURM_CONF={shlex.quote(str(conf))}",
        "export GPUACCEPT_PLUGINS=",
        f'fault={shlex.quote(str(base))}/fault-"$SLURMD_NODENAME"',
        f'[ -f "$fault" ] && export {FAULT_ENV}="$(cat "$fault")"',
        f'exec {shlex.quote(sys.executable)} -m gpuaccept healthcheck {HC_ARGS} '
        f'--report-dir {shlex.quote(str(base))}/hc-reports/"$SLURMD_NODENAME" '
        f'>> {shlex.quote(str(base))}/hc-"$SLURMD_NODENAME".log 2>&1',
        "",
    ])


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    require(*DAEMONS, "scontrol", "sinfo", "sbatch", "squeue", "scancel")
    cluster = LocalSlurm(extra_conf=["HealthCheckProgram={base}/healthcheck.sh",
                                     f"HealthCheckInterval={INTERVAL_S}", "HealthCheckNodeState=ANY"])
    program = cluster.base / "healthcheck.sh"
    program.write_text(_wrapper(cluster.base))
    program.chmod(0o755)
    with cluster:
        yield cluster


def _node(c: LocalSlurm, name: str) -> NodeState:
    r = c.run("scontrol", "show", "node", "-o", name)
    assert r.returncode == 0, r.stderr
    return parse_scontrol_node(r.stdout, name)


def _wait(c: LocalSlurm, name: str, ok: object, what: str) -> NodeState:
    assert callable(ok)
    deadline = time.monotonic() + WAIT_S
    while True:
        n = _node(c, name)
        if ok(n):
            return n
        if time.monotonic() > deadline:
            log = c.base / f"hc-{name}.log"
            tail = log.read_text()[-1500:] if log.exists() else "(no healthcheck log)"
            raise AssertionError(f"{name}: {what} not reached in {WAIT_S:g} s: {n}; log: {tail}")
        time.sleep(0.5)


def _runs(c: LocalSlurm, name: str) -> int:
    log = c.base / f"hc-{name}.log"
    return log.read_text().count("[HEALTHCHECK]") if log.exists() else 0


def _rounds(c: LocalSlurm, name: str, n: int) -> None:
    """Wait until slurmd has run the check on ``name`` ``n`` more times."""
    start = _runs(c, name)
    deadline = time.monotonic() + WAIT_S
    while _runs(c, name) < start + n:
        assert time.monotonic() < deadline, f"slurmd ran no health check on {name}"
        time.sleep(0.5)


def _cleanup(c: LocalSlurm, name: str) -> None:
    (c.base / f"fault-{name}").unlink(missing_ok=True)
    if _node(c, name).drained:
        c.run("scontrol", "update", f"NodeName={name}", "State=RESUME")
    _wait(c, name, lambda n: not n.drained, "back in service")


def test_a_fault_drains_the_node_with_our_reason_and_recovery_resumes_it(slurm: LocalSlurm) -> None:
    (slurm.base / "fault-node1").write_text("disk_space:no room on /scratch\n")
    try:
        n = _wait(slurm, "node1", lambda n: n.drained, "DRAIN")
        assert n.reason == f"GA-DSK-001 gpuaccept:job disk_space: injected fault ({FAULT_ENV}): no room on /scratch", n
        assert n.ours and n.reason_by == "root"
        assert not _node(slurm, "node2").drained  # slurmd's SLURMD_NODENAME named the node
        assert "[HEALTHCHECK] FAULT GA-DSK-001 disk_space: injected fault" in (slurm.base / "hc-node1.log").read_text()
        (slurm.base / "fault-node1").unlink()
        n = _wait(slurm, "node1", lambda n: not n.drained, "back in service")
        log = (slurm.base / "hc-node1.log").read_text()
        assert "resumed (was: GA-DSK-001 gpuaccept:job disk_space: injected fault" in log
    finally:
        _cleanup(slurm, "node1")


def test_an_admins_drain_survives_healthy_and_faulty_rounds(slurm: LocalSlurm) -> None:
    r = slurm.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=bad DIMM, ticket 4711")
    assert r.returncode == 0, r.stderr
    try:
        _rounds(slurm, "node2", 2)  # healthy: not resumed
        n = _node(slurm, "node2")
        assert n.drained and n.reason == "bad DIMM, ticket 4711", n
        (slurm.base / "fault-node2").write_text("health:XID 79\n")
        _rounds(slurm, "node2", 2)  # faulty: the admin's reason stays
        n = _node(slurm, "node2")
        assert n.drained and n.reason == "bad DIMM, ticket 4711", n
        assert "drained by someone else (bad DIMM, ticket 4711)" in (slurm.base / "hc-node2.log").read_text()
    finally:
        _cleanup(slurm, "node2")


def _direct(c: LocalSlurm, tmp_path: Path, *args: str, path: str | None = None,
            **env: str) -> subprocess.CompletedProcess[str]:
    """Run the healthcheck by hand on this cluster (as an admin would, or a Prolog)."""
    full = c.env()
    full.update({"GPUACCEPT_PLUGINS": "", **env})
    if path is not None:
        full["PATH"] = path
    return subprocess.run([sys.executable, "-m", "gpuaccept", "healthcheck", "--device", "cpu", "--skip",
                           "env,compute", "--report-dir", str(tmp_path / "rep"), *args], capture_output=True,
                          text=True, env=full, timeout=120, check=False)


def test_a_node_slurm_does_not_know_is_refused_and_nothing_is_drained(slurm: LocalSlurm, tmp_path: Path) -> None:
    r = _direct(slurm, tmp_path, "--slurm", "drain", "--node", "nosuch", **{FAULT_ENV: "disk_space:x"})
    line = one_error_line(r)
    assert "node nosuch (from --node) is not a node of a reachable Slurm cluster" in line
    assert "Node nosuch not found" in line and "nothing was run or drained" in line
    assert not (tmp_path / "rep").exists()
    assert not _node(slurm, "node1").drained and not _node(slurm, "node2").drained


def test_a_failed_drain_is_exit_6_and_keeps_the_results(slurm: LocalSlurm, tmp_path: Path) -> None:
    """An scontrol whose updates are refused (a stand-in before the real one on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = subprocess.run(["sh", "-c", "command -v scontrol"], capture_output=True, text=True, check=True).stdout
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = update ]; then echo "slurm_update error: Access/permission denied" >&2; exit 1; fi\n'
        f'exec {real.strip()} "$@"\n')
    (bin_dir / "scontrol").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    r = _direct(slurm, tmp_path, "--slurm", "drain", "--node", "node1", path=path, **{FAULT_ENV: "disk_space:x"})
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert "cannot drain node1: update NodeName=node1 failed: slurm_update error: Access/permission denied" in r.stderr
    line, = r.stdout.splitlines()
    assert line.startswith("[HEALTHCHECK] FAULT GA-DSK-001 disk_space: injected fault") and "node1 NOT drained" in line
    assert Path(line.rsplit("report: ", 1)[1]).exists()
    assert not _node(slurm, "node1").drained
    # the same in prolog mode: exit 1 (the node's fault), so that Slurm drains it itself
    r = _direct(slurm, tmp_path, "--slurm", "drain", "--node", "node1", "--mode", "prolog", path=path,
                **{FAULT_ENV: "disk_space:x"})
    assert r.returncode == 1, (r.stdout, r.stderr)


def test_print_mode_says_what_it_would_run_and_runs_nothing(slurm: LocalSlurm, tmp_path: Path) -> None:
    r = _direct(slurm, tmp_path, "--slurm", "print", "--node", "node2", **{FAULT_ENV: "health:XID 48"})
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "would run: " in r.stdout
    assert (f"scontrol update NodeName=node2 State=DRAIN Reason=GA-XID-048 gpuaccept:node health: injected fault "
            f"({FAULT_ENV}): "
            "XID 48") in r.stdout
    assert not _node(slurm, "node2").drained


def test_a_drain_reason_that_is_not_utf8_is_read_in_every_mode(slurm: LocalSlurm, tmp_path: Path) -> None:
    """An admin's reason in Latin-1 (``caf\\xe9``): scontrol prints it as it is; the healthcheck reads it with a
    replacement character, leaves the admin's drain alone and never ends in an internal error."""
    r = subprocess.run([b"scontrol", b"update", b"NodeName=node2", b"State=DRAIN", b"Reason=caf\xe9 ticket 12"],
                       capture_output=True, env=slurm.env(), timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    try:
        shown = subprocess.run(["scontrol", "show", "node", "-o", "node2"], capture_output=True, env=slurm.env(),
                               timeout=60, check=True).stdout
        assert b"caf\xe9" in shown  # the premise: scontrol passes the byte through
        for mode in ("check", "prolog", "epilog"):
            r2 = _direct(slurm, tmp_path, "--slurm", "print", "--node", "node2", "--mode", mode)
            assert r2.returncode == 0, (mode, r2.stdout, r2.stderr)
            assert "internal error" not in r2.stderr and "Traceback" not in r2.stderr
            assert "node2 drained by someone else (caf\ufffd ticket 12); left drained" in r2.stdout, r2.stdout
    finally:
        slurm.run("scontrol", "update", "NodeName=node2", "State=RESUME")  # before the reason is read as text
        _cleanup(slurm, "node2")
