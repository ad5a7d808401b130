"""The history in a SQLite file: WAL mode, a busy timeout, retried write transactions.

Before writing anything the file is inspected read-only: a file that is not
SQLite, a SQLite database of another application, or a gpuaccept history
with a newer schema than this code knows is refused with InputError and left
byte-for-byte unchanged. A gpuaccept file is recognised by its SQLite
``application_id`` (``GPUA``); ``user_version`` mirrors the schema version.

WAL needs shared memory between all writers, so it is not used on a network
filesystem (NFS, Lustre, GPFS, BeeGFS, CIFS... found in ``/proc/mounts``):
there the store keeps SQLite's rollback journal, which relies on the
filesystem's locks. Many hosts writing one SQLite file over NFS is still
fragile; a fleet should use PostgreSQL, or store cluster reports once from the
launching host.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from gpuaccept.errors import GpuacceptError, InputError
from gpuaccept.results import migrations
from gpuaccept.results.dburl import DbUrl
from gpuaccept.results.metricrows import VALUE_COLUMNS, split_value_rows
from gpuaccept.results.store import Store, StoreError

_BY_KEY = itemgetter(1 + VALUE_COLUMNS.index("key"), 1 + VALUE_COLUMNS.index("place"))
"""The (key, place) of a numbered ``metric_values`` row (its id first)."""

APPLICATION_ID = 0x47505541  # "GPUA"
SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 30.0
CACHE_KIB = 64 * 1024
"""SQLite page cache per connection (KiB; its default is 2 MiB): a fleet's import inserts into indexes of
millions of metric rows, which a small cache reads back from the file again and again."""


def _untouched(path: Path) -> str:
    return f"gpuaccept did not modify {path}; pass another --db or move the file away"


def inspect_sqlite_file(path: Path) -> int | None:
    """Read-only look at ``path``: None when it is new or an empty database, else its gpuaccept schema version.

    InputError (the file untouched) when it is not SQLite, not gpuaccept's,
    corrupt, or of a newer schema than :data:`migrations.LATEST`.
    """
    try:
        if not path.exists() or (path.is_file() and path.stat().st_size == 0):
            return None
        if not path.is_file():
            raise InputError(f"{path}: not a regular file; {_untouched(path)}")
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except PermissionError as exc:
        raise StoreError(f"{path}: cannot read the history database ({exc.strerror})") from None
    if head != SQLITE_MAGIC:
        raise InputError(f"{path}: not a SQLite database (history files start with 'SQLite format 3'); "
                         f"{_untouched(path)}")
    try:
        conn = connect_read_only(path)
    except sqlite3.Error as exc:
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
            raise InputError(f"{path}: corrupt or unreadable SQLite database ({exc}); {_untouched(path)}") from None
        raise StoreError(f"{path}: cannot open the history database read-only ({exc})") from None
    try:
        conn.execute("BEGIN")  # one snapshot for every read below: another process may be creating the file
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = sorted(r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"))
        if app_id != APPLICATION_ID:
            if not tables:
                return None
            shown = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
            raise InputError(f"{path}: a SQLite database of another application (tables: {shown}), "
                             f"not a gpuaccept history; {_untouched(path)}")
        if "schema_version" not in tables:
            raise InputError(f"{path}: marked as a gpuaccept history but has no schema_version table (damaged?); "
                             f"{_untouched(path)}")
        version = int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and _busy(exc):
            raise StoreError(f"{path}: the history database stayed locked for {BUSY_TIMEOUT_S:.0f} s") from None
        raise InputError(f"{path}: corrupt or unreadable SQLite database ({exc}); {_untouched(path)}") from None
    finally:
        conn.close()
    if version > migrations.LATEST:
        raise InputError(f"{path}: written by a newer gpuaccept (history schema v{version}; this version knows up "
                         f"to v{migrations.LATEST}); upgrade gpuaccept to use it. {_untouched(path)}")
    return version


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection (``mode=ro``) to ``path``, probed with one read.

    On read-only media a database in WAL mode cannot be opened that way (SQLite cannot
    create its ``-shm`` index there): then it is opened ``immutable=1``, which needs no
    index and no lock (nobody can write to read-only media either). sqlite3.Error when
    neither works.
    """
    base = f"file:{path.resolve().as_posix()}?mode=ro"
    last: sqlite3.Error | None = None
    for uri in (base, base + "&immutable=1"):
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA application_id").fetchone()
            return conn
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            last = exc
            if _busy(exc) or not isinstance(exc, sqlite3.OperationalError):
                break
    assert last is not None
    raise last


NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "fuse.sshfs",
                        "glusterfs", "fuse.glusterfs", "9p", "afs", "panfs", "wekafs", "fuse.juicefs"})


def mount_fstype(path: Path, mounts_text: str | None = None) -> str | None:
    """Filesystem type of the mount holding ``path`` (longest matching mount point in ``/proc/mounts``)."""
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/mounts").read_text()
        except OSError:
            return None
    target = os.path.abspath(path)
    best, fstype = -1, None
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, fstype = len(point), parts[2]
    return fstype


def _busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class SqliteStore(Store):
    """History in one SQLite file (created, with its directory, on first use).

    ``read_only`` (the listing and reading commands) creates nothing: a missing file is an
    InputError, and the file is opened with SQLite's ``mode=ro`` (``immutable=1`` as well
    where even the WAL index cannot be created, on read-only media), never migrated.
    """

    dialect = "sqlite"

    def __init__(self, url: DbUrl, retry_s: float = 120.0, read_only: bool = False) -> None:
        super().__init__(url, retry_s)
        assert url.path is not None
        self.path = url.path
        self.read_only = read_only
        self._conn: sqlite3.Connection | None = None
        version = inspect_sqlite_file(self.path)
        if read_only:
            self._open_read_only(version)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path.parent}: cannot create the history directory ({exc.strerror})") from None
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the history database ({exc})") from None
        try:
            self._retrying(self._setup, write=False)
        except BaseException:
            self.close()
            raise

    def _open_read_only(self, version: int | None) -> None:
        if not self.path.is_file():
            raise InputError(f"no history database at {self.path} (nothing stored yet; a read-only command "
                             "creates none)")
        if version is None:
            raise InputError(f"{self.path}: an empty database, not a gpuaccept history yet")
        if version < migrations.LATEST:
            raise InputError(f"{self.path}: a history of an older schema (v{version}); a command that stores "
                             "runs (history --import, run) upgrades it")
        try:
            self._conn = connect_read_only(self.path)
        except sqlite3.Error as exc:
            raise self._translate(exc) from None

    def _setup(self) -> None:
        conn = self._db
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if mount_fstype(self.path.parent) not in NETWORK_FS:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        conn.execute("PRAGMA foreign_keys = ON")
        with self._transaction():
            # Re-read under the write lock: another process may have created or migrated the file meanwhile.
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            has_table = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
            if app_id not in (0, APPLICATION_ID) or (app_id == 0 and conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchone()):
                raise InputError(f"{self.path}: became another application's database while opening; "
                                 f"{_untouched(self.path)}")
            current = int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0) \
                if has_table else 0
            if current > migrations.LATEST:
                raise InputError(f"{self.path}: written by a newer gpuaccept (history schema v{current}); "
                                 "upgrade gpuaccept to use it")
            if current < migrations.LATEST:
                reached = self._migrate_locked(current)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {reached}")

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.path}: the history store is closed")
        return self._conn

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(sql, tuple(params)).fetchall()

    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._db.executemany(sql, rows)

    def _insert_values(self, rows: list[tuple[Any, ...]]) -> None:
        """Rows numbered in their order (the report's, which readers keep), inserted sorted by (key, place): each
        node adds a row under each of a few hundred keys, so in the report's order every row lands in another
        part of the ``metric_values_key_place`` index; sorted, a batch's rows of one key land together (a fleet's
        ``history --import`` spends about 10% less time a row). The ids come after the largest one there."""
        if len(rows) < 2:
            super()._insert_values(rows)
            return
        base = self._next_value_id()
        numbered = sorted(((base + i, *row) for i, row in enumerate(rows)), key=_BY_KEY)
        self._bulk_insert("metric_values", ("id", *VALUE_COLUMNS), numbered)

    def _insert_split(self, parts: list[tuple[Any, ...]]) -> None:
        """:meth:`_insert_values` of split metrics, numbered as they are made (no second pass over the rows)."""
        rows = split_value_rows(parts, self._execute, self._bulk_insert, self._key_ids, first_id=self._next_value_id())
        rows.sort(key=_BY_KEY)
        self._bulk_insert("metric_values", ("id", *VALUE_COLUMNS), rows)

    def _next_value_id(self) -> int:
        return int(self._execute("SELECT COALESCE(MAX(id), 0) FROM metric_values", ())[0][0]) + 1

    def _insert_id(self, sql: str, params: Sequence[Any]) -> int:
        cur = self._db.execute(sql, tuple(params))
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        conn = self._db
        bulk = self._bulk_write  # every id it writes was just inserted or looked up in this very transaction
        if bulk:  # so SQLite's foreign key lookups (4 per metric row, a quarter of its insert time) are left out
            conn.execute("PRAGMA foreign_keys = OFF")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            if bulk:
                conn.execute("PRAGMA foreign_keys = ON")

    def _is_transient(self, exc: BaseException) -> bool:
        return _busy(exc)

    def _translate(self, exc: BaseException) -> GpuacceptError:
        if isinstance(exc, GpuacceptError):
            return exc
        text = str(exc)
        if _busy(exc):
            return StoreError(f"{self.path}: the history database stayed busy for {self.retry_s:.0f} s "
                              "(too many writers at once, or a process holds it open); try again")
        if isinstance(exc, sqlite3.OperationalError) and "readonly" in text.replace(" ", "").lower():
            return StoreError(f"{self.path}: no permission to write the history database")
        if isinstance(exc, sqlite3.OperationalError) and "unable to open" in text:
            return StoreError(f"{self.path}: cannot open the history database ({text})")
        if isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text):
            return InputError(f"{self.path}: the history database is corrupt ({text})")
        if isinstance(exc, sqlite3.Error):
            return StoreError(f"{self.path}: history database error: {text}")
        return StoreError(f"{self.path}: {type(exc).__name__}: {text}")

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def file_size(self) -> int:
        """Bytes on disk of the database and its WAL (for benchmarks and diagnostics)."""
        total = 0
        for p in (self.path, Path(str(self.path) + "-wal")):
            with contextlib.suppress(OSError):
                total += os.path.getsize(p)
        return total
