"""Estimates calibrated from the history (:mod:`gpuaccept.node.calibrate`), the planner's required checks and
ceilings (:mod:`gpuaccept.node.budget`), and ``run --budget`` reading this host's past runs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gpuaccept.errors import GpuacceptError
from gpuaccept.model import CheckResult, NodeReport, Status
from gpuaccept.node.budget import Candidate, Depth, Level, Stretch, estimates_of, plan_budget
from gpuaccept.node.calibrate import (
    MAX_FACTOR,
    MIN_FACTOR,
    NEWEST,
    calibrate,
    calibration,
    from_history,
    planned_with_history,
    samples_of,
)
from gpuaccept.results.history import open_store
from gpuaccept.results.rows import unpack_report
from tests.helpers import gpuaccept, validate_report
from tests.pg_server import shared_server


def report(run_id: str, durations: dict[str, float], estimates: dict[str, float], *, device: str = "cuda",
           status: Status = Status.PASS, host: str = "n1", started: str = "2026-11-24T10:00:00Z") -> NodeReport:
    checks = [CheckResult(name, status, "", duration_s=d) for name, d in durations.items()]
    return NodeReport(run_id=run_id, host=host, profile="quick", started=started, finished=started,
                      checks=checks, device=device, estimates=estimates)


def cand(name: str, *seconds: float, planned: int = 0, required: bool = False, ceiling: int | None = None,
         stretch: Stretch | None = None) -> Candidate:
    levels = tuple(Level(f"l{i}", {"i": i, "duration_s": 12.0}, s, stretch if i == 0 else None)
                   for i, s in enumerate(seconds))
    return Candidate(name, levels, planned, required=required, ceiling=ceiling)


# ---------------------------------------------------------------- factors from past runs


def test_a_factor_is_the_largest_ratio_of_the_newest_results() -> None:
    reports = [report(f"r{i}", {"compute": d}, {"compute": 10.0}) for i, d in enumerate([2.0, 3.0, 1.0, 2.5, 1.5, 9.0])]
    cal = calibration(reports, "cuda", "db")  # newest first: the sixth (9 s) is older than NEWEST results
    assert NEWEST == 5 and cal.factors == {"compute": pytest.approx(0.3)} and cal.results == {"compute": 5}
    assert cal.runs == 5 and "calibrated from 5 past runs" in cal.summary() and "compute x0.3" in cal.summary()


def test_what_does_not_say_how_long_a_check_takes_is_not_learnt() -> None:
    rerun = CheckResult("compute", Status.PASS, "", duration_s=50.0, details={"rerun": {"estimate_s": 1}})
    errored = report("e", {"memory": 99.0}, {"memory": 1.0}, status=Status.ERROR)
    on_cpu = report("c", {"memory": 99.0}, {"memory": 1.0}, device="cpu")
    no_estimates = report("n", {"memory": 99.0}, {})
    mixed = report("m", {"compute": 4.0, "nbody": 0.0, "env": float("nan")}, {"compute": 8.0, "nbody": 1.0, "env": 1.0})
    mixed.checks.append(rerun)
    assert all(samples_of(r, "cuda") == [] for r in (errored, on_cpu, no_estimates))
    assert [(s.name, s.ratio) for s in samples_of(mixed, "cuda")] == [("compute", 0.5)]
    skipped = report("s", {"health": 0.1}, {"health": 2.0}, status=Status.SKIP)  # skips on this host: learnt short
    assert calibration([skipped], "cuda", "db").factors == {"health": pytest.approx(0.05)}


def test_factors_are_clamped() -> None:
    cal = calibration([report("a", {"x": 1e6, "y": 1e-6}, {"x": 1.0, "y": 1.0})], "cuda", "db")
    assert cal.factors == {"x": MAX_FACTOR, "y": MIN_FACTOR}


def test_bad_estimates_in_a_stored_report_are_dropped_not_fatal() -> None:
    raw = report("a", {"x": 1.0}, {}).to_dict()
    raw["estimates"] = {"x": 2.0, "y": float("inf"), "z": -1, "w": "3", "v": True}
    assert NodeReport.from_dict(raw).estimates == {"x": 2.0}
    raw["estimates"] = ["not", "a", "dict"]
    assert NodeReport.from_dict(raw).estimates == {}


def test_calibrate_scales_the_levels_that_ran_here_and_their_stretch() -> None:
    st = Stretch("duration_s", 5.0, 2.0, 1.0)
    cands = [cand("stress", 12.0, 62.0, stretch=st), cand("env", 4.0)]
    cal = calibration([report("a", {"stress": 6.0}, {"stress": 12.0})], "cuda", "db")
    out = calibrate(cands, cal)
    # the deeper level never ran here: a fast host does not shorten its fixed durations
    assert [lv.estimate_s for lv in out[0].levels] == [6.0, 62.0]
    assert out[0].levels[0].at(10.0) == ({"i": 0, "duration_s": 10.0}, pytest.approx(6.0))  # (2 + 1 x 10) x 0.5
    assert out[1] is cands[1]


def test_a_slow_host_lengthens_every_level_and_no_level_costs_more_than_a_deeper_one() -> None:
    slow = calibrate([cand("memtest", 2.0, 10.0, 40.0)],
                     calibration([report("a", {"memtest": 6.0}, {"memtest": 2.0})], "cuda", "db"))
    assert [lv.estimate_s for lv in slow[0].levels] == [6.0, 30.0, 120.0]  # x3 where it never ran too
    deep_seen = calibrate([cand("compute", 2.0, 10.0, 40.0)],
                          calibration([report("a", {"compute": 1.0}, {"compute": 10.0})], "cuda", "db"))
    assert [lv.estimate_s for lv in deep_seen[0].levels] == [1.0, 1.0, 40.0]


def test_levels_are_told_apart_by_their_built_in_estimate() -> None:
    reports = [report("a", {"compute": 1.0}, {"compute": 2.0}), report("b", {"compute": 30.0}, {"compute": 10.0})]
    cal = calibration(reports, "cuda", "db")
    assert cal.levels == {"compute": {2.0: 0.5, 10.0: 3.0}} and cal.factors == {"compute": 3.0}
    out = calibrate([cand("compute", 2.0, 10.0, 40.0)], cal)
    assert [lv.estimate_s for lv in out[0].levels] == [1.0, 30.0, 120.0]


def test_a_calibrated_plan_keeps_what_the_built_in_estimates_leave_out() -> None:
    cands = [cand("env", 4.0), cand("compute", 30.0)]
    assert [c.name for c in plan_budget(cands, 20.0, overhead_s=1.0).left_out] == ["compute"]
    cal = calibration([report("a", {"env": 1.0, "compute": 6.0}, {"env": 4.0, "compute": 30.0})], "cuda", "db")
    fitted = plan_budget(calibrate(cands, cal), 20.0, overhead_s=1.0)
    assert fitted.left_out == [] and [k.name for k in fitted.kept] == ["env", "compute"]


# ---------------------------------------------------------------- required checks, ceilings, recorded estimates


def test_a_required_check_is_kept_over_the_budget_and_the_plan_says_so() -> None:
    chosen = plan_budget([cand("compute", 50.0, required=True), cand("memory", 1.0)], 10.0, overhead_s=1.0)
    assert [k.name for k in chosen.kept] == ["compute"] and [c.name for c in chosen.left_out] == ["memory"]
    assert "0s of the budget was left" in chosen.left_out[0].why
    assert any("more than the budget: they run anyway" in line for line in chosen.lines())


def test_a_ceiling_lets_the_depth_step_go_past_the_planned_level() -> None:
    plain = plan_budget([cand("compute", 1.0, 5.0, 20.0)], 100.0, overhead_s=0.0)
    deep = plan_budget([cand("compute", 1.0, 5.0, 20.0, ceiling=2)], 100.0, overhead_s=0.0)
    tight = plan_budget([cand("compute", 1.0, 5.0, 20.0, ceiling=2)], 10.0, overhead_s=0.0)
    assert plain.kept[0].depth == Depth(0) and plain.kept[0].why == "as planned"
    assert deep.kept[0].depth == Depth(2) and "deeper than the l0 level planned" in deep.kept[0].why
    assert tight.kept[0].depth == Depth(1)  # 5 s fits 10 s less the fifth kept for re-runs; 20 s does not


def test_estimates_recorded_are_the_built_in_ones_at_the_depth_run() -> None:
    raw = [cand("compute", 1.0, 5.0, 20.0, ceiling=2), Candidate("plugin", (Level("quick", {}, 60.0),), 0,
                                                                   estimated=False)]
    assert estimates_of(raw) == {"compute": 1.0}
    cal = calibration([report("a", {"compute": 0.5}, {"compute": 1.0})], "cuda", "db")
    chosen = plan_budget(calibrate(raw, cal), 100.0, overhead_s=0.0)
    assert estimates_of(raw, chosen) == {"compute": 20.0}  # not 10.0: factors must not compound


# ---------------------------------------------------------------- reading the history


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_newest_reports_of_this_host_are_read(tmp_path: Path, backend: str) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}" if backend == "sqlite" else shared_server().new_database()
    with open_store(url) as store:
        for i in range(4):
            store.add_node_report(report(f"r{i}", {"compute": 1.0 + i}, {"compute": 10.0},
                                         started=f"2026-11-24T10:0{i}:00Z"))
        store.add_node_report(report("other", {"compute": 99.0}, {"compute": 1.0}, host="n2"))
        assert [r.run_id for r in store.recent_reports("n1", 3)] == ["r3", "r2", "r1"]
    cal = from_history(url, "n1", "cuda")
    assert cal.factors == {"compute": pytest.approx(0.4)} and cal.runs == 4


def test_no_history_yet_means_the_built_in_estimates(tmp_path: Path) -> None:
    cal = from_history(f"sqlite:///{tmp_path / 'none.db'}", "n1", "cuda")
    assert cal.factors == {} and "built in (no past run" in cal.summary()
    assert not (tmp_path / "none.db").exists()  # reading created nothing


def test_a_history_that_cannot_be_read_costs_a_warning_not_the_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(GpuacceptError):
        from_history(f"sqlite:///{bad}", "n1", "cuda")
    cands = [cand("env", 4.0)]
    out, said, warning = planned_with_history(cands, "cuda", f"sqlite:///{bad}", "n1")
    assert out == cands and said["factors"] == {} and warning is not None and "built-in ones" in warning
    _, off, none = planned_with_history(cands, "cuda", None, "n1", off="--no-history")
    assert none is None and "--no-history: the history is not read" in off["summary"]


# ---------------------------------------------------------------- run --budget, for real


def test_run_budget_learns_from_this_hosts_past_runs(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'h.db'}"
    args = ("run", "--profile", "quick", "--device", "cpu", "--checks", "env,compute,memory", "--db", db)
    first = gpuaccept(*args, "--report-dir", str(tmp_path / "a"), timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    plain = validate_report(next((tmp_path / "a").glob("*/report.json")))
    assert set(plain["estimates"]) == {"env", "compute", "memory"} and "budget" not in plain
    second = gpuaccept(*args, "--budget", "2m", "--report-dir", str(tmp_path / "b"), timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "[BUDGET] estimates: calibrated from 1 past runs of this host" in second.stdout
    rep = validate_report(next((tmp_path / "b").glob("*/report.json")))
    cal = rep["budget"]["calibration"]
    assert set(cal["factors"]) == {"env", "compute", "memory"} and cal["runs"] == 1
    durations = {c["name"]: c["duration_s"] for c in plain["checks"]}
    for name, factor in cal["factors"].items():  # measured / estimated, as the first run recorded them
        assert factor == pytest.approx(min(max(durations[name] / plain["estimates"][name], MIN_FACTOR), MAX_FACTOR),
                                       abs=2e-3)
    kept = {k["name"]: k for k in rep["budget"]["kept"]}
    assert set(rep["estimates"]) == set(kept)
    with sqlite3.connect(tmp_path / "h.db") as conn:
        stored = unpack_report(*conn.execute("SELECT report_json, report_z FROM runs WHERE run_id = ?",
                                             (rep["run_id"],)).fetchone(), "h.db")
    assert stored["estimates"] == rep["estimates"]  # the next plan learns from this one too


def test_run_budget_without_history_says_its_estimates_are_built_in(tmp_path: Path) -> None:
    r = gpuaccept("run", "--plan", "--profile", "quick", "--device", "cpu", "--budget", "1m", "--no-history")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["budget"]["calibration"]["summary"].startswith("estimates: built in (--no-history")


def test_estimates_plan_for_the_selection_else_what_nvml_counted_else_a_full_node() -> None:
    from gpuaccept.node.budget import ASSUMED_GPUS, planned_gpus

    assert planned_gpus("cuda", [0, 3], 8) == (2, False)
    assert planned_gpus("cuda", None, 4) == (4, False)
    assert planned_gpus("cuda", None, 0) == (ASSUMED_GPUS, True)
    assert planned_gpus("cpu", [0], 8) == (0, False)
