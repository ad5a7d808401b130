"""The history in PostgreSQL (for a fleet), through psycopg 3 (imported only here).

Tables live in their own schema (``gpuaccept``, or ``?schema=`` in the URL)
so the database can be shared with other applications. Each report is one
transaction; serialization failures, deadlocks and the unique-key race of two
writers storing the same run are retried, and so is a refused connection when
the server is at ``max_connections`` or starting up. Migrations run under a
transaction-scoped advisory lock, so many nodes may open a new database at
once. A schema holding other tables, or a newer history schema, is refused
before anything is written. A read-only open (the commands that only read) runs
no DDL and no migration, and its session is read-only: a missing or older
history schema is an InputError asking for a writing command first.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

from gpuaccept.errors import GpuacceptError, InputError
from gpuaccept.results import migrations
from gpuaccept.results.dburl import DbUrl
from gpuaccept.results.store import Store, StoreError

# SQLSTATEs worth retrying: serialization failure, deadlock, unique violation (concurrent replace), lock not available.
_TRANSIENT = {"40001", "40P01", "23505", "55P03"}
# Refused connections worth retrying: too many connections, server starting up or shutting down for restart.
_CONNECT_TRANSIENT = ("too many clients", "too many connections", "starting up", "remaining connection slots",
                      "the database system is in recovery")
_LOCK_KEY = 0x47505541  # "GPUA"


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreError("a postgresql:// history needs psycopg 3: pip install 'gpuaccept[postgres]' "
                         "(or psycopg[binary])") from None
    return psycopg


class PostgresStore(Store):
    """History in a PostgreSQL database."""

    dialect = "postgresql"

    def __init__(self, url: DbUrl, retry_s: float = 120.0, read_only: bool = False) -> None:
        super().__init__(url, retry_s)
        self._pg = _psycopg()
        self.schema = url.schema
        self.read_only = read_only
        self._conn: Any = None
        self._conn = self._connect()
        try:
            if read_only:
                self._execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            self._retrying(self._check_readable if read_only else self._setup, write=False)
        except BaseException:
            self.close()
            raise

    def _connect(self) -> Any:
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                conn = self._pg.connect(autocommit=True, **self.url.pg_kwargs())
                break
            except self._pg.OperationalError as exc:
                text = str(exc)
                if not any(t in text for t in _CONNECT_TRANSIENT) or time.monotonic() >= deadline:
                    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
                    raise StoreError(f"{self.url.redacted()}: cannot connect to PostgreSQL: {first}") from None
            except self._pg.ProgrammingError as exc:  # e.g. an invalid connection option in the URL
                raise StoreError(f"{self.url.redacted()}: bad connection parameters: {exc}") from None
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
        # The schema need not exist yet: PostgreSQL skips missing schemas in search_path.
        conn.execute(f'SET search_path TO "{self.schema}"')
        return conn

    def _state(self) -> int | None:
        """None when our schema is absent or empty; else its history version. InputError when it is not ours."""
        tables = sorted(r[0] for r in self._execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", (self.schema,)))
        if not tables:
            return None
        if "schema_version" not in tables or "runs" not in tables:
            shown = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
            raise InputError(f"{self.url.redacted()}: schema {self.schema!r} holds other tables ({shown}), not a "
                             "gpuaccept history; nothing was changed (choose another with ?schema=NAME)")
        version = int(self._execute("SELECT MAX(version) FROM schema_version")[0][0] or 0)
        if version > migrations.LATEST:
            raise InputError(f"{self.url.redacted()}: written by a newer gpuaccept (history schema v{version}; this "
                             f"version knows up to v{migrations.LATEST}); upgrade gpuaccept. Nothing was changed")
        return version

    def _check_readable(self) -> None:
        """A read-only open: the history must be there at the latest schema; nothing is created or migrated."""
        version = self._state()
        where = f"{self.url.redacted()} (schema {self.schema!r})"
        if version is None:
            raise InputError(f"{where}: no gpuaccept history yet (nothing stored yet; a read-only command creates "
                             "none); run a writing command first (gpuaccept run, or history --import)")
        if version < migrations.LATEST:
            raise InputError(f"{where}: a history of an older schema (v{version}); run a writing command first "
                             "(gpuaccept run, or history --import) to upgrade it")

    def _setup(self) -> None:
        if self._state() == migrations.LATEST:
            return
        with self._transaction():
            self._execute("SELECT pg_advisory_xact_lock(?::int4, hashtext(?::text))", (_LOCK_KEY, self.schema))
            current = self._state()  # again, under the lock: another node may have migrated meanwhile
            if current is None:
                exists = self._execute("SELECT 1 FROM pg_namespace WHERE nspname = ?", (self.schema,))
                if not exists:
                    self._execute(f'CREATE SCHEMA "{self.schema}"')
                current = 0
            if current < migrations.LATEST:
                self._migrate_locked(current)

    @property
    def _db(self) -> Any:
        if self._conn is None:
            raise StoreError(f"{self.url.redacted()}: the history store is closed")
        return self._conn

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._db.execute(sql.replace("?", "%s"), tuple(params) if params else None)
        return list(cur.fetchall()) if cur.description is not None else []

    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._db.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])

    def _bulk_insert(self, table: str, cols: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """COPY ... FROM STDIN (binary-safe text rows through psycopg): many times faster than INSERTs."""
        with self._db.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def _insert_id(self, sql: str, params: Sequence[Any]) -> int:
        row = self._db.execute(sql.replace("?", "%s") + " RETURNING id", tuple(params)).fetchone()
        return int(row[0])

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._db.transaction():
            yield

    def _is_transient(self, exc: BaseException) -> bool:
        return getattr(exc, "sqlstate", None) in _TRANSIENT

    def _translate(self, exc: BaseException) -> GpuacceptError:
        if isinstance(exc, GpuacceptError):
            return exc
        where = self.url.redacted()
        if self._is_transient(exc):
            return StoreError(f"{where}: the history database stayed contended for {self.retry_s:.0f} s; try again")
        sqlstate = getattr(exc, "sqlstate", None) or ""
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if sqlstate == "42501":
            return StoreError(f"{where}: permission denied ({text}); the user needs CREATE on the database "
                              f"(first use) and INSERT/SELECT/UPDATE/DELETE on schema {self.schema!r}")
        if isinstance(exc, self._pg.OperationalError):
            return StoreError(f"{where}: lost the PostgreSQL connection: {text}")
        if isinstance(exc, self._pg.Error):
            return StoreError(f"{where}: history database error [{sqlstate}]: {text}")
        return StoreError(f"{where}: {type(exc).__name__}: {text}")

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
