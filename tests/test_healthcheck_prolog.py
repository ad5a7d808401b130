"""``gpuaccept healthcheck --mode prolog|epilog`` as Slurm's Prolog and Epilog, run by slurmd itself.

A one-node Slurm 22.05 cluster (tests/slurm_cluster.py) with ``Prolog=``, ``Epilog=`` and
``PrologFlags=Alloc``, as the README documents them: each is a wrapper script in the cluster's directory
that runs this checkout's ``gpuaccept healthcheck --mode prolog`` (``epilog``) with ``--slurm drain``.
slurmd runs it with no arguments and an environment of its own (``SLURMD_NODENAME``, ``SLURM_JOB_ID``, no
``PATH``). A fault is injected by a file the wrapper turns into ``GPUACCEPT_TEST_HEALTH_FAULT``: ``fault``
is seen by both (a broken node stays broken), ``fault-prolog`` and ``fault-epilog`` by one. On this
machine's CPU the wrapper leaves out ``env`` and ``compute``, as the HealthCheckProgram tests do.

What Slurm 22.05 does here (asserted below): a Prolog that exits non-zero keeps the job from running,
requeues it held (``launch_failed_requeued_held``) and drains the node; our drain comes first, and
Slurm's own ("Prolog error", "Epilog error") does not replace its reason. slurmd then runs the Epilog
for that job too. An Epilog that exits non-zero drains the node after the job ran.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuaccept.health.run import FAULT_ENV
from gpuaccept.health.slurm import NodeState, parse_scontrol_node
from tests.launch_support import require
from tests.slurm_cluster import DAEMONS, LocalSlurm

WAIT_S = 90.0
HC_ARGS = "--device cpu --skip env,compute --deadline 20 --slurm drain"
NODE = "node1"


def _wrapper(base: Path, mode: str) -> str:
    b = shlex.quote(str(base))
    return "\n".join([
        "#!/bin/sh",
        f"# {mode.capitalize()} of the test cluster: slurmd passes no arguments and no PATH",
        "export PATH=/usr/sbin:/usr/bin:/bin",
        f"export SLURM_CONF={b}/slurm.conf",
        "export GPUACCEPT_PLUGINS=",
        f'for f in {b}/fault {b}/fault-{mode}; do [ -f "$f" ] && export {FAULT_ENV}="$(cat "$f")"; done',
        f"{shlex.quote(sys.executable)} -m gpuaccept healthcheck --mode {mode} {HC_ARGS} "
        f"--report-dir {b}/reports-{mode} >> {b}/{mode}.log 2>&1",
        "rc=$?",
        f'echo "{mode} job=$SLURM_JOB_ID node=$SLURMD_NODENAME exit $rc" >> {b}/{mode}.log',
        'exit "$rc"',
        "",
    ])


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    require(*DAEMONS, "scontrol", "sinfo", "sbatch", "squeue", "scancel")
    cluster = LocalSlurm(nodes=1, extra_conf=["Prolog={base}/prolog.sh", "Epilog={base}/epilog.sh",
                                              "PrologFlags=Alloc"])
    for mode in ("prolog", "epilog"):
        script = cluster.base / f"{mode}.sh"
        script.write_text(_wrapper(cluster.base, mode))
        script.chmod(0o755)
    with cluster:
        yield cluster


def _node(c: LocalSlurm) -> NodeState:
    r = c.run("scontrol", "show", "node", "-o", NODE)
    assert r.returncode == 0, r.stderr
    return parse_scontrol_node(r.stdout, NODE)


def _job(c: LocalSlurm, job: str) -> dict[str, str]:
    """``scontrol show job -o`` as KEY=VALUE pairs (the values used here have no spaces)."""
    out = c.run("scontrol", "show", "job", "-o", job).stdout
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def _log(c: LocalSlurm, mode: str) -> str:
    path = c.base / f"{mode}.log"
    return path.read_text() if path.exists() else ""


def _until(ok: Callable[[], bool], what: str, c: LocalSlurm) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {WAIT_S:g} s: {_node(c)}; prolog log: "
                                 f"{_log(c, 'prolog')[-800:]}; epilog log: {_log(c, 'epilog')[-800:]}")
        time.sleep(0.3)


def _submit(c: LocalSlurm, out: Path) -> str:
    r = c.run("sbatch", "--parsable", "-w", NODE, "-o", str(out), "--wrap", 'echo "job ran on $SLURMD_NODENAME"')
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _epilog_done(c: LocalSlurm, job: str) -> bool:
    return f"epilog job={job} node={NODE} exit" in _log(c, "epilog") and "COMPLETING" not in _node(c).states


@pytest.fixture
def clean(slurm: LocalSlurm) -> Iterator[LocalSlurm]:
    """No fault file before; after: faults removed, held jobs cancelled, the node back in service."""
    yield slurm
    for name in ("fault", "fault-prolog", "fault-epilog"):
        (slurm.base / name).unlink(missing_ok=True)
    slurm.run("scancel", "--user", slurm.user)
    _until(lambda: not slurm.queued_jobs(), "no job left", slurm)
    if _node(slurm).drained:
        slurm.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
    _until(lambda: not _node(slurm).drained, "back in service", slurm)


def test_a_healthy_node_runs_the_job_after_the_prolog_and_stays_in_service(clean: LocalSlurm,
                                                                           tmp_path: Path) -> None:
    c = clean
    out = tmp_path / "job.out"
    job = _submit(c, out)
    assert c.wait_job(job) == "COMPLETED"
    assert out.read_text() == f"job ran on {NODE}\n"
    _until(lambda: _epilog_done(c, job), "the epilog ran", c)
    for mode in ("prolog", "epilog"):  # slurmd ran each, for this job, on this node
        log = _log(c, mode)
        assert f"{mode} job={job} node={NODE} exit 0" in log, log
        assert "[HEALTHCHECK] HEALTHY" in log and "slurm: node1 in service" in log
    assert not _node(c).drained


def test_a_failing_prolog_holds_the_job_and_drains_the_node_with_our_reason(clean: LocalSlurm,
                                                                            tmp_path: Path) -> None:
    c = clean
    (c.base / "fault").write_text("disk_space:no room on /scratch\n")
    out = tmp_path / "job.out"
    job = _submit(c, out)
    _until(lambda: _job(c, job).get("Reason") == "launch_failed_requeued_held" and _epilog_done(c, job),
           "the job requeued held and the epilog done", c)
    info = _job(c, job)
    assert (info["JobState"], info["Restarts"]) == ("PENDING", "1"), info
    assert not out.exists()  # the batch script never started
    n = _node(c)
    assert n.drained and n.ours, n
    assert c.run("sinfo", "-h", "-n", NODE, "-o", "%T").stdout.strip() == "drained"
    assert n.reason == f"GA-DSK-001 gpuaccept:job disk_space: injected fault ({FAULT_ENV}): no room on /scratch", n
    assert f"prolog job={job} node={NODE} exit 1" in _log(c, "prolog")
    assert f"[job {job}] prolog failed status=1:0" in (c.base / "log" / f"slurmd-{NODE}.log").read_text()
    # slurmd ran the epilog for the held job too; it sees the same fault and leaves our drain as it is
    epilog = _log(c, "epilog")
    assert f"epilog job={job} node={NODE} exit 1" in epilog and "node1 already drained with this reason" in epilog


def test_a_failing_epilog_drains_the_node_after_the_job_ran(clean: LocalSlurm, tmp_path: Path) -> None:
    c = clean
    (c.base / "fault-epilog").write_text("health:XID 79\n")
    out = tmp_path / "job.out"
    job = _submit(c, out)
    assert c.wait_job(job) == "COMPLETED"
    assert out.read_text() == f"job ran on {NODE}\n"
    _until(lambda: _epilog_done(c, job) and _node(c).drained, "the node drained after the epilog", c)
    n = _node(c)
    assert n.reason == f"GA-XID-079 gpuaccept:node health: injected fault ({FAULT_ENV}): XID 79" and n.ours, n
    assert f"JobId={job} epilog error on {NODE}, draining the node" in \
        (c.base / "log" / "slurmctld.log").read_text()
    # a drained node takes no new job: the next one waits
    nxt = _submit(c, tmp_path / "next.out")
    _until(lambda: _job(c, nxt).get("Reason", "None") != "None", "the scheduler looked at the next job", c)
    info = _job(c, nxt)
    assert info["JobState"] == "PENDING" and "ReqNodeNotAvail" in info["Reason"], info


def test_a_fault_only_the_prolog_saw_is_cleared_by_the_epilog_and_the_job_stays_held(clean: LocalSlurm,
                                                                                     tmp_path: Path) -> None:
    """NHC semantics: a healthy run resumes our own drain, and slurmd runs the Epilog after a failed Prolog."""
    c = clean
    (c.base / "fault-prolog").write_text("disk_space:transient\n")
    job = _submit(c, tmp_path / "job.out")
    _until(lambda: _epilog_done(c, job) and not _node(c).drained, "the epilog resumed the node", c)
    assert "node1 resumed (was: GA-DSK-001 gpuaccept:job disk_space: injected fault" in _log(c, "epilog")
    assert _job(c, job)["Reason"] == "launch_failed_requeued_held"  # the job waits for scontrol release
    assert not (tmp_path / "job.out").exists()
