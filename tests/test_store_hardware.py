"""Results kept under the hardware's identity, on a SQLite file and a real PostgreSQL server alike.

The reports are ``tests/data/history/reports`` (see its README): on day 4, GPU UA1 moved from gpu-a to
gpu-b, gpu-a got a new GPU UN in its place, and gpu-b's mainboard was replaced.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from gpuaccept.errors import InputError
from gpuaccept.model import NodeReport
from gpuaccept.results import migrations
from gpuaccept.results.history import open_store
from gpuaccept.results.store import Store
from gpuaccept.results.trend import TrendRule, build_trends
from tests.pg_server import shared_server
from tests.test_store import _raw, write_old_history

HISTORY = Path(__file__).resolve().parent / "data" / "history"
UA0, UA1 = "GPU-5c1b7e2a-3d4f-4a61-9b8c-0e1f2a3b4c50", "GPU-5c1b7e2a-3d4f-4a61-9b8c-0e1f2a3b4c51"
UB1, UN = "GPU-8e2d4c6a-1b3f-4e5d-a7c9-2b4d6f8a0c71", "GPU-d41f0a9b-7c2e-4b8d-9e3f-6a5b4c3d2e10"
BOARD_B_OLD, BOARD_B_NEW = "OM234S600977", "OM241S700938"
PORT_A = "0xb8599f03000ca7f6"


def reports(days: range = range(8)) -> list[NodeReport]:
    files = sorted(HISTORY.glob("reports/*.json"))
    out = [NodeReport.from_dict(json.loads(f.read_text())) for f in files]
    return [r for r in out if int(r.run_id.rsplit("-d", 1)[1]) in days]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return shared_server().new_database()


def _filled(url: str, days: range = range(8)) -> Store:
    store = open_store(url)
    for r in reports(days):
        store.add_node_report(r)
    return store


def _places(store: Store, hw: str) -> list[tuple[str, str | None, int]]:
    return [(s.host, s.device, s.runs) for s in store.sightings([hw])]


def test_a_gpu_is_followed_from_host_to_host(url: str) -> None:
    with _filled(url) as store:
        assert _places(store, UA1) == [("gpu-a", "cuda:1", 4), ("gpu-b", "cuda:1", 4)]
        (first, second) = store.sightings([UA1])
        assert first.serial == "1654922000151" and first.first < first.last < second.first
        assert [r.host for r in store.list_runs(hw_id=UA1)] == ["gpu-b"] * 4 + ["gpu-a"] * 4
        # The replaced GPU's history ends, the new one's starts (gpu-a's day-6 run had no env check).
        assert _places(store, UB1) == [("gpu-b", "cuda:1", 4)]
        assert _places(store, UN) == [("gpu-a", "cuda:1", 3)]
        assert [r.run_id[-2:] for r in store.list_runs(hw_id=UN)] == ["d7", "d5", "d4"]
        # The board and the RDMA port, where the env check could read them (from day 2 on).
        assert _places(store, BOARD_B_OLD) == [("gpu-b", None, 2)]
        assert _places(store, BOARD_B_NEW) == [("gpu-b", None, 4)]
        assert _places(store, PORT_A) == [("gpu-a", "mlx5_0:1", 5)]
        assert store.hardware_count("gpu") == 5 and store.hardware_count("node") == 3
        assert store.sightings(["GPU-00000000-0000-0000-0000-000000000000"]) == [] == store.sightings([])
        # Every value of the GPU, wherever it was measured; the old-format reports of days 0-1 included.
        pts = store.metric_points(metric="gemm_bf16_tflops", hw_ids=[UA1])
        assert [(p.host, p.device) for p in pts] == [("gpu-a", "cuda:1")] * 4 + [("gpu-b", "cuda:1")] * 4
        assert {(p.hw_kind, p.hw_serial) for p in pts[2:]} == {("gpu", "1654922000151")}
        assert pts[0].hw_serial is None  # the previous version did not record serials
        assert store.metric_names(hw_id=BOARD_B_NEW) == ["cpu_count", "gpu_count", "stream_triad_gbs"]


def test_storing_again_replaces_the_hardware_rows(url: str) -> None:
    with _filled(url, range(2, 4)) as store:
        before = _places(store, UA1)
        for r in reports(range(2, 4)):
            store.add_node_report(r)
        assert _places(store, UA1) == before == [("gpu-a", "cuda:1", 2)]


def test_trends_follow_the_hardware(url: str) -> None:
    rule = TrendRule()
    with _filled(url) as store:
        pts = store.metric_points(metric="gemm_bf16_tflops")
    series = {s.hw_id: s for s in build_trends(pts, rule)}
    assert set(series) == {UA0, UA1, UN, UB1, "GPU-8e2d4c6a-1b3f-4e5d-a7c9-2b4d6f8a0c70"}
    moved = series[UA1]
    assert moved.hosts == ["gpu-a", "gpu-b"] and moved.moved and len(moved.points) == 8
    assert moved.regressed  # 680 on gpu-b against its own 740 on both hosts
    assert moved.points[-1].reference == pytest.approx(740, rel=0.01)
    new = series[UN]
    assert len(new.points) == 4 and not new.regressed  # the day-6 value without identity is UN's
    assert new.points[-1].reference is None  # too little history to judge a new part
    assert series[UB1].replaced_by == UA1 and series[UA1].replaced_by is None
    # Keyed by host and device alone (what the history did before), both verdicts would be wrong.
    by_place = {(s.points[-1].host, s.device): s for s in build_trends(
        [type(p)(**{**p.__dict__, "hw_id": None, "hw_kind": None}) for p in pts], rule)}
    assert by_place[("gpu-a", "cuda:1")].regressed and not by_place[("gpu-b", "cuda:1")].regressed


def test_a_replaced_board_starts_a_new_node_history(url: str) -> None:
    with _filled(url) as store:
        pts = store.metric_points(metric="stream_triad_gbs", hosts=["gpu-b"])
    series = build_trends(pts, TrendRule())
    assert [(s.hw_kind, s.hw_id, len(s.points)) for s in series] == [("node", BOARD_B_OLD, 4), ("node", BOARD_B_NEW, 4)]
    assert series[0].replaced_by == BOARD_B_NEW and not any(s.regressed for s in series)


# ---- an existing history migrates ----
def _migrates_and_keeps_following_the_gpu(url: str) -> None:
    with pytest.raises(InputError, match="older schema \\(v2\\)"):
        open_store(url, read_only=True)  # a reading command migrates nothing
    with open_store(url) as store:
        assert store.schema_version() == migrations.LATEST
        # Backfilled from the stored reports: the old-format runs by NVML index, the newer ones in full.
        assert _places(store, UA1) == [("gpu-a", "cuda:1", 4)]
        assert _places(store, BOARD_B_OLD) == [("gpu-b", None, 2)]
        assert len(store.metric_points(metric="gemm_bf16_tflops", hw_ids=[UA1])) == 4
        assert store.get_run("20260921T141320Z-gpu-a-d0").report.to_dict() == reports(range(1))[0].to_dict()
        for r in reports(range(4, 8)):
            store.add_node_report(r)
        assert _places(store, UA1) == [("gpu-a", "cuda:1", 4), ("gpu-b", "cuda:1", 4)]
        pts = store.metric_points(metric="gemm_bf16_tflops")
    assert next(s for s in build_trends(pts, TrendRule()) if s.hw_id == UA1).regressed
    ex, close, _dialect = _raw(url)
    try:
        assert [r[0] for r in ex("SELECT version FROM schema_version ORDER BY version", ())] == \
            list(range(1, migrations.LATEST + 1))
        nulls = ex("SELECT COUNT(*) FROM metrics WHERE hw_id IS NULL AND device LIKE 'cuda:%'", ())
        assert nulls == [(2,)]  # only gpu-a's day-6 run, which had no env check
    finally:
        close()


def test_a_history_written_at_v2_migrates(url: str) -> None:
    write_old_history(url, reports(range(4)), 2)
    _migrates_and_keeps_following_the_gpu(url)


def test_the_history_v2_gpuaccept_made_migrates(tmp_path: Path) -> None:
    """The SQLite history written by gpuaccept at schema v2 itself (tests/data/history/README.md)."""
    path = tmp_path / "history.db"
    shutil.copy(HISTORY / "history-v2.db", path)
    _migrates_and_keeps_following_the_gpu(f"sqlite:///{path}")


def test_recorded_v2_file_is_what_v2_wrote() -> None:
    """The fixture is a real v2 history, not a current one: no hardware table, version 2."""
    conn = sqlite3.connect(f"file:{HISTORY / 'history-v2.db'}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "hardware" not in tables and {"runs", "checks", "metrics"} <= tables
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone() == (2,)
        cols = [r[1] for r in conn.execute("PRAGMA table_info(metrics)")]
        assert "hw_id" not in cols and conn.execute("SELECT COUNT(*) FROM runs").fetchone() == (8,)
    finally:
        conn.close()
