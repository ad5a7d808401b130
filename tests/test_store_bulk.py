"""A fleet's cluster report stored in bulk (one COPY on PostgreSQL, one executemany on SQLite): rows intact."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuaccept.model import CheckResult, Metric, Status
from gpuaccept.results.history import open_store
from gpuaccept.results.rows import tags_json, tags_json_memo
from tests.pg_server import shared_server
from tests.store_reports import cluster_report, metrics_per_node


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return shared_server().new_database()


def test_awkward_values_survive_the_bulk_path_and_a_reimport_replaces_every_row(url: str) -> None:
    hosts = [f"n{i:03d}" for i in range(40)]
    cr = cluster_report("bulk1", hosts)
    odd = {"note": 'tab\there, "quoted", back\\slash, new\nline, \\N, é', "size_bytes": 1 << 40, "flag": True}
    first = cr.nodes[0].report
    assert first is not None
    first.checks.append(CheckResult("odd", Status.PASS, "", metrics=[
        Metric("weird", float("nan"), "GB/s", device="cuda:0", tags=odd),
        Metric("plain", 1.5, "GB/s", tags={"n": 1.0})]))
    per_node = metrics_per_node()
    with open_store(url) as store:
        store.add_cluster_report(cr)
        store.add_cluster_report(cr)  # stored again: replaced, not doubled
        points = store.metric_points(run_ids=[f"bulk1-{h}" for h in hosts])
        got = store.get_run("bulk1")
    assert len(points) == per_node * len(hosts) + 2
    weird = [p for p in points if p.name == "weird"]
    assert len(weird) == 1 and weird[0].value is None and weird[0].device == "cuda:0"
    assert weird[0].tags == odd
    assert [p.tags for p in points if p.name == "plain"] == [{"n": 1.0}]
    assert got.report.to_dict() == cr.to_dict()


def test_the_tags_cache_keeps_equal_but_differently_typed_values_apart() -> None:
    for tags in ({"a": 1}, {"a": 1.0}, {"a": True}, {"a": 1}, {"b": [1, 2]}, {"b": {"c": 1}}):
        assert tags_json_memo(tags) == tags_json(tags)
