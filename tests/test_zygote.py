"""Check processes forked from the warm process (gpuaccept.node.zygote): the guarantees of a process per check.

Real processes throughout. Each test checks that its checks really were forked by the warm process
(a probe reports its parent), so none passes by running the old spawn path.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks.base import Check
from gpuaccept.model import CheckResult, NodeReport, Status
from gpuaccept.node.config import Config
from gpuaccept.node.runner import RunEvents, Runner
from gpuaccept.node.suite import PlannedCheck, RunOptions, plan_suite
from gpuaccept.node.warm import REAP_S, WarmProcess
from tests.helpers import (
    ROOT,
    alive,
    cli_env,
    descendants,
    gpuaccept,
    only_run_dir,
    parent_of,
    validate_report,
    wait_for_check_process,
)
from tests.plugins import fake_checks, state_checks

REG: dict[str, type[Check]] = {c.name: c for c in (*fake_checks.CHECKS, *state_checks.CHECKS)}
Leftover = Callable[[], list[int]]
PLUGINS = "tests.plugins.state_checks,tests.plugins.fake_checks"  # probe runs before nap


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("GPUACCEPT_ZYGOTE", raising=False)


@pytest.fixture
def leftover() -> Leftover:
    """The processes below this one started since the test began and still alive (other tests' fixtures
    may keep servers of their own running)."""
    before = set(descendants(os.getpid()))

    def left(within_s: float = 10.0) -> list[int]:
        """Those still alive ``within_s`` seconds from now at the latest (a killed process may take a moment to
        be reaped on a loaded machine; one that survives that long was left behind)."""
        deadline = time.monotonic() + within_s
        while True:
            alive_now = [p for p in descendants(os.getpid()) if p not in before and alive(p)]
            if not alive_now or time.monotonic() > deadline:
                return alive_now
            time.sleep(0.1)

    return left


def _runner(tmp_path: Path, checks: list[str], *, warm: bool | WarmProcess | None = True,
            events: RunEvents | None = None, **params: dict[str, Any]) -> Runner:
    plan = plan_suite(RunOptions(checks=checks), Config(), {n: REG[n] for n in checks}, "cpu")  # in this order
    for c in plan.checks:
        c.params.update(params.get(c.name, {}))
    return Runner(plan, tmp_path, host="testhost", warm=warm, events=events)


def _by_name(report: NodeReport) -> dict[str, CheckResult]:
    return {c.name: c for c in report.checks}


def _forked(result: CheckResult) -> bool:
    assert result.status is Status.PASS, result.reason
    return "gpuaccept.node.zygote" in result.details["parent"]


def test_checks_are_forked_from_one_warm_process_that_the_run_ends(
        tmp_path: Path, leftover: Leftover) -> None:
    runner = _runner(tmp_path, ["probe", "probe2"])
    report = runner.run()
    probe, probe2 = report.checks
    assert _forked(probe) and _forked(probe2)
    assert probe.details["parent"] == probe2.details["parent"]
    assert probe.details["pid"] != probe2.details["pid"]
    assert runner.warm is None, "the run closes its warm process"
    assert not leftover(), "no process of the run outlives it"
    assert not (runner.log_dir / "zygote.log").exists(), "an empty warm-process log is removed"


def test_the_spawn_path_when_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUACCEPT_ZYGOTE", "0")
    runner = _runner(tmp_path, ["probe"], warm=None)
    probe, = runner.run().checks
    assert not _forked(probe) and "gpuaccept.node.child" not in probe.details["parent"]
    assert runner.warm_off == "GPUACCEPT_ZYGOTE=0"


def test_a_check_changes_nothing_for_the_next_one(tmp_path: Path) -> None:
    """Environment, cwd, sys.path, module globals, signal handlers, torch threads, seeds, TF32, matmul
    precision, determinism, default dtype, grad mode: after ``leaky``, a forked ``probe`` sees what a freshly
    started process sees."""
    fresh = _runner(tmp_path / "fresh", ["probe"], warm=False).run().checks[0]
    assert not _forked(fresh)
    leaky, probe, probe2 = _runner(tmp_path / "forked", ["leaky", "probe", "probe2"]).run().checks
    assert leaky.status is Status.PASS and _forked(probe) and _forked(probe2)
    changed = leaky.details["state"]
    expected = fresh.details["state"]
    assert {k for k in expected if changed[k] != expected[k]} >= {
        "env_leak", "cwd", "sys_path_leak", "mark", "sigterm", "sigint", "sigchld", "sigpipe", "torch_threads",
        "torch_seed",
        "torch_random", "tf32_matmul", "tf32_cudnn", "matmul_precision", "deterministic", "default_dtype",
        "grad_enabled", "omp_num_threads"}, "leaky must really change what the probe compares"
    drawn = ("torch_seed", "torch_random")  # a fresh process seeds torch's CPU generator at random
    assert {k: v for k, v in probe.details["state"].items() if k not in drawn} == \
        {k: v for k, v in expected.items() if k not in drawn}
    assert {k: v for k, v in probe2.details["state"].items() if k not in drawn} == \
        {k: v for k, v in expected.items() if k not in drawn}
    # each forked process gets fresh seeds (inherited from the warm process, they would repeat the same draws)
    assert probe.details["random"] != probe2.details["random"]
    assert probe.details["numpy_random"] != probe2.details["numpy_random"]
    assert len({probe.details["state"]["torch_seed"], probe2.details["state"]["torch_seed"], 1234}) == 3
    assert probe.details["state"]["torch_random"] != probe2.details["state"]["torch_random"]


def test_omp_num_threads_given_to_a_process_sets_torchs_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) \
        -> None:
    """The warm process started without OMP_NUM_THREADS; a process asked for with OMP_NUM_THREADS=1 (as a
    rank process on a shared node is) runs torch on one thread, as a fresh interpreter would."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 capture_output=True, text=True, check=True).stdout)
    if default == 1:
        pytest.skip("torch runs one thread here anyway")

    def on_start(check: PlannedCheck, i: int, n: int) -> None:
        if check.name == "probe2":
            os.environ["OMP_NUM_THREADS"] = "1"

    try:
        probe, probe2 = _runner(tmp_path, ["probe", "probe2"], events=RunEvents(on_start=on_start)).run().checks
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)
    assert _forked(probe) and _forked(probe2)
    assert probe.details["state"]["torch_threads"] == default
    assert probe2.details["state"]["torch_threads"] == 1


def test_hung_check_is_killed_at_its_timeout_and_the_warm_process_forks_the_next(tmp_path: Path) -> None:
    runner = _runner(tmp_path, ["hang", "probe"])
    runner.plan.checks[0].timeout_s = 2.0
    started = time.monotonic()
    hang, probe = runner.run().checks
    assert hang.status is Status.FAIL and "timed out after" in hang.reason and "limit 2 s" in hang.reason
    assert 2.0 <= hang.duration_s < 15 and time.monotonic() - started < 60
    assert _forked(probe)


def test_a_check_that_times_out_before_the_warm_process_is_ready_leaves_it_running(tmp_path: Path) -> None:
    """hang's 0.2 s run out while the warm process still imports torch: the request is cancelled, not the warm
    process killed, and the next check is forked from it."""
    runner = _runner(tmp_path, ["hang", "probe"])
    runner.plan.checks[0].timeout_s = 0.2
    hang, probe = runner.run().checks
    assert hang.status is Status.FAIL and "limit 0.2 s" in hang.reason
    assert _forked(probe)


@pytest.mark.parametrize("check,how", [("segv", "SIGSEGV"), ("exits", "exit code 3"), ("crash", "SIGKILL")])
def test_a_crash_is_that_checks_error_only(tmp_path: Path, check: str, how: str) -> None:
    results = _by_name(_runner(tmp_path, [check, "steady", "probe"]).run())
    bad = results[check]
    assert bad.status is Status.ERROR and f"check process died ({how}) without a result" in bad.reason, bad.reason
    assert results["steady"].status is Status.PASS
    assert _forked(results["probe"]), "the warm process outlives a crashed check"


def test_a_dead_warm_process_fails_the_check_in_flight_and_the_rest_start_the_old_way(
        tmp_path: Path, leftover: Leftover) -> None:
    runner = _runner(tmp_path, ["nap", "probe"], nap={"seconds": 30.0})
    warm_pid: list[int] = []

    def kill_warm() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            log = runner.log_dir / "nap.log"
            warm = runner.warm
            if warm is not None and log.exists() and any(p.pid for p in warm.pending.values()):
                warm_pid.append(warm.proc.pid)
                os.kill(warm.proc.pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_warm)
    killer.start()
    started = time.monotonic()
    nap, probe = runner.run().checks
    killer.join()
    assert warm_pid, "the warm process was never seen forking nap"
    assert time.monotonic() - started < 25, "nap died with the warm process, it did not sleep its 30 s"
    assert nap.status is Status.ERROR and "SIGKILL" in nap.reason and "warm process" in nap.reason, nap.reason
    assert probe.status is Status.PASS and not _forked(probe)
    assert not leftover()


def test_a_warm_process_stuck_before_the_fork_is_killed_at_the_checks_timeout(
        tmp_path: Path, leftover: Leftover) -> None:
    warm = WarmProcess()
    assert warm.wait_ready(120) is not None  # stuck in what it imports for the check, not in its first imports
    runner = _runner(tmp_path, ["stuck", "probe"], warm=warm)
    runner.plan.checks[0].timeout_s = 2.0
    stuck, probe = runner.run().checks
    assert stuck.status is Status.ERROR and stuck.duration_s < 10, stuck.reason
    assert stuck.reason.startswith(f"not run: the warm process (pid {warm.proc.pid}) did not fork the check"), \
        stuck.reason
    assert probe.status is Status.PASS and not _forked(probe), "the rest start the old way"
    assert not leftover()


def test_a_warm_process_stopped_before_a_fork_is_replaced_by_a_fresh_process(
        tmp_path: Path, leftover: Leftover) -> None:
    """SIGSTOP on the ready warm process: the fork request gets no answer, so within seconds the warm process is
    killed and the check starts afresh; it passes, and its details name the warm process."""
    warm = WarmProcess()
    assert warm.wait_ready(120) is not None
    os.kill(warm.proc.pid, signal.SIGSTOP)
    runner = _runner(tmp_path, ["probe", "probe2"], warm=warm)
    runner.plan.checks[0].timeout_s = 60.0
    started = time.monotonic()
    probe, probe2 = runner.run().checks
    assert time.monotonic() - started < 40
    assert probe.status is Status.PASS and not _forked(probe), probe.reason
    assert f"the warm process (pid {warm.proc.pid}) is stopped" in probe.details["warm_process"]
    assert probe2.status is Status.PASS and not _forked(probe2)
    assert warm.proc.poll() is not None, "the stopped warm process was killed"
    assert not leftover()


def test_a_warm_process_that_answers_no_fork_request_is_replaced(tmp_path: Path, leftover: Leftover,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm process that reads but never forks (its imports hang) is given up on after its answer time, and
    the check runs afresh within its limit instead of timing out."""
    import gpuaccept.node.warm as warm_mod

    monkeypatch.setattr(warm_mod, "FORK_IMPORT_S", 0.0)
    warm = WarmProcess()
    assert warm.wait_ready(120) is not None
    runner = _runner(tmp_path, ["stuck", "probe"], warm=warm)
    runner.plan.checks[0].timeout_s = 60.0
    started = time.monotonic()
    stuck, probe = runner.run().checks
    assert stuck.status is Status.PASS and stuck.duration_s < 40, stuck.reason
    assert "did not answer a fork request in 5 s" in stuck.details["warm_process"]
    assert probe.status is Status.PASS and not _forked(probe)
    assert time.monotonic() - started < 60
    assert not leftover()


def test_a_stopped_warm_process_cannot_hold_up_the_run(
        tmp_path: Path, leftover: Leftover) -> None:
    """The warm process is stopped (SIGSTOP) while hang runs: it could neither report hang's end nor reap it, so
    it is killed at once, hang starts afresh (and times out on its own), and the run goes on the old way."""
    warm = WarmProcess()
    assert warm.wait_ready(120) is not None  # hang is forked well within its 3 s
    runner = _runner(tmp_path, ["hang", "probe"], warm=warm)
    runner.plan.checks[0].timeout_s = 3.0

    def stop_warm() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            warm = runner.warm
            if warm is not None and any(p.pid for p in warm.pending.values()):
                os.kill(warm.proc.pid, signal.SIGSTOP)
                return
            time.sleep(0.05)

    stopper = threading.Thread(target=stop_warm)
    stopper.start()
    started = time.monotonic()
    hang, probe = runner.run().checks
    stopper.join()
    assert hang.status is Status.FAIL and "timed out" in hang.reason
    assert "is stopped" in hang.details.get("warm_process", ""), hang.details
    assert time.monotonic() - started < 3.0 + REAP_S + 20
    assert probe.status is Status.PASS and not _forked(probe)
    assert not leftover()


def test_the_warm_process_never_touches_cuda_nor_runs_torch() -> None:
    """Read from the source: no ``cuda`` anywhere in the warm process's module, and torch is used only in
    ``Zygote.reset``, which runs in the forked process: a fork after CUDA or an OpenMP pool started is unsafe."""
    tree = ast.parse((ROOT / "src" / "gpuaccept" / "node" / "zygote.py").read_text())
    attrs = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not any("cuda" in a for a in attrs), attrs
    reset = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "reset")
    in_reset = {ast.unparse(n) for n in ast.walk(reset) if isinstance(n, ast.Attribute)}
    torch_uses = {a for a in attrs if a.startswith("torch.")}
    assert torch_uses and torch_uses <= in_reset, torch_uses - in_reset


def test_the_warm_process_starts_no_thread_of_its_own(tmp_path: Path) -> None:
    """As many threads as a fresh interpreter has after the same imports (numpy's OpenBLAS starts one, and
    stops it around fork): a torch operation there would start an OpenMP pool and show up here."""
    runner = _runner(tmp_path, ["probe"])
    runner.prepare()
    try:
        assert runner.warm is not None
        ready = runner.warm.wait_ready(120)
        assert ready is not None and ready["failed"] == [], ready
        code = ("import os, torch, torch.distributed, torch.nn.functional\n"
                "print(len(os.listdir('/proc/self/task')))")
        fresh = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        assert ready["threads"] == fresh
        assert ready["rss_kib"] > 50_000  # torch is imported there
    finally:
        runner.close_warm()


def test_the_cli_forks_and_a_sigkilled_runner_leaves_no_process(tmp_path: Path) -> None:
    env = cli_env(GPUACCEPT_PLUGINS=PLUGINS)
    proc = subprocess.Popen([sys.executable, "-m", "gpuaccept", "run", "--device", "cpu", "--checks", "probe,nap",
                             "--report-dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, cwd=ROOT)
    family = wait_for_check_process(proc, "nap")
    assert len(family) >= 2, "a warm process and the nap check forked from it"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in family):
        time.sleep(0.1)
    assert not [p for p in family if alive(p)], "the warm process and the check in flight die with the runner"
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    assert report["verdict"] == "running" and report["in_flight"] == "nap", report
    probe, = report["checks"]
    assert "gpuaccept.node.zygote" in probe["details"]["parent"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_cli_run_keeps_its_finished_checks_and_leaves_no_process(tmp_path: Path,
                                                                                sig: signal.Signals) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gpuaccept", "run", "--device", "cpu", "--checks", "probe,nap",
                             "--report-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env(GPUACCEPT_PLUGINS=PLUGINS), cwd=ROOT)
    family = wait_for_check_process(proc, "nap")
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert not [p for p in family if alive(p)]
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    assert report["verdict"] == "interrupted" and [c["name"] for c in report["checks"]] == ["probe"]
    assert "gpuaccept.node.zygote" in report["checks"][0]["details"]["parent"]


def test_sigterm_to_every_process_of_the_run_is_an_interrupted_run(tmp_path: Path) -> None:
    """As a scheduler cancelling a job step signals every process in it: the warm process ignores SIGTERM and
    lives until the runner, which handles it, has saved the run as interrupted; nothing is left behind."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuaccept", "run", "--device", "cpu", "--checks", "probe,nap",
                             "--report-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env(GPUACCEPT_PLUGINS=PLUGINS), cwd=ROOT)
    family = wait_for_check_process(proc, "nap")
    assert len(family) == 2, family
    warm = next(p for p in family if parent_of(p) == proc.pid)
    os.kill(warm, signal.SIGTERM)  # whichever process the scheduler signals first
    time.sleep(1.0)
    assert alive(warm) and proc.poll() is None
    for pid in (proc.pid, *family):
        os.kill(pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert not [p for p in family if alive(p)]
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    assert report["verdict"] == "interrupted" and [c["name"] for c in report["checks"]] == ["probe"]


def test_gpuaccept_zygote_0_runs_the_cli_the_old_way(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--checks", "probe", "--report-dir", str(tmp_path),
                  GPUACCEPT_PLUGINS=PLUGINS, GPUACCEPT_ZYGOTE="0")
    assert r.returncode == 0, r.stderr
    probe, = validate_report(only_run_dir(tmp_path) / "report.json")["checks"]
    assert "gpuaccept.node.zygote" not in probe["details"]["parent"] and "gpuaccept run" in probe["details"]["parent"]


@pytest.mark.gpu
def test_the_warm_process_holds_no_gpu_memory(tmp_path: Path) -> None:
    """Once its imports are done, nvidia-smi does not list the warm process (no CUDA context, no GPU memory),
    a process forked from it finds CUDA not initialised, and one forked after the warm process imported
    torch._dynamo (train's warm import) runs a CUDA kernel: the driver was not started before the fork."""
    runner = _runner(tmp_path, ["probe"])
    runner.prepare()
    try:
        assert runner.warm is not None and runner.warm.wait_ready(120) is not None
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert str(runner.warm.proc.pid) not in apps
    finally:
        runner.close_warm()
    probe, kernel = _runner(tmp_path / "run", ["probe", "cuda_kernel"]).run().checks
    assert _forked(probe) and probe.details["state"]["cuda_initialized"] is False
    assert _forked(kernel) and kernel.details["cuda_initialized_before"] is False
