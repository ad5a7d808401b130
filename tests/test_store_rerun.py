"""A ``run --budget`` report in the history, on SQLite and a real PostgreSQL: the report (its ``budget``
included) reads back as written; the re-run is stored, flagged ``rerun``, and left out of the series that
trends read (one first-pass value per run); a history written before the flag (schema v3) is migrated
and its re-runs flagged from the stored reports."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gpuaccept.model import NodeReport, Status
from gpuaccept.results import migrations
from gpuaccept.results.history import open_store
from gpuaccept.results.trend import TrendRule, build_trends
from tests.pg_server import shared_server
from tests.report_data import node_budget
from tests.test_store import _raw, write_old_history


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hist' / 'history.db'}"
    return shared_server().new_database()


def _runs(n: int) -> list[NodeReport]:
    """``n`` runs of the recorded budget report, a day apart (run ids and start times changed)."""
    out = []
    for i in range(n):
        rep = copy.deepcopy(node_budget())
        rep.run_id = f"{rep.run_id}-{i}"
        rep.started = f"2026-11-{24 + i:02d}T11:29:29Z"
        rep.finished = f"2026-11-{24 + i:02d}T11:29:34Z"
        out.append(rep)
    return out


def _drop(rep: NodeReport, rerun: bool) -> float:
    return next(m.value for c in rep.checks if c.is_rerun is rerun for m in c.metrics if m.name == "train_loss_drop")


def test_a_budget_report_reads_back_as_written(url: str) -> None:
    rep = node_budget()
    failed = copy.deepcopy(rep)
    failed.run_id += "-f"
    failed.checks[-1].status = Status.FAIL  # the re-run confirmed the problem
    with open_store(url) as store:
        store.add_node_report(rep)
        store.add_node_report(failed)
        got = store.get_run(rep.run_id)
        bad = store.get_run(failed.run_id).summary
    assert got.report.to_dict() == rep.to_dict() and got.report.budget == rep.budget
    assert got.summary.checks == {"pass": 4, "warn": 2}
    assert bad.failed == ["train (re-run)"]


def test_series_hold_the_first_pass_and_the_rerun_is_kept_flagged(url: str) -> None:
    reps = _runs(3)
    with open_store(url) as store:
        for rep in reps:
            store.add_node_report(rep)
        first = store.metric_points(metric="train_loss_drop")
        both = store.metric_points(metric="train_loss_drop", reruns=True)
        series = store.metric_series("vm", "train_loss_drop")
    assert [(p.run_id, p.value, p.rerun) for p in first] == [(r.run_id, _drop(r, False), False) for r in reps]
    assert [p.value for p in series] == [p.value for p in first]
    assert sorted((p.run_id, p.rerun) for p in both) == sorted([(r.run_id, False) for r in reps]
                                                               + [(r.run_id, True) for r in reps])
    assert {p.value for p in both if p.rerun} == {_drop(reps[0], True)}
    assert {p.tags["steps"] for p in both if p.rerun} == {200}  # the re-run's own depth
    (trend,) = build_trends(first, TrendRule(min_history=1, recent=1))
    assert [p.run_id for p in trend.points] == [r.run_id for r in reps]  # one value per run
    ex, close, _dialect = _raw(url)
    try:
        flags = ex("SELECT k.name, k.rerun FROM checks k JOIN runs r ON r.id = k.run WHERE r.run_id = ? "
                   "ORDER BY k.id", (reps[0].run_id,))
        assert flags == [("env", 0), ("compute", 0), ("memory", 0), ("train", 0), ("collectives", 0), ("train", 1)]
        assert ex("SELECT COUNT(*) FROM metrics WHERE rerun = 1", ()) == [(3 * len(reps[0].checks[-1].metrics),)]
    finally:
        close()


def test_a_v3_history_holding_reruns_is_migrated_and_flagged(url: str) -> None:
    reps = _runs(2)
    write_old_history(url, reps, 3, "2026-11-24T00:00:00Z")
    with open_store(url) as store:
        assert store.schema_version() == migrations.LATEST == 5
        first = store.metric_points(metric="train_loss_drop")
        both = store.metric_points(metric="train_loss_drop", reruns=True)
        assert store.get_run(reps[1].run_id).report.to_dict() == reps[1].to_dict()
    assert [(p.value, p.rerun) for p in first] == [(_drop(r, False), False) for r in reps]
    assert sorted(p.rerun for p in both) == [False, False, True, True]
    ex, close, _dialect = _raw(url)
    try:
        assert ex("SELECT name FROM checks WHERE rerun = 1 ORDER BY id", ()) == [("train",), ("train",)]
        assert ex("SELECT COUNT(*) FROM metrics WHERE rerun = 1", ()) == [(2 * len(reps[0].checks[-1].metrics),)]
        assert ex("SELECT version FROM schema_version ORDER BY version", ()) == [(1,), (2,), (3,), (4,), (5,)]
    finally:
        close()
