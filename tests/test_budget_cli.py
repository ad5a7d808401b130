"""``gpuaccept run --budget`` on this machine's CPU: the plan ``--plan`` prints, bad input, a budget that fits
nothing, and real runs whose report records the plan, what was left out and a deeper re-run. No timing is
asserted: the plan's estimate against the budget is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_inproc import run_main
from tests.helpers import gpuaccept, only_run_dir, validate_report


@pytest.fixture(autouse=True)
def _empty_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """These plans are made from the built-in estimates: a history of this host (the session's, which other
    tests' runs fill) would calibrate them (tests/test_calibrate.py covers that)."""
    monkeypatch.setenv("GPUACCEPT_DB", f"sqlite:///{tmp_path / 'empty-history.db'}")


def _plan(*args: str) -> dict[str, Any]:
    r = run_main("run", "--plan", "--device", "cpu", *args)
    assert r.rc == 0, r.err
    plan: dict[str, Any] = json.loads(r.out)
    return plan


def test_plan_shows_what_fits_at_which_depth_and_what_was_left_out() -> None:
    plan = _plan("--profile", "standard", "--budget", "60s")
    budget = plan["budget"]
    assert budget["budget_s"] == 60.0 and budget["estimate_s"] <= 60.0 and budget["left_out"] == []
    kept = {c["name"]: c for c in budget["kept"]}
    assert [c["name"] for c in plan["checks"]] == list(kept)
    compute = kept["compute"]
    assert (compute["level"], compute["planned_level"]) == ("quick", "standard")
    assert compute["changed"]["trials"] == [5, 3] and compute["why"].startswith("quick level, ~")
    shown = next(c for c in plan["checks"] if c["name"] == "compute")
    assert shown["params"]["trials"] == 3 and shown["timeout_s"] == 120.0  # the quick level's timeout
    assert kept["env"]["why"] == "as planned"

    wide = _plan("--profile", "standard", "--budget", "1h")["budget"]
    assert all(c["why"] == "as planned" for c in wide["kept"]) and wide["estimate_s"] < 3600.0


def test_plan_leaves_out_what_does_not_fit_and_says_why() -> None:
    budget = _plan("--profile", "full", "--budget", "30s")["budget"]
    out = {c["name"]: c for c in budget["left_out"]}
    assert "stress" in out and out["stress"]["why"].startswith("needs ~") and "of the budget was left" in \
        out["stress"]["why"]
    assert budget["estimate_s"] <= 30.0 and budget["kept"]
    assert set(out).isdisjoint(c["name"] for c in budget["kept"])


def test_a_shortened_duration_shows_in_the_plan() -> None:
    plan = _plan("--profile", "full", "--checks", "env,stress", "--budget", "40s")
    stress = next(c for c in plan["checks"] if c["name"] == "stress")
    assert 10.0 <= stress["params"]["duration_s"] < 30.0
    assert plan["budget"]["kept"][1]["changed"]["duration_s"] == [30.0, stress["params"]["duration_s"]]


@pytest.mark.parametrize(("args", "words"), [
    (["--budget", "0"], "argument --budget: '0' must be more than 0 seconds"),
    (["--budget", "-5m"], "argument --budget: '-5m' must be more than 0 seconds"),
    (["--budget=-5m"], "argument --budget: '-5m' must be more than 0 seconds"),
    (["--budget", "abc"], "argument --budget: 'abc' is not a duration such as 90s, 10m, 1h30m or 2d"),
    (["--budget", "100d"], "argument --budget: '100d' is longer than the maximum, 7d (604800 s)"),
    (["--budget", "nan"], "is not a duration"),
    (["--budget"], "argument --budget: expected one argument"),
])
def test_bad_budgets_exit_2_with_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    line = run_main("run", "--device", "cpu", *args, "--report-dir", str(tmp_path)).one_line_error()
    assert line.startswith("gpuaccept: error: ") and words in line, line
    assert not list(tmp_path.iterdir())


def test_a_budget_that_fits_no_check_is_refused_before_anything_runs(tmp_path: Path) -> None:
    line = run_main("run", "--device", "cpu", "--budget", "5s", "--report-dir", str(tmp_path)).one_line_error()
    assert line.startswith("gpuaccept: error: --budget 5s fits no check; the smallest, ") and "needs ~" in line, line
    line = run_main("run", "--device", "cpu", "--checks", "env,compute", "--budget", "9s",
                    "--report-dir", str(tmp_path)).one_line_error()
    assert "--budget 9s fits no check that measures (only env, which takes stock); the smallest, compute" in line
    assert not list(tmp_path.iterdir())
    line = run_main("run", "--plan", "--device", "cpu", "--budget", "5s").one_line_error()
    assert "fits no check" in line


def test_expect_gpus_needs_env_in_what_the_budget_keeps() -> None:
    line = run_main("run", "--plan", "--device", "cpu", "--checks", "env,memory", "--expect-gpus", "0",
                    "--budget", "8s").one_line_error()  # memory fits, env does not
    assert "--expect-gpus/expect_gpus 0: the env check counts the GPUs" in line, line


def test_a_budgeted_quick_run_records_its_plan(tmp_path: Path) -> None:
    r = gpuaccept("run", "--profile", "quick", "--device", "cpu", "--budget", "60s", "--no-history",
                  "--report-dir", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    budget = report["budget"]
    n = len(budget["kept"])  # every check of quick fits a minute on a CPU
    assert n >= 10 and f"[BUDGET] budget 1m: {n} of {n} checks fit, ~" in r.stdout
    assert budget["budget_s"] == 60.0 and budget["estimate_s"] <= 60.0 and budget["left_out"] == []
    assert [c["name"] for c in report["checks"]] == [c["name"] for c in budget["kept"]]
    assert budget["reruns"] == []  # nothing suspect on a healthy CPU


def test_a_budget_that_leaves_checks_out_runs_only_the_rest(tmp_path: Path) -> None:
    r = gpuaccept("run", "--profile", "quick", "--device", "cpu", "--budget", "20s", "--no-history",
                  "--report-dir", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    budget = report["budget"]
    left_out = [c["name"] for c in budget["left_out"]]
    assert left_out and budget["estimate_s"] <= 20.0
    assert all(f"[BUDGET] left out: {name}: needs ~" in r.stdout for name in left_out)
    ran = [c["name"] for c in report["checks"]]
    assert ran == [c["name"] for c in budget["kept"]] and set(ran).isdisjoint(left_out)


def test_a_suspect_result_is_run_again_deeper_and_the_report_says_why(tmp_path: Path) -> None:
    cfg = tmp_path / "warn.yaml"  # train's loss never falls by 200 %: a WARN on every run
    cfg.write_text("checks:\n  train:\n    thresholds:\n      - {metric: train_loss_drop, min: 2.0, severity: warn}\n")
    r = gpuaccept("run", "--profile", "quick", "--device", "cpu", "--checks", "env,train,memory", "--budget", "2m",
                  "--config", str(cfg), "--no-history", "--report-dir", str(tmp_path / "r"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr  # warnings do not fail the node
    assert "[BUDGET] train: deeper re-run at the standard level, ~" in r.stdout
    assert "[RESULT] train (re-run) WARN" in r.stdout
    report = validate_report(only_run_dir(tmp_path / "r") / "report.json")
    trains = [c for c in report["checks"] if c["name"] == "train"]
    assert [c["status"] for c in trains] == ["warn", "warn"] and "rerun" not in trains[0].get("details", {})
    rerun = trains[1]["details"]["rerun"]
    assert rerun["level"] == "standard" and rerun["why"].startswith("it warned: train_loss_drop")
    assert rerun["changed"]["steps"] == [60, 200] and rerun["first"]["status"] == "warn"
    assert trains[1]["reason"].startswith("deeper re-run at the standard level: ")
    assert trains[1]["metrics"][0]["tags"]["steps"] == 200  # it did run the deeper level
    assert report["budget"]["reruns"] == [rerun]
    assert [c["name"] for c in report["checks"]].count("memory") == 1  # only what was suspect


def test_a_budget_is_refused_under_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    assert run_main("run", "--plan", "--distributed", "--device", "cpu").rc == 0  # the environment is a rank's
    line = run_main("run", "--plan", "--distributed", "--device", "cpu", "--budget", "10m").one_line_error()
    assert "--budget is for a run on one node; under --distributed" in line, line


def test_help_describes_the_budget() -> None:
    r = run_main("run", "--help")
    text = " ".join(r.out.split())  # as wide as the terminal
    assert r.rc == 0 and "--budget DURATION" in text and "fit the run in this window (90s, 10m, 1h30m" in text


def test_launch_passes_the_budget_to_each_node_of_a_per_node_run(tmp_path: Path) -> None:
    r = run_main("launch", "local", "--nodes", "2", "--per-node-only", "--device", "cpu", "--budget", "1h30m",
                 "--results-dir", str(tmp_path), "--dry-run")
    assert r.rc == 0, r.err
    runs = [line for line in r.out.splitlines() if " -m gpuaccept run " in line]
    assert len(runs) == 2 and all(" --budget 5400 " in line for line in runs), r.out
    spec = tmp_path / "spec.yaml"
    spec.write_text("backend: local\nnodes: 1\nsuite:\n  device: cpu\n  budget: 90.5\n")
    r = run_main("launch", "local", "--spec", str(spec), "--results-dir", str(tmp_path), "--dry-run")
    assert r.rc == 0 and " --budget 90.500 " in r.out, r.out + r.err


@pytest.mark.parametrize(("args", "words"), [
    (["--nodes", "2"], "--budget fits one node's run in a window; under --distributed every rank"),
    (["--nodes", "1", "--", "true"], "--budget is a suite option; it does not apply to a command after --"),
    (["--nodes", "1", "--budget", "8d"], "is longer than the maximum, 7d"),
])
def test_launch_refuses_a_budget_it_cannot_honour(tmp_path: Path, args: list[str], words: str) -> None:
    more = [] if "--budget" in args else ["--budget", "10m"]
    line = run_main("launch", "local", *more, "--results-dir", str(tmp_path), "--dry-run", *args).one_line_error()
    assert words in line, line


def test_a_budgeted_node_launched_locally_reports_its_plan(tmp_path: Path) -> None:
    r = gpuaccept("launch", "local", "--nodes", "1", "--device", "cpu", "--profile", "quick", "--checks",
                  "env,compute", "--budget", "60s", "--results-dir", str(tmp_path), "--run-id", "b", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = validate_report(next((tmp_path / "b").rglob("report.json")))
    assert report["budget"]["budget_s"] == 60.0 and [c["name"] for c in report["budget"]["kept"]] == ["env", "compute"]
