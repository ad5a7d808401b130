"""The history store, run against a SQLite file and a real PostgreSQL server alike."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import GpuacceptError, InputError
from gpuaccept.model import NodeReport, Verdict
from gpuaccept.results import migrations
from gpuaccept.results.history import open_store, record
from gpuaccept.results.rows import CHECK_COLUMNS, METRIC_COLUMNS, RUN_COLUMNS, flatten_node
from gpuaccept.results.store import StoreError
from gpuaccept.results.store_sqlite import APPLICATION_ID
from tests.pg_server import shared_server
from tests.store_reports import T0, cluster_report, iso, metrics_per_node, node_report

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty history location on each backend: a new SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hist' / 'history.db'}"
    return shared_server().new_database()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- round trips ----
def test_node_report_round_trip(url: str) -> None:
    rep = node_report("gpu01", "20260921T000000Z-gpu01-aaaa", nan=True, fail=True)
    with open_store(url) as store:
        assert store.schema_version() == migrations.LATEST
        assert store.add_node_report(rep) == rep.run_id
        got = store.get_run(rep.run_id)
    assert got.report.to_dict() == rep.to_dict()
    s = got.summary
    assert (s.kind, s.host, s.verdict, s.profile, s.sku) == ("node", "gpu01", "failure", "standard", "h100-sxm5-80gb")
    assert s.checks == {"pass": 4, "fail": 1}
    assert s.failed == ["memtest"]
    assert s.parent_run_id is None


def test_cluster_report_links_its_nodes(url: str) -> None:
    cr = cluster_report("c1", ["n1", "n2", "n3"], missing=("n3",), failing=("n2",))
    with open_store(url) as store:
        store.add_cluster_report(cr)
        got = store.get_run("c1")
        top = store.list_runs()
        members = store.list_runs(include_members=True)
        n1 = store.list_runs(host="n1")
    assert got.report.to_dict() == cr.to_dict()
    assert [r.run_id for r in top] == ["c1"]
    c = top[0]
    assert (c.kind, c.nodes, c.expected_nodes, c.verdict, c.backend) == ("cluster", 2, 3, "failure", "slurm")
    assert c.failed == ["n2"]
    assert c.checks == {"pass": 9, "fail": 1}
    assert sorted(r.run_id for r in members) == ["c1", "c1-n1", "c1-n2"]
    assert [(r.run_id, r.parent_run_id, r.verdict) for r in n1] == [("c1-n1", "c1", "success")]


def test_filters_and_order(url: str) -> None:
    with open_store(url) as store:
        for i in range(5):
            store.add_node_report(node_report("a" if i % 2 == 0 else "b", f"r{i}", T0 + 3600 * i))
        rep = node_report("b", "r5", T0 + 3600 * 5)
        rep.checks = [c for c in rep.checks if c.name != "train"]
        store.add_node_report(rep)
        assert [r.run_id for r in store.list_runs()] == ["r5", "r4", "r3", "r2", "r1", "r0"]
        assert [r.run_id for r in store.list_runs(host="a")] == ["r4", "r2", "r0"]
        assert [r.run_id for r in store.list_runs(check="train", host="b")] == ["r3", "r1"]
        assert [r.run_id for r in store.list_runs(since=T0 + 3600 * 3)] == ["r5", "r4", "r3"]
        assert [r.run_id for r in store.list_runs(limit=2)] == ["r5", "r4"]
        assert store.list_runs(host="nobody") == []
        assert store.list_runs(kind="cluster") == []
        assert store.hosts() == ["a", "b"]
        assert "gemm_bf16_tflops" in store.metric_names("a")


def test_metric_series_values(url: str) -> None:
    with open_store(url) as store:
        store.add_node_report(node_report("gpu07", "late", T0 + 100, tflops=610.0))
        store.add_node_report(node_report("gpu07", "early", T0, tflops=600.0, nan=True))
        store.add_node_report(node_report("gpu08", "other", T0, tflops=1.0))
        pts = store.metric_series("gpu07", "gemm_bf16_tflops")
        since = store.metric_series("gpu07", "gemm_bf16_tflops", since=T0 + 50, device="cuda:1")
        d2d = store.metric_series("gpu07", "d2d_copy_gbs")
        by_sku = store.metric_points(metric="gemm_bf16_tflops", sku="h100-sxm5-80gb")
        by_run = store.metric_points(run_ids=["other"])
    assert [(p.run_id, p.device, p.value) for p in pts] == [
        ("early", "cuda:0", 600.0), ("early", "cuda:1", 601.0), ("late", "cuda:0", 610.0), ("late", "cuda:1", 611.0)]
    p = pts[0]
    assert (p.host, p.check, p.unit, p.dtype, p.threshold_op, p.threshold_value, p.expected, p.started) == \
        ("gpu07", "compute", "TFLOP/s", "bf16", ">=", 500.0, 989.0, iso(T0))
    assert p.tags == {"dtype": "bf16", "size": 8192, "mode": "single", "stat": "median"}
    assert [(x.run_id, x.value) for x in since] == [("late", 611.0)]
    assert [x.value for x in d2d if x.run_id == "early"] == [None, 3010.0]  # NaN is stored as NULL
    assert d2d[0].size_bytes == 1 << 30
    assert len(by_sku) == 6
    assert len(by_run) == metrics_per_node() and {x.host for x in by_run} == {"gpu08"}


def test_storing_again_replaces_and_links(url: str) -> None:
    with open_store(url) as store:
        store.add_node_report(node_report("n1", "c2-n1", T0, tflops=100.0))
        store.add_node_report(node_report("n1", "c2-n1", T0, tflops=200.0))
        assert [p.value for p in store.metric_series("n1", "gemm_bf16_tflops")] == [200.0, 201.0]
        # The same node run arrives again inside its cluster report: one copy, now linked.
        store.add_cluster_report(cluster_report("c2", ["n1", "n2"]))
        store.add_cluster_report(cluster_report("c2", ["n1", "n2"]))
        runs = store.list_runs(include_members=True)
        assert sorted((r.run_id, r.parent_run_id) for r in runs) == [("c2", None), ("c2-n1", "c2"), ("c2-n2", "c2")]
        assert [p.value for p in store.metric_series("n1", "gemm_bf16_tflops")] == [600.0, 601.0]
        # Storing the node on its own afterwards keeps the link.
        store.add_node_report(node_report("n1", "c2-n1", T0, tflops=300.0))
        assert [r.parent_run_id for r in store.list_runs(host="n1")] == ["c2"]
        assert len(store.metric_points()) == 2 * metrics_per_node()


def test_get_run_by_prefix_and_errors(url: str) -> None:
    with open_store(url) as store:
        store.add_node_report(node_report("h1", "20260921T0000Z-h1-aaaa", T0))
        store.add_node_report(node_report("h2", "20260921T0000Z-h2-bbbb", T0))
        store.add_node_report(node_report("h1", "same", T0))
        store.add_node_report(node_report("h2", "same", T0 + 1))
        assert store.get_run("20260921T0000Z-h2").report.host == "h2"
        with pytest.raises(InputError, match="ambiguous: 2 runs match"):
            store.get_run("20260921T0000Z")
        with pytest.raises(InputError, match="no run 'nope'"):
            store.get_run("nope")
        with pytest.raises(InputError, match="names 2 node runs"):
            store.get_run("same")
        assert store.get_run("same", host="h2").report.started == iso(T0 + 1)


# ---- schema versions ----
def _raw(url: str) -> tuple[Callable[[str, tuple[Any, ...]], list[Any]], Callable[[], None], str]:
    """A plain driver connection to the history at ``url`` (no gpuaccept code): execute, close, dialect."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url[len("sqlite:///"):], isolation_level=None)
        return (lambda sql, p=(): conn.execute(sql, p).fetchall()), conn.close, "sqlite"
    import psycopg

    pg = psycopg.connect(url, autocommit=True)
    pg.execute("CREATE SCHEMA IF NOT EXISTS gpuaccept")
    pg.execute("SET search_path TO gpuaccept")

    def ex(sql: str, p: tuple[Any, ...] = ()) -> list[Any]:
        cur = pg.execute(sql.replace("?", "%s"), p or None)
        return cur.fetchall() if cur.description else []

    return ex, pg.close, "postgresql"


#: The columns each schema version added (results/migrations.py), left out of a history written at an older one.
ADDED_BY = {2: {"runs": {"sku"}}, 3: {"metrics": {"hw_kind", "hw_id", "hw_serial"}},
            4: {"checks": {"rerun"}, "metrics": {"rerun"}}, 7: {"runs": {"report_z"}}}


def write_old_history(url: str, reps: list[NodeReport], version: int, stamp: str = "2026-01-01T00:00:00Z") -> None:
    """A history as gpuaccept wrote it at schema ``version`` (its migrations, without the columns later ones
    added), written with the driver alone."""
    if url.startswith("sqlite:"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    later = [ADDED_BY.get(v, {}) for v in range(version + 1, migrations.LATEST + 1)]

    def kept(table: str, columns: tuple[str, ...]) -> list[str]:
        return [c for c in columns if not any(c in added.get(table, set()) for added in later)]

    def insert(table: str, lead: dict[str, Any], columns: tuple[str, ...], row: Any) -> None:
        values = dict(zip(columns, row, strict=True))
        if "report_z" in values and "report_z" not in kept(table, columns):  # before v7: the JSON text
            values["report_json"] = zlib.decompress(values["report_z"]).decode()
        cols = [*lead, *kept(table, columns)]
        ex(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
           (*lead.values(), *(values[c] for c in kept(table, columns))))

    ex, close, dialect = _raw(url)
    for m in migrations.MIGRATIONS[:version]:
        for stmt in m.ddl(dialect):
            ex(stmt, ())
        ex("INSERT INTO schema_version VALUES (?, ?, ?)", (m.version, m.description, stamp))
    check_id = 0
    for run_pk, rep in enumerate(reps, 1):
        flat = flatten_node(rep, stamp)
        insert("runs", {"id": run_pk}, RUN_COLUMNS, flat.row)
        for fc in flat.checks:
            check_id += 1
            insert("checks", {"id": check_id, "run": run_pk}, CHECK_COLUMNS, fc.row)
            for m in fc.metrics:
                insert("metrics", {"run": run_pk, "check_id": check_id}, METRIC_COLUMNS, m)
    if dialect == "sqlite":
        ex(f"PRAGMA application_id = {APPLICATION_ID}", ())
        ex(f"PRAGMA user_version = {version}", ())
    close()


def test_v1_history_is_migrated(url: str) -> None:
    old = node_report("oldnode", "old-run", T0, tflops=555.0)
    write_old_history(url, [old], 1)
    with open_store(url) as store:
        assert store.schema_version() == migrations.LATEST
        assert store.get_run("old-run").report.to_dict() == old.to_dict()
        # v2 backfilled the SKU from the stored report, so SKU queries see the old run.
        assert [p.value for p in store.metric_points(metric="gemm_bf16_tflops", sku="h100-sxm5-80gb")] == [555.0, 556.0]
        store.add_node_report(node_report("oldnode", "new-run", T0 + 10))
        assert [r.run_id for r in store.list_runs(host="oldnode")] == ["new-run", "old-run"]
    ex, close, dialect = _raw(url)
    try:
        assert [r[0] for r in ex("SELECT version FROM schema_version ORDER BY version", ())] == \
            list(range(1, migrations.LATEST + 1))
        if dialect == "sqlite":
            assert ex("PRAGMA user_version", ()) == [(migrations.LATEST,)]
    finally:
        close()


def test_newer_schema_is_refused_untouched(url: str) -> None:
    with open_store(url) as store:
        store.add_node_report(node_report("n", "r", T0))
    ex, close, dialect = _raw(url)
    ex("INSERT INTO schema_version VALUES (?, 'from the future', '2030-01-01T00:00:00Z')", (migrations.LATEST + 7,))
    close()
    if dialect == "sqlite":
        path = Path(url[len("sqlite:///"):])
        before = _sha(path)
    with pytest.raises(InputError, match=f"newer gpuaccept \\(history schema v{migrations.LATEST + 7}"):
        open_store(url)
    ex, close, _ = _raw(url)
    try:
        assert [r[0] for r in ex("SELECT version FROM schema_version ORDER BY version", ())] == \
            [*range(1, migrations.LATEST + 1), migrations.LATEST + 7]
        assert ex("SELECT COUNT(*) FROM runs", ()) == [(1,)]
    finally:
        close()
    if dialect == "sqlite":
        assert _sha(path) == before


# ---- refusing files and schemas that are not ours ----
def _foreign_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('alice')")
    conn.commit()
    conn.close()


def _corrupt_history(path: Path) -> None:
    with open_store(f"sqlite:///{path}") as store:
        for i in range(40):
            store.add_node_report(node_report(f"n{i}", f"r{i}", T0 + i))
    data = bytearray(path.read_bytes())
    assert len(data) > 8 * 4096
    data[4096:len(data) - 4096] = os.urandom(len(data) - 8192)  # every page but the first and last
    path.write_bytes(bytes(data))


BAD_FILES: dict[str, Callable[[Path], None]] = {
    "random-bytes": lambda p: p.write_bytes(os.urandom(8192)),
    "text": lambda p: p.write_text("hosts:\n  - gpu01\n"),
    "sqlite-header-then-garbage": lambda p: p.write_bytes(b"SQLite format 3\x00" + os.urandom(4000)),
    "foreign-sqlite": _foreign_sqlite,
    "corrupt-history": _corrupt_history,
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_bad_sqlite_file_is_refused_and_never_modified(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "history.db"
    BAD_FILES[kind](path)
    before = _sha(path)
    siblings = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InputError) as err:
        with open_store(f"sqlite:///{path}") as store:  # a damaged page may only show when read
            store.list_runs()
            store.metric_points()
            store.get_run("r3")
            store.add_node_report(node_report("x", "y", T0))
    text = str(err.value)
    assert str(path) in text and "\n" not in text
    assert ("did not modify" in text) or ("corrupt" in text)
    assert _sha(path) == before
    # No journal with content is left beside it (an -shm file is SQLite's shared-memory index, never data).
    assert sorted(p.name for p in tmp_path.iterdir() if p.stat().st_size > 0 and not p.name.endswith("-shm")) \
        == siblings


def test_empty_file_becomes_a_history(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.touch()
    with open_store(f"sqlite:///{path}") as store:
        store.add_node_report(node_report("n", "r", T0))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_directory_as_database_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GpuacceptError, match="is a directory"):
        open_store(f"sqlite:///{tmp_path}")


def test_postgres_schema_of_another_application_is_refused() -> None:
    server = shared_server()
    url = server.new_database()
    ex, close, _ = _raw(url)  # creates schema gpuaccept
    ex("CREATE TABLE users (id INT)", ())
    close()
    with pytest.raises(InputError, match="holds other tables \\(users\\)"):
        open_store(url)
    ex, close, _ = _raw(url)
    try:
        assert ex("SELECT table_name FROM information_schema.tables WHERE table_schema = 'gpuaccept'", ()) == \
            [("users",)]
    finally:
        close()
    # ?schema= puts the history beside it.
    with open_store(url + "?schema=gpu_history") as store:
        store.add_node_report(node_report("n", "r", T0))
        assert [r.run_id for r in store.list_runs()] == ["r"]


def test_unreachable_postgres_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}/x: cannot connect to PostgreSQL"):
        open_store(f"postgresql://nobody:secret@127.0.0.1:{port}/x")


def test_postgres_connection_limit_is_waited_out() -> None:
    """Every connection slot taken: open_store retries "too many clients" until one frees up."""
    import threading
    import time

    import psycopg

    url = shared_server().new_database()
    open_store(url).close()
    held: list[Any] = []
    try:
        with pytest.raises(psycopg.OperationalError, match="too many clients"):
            for _ in range(200):
                held.append(psycopg.connect(url))
        timer = threading.Timer(1.0, lambda: [c.close() for c in held[:2]])
        t0 = time.monotonic()
        timer.start()
        with open_store(url) as store:
            store.add_node_report(node_report("n", "r", T0))
            assert [r.run_id for r in store.list_runs()] == ["r"]
        assert time.monotonic() - t0 >= 0.9
        timer.join()
    finally:
        for c in held:
            c.close()


def test_password_never_shown() -> None:
    with pytest.raises(StoreError) as err:
        open_store("postgresql://u:hunter2@127.0.0.1:1/db")
    assert "hunter2" not in str(err.value) and "u:***@" in str(err.value)


def test_missing_psycopg_is_a_clear_error() -> None:
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "from gpuaccept.results.history import open_store\nfrom gpuaccept.results.store import StoreError\n"
            "try:\n    open_store('postgresql://u@127.0.0.1:1/db')\n"
            "except StoreError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "needs psycopg 3: pip install 'gpuaccept[postgres]'" in out.stdout


def test_record_returns_a_note_and_raises_typed_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    note = record(node_report("n", "r1", T0), url)
    assert note == f"stored run r1 in {url}"
    assert "cluster run c (2 nodes)" in record(cluster_report("c", ["a", "b"]), url)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create the history directory"):
        record(node_report("n", "r2", T0), f"sqlite:///{blocker / 'sub' / 'h.db'}")


def test_default_location_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GPUACCEPT_DB", raising=False)
    record(node_report("n", "r1", T0))
    assert (tmp_path / "xdg" / "gpuaccept" / "history.db").is_file()
    monkeypatch.setenv("GPUACCEPT_DB", str(tmp_path / "env.db"))
    record(node_report("n", "r2", T0))
    with open_store(None) as store:
        assert [r.run_id for r in store.list_runs()] == ["r2"]


# ---- many writers at once ----
WRITERS, REPORTS_EACH = 64, 3


def _writer(url: str, idx: int, barrier: Any, errors: Any) -> None:
    try:
        barrier.wait(60)
        with open_store(url) as store:
            for k in range(REPORTS_EACH):
                store.add_node_report(node_report(f"node{idx:02d}", f"r{idx:02d}-{k}", T0 + 60 * k + idx))
    except BaseException as exc:  # reported to the parent, which fails the test with it
        errors.put(f"writer {idx}: {type(exc).__name__}: {exc}")
        raise SystemExit(1) from None


def _run_writers(url: str) -> Iterator[str]:
    ctx = multiprocessing.get_context("fork")
    barrier, errors = ctx.Barrier(WRITERS), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, i, barrier, errors)) for i in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    while not errors.empty():
        yield errors.get()
    for i, p in enumerate(procs):
        if p.exitcode != 0:
            yield f"writer {i} exited with {p.exitcode}"


@pytest.mark.slow
def test_64_processes_write_at_once(url: str) -> None:
    problems = list(_run_writers(url))
    assert problems == []
    with open_store(url) as store:
        runs = store.list_runs()
        assert len(runs) == WRITERS * REPORTS_EACH
        assert {r.verdict for r in runs} == {Verdict.SUCCESS.value}
        assert len(store.hosts()) == WRITERS
        assert len(store.metric_points()) == WRITERS * REPORTS_EACH * metrics_per_node()
        series = store.metric_series("node17", "gemm_bf16_tflops")
        assert [(p.run_id, p.value) for p in series] == [
            (f"r17-{k}", 600.0 + d) for k in range(REPORTS_EACH) for d in (0, 1)]


def test_network_filesystems_are_recognised() -> None:
    from gpuaccept.results.store_sqlite import NETWORK_FS, mount_fstype

    mounts = ("/dev/sda1 / ext4 rw 0 0\n"
              "server:/home /home nfs4 rw,vers=4.2 0 0\n"
              "/dev/nvme0n1 /home/local\\040disk xfs rw 0 0\n"
              "lustre@tcp:/fs /lustre lustre rw 0 0\n")
    assert mount_fstype(Path("/home/alice/.local/share/gpuaccept"), mounts) == "nfs4"
    assert mount_fstype(Path("/home/local disk/h.db"), mounts) == "xfs"
    assert mount_fstype(Path("/homework/x"), mounts) == "ext4"
    assert mount_fstype(Path("/lustre/proj"), mounts) in NETWORK_FS
    assert mount_fstype(Path("/tmp"), mounts) not in NETWORK_FS


# ---- read-only opens ----
def _pg_tables(url: str) -> list[tuple[str, str]]:
    """(schema, table) of every user table of the PostgreSQL database at ``url``, with the driver alone."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        return pg.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema "
                          "NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2").fetchall()


def test_read_only_open_of_an_empty_postgres_creates_nothing() -> None:
    url = shared_server().new_database()
    with pytest.raises(InputError, match=r"no gpuaccept history yet .*run a writing command first"):
        open_store(url, read_only=True)
    assert _pg_tables(url) == []
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        assert pg.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'gpuaccept'").fetchall() == []


def test_read_only_open_of_an_older_postgres_history_migrates_nothing() -> None:
    url = shared_server().new_database()
    write_old_history(url, [node_report("oldnode", "old-run", T0)], 1)
    with pytest.raises(InputError, match=r"older schema \(v1\); run a writing command first"):
        open_store(url, read_only=True)
    ex, close, _ = _raw(url)
    try:
        assert ex("SELECT version FROM schema_version", ()) == [(1,)]
    finally:
        close()


def test_read_only_postgres_session_refuses_writes() -> None:
    url = shared_server().new_database()
    record(node_report("n", "r1", T0), url)
    with open_store(url, read_only=True) as store:
        assert [r.run_id for r in store.list_runs()] == ["r1"]
        with pytest.raises(StoreError, match="read-only transaction"):
            store.add_node_report(node_report("n", "r2", T0 + 1))
    with open_store(url) as store:
        assert [r.run_id for r in store.list_runs()] == ["r1"]
