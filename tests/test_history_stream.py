"""``history --import`` of a line-layout cluster report, a node at a time (issue #27: fleet scale), and the
reports stored zlib-compressed (schema v7): what reads the history back sees what it saw before."""

from __future__ import annotations

import json
import sqlite3
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import InputError
from gpuaccept.model import ClusterReport, NodeEntry
from gpuaccept.results.clusterfile import write_cluster_file
from gpuaccept.results.history import open_store
from gpuaccept.results.load import open_cluster, open_cluster_data
from gpuaccept.results.rows import RUN_COLUMNS, flatten_cluster
from tests.helpers import gpuaccept, ok, one_line_error
from tests.pg_server import shared_server
from tests.store_reports import T0, cluster_report, metrics_per_node

HOSTS = [f"gpu{i:02d}" for i in range(11)]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return shared_server().new_database()


def _write(path: Path, cluster: ClusterReport, line_layout: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        write_cluster_file(cluster, fh, line_layout=line_layout)
    return path


def _state(url: str, run_id: str) -> dict[str, Any]:
    with open_store(url) as store:
        return {"runs": [r.to_dict() for r in store.list_runs(include_members=True)],
                "points": [p.to_dict() for p in store.metric_points(reruns=True)],
                "report": store.get_run(run_id).report.to_dict()}


@pytest.mark.parametrize("opener", [open_cluster_data, open_cluster])
def test_a_streamed_cluster_stores_what_the_whole_one_does(url: str, tmp_path: Path, opener: Any) -> None:
    """Stored from the file's validated JSON (history --import) or from NodeEntry objects, as a whole report."""
    cluster = cluster_report("c1", HOSTS, missing=("gpu03",), failing=("gpu05",))
    with open_store(url) as store:
        assert store.add_cluster_stream(lambda: opener(_write(tmp_path / "c.json", cluster, True)), batch=4) == "c1"
    streamed = _state(url, "c1")
    whole = f"sqlite:///{tmp_path / 'whole.db'}" if url.startswith("sqlite") else shared_server().new_database()
    with open_store(whole) as store:
        store.add_cluster_report(cluster)
    assert streamed == _state(whole, "c1")
    assert streamed["report"] == cluster.to_dict()  # read back as it was
    assert len(streamed["points"]) == metrics_per_node() * (len(HOSTS) - 1)
    (summary,) = [r for r in streamed["runs"] if r["kind"] == "cluster"]
    assert summary["verdict"] == cluster.verdict.value == "failure" and summary["nodes"] == len(HOSTS) - 1
    assert summary["failed"] == ["gpu05"]


@pytest.mark.parametrize("workers", [1, 2])
def test_rows_made_in_worker_processes_store_what_the_file_does(url: str, tmp_path: Path, workers: int) -> None:
    """``history --import``'s path: each node's rows made in a worker (chunks of 16 nodes), stored in order."""
    from gpuaccept.results.import_rows import open_cluster_rows

    hosts = [f"gpu{i:02d}" for i in range(37)]  # three chunks
    cluster = cluster_report("c1", hosts, missing=("gpu03",), failing=("gpu20",))
    path = _write(tmp_path / "c.json", cluster, True)
    with open_store(url) as store:
        assert store.add_cluster_stream(lambda: open_cluster_rows(path, "2026-11-28T00:00:00Z", workers=workers),
                                        batch=5, stored_at="2026-11-28T00:00:00Z") == "c1"
    got = _state(url, "c1")
    whole = f"sqlite:///{tmp_path / 'whole.db'}" if url.startswith("sqlite") else shared_server().new_database()
    with open_store(whole) as store:
        store.add_cluster_stream(lambda: open_cluster_data(path), batch=5)
    assert got == _state(whole, "c1") and got["report"] == cluster.to_dict()
    assert len(got["points"]) == metrics_per_node() * (len(hosts) - 1)


def test_the_stream_is_held_a_batch_at_a_time(tmp_path: Path) -> None:
    cluster = cluster_report("c1", HOSTS)
    alive: list[weakref.ref[NodeEntry]] = []
    most = 0

    def entries() -> Iterator[NodeEntry]:
        nonlocal most
        for entry in cluster.nodes:
            copy = NodeEntry.from_dict(entry.to_dict())
            alive.append(weakref.ref(copy))
            most = max(most, sum(r() is not None for r in alive))
            yield copy
            del copy

    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        store.add_cluster_stream(lambda: (cluster, entries()), batch=3)
    assert len(alive) == len(HOSTS) and most <= 3 + 1  # a batch, and the one being read


def test_a_transient_error_mid_stream_rolls_back_and_reads_the_source_again(tmp_path: Path) -> None:
    cluster = cluster_report("c1", HOSTS)
    calls = 0

    def source() -> tuple[ClusterReport, Iterator[NodeEntry]]:
        nonlocal calls
        calls += 1

        def entries() -> Iterator[NodeEntry]:
            for i, entry in enumerate(cluster.nodes):
                if calls == 1 and i == 7:
                    raise sqlite3.OperationalError("database is locked")
                yield entry

        return cluster, entries()

    url = f"sqlite:///{tmp_path / 'h.db'}"
    with open_store(url) as store:
        store.add_cluster_stream(source, batch=2)
    assert calls == 2
    assert _state(url, "c1")["report"] == cluster.to_dict()


def test_stored_again_replaces_and_links_a_node_stored_alone(url: str, tmp_path: Path) -> None:
    cluster = cluster_report("c1", HOSTS)
    path = _write(tmp_path / "c.json", cluster, True)
    with open_store(url) as store:
        alone = cluster.nodes[4].report
        assert alone is not None
        store.add_node_report(alone)
        for _ in range(2):
            store.add_cluster_stream(lambda: open_cluster_data(path), batch=3)
        runs = store.list_runs(include_members=True)
        assert len(runs) == len(HOSTS) + 1
        assert {r.parent_run_id for r in runs if r.kind == "node"} == {"c1"}
        assert len(store.metric_points()) == metrics_per_node() * len(HOSTS)


def test_reports_are_stored_compressed_and_a_damaged_one_is_one_error(tmp_path: Path) -> None:
    cluster = cluster_report("c1", HOSTS[:3])
    _, nodes = flatten_cluster(cluster, "now")
    packed = nodes[0].row[RUN_COLUMNS.index("report_z")]
    first = cluster.nodes[0].report
    assert first is not None and nodes[0].row[RUN_COLUMNS.index("report_json")] == ""
    assert 0 < len(packed) < len(json.dumps(first.to_dict(), separators=(",", ":"))) / 2
    db = tmp_path / "h.db"
    with open_store(f"sqlite:///{db}") as store:
        store.add_cluster_report(cluster)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET report_z = ? WHERE host = 'gpu01'", (packed[: len(packed) // 2],))
    with open_store(f"sqlite:///{db}") as store, pytest.raises(InputError, match="run c1-gpu01 on gpu01: the stored"):
        store.get_run("c1")
    one_line_error(gpuaccept("report", "c1", "--db", f"sqlite:///{db}", "-f", "md"), "the stored report")


def test_cli_import_streams_a_line_layout_file_and_a_bad_line_stores_nothing(tmp_path: Path) -> None:
    good = _write(tmp_path / "run" / "cluster-report.json", cluster_report("c1", HOSTS), True)
    lines = good.read_text().splitlines(keepends=True)
    bad = tmp_path / "bad" / "cluster-report.json"
    bad.parent.mkdir()
    bad.write_text("".join(lines[:6]) + '{"host": "x", "state": "weird"},\n' + "".join(lines[6:]))
    db = tmp_path / "h.db"
    one_line_error(gpuaccept("history", "--import", str(bad), "--db", str(db)), f"{bad}: nodes[5]")
    assert not db.exists() or not sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    node = tmp_path / "n" / "report.json"
    node.parent.mkdir()
    other = cluster_report("c2", ["solo"]).nodes[0].report
    assert other is not None
    node.write_text(json.dumps(other.to_dict()))
    out = json.loads(ok(gpuaccept("history", "--import", str(node), str(good.parent), "--db", str(db),
                                  "--json", "-")))
    assert out["stored"] == [{"file": str(node), "run_id": "c2-solo"}, {"file": str(good.parent), "run_id": "c1"}]


def test_every_reader_sees_the_same_history_after_a_streamed_import(tmp_path: Path) -> None:
    """history, trend, report RUN_ID and baseline create --history read a streamed import as a whole one."""
    runs = [cluster_report("c1", HOSTS, tflops=600.0), cluster_report("c2", HOSTS, T0 + 3600, tflops=610.0),
            cluster_report("c3", HOSTS, T0 + 7200, tflops=450.0)]
    outputs = []
    for line_layout in (True, False):
        db = f"sqlite:///{tmp_path / f'h{line_layout}.db'}"
        files = [str(_write(tmp_path / f"{c.run_id}{line_layout}" / "cluster-report.json", c, line_layout))
                 for c in runs]
        ok(gpuaccept("history", "--import", *files, "--db", db))
        outputs.append([
            ok(gpuaccept("history", "--db", db, "--json", "-")),
            ok(gpuaccept("history", "--db", db, "--all-nodes", "--host", "gpu02")),
            ok(gpuaccept("trend", "--host", "gpu02", "--metric", "gemm_bf16_tflops", "--db", db, "--json", "-")),
            ok(gpuaccept("report", "c2", "--db", db, "-f", "md", "-o", "-")),
            ok(gpuaccept("baseline", "create", "--history", "--db", db)),
        ])
    streamed, whole = outputs
    for out in outputs:  # the baseline's creation time
        out[4] = "\n".join(line for line in out[4].splitlines() if not line.lstrip().startswith("created:"))
    assert streamed == whole
    assert len(json.loads(streamed[0])) == 3 and "c3" in streamed[1] and "gemm_bf16_tflops" in streamed[4]


def test_the_tag_columns_cache_gives_what_the_tags_give() -> None:
    from gpuaccept.results.rows import _tag_columns, _tag_columns_memo

    cases = [{"a": 1}, {"a": 1.0}, {"a": True}, {"a": "1"}, {"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 2, "b": 1},
             {"dtype": "bf16", "size_bytes": 1 << 30}, {"size_bytes": float("inf")}, {"size_bytes": True},
             {"dtype": 16}, {"b": [1, 2]}, {}]
    for _ in range(2):  # filled, then hit
        for tags in cases:
            assert _tag_columns_memo(tags) == _tag_columns(tags)
    assert _tag_columns({"dtype": "bf16", "size_bytes": 1024.0})[1:] == ("bf16", 1024)
    assert _tag_columns({"size_bytes": True, "dtype": 16})[1:] == ("16", None)


def test_foreign_keys_are_checked_again_after_a_bulk_write_even_a_failed_one(tmp_path: Path) -> None:
    """The streamed write leaves SQLite's foreign key checks out (its ids are its own); they come back after."""
    cluster = cluster_report("c1", HOSTS[:3])
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        conn = store._db  # type: ignore[attr-defined]
        store.add_cluster_stream(lambda: (cluster, cluster.nodes))
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1

        def broken() -> tuple[ClusterReport, Iterator[NodeEntry]]:
            def entries() -> Iterator[NodeEntry]:
                yield cluster.nodes[0]
                raise InputError("line 3: not valid JSON")
            return cluster, entries()

        with pytest.raises(InputError):
            store.add_cluster_stream(broken)
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO checks (run, name, status) VALUES (999999, 'x', 'pass')")
        assert len(store.list_runs(include_members=True)) == 4  # the failed write stored nothing


def test_a_fleet_import_keeps_each_node_line_as_read_and_reads_its_report_back(tmp_path: Path) -> None:
    """``history --import``'s workers store each node's line as read (schema v8: ``E`` then zlib of the line), not
    its report serialised again; every reader gets the node's report out of it, and a damaged one is an error."""
    import zlib

    from gpuaccept.results.import_rows import open_cluster_rows
    from gpuaccept.results.rows import ENTRY_MARK, unpack_report

    cluster = cluster_report("c1", HOSTS, missing=("gpu03",))
    path = _write(tmp_path / "c.json", cluster, True)
    lines = path.read_text().splitlines()[1:-1]
    db = tmp_path / "h.db"
    with open_store(f"sqlite:///{db}") as store:
        store.add_cluster_stream(lambda: open_cluster_rows(path, "2026-11-28T00:00:00Z", workers=1), batch=4)
    with sqlite3.connect(db) as conn:
        stored = dict(conn.execute("SELECT host, report_z FROM runs WHERE kind = 'node'").fetchall())
    assert len(stored) == len(HOSTS) - 1
    first = next(line for line in lines if '"gpu00"' in line[:40]).rstrip(",")
    assert stored["gpu00"][:1] == ENTRY_MARK and zlib.decompress(stored["gpu00"][1:]).decode() == first
    assert _state(f"sqlite:///{db}", "c1")["report"] == cluster.to_dict()
    assert unpack_report(None, stored["gpu00"], "x") == json.loads(first)["report"]
    no_report = ENTRY_MARK + zlib.compress(b'{"host": "gpu00", "report": null}')
    with pytest.raises(InputError, match="x: the stored report is not a JSON object"):
        unpack_report(None, no_report, "x")
    with pytest.raises(InputError, match="x: the stored report cannot be read"):
        unpack_report(None, ENTRY_MARK + stored["gpu00"][1:50], "x")


def test_a_chunk_numbers_its_keys_once_and_the_writer_looks_each_up_once(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's chunk shares one key list (sent once); the writer looks a key up once per transaction."""
    from gpuaccept.results.import_rows import open_cluster_rows
    from gpuaccept.results.store_sqlite import SqliteStore

    path = _write(tmp_path / "c.json", cluster_report("c1", HOSTS), True)
    _, rows = open_cluster_rows(path, "2026-11-28T00:00:00Z", workers=1)
    flats = [f.flat for f in rows if f.flat is not None]
    assert len(flats) == len(HOSTS) and all(f.split is not None for f in flats)
    assert len({id(f.split.keys) for f in flats if f.split is not None}) == 1  # 11 nodes: one chunk of 16
    looked: list[str] = []
    real = SqliteStore._execute

    def counting(self: SqliteStore, sql: str, params: Any = ()) -> Any:
        if "FROM metric_keys" in sql:
            looked.append(sql)
        return real(self, sql, params)

    db = f"sqlite:///{tmp_path / 'h.db'}"
    monkeypatch.setattr(SqliteStore, "_execute", counting)
    with open_store(db) as store:
        store.add_cluster_stream(lambda: open_cluster_rows(path, "2026-11-28T00:00:00Z", workers=1), batch=2)
    monkeypatch.undo()
    assert 1 <= len(looked) <= 2, looked  # the first batch's keys: looked up, inserted, read back; never again
    assert _state(db, "c1")["report"] == cluster_report("c1", HOSTS).to_dict()
