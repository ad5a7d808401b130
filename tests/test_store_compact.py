"""History schema v6 (issue #27): a metric row holds ids and numbers; names and places are stored once each."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.results import migrations
from gpuaccept.results.history import open_store
from tests.pg_server import shared_server
from tests.store_reports import T0, cluster_report, metrics_per_node
from tests.test_store import _raw, write_old_history

HOSTS = [f"n{i:03d}" for i in range(12)]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return shared_server().new_database()


def _points(url: str) -> list[dict[str, Any]]:
    with open_store(url) as store:
        return [p.to_dict() for p in store.metric_points(reruns=True)]


def _count(url: str, sql: str) -> int:
    ex, close, _ = _raw(url)
    try:
        return int(ex(sql, ())[0][0])
    finally:
        close()


def test_each_name_and_place_is_stored_once_however_many_nodes_and_runs(url: str) -> None:
    with open_store(url) as store:
        store.add_cluster_report(cluster_report("c1", HOSTS))
    keys, places = _count(url, "SELECT COUNT(*) FROM metric_keys"), _count(url, "SELECT COUNT(*) FROM metric_places")
    values = _count(url, "SELECT COUNT(*) FROM metric_values")
    assert values == metrics_per_node() * len(HOSTS) == _count(url, "SELECT COUNT(*) FROM metrics")
    per_node_places = places // len(HOSTS)
    assert places == per_node_places * len(HOSTS) and 1 <= per_node_places < metrics_per_node()
    assert keys < metrics_per_node()  # shared by the nodes: the same metrics on each
    with open_store(url) as store:   # a second run of the same fleet adds values only
        store.add_cluster_report(cluster_report("c2", HOSTS, T0 + 3600))
    assert _count(url, "SELECT COUNT(*) FROM metric_keys") == keys
    assert _count(url, "SELECT COUNT(*) FROM metric_places") == places
    assert _count(url, "SELECT COUNT(*) FROM metric_values") == 2 * values
    with open_store(url) as store:   # stored again: replaced, not doubled
        store.add_cluster_report(cluster_report("c2", HOSTS, T0 + 3600))
    assert _count(url, "SELECT COUNT(*) FROM metric_values") == 2 * values


def test_a_v4_history_migrates_to_the_same_points_as_a_new_one(url: str, tmp_path: Path) -> None:
    reports = [n.report for n in cluster_report("old", HOSTS[:4]).nodes if n.report is not None]
    write_old_history(url, reports, 4)
    assert _count(url, "SELECT COUNT(*) FROM metrics") == metrics_per_node() * 4  # the v4 table
    migrated = _points(url)
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}" if url.startswith("sqlite") else shared_server().new_database()
    with open_store(fresh) as store:
        for rep in reports:
            store.add_node_report(rep)
    assert len(migrated) == metrics_per_node() * 4
    assert migrated == _points(fresh)
    ex, close, _ = _raw(url)
    try:
        versions = [r[0] for r in ex("SELECT version FROM schema_version ORDER BY version", ())]
        assert versions == list(range(1, migrations.LATEST + 1))
    finally:
        close()
    assert migrations.LATEST == 8  # v8: a node report may be kept as its cluster line (no DDL)


def test_trend_and_gpu_history_queries_use_the_indexes(tmp_path: Path) -> None:
    """The queries ``trend --host``, ``history --gpu`` and baselines make look values up through indexes,
    never by walking every value (SQLite's plan of the store's own statements)."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    plans: list[str] = []
    with open_store(url) as store:
        store.add_cluster_report(cluster_report("c1", HOSTS))
        execute = store._execute

        def explained(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
            if "metric_values" in sql or "FROM metrics" in sql:
                plans.append(" | ".join(str(r[-1]) for r in execute("EXPLAIN QUERY PLAN " + sql, params)))
            return execute(sql, params)

        store._execute = explained  # type: ignore[method-assign]
        series = store.metric_series("n001", "gemm_bf16_tflops")
        by_gpu = store.metric_points(hw_ids=["GPU-x"])
        fleet = store.metric_points(metric="gemm_bf16_tflops", sku="h100-sxm5-80gb")
    assert len(series) == 2 and by_gpu == [] and len(fleet) == 2 * len(HOSTS)
    host_plan, gpu_plan, fleet_plan = plans
    assert "metric_values_key_place (key=? AND place=?)" in host_plan, host_plan
    assert "metric_places_hw_id" in gpu_plan and "metric_values_place_key (place=?)" in gpu_plan, gpu_plan
    assert "metric_keys_name" in fleet_plan, fleet_plan
    for plan in plans:
        assert "SCAN" not in plan, plan


def test_a_value_row_is_ids_and_numbers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with open_store(url):
        pass
    db = sqlite3.connect(tmp_path / "h.db")
    try:
        cols = {r[1]: r[2] for r in db.execute("PRAGMA table_info(metric_values)")}
    finally:
        db.close()
    assert cols == {"id": "INTEGER", "run": "BIGINT", "check_id": "BIGINT", "key": "BIGINT", "place": "BIGINT",
                    "value": "DOUBLE PRECISION", "expected": "DOUBLE PRECISION", "threshold_op": "TEXT",
                    "threshold_value": "DOUBLE PRECISION", "rerun": "SMALLINT"}
