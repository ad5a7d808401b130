"""``gpuaccept healthcheck --budget``: the window planned from estimates calibrated on this host's past
runs (the four checks always, extras and deeper levels where they fit), on this machine's CPU."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuaccept.checks import registry
from gpuaccept.health.plan import CHECKS, EXTRAS, health_candidates, plan_health, plan_health_budget
from gpuaccept.health.run import WindowHealthRunner
from gpuaccept.model import Status
from gpuaccept.node.budget import BudgetPlan, Choice, Depth
from gpuaccept.node.calibrate import MAX_FACTOR, MIN_FACTOR
from gpuaccept.node.config import Config
from tests.helpers import gpuaccept, validate_report


def _hc(tmp_path: Path, *args: str, timeout: float = 180) -> tuple[int, list[str], dict[str, Any]]:
    r = gpuaccept("healthcheck", "--device", "cpu", "--report-dir", str(tmp_path / "rep"), *args, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    summary = lines[-1]
    report = validate_report(Path(summary.rsplit("report: ", 1)[1]))
    return r.returncode, lines, report


def test_without_a_budget_the_fast_plan_runs_and_records_its_estimates(tmp_path: Path) -> None:
    code, lines, report = _hc(tmp_path)
    assert code == 0 and len(lines) == 1, lines
    assert [c["name"] for c in report["checks"]] == ["env", "health", "disk_space", "compute"]
    assert set(report["estimates"]) == set(CHECKS) and "budget" not in report


def test_a_budget_plans_extras_and_learns_from_the_history(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'h.db'}"
    code, lines, first = _hc(tmp_path, "--budget", "20", "--db", db, "-v")
    assert code == 0, lines
    assert any(line.startswith("[BUDGET] estimates: built in (no past run of this host on this device in")
               for line in lines), lines
    names = [c["name"] for c in first["checks"]]
    assert set(names[:4]) == set(CHECKS) and set(names[4:]) <= set(EXTRAS), names  # the four first
    assert "memtest" in names and first["budget"]["calibration"]["runs"] == 0
    kept = {k["name"] for k in first["budget"]["kept"]}
    assert set(first["estimates"]) == kept and set(CHECKS) <= kept
    code, lines, second = _hc(tmp_path, "--budget", "20", "--db", db, "-v")
    assert code == 0, lines
    cal = second["budget"]["calibration"]
    assert cal["runs"] == 1 and {"env", "compute", "disk_space"} <= set(cal["factors"])
    assert any(line.startswith("[BUDGET] estimates: calibrated from 1 past runs of this host") for line in lines)
    by_name = {c["name"]: c for c in first["checks"]}
    # measured / estimated, clamped as calibrate clamps it (env often runs in under 2 % of its 3.5 s estimate)
    env_factor = min(MAX_FACTOR, max(MIN_FACTOR, by_name["env"]["duration_s"] / first["estimates"]["env"]))
    assert abs(cal["factors"]["env"] - env_factor) < 2e-3
    assert lines[-1].startswith("[HEALTHCHECK] HEALTHY in ")


def test_a_budget_without_a_history_says_so(tmp_path: Path) -> None:
    code, lines, report = _hc(tmp_path, "--budget", "30", "--skip", "memtest,memory", "-v")
    assert code == 0, lines
    assert "[BUDGET] estimates: built in (no --db: the history is not read)" in lines
    assert {c["name"] for c in report["checks"]}.isdisjoint({"memtest", "memory"})


def test_an_extra_the_window_has_no_time_left_for_is_skipped_not_failed(tmp_path: Path) -> None:
    reg = registry()
    plan = plan_health(Config(), reg, "cpu", budget_s=30.0, skip=["health", "compute", "fabric", "memory"],
                       require_gpu=False, extras=True)
    cands = health_candidates(plan, Config(), reg, 0)
    plan, chosen = plan_health_budget(plan, Config(), reg, cands, 30.0, 0, False)
    assert [c.name for c in plan.checks] == ["env", "disk_space", "memtest"]
    # the plan said memtest needs far more than what will be left once the four have run
    kept = [k if k.name != "memtest" else Choice(k.name, k.level, k.planned_level, k.params, {}, 1e4, "", Depth(0))
            for k in chosen.kept]
    budget = BudgetPlan(30.0, 1.0, 0.0, 0, False, kept, [])
    runner = WindowHealthRunner(plan, tmp_path, deadline=time.monotonic() + 30.0, budget=budget, candidates=cands,
                                registry=reg, config=Config(), warm=False)
    report = runner.run()
    status = {c.name: c for c in report.checks}
    assert status["env"].status is Status.PASS and status["disk_space"].status is Status.PASS
    memtest = status["memtest"]
    assert memtest.status is Status.SKIP and "(an extra, not a fault)" in memtest.reason
    assert report.verdict.value == "success"


def test_a_suspect_result_is_run_again_deeper_within_the_window(tmp_path: Path) -> None:
    cfg = tmp_path / "warn.yaml"  # no CPU copies at 1 PB/s: memory warns on every run, and a WARN is suspect
    cfg.write_text("checks:\n  memory:\n    thresholds:\n"
                   "      - {metric: stream_copy_gbs, min: 1000000, severity: warn}\n")
    code, lines, report = _hc(tmp_path, "--budget", "30", "--config", str(cfg), "--skip", "memtest,fabric")
    assert code == 0, lines  # a warning is not a node fault
    assert "memory WARN" in lines[-1] and "memory (re-run) WARN" in lines[-1], lines
    memory = [c for c in report["checks"] if c["name"] == "memory"]
    assert len(memory) == 2 and "rerun" in memory[1]["details"] and "rerun" not in memory[0].get("details", {})
    rerun = report["budget"]["reruns"][0]
    assert rerun["name"] == "memory" and rerun["why"].startswith("it warned: ") and rerun["first"]["status"] == "warn"
    first = next(k for k in report["budget"]["kept"] if k["name"] == "memory")
    assert rerun["level"] != first["level"]  # deeper than the first pass
