"""The runner with real child processes: timeouts, crashes, incremental files, SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuaccept.checks.base import Check
from gpuaccept.model import Status, Verdict
from gpuaccept.node.config import Config
from gpuaccept.node.runner import Runner
from gpuaccept.node.suite import RunOptions, plan_suite
from tests.helpers import ROOT, cli_env, only_run_dir, validate_report, wait_for_check_process
from tests.plugins import fake_checks

REG: dict[str, type[Check]] = {c.name: c for c in fake_checks.CHECKS}


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def _run(tmp_path: Path, checks: list[str], **opts: object) -> Runner:
    plan = plan_suite(RunOptions(checks=checks, **opts), Config(), REG, "cpu")  # type: ignore[arg-type]
    runner = Runner(plan, tmp_path, host="testhost")
    runner.run()
    return runner


def test_hung_check_is_killed_at_its_timeout_and_the_next_check_runs(tmp_path: Path) -> None:
    plan = plan_suite(RunOptions(checks=["hang", "nap"]), Config(), REG, "cpu")
    assert [c.name for c in plan.checks] == ["hang", "nap"]  # suite order is registry order
    plan.checks[0].timeout_s = 3.0
    plan.checks[1].params["seconds"] = 0.1
    runner = Runner(plan, tmp_path, host="testhost")
    started = time.monotonic()
    report = runner.run()
    assert time.monotonic() - started < 60
    hang, nap = report.checks
    assert hang.status is Status.FAIL and "timed out after" in hang.reason and "limit 3 s" in hang.reason
    assert 3.0 <= hang.duration_s < 20  # killed at the limit, not at the end of the suite
    assert nap.status is Status.PASS and nap.reason == "woke up"
    assert report.verdict is Verdict.FAILURE
    lines = runner.results_path.read_text().splitlines()
    assert [json.loads(x)["name"] for x in lines] == ["hang", "nap"]
    validate_report(runner.report_path)


def test_exception_is_error_with_the_message_and_crash_is_error_with_the_signal(tmp_path: Path) -> None:
    report = _run(tmp_path, ["boom", "crash", "steady"]).report
    steady, boom, crash = report.checks
    assert boom.status is Status.ERROR and "RuntimeError: simulated failure" in boom.reason
    assert crash.status is Status.ERROR and "SIGKILL" in crash.reason and "about to die" in crash.reason
    assert steady.status is Status.PASS


def test_thresholds_from_the_plan_judge_the_metrics(tmp_path: Path) -> None:
    plan = plan_suite(RunOptions(checks=["steady"]), Config(), REG, "cpu")
    plan.checks[0].params["value"] = 1.0  # below the default min 5.0
    report = Runner(plan, tmp_path, host="h").run()
    assert report.checks[0].status is Status.FAIL and "steady_value on cpu 1 < 5 GB/s" in report.checks[0].reason
    assert report.checks[0].metrics[0].threshold is not None


def test_require_gpu_turns_a_gpu_skip_into_a_failure(tmp_path: Path) -> None:
    assert _run(tmp_path / "a", ["gpuonly"]).report.checks[0].status is Status.SKIP
    assert _run(tmp_path / "b", ["gpuonly"], require_gpu=True).report.checks[0].status is Status.FAIL


def _start_cli(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuaccept", "run", "--device", "cpu",
                             "--report-dir", str(tmp_path), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT)


def _wait_for_result(run_dir_parent: Path, name: str, limit: float = 60) -> Path:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for jsonl in run_dir_parent.glob("*/results.jsonl"):
            if any(json.loads(line)["name"] == name for line in jsonl.read_text().splitlines()):
                return jsonl
        time.sleep(0.2)
    raise AssertionError(f"{name} never finished")


def test_sigkill_of_the_runner_keeps_finished_results_and_kills_the_check_in_flight(tmp_path: Path) -> None:
    proc = _start_cli(tmp_path, "--checks", "steady,nap")
    jsonl = _wait_for_result(tmp_path, "steady")
    children = wait_for_check_process(proc, "nap")  # the warm process and the nap check it forked
    assert len(children) >= 2, "the nap check should be running in a process forked by the warm process"
    proc.kill()
    proc.wait()
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [x["name"] for x in lines] == ["steady"] and lines[0]["status"] == "pass"
    report = validate_report(jsonl.parent / "report.json")
    assert report["verdict"] == "running" and [c["name"] for c in report["checks"]] == ["steady"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{c}").exists() for c in children):
        time.sleep(0.1)
    alive = [c for c in children if Path(f"/proc/{c}").exists()
             and "zombie" not in Path(f"/proc/{c}/status").read_text().lower()]
    assert not alive, "the child of a killed runner must die with it"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupt_writes_what_was_measured_and_exits_130(tmp_path: Path, sig: signal.Signals) -> None:
    proc = _start_cli(tmp_path, "--checks", "steady,nap")
    _wait_for_result(tmp_path, "steady")
    wait_for_check_process(proc, "nap")
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "[RESULT] INTERRUPTED" in out and "Traceback" not in err
    run_dir = only_run_dir(tmp_path)
    report = validate_report(run_dir / "report.json")
    assert report["verdict"] == "interrupted" and [c["name"] for c in report["checks"]] == ["steady"]
    assert "INTERRUPTED" in (run_dir / "report.html").read_text()  # the partial report's page
    assert f"[RESULT] report directory: {run_dir} (report.json, report.html)" in out.splitlines()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_an_unfinished_run_shows_its_check_in_flight_as_an_error_in_every_format(tmp_path: Path, how: str) -> None:
    import xml.etree.ElementTree as ET

    from gpuaccept.model import NodeReport
    from gpuaccept.report.html import render_html
    from gpuaccept.report.junit import render_junit
    from gpuaccept.report.markdown import render_markdown

    proc = _start_cli(tmp_path, "--checks", "steady,nap")
    _wait_for_result(tmp_path, "steady")
    wait_for_check_process(proc, "nap")
    if how == "sigkill":
        proc.kill()
        proc.wait()
    else:
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    data = validate_report(only_run_dir(tmp_path) / "report.json")
    assert data["verdict"] == ("running" if how == "sigkill" else "interrupted")
    assert data["in_flight"] == "nap" and [c["name"] for c in data["checks"]] == ["steady"]
    report = NodeReport.from_dict(data)
    root = ET.fromstring(render_junit(report))
    assert root.get("errors") == "1" and root.get("tests") == "2"
    case = root.find(".//testcase[@name='nap']")
    assert case is not None and case.find("error") is not None
    md = render_markdown(report)
    assert re.search(r"\| `nap` \| \*\*ERROR\*\*", md), md
    html = render_html(report)
    assert "nap" in html and ("interrupted while it ran" in html or "did not finish" in html)
