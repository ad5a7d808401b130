"""``gpuaccept healthcheck``: the pure parts (node name, ``scontrol show node`` parser on recorded outputs,
drain/resume decision, reason text, plan, budget, exit codes), the disk check, and the command on this
machine's CPU (bad input, the summary line, the budget, injected faults). The Slurm drain and resume are
tested on the real local cluster in ``tests/test_healthcheck_slurm.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuaccept.checks import registry
from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.disk_space import DiskSpaceCheck, Space, judge_space
from gpuaccept.errors import InputError, UsageError
from gpuaccept.health.plan import (
    CHECKS,
    MIN_BUDGET_S,
    Ending,
    check_budget,
    exit_code,
    plan_health,
)
from gpuaccept.health.run import FAULT_ENV, budget_end, injected_fault
from gpuaccept.health.slurm import (
    MAX_REASON,
    NodeState,
    decide,
    drain_argv,
    parse_scontrol_node,
    reason_text,
    resume_argv,
    this_node,
)
from gpuaccept.model import CheckResult, Status, Verdict
from gpuaccept.node.config import CheckSettings, Config
from tests.helpers import cli_env, gpuaccept, validate_report
from tests.launch_support import SLURM_DATA, one_error_line


def _data(name: str) -> str:
    return (SLURM_DATA / name).read_text()


# ------------------------------------------------------------------ node name

def test_node_name_flag_then_slurmd_nodename_then_short_hostname() -> None:
    env = {"SLURMD_NODENAME": "gpu17"}
    assert this_node("gpu03", env, "host.example.org") == ("gpu03", "--node")
    assert this_node(None, env, "host.example.org") == ("gpu17", "SLURMD_NODENAME")
    assert this_node(None, {}, "host.example.org") == ("host", "the host name")
    assert this_node(None, {"SLURMD_NODENAME": ""}, "h2") == ("h2", "the host name")


@pytest.mark.parametrize("bad", ["gpu[01-04]", "a b", "x=y", "-rf", "", "n;reboot"])
def test_a_name_that_is_not_one_node_is_refused(bad: str) -> None:
    if not bad:
        with pytest.raises(UsageError, match="no node name"):
            this_node(bad, {}, "")
        return
    with pytest.raises(UsageError, match="is not a Slurm node name"):
        this_node(bad, {}, "host")


# ------------------------------------------------------------------ scontrol show node (recorded)

@pytest.mark.parametrize(("name", "node", "states", "reason", "drained", "ours"), [
    ("scontrol_node_idle.txt", "node1", ("IDLE",), "", False, False),
    ("scontrol_node_drained_ours.txt", "node1", ("IDLE", "DRAIN"), "gpuaccept: compute: injected fault", True, True),
    ("scontrol_node_drained_multiline.txt", "node1", ("IDLE", "DRAIN"), "gpuaccept: compute: injected fault",
     True, True),
    ("scontrol_node_drained_admin.txt", "node2", ("IDLE", "DRAIN"), "bad DIMM, ticket 4711", True, False),
    ("scontrol_node_draining_job.txt", "node2", ("MIXED", "DRAIN"), "gpuaccept: health: XID 79 on GPU 3",
     True, True),
])
def test_scontrol_show_node_recorded(name: str, node: str, states: tuple[str, ...], reason: str,
                                     drained: bool, ours: bool) -> None:
    got = parse_scontrol_node(_data(name), node)
    assert got.states == states and got.reason == reason
    assert got.drained is drained and got.ours is ours
    if reason:
        assert got.reason_by == "root"


@pytest.mark.parametrize("name", ["scontrol_node_unknown.txt", "scontrol_no_cluster.stderr.txt",
                                  "scontrol_update_unknown.stderr.txt"])
def test_what_is_not_a_node_record_is_refused(name: str) -> None:
    with pytest.raises(InputError, match="expected a NodeName= record"):
        parse_scontrol_node(_data(name), "nosuch")


def test_a_record_of_another_node_or_without_state_is_refused() -> None:
    with pytest.raises(InputError, match="the record is for 'node1'"):
        parse_scontrol_node(_data("scontrol_node_idle.txt"), "node2")
    with pytest.raises(InputError, match="no State="):
        parse_scontrol_node("NodeName=n1 Arch=x86_64\n", "n1")


def test_isolates_drain_is_not_ours_to_resume() -> None:
    n = NodeState("n1", ("IDLE", "DRAIN"), "gpuaccept: isolated: failed with n2 (3.1 GB/s)")
    assert n.drained and not n.ours


# ------------------------------------------------------------------ reason and argv

def test_reason_is_one_slurm_safe_line_and_truncated() -> None:
    assert reason_text("compute", "wrong answer on cuda:3") == "gpuaccept: compute: wrong answer on cuda:3"
    r = reason_text("health", 'XID 79\non "GPU 3"\t\x1b[31m ' + "é" * 5 + "x" * 300)
    assert r.startswith("gpuaccept: health: XID 79 on GPU 3 [31m")
    assert len(r) == MAX_REASON and r.endswith("...") and r.isascii() and r.isprintable()
    assert '"' not in r and "\n" not in r
    assert reason_text("", "nothing measured") == "gpuaccept: nothing measured"


def test_argv_is_a_list_without_a_shell() -> None:
    assert drain_argv("gpu01", "gpuaccept: disk_space: /tmp 0.1 GiB free") == [
        "scontrol", "update", "NodeName=gpu01", "State=DRAIN", "Reason=gpuaccept: disk_space: /tmp 0.1 GiB free"]
    assert resume_argv("gpu01", "/usr/bin/scontrol") == ["/usr/bin/scontrol", "update", "NodeName=gpu01",
                                                         "State=RESUME"]


# ------------------------------------------------------------------ decision

IDLE = NodeState("n1", ("IDLE",))
OURS = NodeState("n1", ("IDLE", "DRAIN"), "gpuaccept: compute: old", "root")
ADMIN = NodeState("n1", ("IDLE", "DRAIN"), "bad DIMM", "root")
DOWN = NodeState("n1", ("DOWN",), "Not responding")
R = "gpuaccept: compute: new"


def test_a_fault_drains_a_node_in_service_or_drained_by_us_for_another_reason() -> None:
    a = decide(IDLE, False, R)
    assert a.kind == "drain" and a.argv == tuple(drain_argv("n1", R))
    assert decide(OURS, False, R).kind == "drain"
    assert decide(DOWN, False, R).kind == "drain"
    assert decide(NodeState("n1", ("IDLE", "DRAIN"), R), False, R).kind == "none"


def test_an_admins_drain_is_never_touched() -> None:
    for healthy in (True, False):
        a = decide(ADMIN, healthy, R)
        assert a.kind == "none" and a.argv == () and "bad DIMM" in a.why
    isolated = NodeState("n1", ("IDLE", "DRAIN"), "gpuaccept: isolated: failed with n2")
    assert decide(isolated, True, R).kind == "none"


def test_healthy_resumes_only_our_drain() -> None:
    a = decide(OURS, True, R, scontrol="/usr/bin/scontrol")
    assert a.kind == "resume" and a.argv == tuple(resume_argv("n1", "/usr/bin/scontrol"))
    assert decide(IDLE, True, R).kind == "none"
    assert decide(DOWN, True, R).kind == "none"  # down, not drained: Slurm's business


# ------------------------------------------------------------------ plan, budget, exit codes

def test_plan_is_four_checks_within_the_budget_and_config_wins() -> None:
    plan = plan_health(Config(), registry(), "cpu", budget_s=12.0)
    assert [c.name for c in plan.checks] == ["env", "health", "disk_space", "compute"]
    assert set(CHECKS) == {c.name for c in plan.checks} and plan.profile == "health"
    assert all(c.timeout_s <= 12.0 for c in plan.checks)
    compute = next(c for c in plan.checks if c.name == "compute")
    assert compute.params["concurrent"] and not compute.params["per_gpu"]
    assert any(r.source == "healthcheck" and r.min_fraction == 0.25 for r in compute.overrides)
    user = Config(source="site.yaml",
                  checks={"disk_space": CheckSettings(params={"paths": ["/scratch"]}, timeout_s=3.0)})
    plan = plan_health(user, registry(), "cuda", budget_s=45.0, skip=["compute"], expect_gpus=8)
    disk = next(c for c in plan.checks if c.name == "disk_space")
    assert disk.params["paths"] == ["/scratch"] and disk.timeout_s == 3.0
    assert "compute" not in {c.name for c in plan.checks} and plan.require_gpu and plan.expect_gpus == 8


@pytest.mark.parametrize("budget", [0.5, MIN_BUDGET_S - 0.1, 3601.0, float("nan")])
def test_budget_outside_its_bounds_is_refused(budget: float) -> None:
    with pytest.raises(UsageError, match="--budget"):
        check_budget(budget)
    assert check_budget(MIN_BUDGET_S) == MIN_BUDGET_S


@pytest.mark.parametrize(("mode", "end", "code"), [
    ("check", Ending(Verdict.SUCCESS), 0),
    ("check", Ending(Verdict.FAILURE), 1),
    ("check", Ending(Verdict.NOTHING_MEASURED), 1),
    ("check", Ending(None, usage_error=True), 2),
    ("check", Ending(None, report_write_failed=True), 4),
    ("check", Ending(Verdict.FAILURE, slurm_failed=True), 6),
    ("check", Ending(Verdict.SUCCESS, slurm_failed=True), 6),
    ("check", Ending(Verdict.INTERRUPTED, interrupted=True), 130),
    ("prolog", Ending(Verdict.SUCCESS), 0),
    ("prolog", Ending(Verdict.FAILURE), 1),
    ("prolog", Ending(Verdict.FAILURE, slurm_failed=True), 1),
    ("prolog", Ending(Verdict.SUCCESS, slurm_failed=True), 0),
    ("prolog", Ending(None, report_write_failed=True), 0),
    ("prolog", Ending(Verdict.RUNNING, report_write_failed=True), 0),
    ("check", Ending(Verdict.RUNNING, report_write_failed=True), 4),
    ("prolog", Ending(Verdict.INTERRUPTED, interrupted=True), 0),
    ("prolog", Ending(None, usage_error=True), 2),
    ("epilog", Ending(Verdict.NOTHING_MEASURED), 1),
    ("epilog", Ending(Verdict.SUCCESS, slurm_failed=True), 0),
    ("check", Ending(Verdict.SUCCESS, out_of_time=True), 3),
    ("check", Ending(Verdict.NOTHING_MEASURED, out_of_time=True), 3),
    ("check", Ending(Verdict.FAILURE, out_of_time=True), 1),
    ("prolog", Ending(Verdict.NOTHING_MEASURED, out_of_time=True), 0),
    ("prolog", Ending(Verdict.FAILURE, out_of_time=True), 1),
])
def test_exit_codes_per_mode(mode: str, end: Ending, code: int) -> None:
    assert exit_code(mode, end) == code


def test_what_the_budget_or_the_warm_process_ended_is_no_fault() -> None:
    not_run = CheckResult("compute", Status.FAIL, "not run: the budget was spent (0.2 s left)",
                          details={"budget": True})
    cut = CheckResult("compute", Status.FAIL, "timed out after 3.0 s", duration_s=3.0, details={"timeout": True})
    unforked = CheckResult("health", Status.ERROR, "not run: the warm process (pid 7) did not fork the check",
                           details={"warm_process": "x", "not_started": True})
    for r, cut_limit in ((not_run, False), (cut, True), (unforked, False)):
        got = budget_end(r, cut_limit)
        assert got.status is Status.SKIP and got.details["budget"] is True, got
    assert budget_end(cut, False) is cut  # its own limit: a hung check is a fault
    failed = CheckResult("health", Status.FAIL, "XID 79")
    assert budget_end(failed, True) is failed


def test_injected_fault_is_inert_without_the_variable() -> None:
    assert injected_fault({}, "compute") is None
    assert injected_fault({FAULT_ENV: "disk_space"}, "compute") is None
    assert injected_fault({FAULT_ENV: "compute:bad sums"}, "compute") == f"injected fault ({FAULT_ENV}): bad sums"


# ------------------------------------------------------------------ disk check

def test_disk_judgement() -> None:
    gib = 1 << 30
    ok = judge_space([Space("/tmp", 50 * gib, 100 * gib)], {}, 1.0, 1.0)
    assert ok.status is Status.PASS and "/tmp 50.0 GiB" in ok.reason
    low = judge_space([Space("/tmp", gib // 2, 100 * gib), Space("/s", 2 * gib, 1000 * gib)], {"/x": "No such file"},
                      1.0, 1.0)
    assert low.status is Status.FAIL
    assert low.reason == ("/x: No such file; /tmp: 0.50 GiB free, below 1 GiB; /s: 0.2 % free, below 1 %")
    assert {(m.name, m.tags["path"]) for m in low.metrics} >= {("disk_free_gib", "/tmp"), ("disk_free_pct", "/s")}


def test_disk_check_reads_this_machine(tmp_path: Path) -> None:
    ctx = CheckContext("cpu", {"paths": [str(tmp_path), str(tmp_path / "gone")], "min_free_gib": 0.0,
                               "min_free_pct": 0.0})
    out = DiskSpaceCheck().run(ctx)
    assert out.status is Status.FAIL and "gone: No such file" in out.reason
    assert DiskSpaceCheck().run(CheckContext("cpu", {**ctx.params, "paths": [str(tmp_path)]})).status is Status.PASS
    assert "disk_space" not in {n for n, c in registry().items() if "quick" in c.profiles}


# ------------------------------------------------------------------ the command (CPU)

def _hc(tmp_path: Path, *args: str, timeout: float = 120, **env: str) -> tuple[int, list[str], str]:
    r = gpuaccept("healthcheck", "--device", "cpu", "--report-dir", str(tmp_path / "rep"), *args,
                  timeout=timeout, **env)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, r.stdout.splitlines(), r.stderr


def test_healthy_cpu_run_prints_one_summary_line(tmp_path: Path) -> None:
    started = time.monotonic()
    code, lines, err = _hc(tmp_path, "--deadline", "40", "--skip", "env")
    assert code == 0, (lines, err)
    assert len(lines) == 1 and lines[0].startswith("[HEALTHCHECK] HEALTHY in "), lines
    assert "health SKIP, disk_space PASS, compute NOT JUDGED" in lines[0]  # no spec to judge a CPU GEMM by
    assert time.monotonic() - started < 40
    run_dir = Path(lines[0].rsplit("report: ", 1)[1]).parent
    report = validate_report(run_dir / "report.json")
    assert report["profile"] == "health" and report["verdict"] == "success" and run_dir.name.startswith("hc-")


def test_injected_fault_is_a_node_fault_in_every_mode(tmp_path: Path) -> None:
    for mode in ("check", "prolog", "epilog"):
        code, lines, _ = _hc(tmp_path, "--skip", "env,compute", "--mode", mode,
                             **{FAULT_ENV: "disk_space:no room on /scratch"})
        assert code == 1 and len(lines) == 1
        assert lines[0].startswith(f"[HEALTHCHECK] FAULT GA-DSK-001 disk_space: injected fault ({FAULT_ENV}): "
                                   "no room on /scratch")


def test_the_budget_bounds_the_run_and_running_out_of_time_is_no_fault(tmp_path: Path) -> None:
    """A check the deadline stops is not judged: no verdict on the node (exit 3; 0 in prolog mode), never a
    fault by itself."""
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("checks:\n  compute: {params: {cpu_size: 1024, warmup_s: 60, warmup_max_s: 60}}\n")
    for mode, want in (("check", 3), ("prolog", 0)):
        started = time.monotonic()
        code, lines, err = _hc(tmp_path, "--deadline", "15", "--skip", "env,health", "--config", str(cfg), "--mode",
                               mode, timeout=60)
        took = time.monotonic() - started
        assert took < 15 + 5, took  # + the interpreter's start-up
        assert code == want, (lines, err)
        assert lines[0].startswith("[HEALTHCHECK] NOT FINISHED: compute ran out of the budget"), lines
        assert "compute ran out of the --deadline (15 s): no verdict on the node" in err
        report = validate_report(Path(lines[0].rsplit("report: ", 1)[1]))
        compute = next(c for c in report["checks"] if c["name"] == "compute")
        assert compute["status"] == "skip" and compute["details"]["budget"] is True
        assert "not a fault of the node" in compute["reason"]


def test_a_fault_found_is_still_a_fault_when_time_ran_out(tmp_path: Path) -> None:
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("checks:\n  compute: {params: {cpu_size: 1024, warmup_s: 60, warmup_max_s: 60}}\n")
    code, lines, _ = _hc(tmp_path, "--deadline", "15", "--skip", "env,health", "--config", str(cfg), timeout=60,
                         **{FAULT_ENV: "disk_space:full"})
    assert code == 1 and lines[0].startswith("[HEALTHCHECK] FAULT GA-DSK-001 disk_space: injected fault"), lines


def test_keep_prunes_old_runs(tmp_path: Path) -> None:
    for _ in range(3):
        assert _hc(tmp_path, "--skip", "env,compute,health", "--keep", "2")[0] == 0
    assert len([p for p in (tmp_path / "rep").iterdir() if p.name.startswith("hc-")]) == 2


def test_keep_never_removes_a_run_still_going(tmp_path: Path) -> None:
    """A second healthcheck ``--keep 1`` while a slow one runs leaves the slow one's directory alone; the slow
    one finishes with its report on disk, and a later run prunes it."""
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("checks:\n  compute: {params: {cpu_size: 1024, warmup_s: 60, warmup_max_s: 60}}\n")
    rep = tmp_path / "rep"
    slow = subprocess.Popen([sys.executable, "-m", "gpuaccept", "healthcheck", "--device", "cpu", "--report-dir",
                             str(rep), "--skip", "env,health", "--config", str(cfg), "--deadline", "15", "--keep",
                             "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.monotonic() + 30
        while not (rep.is_dir() and any(p.name.startswith("hc-") for p in rep.iterdir())):
            assert time.monotonic() < deadline and slow.poll() is None, "the slow run did not start"
            time.sleep(0.1)
        first = next(p for p in rep.iterdir() if p.name.startswith("hc-"))
        time.sleep(1.1)  # a later stamp
        assert _hc(tmp_path, "--skip", "env,compute,health", "--keep", "1")[0] == 0
        assert first.is_dir(), "the running healthcheck's directory was pruned"
        out, err = slow.communicate(timeout=60)
    finally:
        if slow.poll() is None:
            slow.kill()
            slow.wait()
    assert slow.returncode == 3, (out, err)
    assert validate_report(first / "report.json")["verdict"] != "running"
    assert _hc(tmp_path, "--skip", "env,compute,health", "--keep", "1")[0] == 0
    assert not first.exists() and len([p for p in rep.iterdir() if p.name.startswith("hc-")]) == 1


@pytest.mark.parametrize(("args", "words"), [
    (["--budget", "2"], "--budget 2: must be between 5 and 3600 seconds"),
    (["--budget", "-1"], "--budget"),
    (["--skip", "nbody"], "--skip: 'nbody' is not one of env, health, compute, disk_space, fabric, memory, memtest"),
    (["--skip", "memtest"], "--skip memtest: the extras (fabric, memory, memtest) run only with --budget"),
    (["--skip", "env,health,compute,disk_space", "--budget", "30"], "--skip leaves none of the four checks"),
    (["--skip", "env", "--expect-gpus", "8"], "--expect-gpus is enforced by the env check"),
    (["--slurm", "drain", "--node", "gpu[1-2]"], "is not a Slurm node name"),
    (["--mode", "prolog", "--budget", "1"], "--budget 1"),
    (["--deadline", "4000"], "--deadline 4000: must be between 5 and 3600 seconds"),
    (["--deadline", "20", "--budget", "20"], "--budget and --deadline: give one"),
    (["--slurm", "drain", "--deadline", "5"], "--deadline 5 with --slurm: 5 s of it is kept for scontrol, leaving 0 s "
                                              "for the checks (at least 5); give --deadline 10 or more"),
    (["--slurm", "print", "--deadline", "8", "--mode", "prolog"], "leaving 3 s for the checks"),
    (["--slurm", "drain", "--budget", "9.5"], "--budget 9.5 with --slurm"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    r = gpuaccept("healthcheck", "--device", "cpu", "--report-dir", str(tmp_path / "rep"), *args)
    assert words in one_error_line(r)
    assert not (tmp_path / "rep").exists()  # nothing ran


def test_slurm_drain_outside_a_slurm_node_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """No cluster here: SLURM_CONF naming no file, scontrol finding no configuration, or no scontrol."""
    rep = tmp_path / "rep"
    r = gpuaccept("healthcheck", "--device", "cpu", "--slurm", "drain", "--report-dir", str(rep),
                  SLURM_CONF=str(tmp_path / "no-such-slurm.conf"))
    line = one_error_line(r)
    assert line.startswith("gpuaccept: error: --slurm drain: SLURM_CONF=") and "nothing was run or drained" in line
    env = {k: v for k, v in cli_env().items() if not k.startswith("SLURM")}
    for path in (os.environ.get("PATH", ""), str(tmp_path)):  # the real scontrol if installed; then none on PATH
        r = subprocess.run([sys.executable, "-m", "gpuaccept", "healthcheck", "--device", "cpu", "--slurm", "drain",
                            "--report-dir", str(rep)], capture_output=True, text=True, timeout=60, check=False,
                           env={**env, "PATH": path})
        line = one_error_line(r)
        assert line.startswith("gpuaccept: error: --slurm drain: ") and "nothing was run or drained" in line
    assert not rep.exists()
