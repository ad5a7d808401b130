"""The warm process imports later checks' ``warm_imports`` beside a check that sets ``imports_beside``.

Real processes; ordering, not timing: a module that writes when it is imported (and by which process)
against the time the check it was imported beside (or not) ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaccept.checks import registry
from gpuaccept.checks.base import Check
from gpuaccept.model import CheckResult, Status
from gpuaccept.node.config import Config
from gpuaccept.node.runner import Runner
from gpuaccept.node.suite import RunOptions, plan_suite
from gpuaccept.node.warm import WarmProcess
from tests.helpers import ROOT, alive, cli_env, descendants, only_run_dir, validate_report
from tests.plugins import preload_checks, state_checks
from tests.plugins.preload_checks import STAMPS_ENV

REG: dict[str, type[Check]] = {c.name: c for c in (*preload_checks.CHECKS, state_checks.Stuck, state_checks.Probe)}
STAMP = "tests.plugins.stamp_import"


@pytest.fixture(autouse=True)
def _stamps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    monkeypatch.setenv(STAMPS_ENV, str(stamps))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("GPUACCEPT_ZYGOTE", raising=False)
    return stamps


def _run(tmp_path: Path, checks: list[str], forked: bool = True, **timeouts: float) \
        -> tuple[Runner, int, dict[str, CheckResult]]:
    """Run ``checks`` in this order, forked from a warm process (all of them, unless ``forked`` is False),
    with these timeouts (s): (the runner, the warm process's pid, the results by name); no process is left."""
    before = set(descendants(os.getpid()))
    plan = plan_suite(RunOptions(checks=checks), Config(), {n: REG[n] for n in checks}, "cpu")
    assert [c.name for c in plan.checks] == checks
    for c in plan.checks:
        c.timeout_s = timeouts.get(c.name, c.timeout_s)
    warm = WarmProcess()
    runner = Runner(plan, tmp_path / "reports", host="testhost", warm=warm)
    report = runner.run()
    assert not [p for p in descendants(os.getpid()) if p not in before and alive(p)]
    results = {c.name: c for c in report.checks}
    if forked:
        assert all("gpuaccept.node.zygote" in r.details["parent"] for r in results.values()), "forked, not spawned"
    return runner, warm.proc.pid, results


def _stamp(stamps: Path, name: str) -> tuple[float, int]:
    """(time, pid) of the one line in stamp file ``name``."""
    line, = (stamps / name).read_text().splitlines()
    when, pid = line.split()
    return float(when), int(pid)


def test_a_later_checks_import_runs_beside_a_quiet_check(tmp_path: Path, _stamps: Path) -> None:
    _, warm_pid, results = _run(tmp_path, ["quiet", "needs_stamp"])
    imported, by = _stamp(_stamps, "import.stamp")
    quiet_end, _ = _stamp(_stamps, "quiet.end")
    assert by == warm_pid, "the warm process imported it, once"
    assert imported < quiet_end, "imported while quiet still slept, not before needs_stamp's fork"
    needs = results["needs_stamp"]
    assert needs.status is Status.PASS and needs.details["inherited"] is True
    note = needs.details["preloaded"]
    assert note["modules"] == [STAMP] and note["beside"] == "quiet" and note["failed"] == []
    assert isinstance(note["seconds"], float) and note["seconds"] >= 0
    assert "preloaded" not in results["quiet"].details


def test_nothing_is_imported_beside_a_check_that_is_not_quiet(tmp_path: Path, _stamps: Path) -> None:
    runner, warm_pid, results = _run(tmp_path, ["busy", "needs_stamp"])
    imported, by = _stamp(_stamps, "import.stamp")
    busy_end, _ = _stamp(_stamps, "busy.end")
    assert by == warm_pid
    assert imported > busy_end, "imported before needs_stamp's fork, after busy ended"
    assert results["needs_stamp"].status is Status.PASS and results["needs_stamp"].details["inherited"] is True
    assert "preloaded" not in results["needs_stamp"].details and runner.preloads == []


def test_each_module_is_preloaded_once_beside_the_first_quiet_check(tmp_path: Path, _stamps: Path) -> None:
    """quiet2 finds nothing left to ask for; busy, forked while the preload may still run, is forked after it."""
    runner, _, results = _run(tmp_path, ["quiet", "busy", "quiet2", "needs_stamp"])
    assert [(p.beside, p.modules) for p in runner.preloads] == [("quiet", [STAMP])]
    imported, _ = _stamp(_stamps, "import.stamp")
    assert imported < _stamp(_stamps, "quiet.end")[0]
    assert results["needs_stamp"].details["preloaded"]["beside"] == "quiet"
    assert all(r.status is Status.PASS for r in results.values())


def test_a_preload_that_fails_to_import_breaks_nothing(tmp_path: Path) -> None:
    """The module raises in the warm process's preload (reported, not fatal), again at needs_broken's fork
    (suppressed, as ever), and in the check itself, which reports its own failure; the next check is still
    forked from the same warm process."""
    runner, _, results = _run(tmp_path, ["quiet", "needs_broken", "needs_stamp"])
    broken = results["needs_broken"]
    assert broken.status is Status.FAIL and "cannot import what it needs" in broken.reason, broken.reason
    assert "on purpose" in broken.reason
    note = broken.details["preloaded"]
    assert note["beside"] == "quiet" and note["modules"] == ["tests.plugins.broken_import"]
    assert len(note["failed"]) == 1 and "RuntimeError" in note["failed"][0], note
    assert [p.modules for p in runner.preloads] == [["tests.plugins.broken_import", STAMP]]
    assert results["quiet"].status is Status.PASS
    assert results["needs_stamp"].status is Status.PASS and results["needs_stamp"].details["preloaded"]["failed"] == []
    assert results["needs_broken"].details["parent"] == results["needs_stamp"].details["parent"]


def test_a_hung_import_beside_a_quiet_check_does_not_hold_up_its_end(tmp_path: Path, _stamps: Path) -> None:
    """stuck's warm import never ends. Beside quiet, whose end the warm process still reports (quiet passes
    within a timeout shorter than the import); stuck's own fork waits behind it, so stuck is an ERROR naming the
    warm process, which is killed as stuck, and the rest start the old way."""
    runner, _, results = _run(tmp_path, ["quiet", "stuck", "probe"], forked=False, quiet=8.0, stuck=2.0)
    assert [(p.beside, p.modules, p.seconds) for p in runner.preloads] == [
        ("quiet", ["tests.plugins.hang_import"], None)], "never answered"
    quiet = results["quiet"]
    assert quiet.status is Status.PASS and "gpuaccept.node.zygote" in quiet.details["parent"], quiet.reason
    stuck = results["stuck"]  # never forked: the warm process's fault, named, not the check's FAIL
    assert stuck.status is Status.ERROR and "did not fork the check before its 2 s limit" in stuck.reason, stuck
    assert runner.warm_off is not None and "stopped" in runner.warm_off
    probe = results["probe"]
    assert probe.status is Status.PASS and "gpuaccept.node.zygote" not in probe.details["parent"]


def test_the_checks_that_only_take_stock_let_the_warm_process_import_beside_them() -> None:
    reg = registry()
    quiet = {"env", "conformance", "health", "fabric", "disk_space"}
    timed = {"compute", "memory", "p2p", "memtest", "train", "nbody", "collectives", "ddp_train", "stress", "agreement",
             "reference_train", "throughput", "disk", "nccl_tests", "reference_train_ddp"}
    assert quiet | timed <= set(reg), (quiet | timed) - set(reg)
    assert {n for n in quiet | timed if reg[n].imports_beside} == quiet
    assert not [n for n, c in reg.items() if c.imports_beside and n not in quiet], "a new quiet check: add it here"
    assert "torch._dynamo" in reg["train"].warm_imports and "torch._dynamo" in reg["ddp_train"].warm_imports


def test_the_quick_profile_preloads_torch_dynamo_beside_env(tmp_path: Path) -> None:
    """The real quick suite: torch._dynamo (train's and ddp_train's) is imported beside env, the first check,
    which train's and ddp_train's results say; nothing is preloaded beside another check."""
    proc = subprocess.run([sys.executable, "-m", "gpuaccept", "run", "--device", "cpu", "--profile", "quick",
                           "--report-dir", str(tmp_path / "reports")], capture_output=True, text=True, timeout=600,
                          env=cli_env(GPUACCEPT_ZYGOTE="1"), cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    report = validate_report(only_run_dir(tmp_path / "reports") / "report.json")
    checks = {c["name"]: c for c in report["checks"]}
    assert report["checks"][0]["name"] == "env"
    noted = {n: c["details"]["preloaded"] for n, c in checks.items() if "preloaded" in c.get("details", {})}
    assert set(noted) == {"train", "ddp_train"}, json.dumps(noted)
    for note in noted.values():
        assert note["beside"] == "env" and note["modules"] == ["torch._dynamo"] and note["failed"] == [], note
        assert note["seconds"] is not None and note["seconds"] > 0
