"""The history store: every node and cluster run, queryable by host, check, metric and time.

``open_store(url)`` (:mod:`gpuaccept.results.history`) gives a :class:`Store` on SQLite (the default, a file in
the user's data directory) or PostgreSQL (for a fleet); see
:mod:`gpuaccept.results.dburl` for URLs. Both keep the same normalized tables
(``runs``, ``checks``, ``metrics``; :mod:`gpuaccept.results.migrations`) and
answer the same queries. Writes are one transaction per report, retried on
contention (SQLite ``busy``, PostgreSQL serialization failures) until
``retry_s`` runs out, so many nodes can write at once.

Storing a report again (same run id, kind and host) replaces the stored copy.
A ``run --budget`` re-run is stored and flagged (:mod:`gpuaccept.results.rows`); :meth:`Store.metric_points`
leaves it out unless asked (``reruns=True``), so trends and baselines read one first-pass value per run.
Each metric is stored with the hardware it measured (GPU UUID, port GUID, board
serial: :mod:`gpuaccept.results.hwid`) beside the host, so histories can follow
a GPU from host to host (:meth:`Store.sightings`, ``hw_ids`` of :meth:`Store.metric_points`).
A node stored on its own and later as part of a cluster report becomes linked
to that cluster.

Errors: :class:`StoreError` (unreachable, busy past the deadline, no
permission) and :class:`~gpuaccept.errors.InputError` (a file that is not a
gpuaccept history, a newer schema, an unknown run id). Driver exceptions never
leak out. A refused database is never modified.
"""

from __future__ import annotations

import abc
import itertools
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from gpuaccept.errors import GpuacceptError, InputError
from gpuaccept.model import ClusterReport, NodeEntry, NodeReport
from gpuaccept.results import migrations
from gpuaccept.results.config_history import CONFIG_COLUMNS
from gpuaccept.results.dburl import DbUrl
from gpuaccept.results.metricrows import VALUE_COLUMNS, split_value_rows, value_rows
from gpuaccept.results.records import MetricPoint, RunSummary, Sighting, StoredRun
from gpuaccept.results.rows import (
    CHECK_COLUMNS,
    HARDWARE_COLUMNS,
    RUN_COLUMNS,
    ClusterRows,
    FlatRun,
    Flattened,
    flatten_node,
    unpack_report,
)
from gpuaccept.results.timespec import epoch_to_iso

T = TypeVar("T")

NODE_BATCH = 32
"""Node reports flattened and stored at a time by :meth:`Store.add_cluster_stream` (about 1 MB each as objects)."""


class StoreError(GpuacceptError):
    """The history store could not be used: unreachable, busy too long, no permission, driver missing."""


_SUMMARY_SQL = """SELECT r.id, r.run_id, r.kind, r.host, r.started, r.finished, r.verdict, r.profile, r.sku,
    r.backend, p.run_id, r.expected_nodes, r.started_ts
    FROM runs r LEFT JOIN runs p ON p.id = r.parent"""

_POINT_SQL = """SELECT r.run_id, m.host, r.sku, r.started, r.started_ts, m.check_name, m.name, m.device, m.value,
    m.unit, m.expected, m.threshold_op, m.threshold_value, m.dtype, m.size_bytes, m.tags_json,
    m.hw_kind, m.hw_id, m.hw_serial, m.rerun
    FROM metrics m JOIN runs r ON r.id = m.run"""


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _chunks(items: Sequence[T], n: int = 500) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _batched(items: Iterable[T], n: int) -> Iterator[list[T]]:
    """``items`` in lists of ``n`` (the last shorter), read lazily."""
    it = iter(items)
    while True:
        part = list(itertools.islice(it, n))
        if not part:
            return
        yield part
        del part  # not held while the next one is read


class Store(abc.ABC):
    """A history database. Use as a context manager, or call :meth:`close`."""

    dialect: ClassVar[str]
    _bulk_write = False
    """Set while :meth:`add_cluster_stream` writes: every id it writes is one it has just inserted or looked up in
    the same transaction, so a dialect may skip its foreign key checks."""
    _key_ids: dict[tuple[Any, ...], int] | None = None
    """While :meth:`add_cluster_stream` writes: the metric key ids looked up or inserted in its transaction."""

    def __init__(self, url: DbUrl, retry_s: float = 120.0) -> None:
        self.url = url
        self.retry_s = retry_s

    # ---- dialect hooks -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (``?`` placeholders); return its rows (empty when it returns none)."""

    @abc.abstractmethod
    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row of parameters."""

    def _bulk_insert(self, table: str, cols: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Insert many rows into ``table`` (one executemany; PostgreSQL: COPY)."""
        self._executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", rows)

    def _insert_values(self, rows: list[tuple[Any, ...]]) -> None:
        """Insert ``metric_values`` rows (:data:`VALUE_COLUMNS`) whose ids follow their order."""
        self._bulk_insert("metric_values", VALUE_COLUMNS, rows)

    def _insert_split(self, parts: list[tuple[Any, ...]]) -> None:
        """Insert the ``metric_values`` rows of node runs whose metrics a worker split (``flat.split``)."""
        self._insert_values(split_value_rows(parts, self._execute, self._bulk_insert, self._key_ids))

    @abc.abstractmethod
    def _insert_id(self, sql: str, params: Sequence[Any]) -> int:
        """Run an INSERT into a table with an ``id`` key; return the new id."""

    @abc.abstractmethod
    def _transaction(self) -> AbstractContextManager[None]:
        """A write transaction: committed on normal exit, rolled back on an exception."""

    @abc.abstractmethod
    def _is_transient(self, exc: BaseException) -> bool:
        """True for errors worth retrying: contention, serialization failure, deadlock."""

    @abc.abstractmethod
    def _translate(self, exc: BaseException) -> GpuacceptError:
        """A driver exception as StoreError or InputError, with a message for the user."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection. The store cannot be used afterwards."""

    # ---- plumbing --------------------------------------------------------------------------------------------
    def __enter__(self) -> Store:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __str__(self) -> str:
        return self.url.redacted()

    def _retrying(self, fn: Callable[[], T], write: bool) -> T:
        """Run ``fn`` (in a write transaction when ``write``), retrying transient errors until ``retry_s``."""
        deadline = time.monotonic() + self.retry_s
        delay = 0.01
        while True:
            try:
                if write:
                    with self._transaction():
                        return fn()
                return fn()
            except GpuacceptError:
                raise
            except Exception as exc:
                if not self._is_transient(exc) or time.monotonic() >= deadline:
                    raise self._translate(exc) from exc
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.5)

    def _migrate_locked(self, current: int, upto: int = migrations.LATEST) -> int:
        """Apply pending migrations; the caller holds the write transaction and has read ``current``."""
        for m in migrations.pending(current, upto):
            for stmt in m.ddl(self.dialect):
                self._execute(stmt)
            if m.backfill is not None:
                m.backfill(self._execute)
            self._execute("INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                          (m.version, m.description, epoch_to_iso(time.time())))
            current = m.version
        return current

    def schema_version(self) -> int:
        """The database's schema version (largest applied migration)."""
        rows = self._retrying(lambda: self._execute("SELECT MAX(version) FROM schema_version"), write=False)
        return int(rows[0][0] or 0)

    # ---- writing ---------------------------------------------------------------------------------------------
    def add_node_report(self, report: NodeReport) -> str:
        """Store one node report (replacing a stored copy of the same run and host). Returns its run id."""
        flat = flatten_node(report, epoch_to_iso(time.time()))

        def write() -> None:
            old = self._execute("SELECT id, parent FROM runs WHERE run_id = ? AND kind = 'node' AND host = ?",
                                (flat.run_id, flat.host))
            parent = old[0][1] if old else None
            self._delete_runs([r[0] for r in old])
            self._insert_run(flat, parent)

        self._retrying(write, write=True)
        return report.run_id

    def add_cluster_report(self, report: ClusterReport) -> str:
        """Store a cluster report and each node report in it, linked to it. Returns the cluster run id."""
        return self.add_cluster_stream(lambda: (report, report.nodes))

    def add_cluster_stream(self, source: Callable[[], tuple[ClusterReport, Iterable[NodeEntry | dict[str, Any]
                                                                                 | Flattened]]],
                           batch: int = NODE_BATCH, stored_at: str | None = None) -> str:
        """Store a cluster report read a node at a time: ``source()`` gives its header (a ClusterReport; its own
        ``nodes`` are not read) and its node entries (NodeEntry, or the validated JSON of one as a cluster report
        file holds it: stored as read, not rebuilt), which are stored ``batch`` nodes at a time, so memory
        holds a batch, not the cluster. One transaction, as :meth:`add_cluster_report`: an error from the
        entries (a malformed line) rolls back everything of this run. ``source`` is called again when the
        transaction is retried. Returns the cluster run id."""
        stored_at = stored_at or epoch_to_iso(time.time())

        def write() -> str:
            self._key_ids = {}  # metric key ids of this transaction (a retry starts again)
            header, entries = source()
            rows = ClusterRows(header, stored_at)
            old = [r[0] for r in self._execute("SELECT id FROM runs WHERE run_id = ? AND kind = 'cluster'",
                                               (header.run_id,))]
            self._delete_runs(old)  # with their node runs
            cluster_pk = self._insert_run(rows.run(), None)  # rewritten below, once every node is stored
            for part in _batched(entries, batch):
                nodes = [flat for entry in part if (flat := rows.add(entry)) is not None]
                self._delete_stale_nodes(nodes)
                bulk: dict[str, list[tuple[Any, ...]]] = {"metrics": [], "hardware": [], "config": []}
                for node in nodes:
                    self._insert_run(node, cluster_pk, bulk)
                self._flush(bulk)
                del part, nodes, bulk  # before the next batch is read: one batch held, not two
            self._execute(f"UPDATE runs SET {', '.join(f'{c} = ?' for c in RUN_COLUMNS)} WHERE id = ?",
                          (*rows.run().row, cluster_pk))
            return header.run_id

        self._bulk_write = True
        try:
            return self._retrying(write, write=True)
        finally:
            self._bulk_write = False
            self._key_ids = None

    def _delete_stale_nodes(self, nodes: Sequence[FlatRun]) -> None:
        """Delete the stored node runs these replace (same run id and host), unless stored by this very write."""
        wanted = {(node.run_id, node.host) for node in nodes}
        if not wanted:
            return
        ids, hosts = sorted({w[0] for w in wanted}), sorted({w[1] for w in wanted})
        stale = [r[0] for r in self._execute(
            f"SELECT id, run_id, host FROM runs WHERE kind = 'node' AND run_id IN ({','.join('?' * len(ids))}) "
            f"AND host IN ({','.join('?' * len(hosts))})", [*ids, *hosts]) if (r[1], r[2]) in wanted]
        self._delete_runs(sorted(stale, reverse=True))

    def _delete_runs(self, pks: list[int]) -> None:
        """Delete runs and their checks and metrics; children (node runs of a cluster) first."""
        if not pks:
            return
        marks = ",".join("?" * len(pks))
        children = [r[0] for r in self._execute(f"SELECT id FROM runs WHERE parent IN ({marks})", pks)]
        given = set(pks)
        pks = [p for p in children if p not in given] + pks
        marks = ",".join("?" * len(pks))
        self._execute(f"DELETE FROM metric_values WHERE run IN ({marks})", pks)
        self._execute(f"DELETE FROM hardware WHERE run IN ({marks})", pks)
        self._execute(f"DELETE FROM config WHERE run IN ({marks})", pks)
        self._execute(f"DELETE FROM checks WHERE run IN ({marks})", pks)
        self._execute(f"UPDATE runs SET parent = NULL WHERE id IN ({marks})", pks)
        self._execute(f"DELETE FROM runs WHERE id IN ({marks})", pks)

    def _insert_run(self, flat: FlatRun, parent: int | None,
                    bulk: dict[str, list[tuple[Any, ...]]] | None = None) -> int:
        """Insert a run and its checks; its metrics and hardware rows too, or into ``bulk`` for :meth:`_flush`."""
        cols = (*RUN_COLUMNS, "parent")
        run_pk = self._insert_id(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                 (*flat.row, parent))
        rows: dict[str, list[tuple[Any, ...]]] = {"metrics": [], "hardware": [], "config": []} if bulk is None else bulk
        check_sql = (f"INSERT INTO checks (run, {', '.join(CHECK_COLUMNS)}) "
                     f"VALUES (?, {', '.join('?' * len(CHECK_COLUMNS))})")
        check_pks = []
        for fc in flat.checks:
            check_pk = self._insert_id(check_sql, (run_pk, *fc.row))
            check_pks.append(check_pk)
            rows["metrics"] += [(run_pk, check_pk, *m) for m in fc.metrics]
        if flat.split is not None:  # made in a worker: flatten_node_data(split=True)
            rows.setdefault("split", []).append((run_pk, check_pks, flat.split))
        rows["hardware"] += [(run_pk, *h) for h in flat.hardware]
        rows["config"] += [(run_pk, *c) for c in flat.config]
        if bulk is None:
            self._flush(rows)
        return run_pk

    def _flush(self, bulk: dict[str, list[tuple[Any, ...]]]) -> None:
        if bulk["metrics"]:
            self._insert_values(value_rows(bulk["metrics"], self._execute, self._bulk_insert))
        if bulk.get("split"):
            self._insert_split(bulk["split"])
        if bulk["hardware"]:
            self._bulk_insert("hardware", ("run", *HARDWARE_COLUMNS), bulk["hardware"])
        if bulk["config"]:
            self._bulk_insert("config", ("run", *CONFIG_COLUMNS), bulk["config"])

    def read_rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read-only query (``?`` placeholders), retried on contention."""
        return self._retrying(lambda: self._execute(sql, params), write=False)

    # ---- reading ---------------------------------------------------------------------------------------------
    def list_runs(self, host: str | None = None, check: str | None = None, since: float | None = None,
                  kind: str | None = None, limit: int | None = None, include_members: bool = False,
                  hw_id: str | None = None) -> list[RunSummary]:
        """Runs, newest first.

        ``host``: node runs on that host (including those inside cluster
        runs); ``hw_id``: node runs, on any host, that named that hardware (GPU
        UUID, port GUID, board serial); ``check``: runs that ran that check (a cluster: on any node);
        ``since``: started at or after this epoch time (s); ``kind``: ``node``
        or ``cluster``. Without ``host``, node runs that belong to a cluster run
        are listed under it only, unless ``include_members``.
        """
        where: list[str] = []
        params: list[Any] = []
        if host is not None:
            where.append("r.kind = 'node' AND r.host = ?")
            params.append(host)
        if hw_id is not None:
            where.append("r.kind = 'node' AND EXISTS (SELECT 1 FROM hardware h WHERE h.run = r.id AND h.hw_id = ?)")
            params.append(hw_id)
        if host is None and hw_id is None and not include_members:
            where.append("r.parent IS NULL")
        if kind is not None:
            if kind not in ("node", "cluster"):
                raise InputError(f"kind must be node or cluster, not {kind!r}")
            where.append("r.kind = ?")
            params.append(kind)
        if check is not None:
            where.append("(EXISTS (SELECT 1 FROM checks k WHERE k.run = r.id AND k.name = ?) OR EXISTS "
                         "(SELECT 1 FROM checks k JOIN runs c ON k.run = c.id WHERE c.parent = r.id AND k.name = ?))")
            params += [check, check]
        if since is not None:
            where.append("r.started_ts >= ?")
            params.append(float(since))
        sql = _SUMMARY_SQL + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY r.started_ts DESC, r.id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))

        def read() -> list[RunSummary]:
            return self._summaries(self._execute(sql, params))

        return self._retrying(read, write=False)

    def _summaries(self, rows: list[tuple[Any, ...]]) -> list[RunSummary]:
        """RunSummary for ``_SUMMARY_SQL`` rows, with check counts and failures."""
        pks = [r[0] for r in rows]
        counts: dict[int, dict[str, int]] = {pk: {} for pk in pks}
        failed: dict[int, list[str]] = {pk: [] for pk in pks}
        nodes: dict[int, int] = dict.fromkeys(pks, 0)
        kinds = {r[0]: r[2] for r in rows}
        node_pks = [pk for pk in pks if kinds[pk] == "node"]
        cluster_pks = [pk for pk in pks if kinds[pk] == "cluster"]
        for chunk in _chunks(node_pks):
            marks = ",".join("?" * len(chunk))
            for run_pk, name, status, rerun in self._execute(
                    f"SELECT run, name, status, rerun FROM checks WHERE run IN ({marks}) ORDER BY id", list(chunk)):
                counts[run_pk][status] = counts[run_pk].get(status, 0) + 1
                if status in ("fail", "error"):
                    failed[run_pk].append(f"{name} (re-run)" if rerun else name)
        for chunk in _chunks(cluster_pks):
            marks = ",".join("?" * len(chunk))
            for parent, host, verdict in self._execute(
                    f"SELECT parent, host, verdict FROM runs WHERE parent IN ({marks}) ORDER BY host", list(chunk)):
                nodes[parent] += 1
                if verdict != "success":
                    failed[parent].append(host)
            for parent, status, n in self._execute(
                    f"SELECT c.parent, k.status, COUNT(*) FROM checks k JOIN runs c ON k.run = c.id "
                    f"WHERE c.parent IN ({marks}) GROUP BY c.parent, k.status", list(chunk)):
                counts[parent][status] = int(n)
        out = []
        for pk, run_id, kind, host, started, finished, verdict, profile, sku, backend, parent, expected, _ts in rows:
            out.append(RunSummary(run_id=run_id, kind=kind, host=host, started=started, finished=finished,
                                  verdict=verdict, profile=profile, sku=sku, backend=backend, parent_run_id=parent,
                                  nodes=nodes[pk] if kind == "cluster" else 1,
                                  expected_nodes=int(expected) if expected is not None else None,
                                  checks=counts[pk], failed=failed[pk]))
        return out

    def get_run(self, run_id: str, host: str | None = None) -> StoredRun:
        """The run ``run_id`` (a unique prefix will do) with its full report.

        A cluster run wins over node runs that share its id; ``host`` picks one
        node run. InputError when no run or more than one matches.
        """
        def read() -> StoredRun:
            rows = self._find(run_id, host)
            cluster = [r for r in rows if r[2] == "cluster"]
            if cluster:
                row = cluster[0]
            elif len(rows) == 1:
                row = rows[0]
            else:
                hosts = ", ".join(sorted(r[3] for r in rows)[:8])
                raise InputError(f"run id {run_id!r} names {len(rows)} node runs (hosts {hosts}); pick one host")
            summary = self._summaries([row])[0]
            return StoredRun(summary=summary, report=self._load_report(row[0], row[2]))

        return self._retrying(read, write=False)

    def recent_reports(self, host: str, limit: int) -> list[NodeReport]:
        """The newest ``limit`` node reports of ``host``, newest first; one whose stored JSON cannot be read is
        passed over (calibration wants what can be read, not an error)."""
        def read() -> list[NodeReport]:
            out = []
            for (pk,) in self._execute("SELECT id FROM runs WHERE kind = 'node' AND host = ? "
                                       "ORDER BY started_ts DESC, id DESC LIMIT ?", (host, int(limit))):
                try:
                    report = self._load_report(pk, "node")
                except (ValueError, KeyError, TypeError, InputError):
                    continue
                if isinstance(report, NodeReport):
                    out.append(report)
            return out

        return self._retrying(read, write=False)

    def _find(self, run_id: str, host: str | None) -> list[tuple[Any, ...]]:
        host_sql, host_params = (" AND r.host = ?", [host]) if host is not None else ("", [])
        rows = self._execute(_SUMMARY_SQL + " WHERE r.run_id = ?" + host_sql, [run_id, *host_params])
        if rows:
            return rows
        rows = self._execute(_SUMMARY_SQL + " WHERE r.run_id LIKE ? ESCAPE '\\'" + host_sql + " ORDER BY r.run_id",
                             [_like_escape(run_id) + "%", *host_params]) if len(run_id) >= 4 else []
        ids = sorted({r[1] for r in rows})
        if len(ids) > 1:
            shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
            raise InputError(f"run id prefix {run_id!r} is ambiguous: {len(ids)} runs match ({shown})")
        if not rows:
            where = f" on host {host}" if host is not None else ""
            raise InputError(f"no run {run_id!r}{where} in the history at {self.url.redacted()} "
                             "(see 'gpuaccept history')")
        return rows

    def _load_report(self, run_pk: int, kind: str) -> NodeReport | ClusterReport:
        run_id, text, packed = self._execute("SELECT run_id, report_json, report_z FROM runs WHERE id = ?",
                                             (run_pk,))[0]
        data = unpack_report(text, packed, f"{self.url.redacted()}: run {run_id}")
        if kind == "node":
            return NodeReport.from_dict(data)
        children: dict[tuple[str, str], NodeReport] = {}
        for child_run_id, child_host, child_text, child_packed in self._execute(
                "SELECT run_id, host, report_json, report_z FROM runs WHERE parent = ?", (run_pk,)):
            where = f"{self.url.redacted()}: run {child_run_id} on {child_host}"
            children[(child_run_id, child_host)] = NodeReport.from_dict(unpack_report(child_text, child_packed, where))
        cluster = ClusterReport.from_dict(data)
        for entry, entry_dict in zip(cluster.nodes, data.get("nodes", []), strict=True):
            key = (entry_dict.get("report_run_id"), entry_dict.get("report_host"))
            if key in children:
                entry.report = children[key]
        return cluster

    def metric_points(self, metric: str | None = None, hosts: Sequence[str] | None = None,
                      since: float | None = None, until: float | None = None, check: str | None = None,
                      device: str | None = None, sku: str | None = None,
                      run_ids: Sequence[str] | None = None, hw_ids: Sequence[str] | None = None,
                      reruns: bool = False) -> list[MetricPoint]:
        """Stored metric values matching every filter given, oldest run first.

        ``since``/``until`` bound the run's start (epoch seconds); ``sku`` is
        the node's GPU SKU id; ``hw_ids`` the hardware measured. For baselines
        learnt from history and for trends: the first pass of each run only, unless ``reruns``
        (then a ``run --budget`` re-run's values come too, ``rerun=True``).
        """
        where: list[str] = [] if reruns else ["m.rerun = 0"]
        params: list[Any] = []
        # What and where a value is are looked up in their own tables first (indexed), then the values by
        # (key, place): without statistics SQLite would otherwise walk every value of a metric name.
        sub: dict[str, tuple[list[str], list[Any]]] = {"metric_keys": ([], []), "metric_places": ([], []),
                                                       "": ([], [])}
        for table, col, value in (("metric_keys", "name", metric), ("metric_keys", "check_name", check),
                                  ("metric_places", "device", device), ("", "r.sku", sku)):
            if value is not None:
                sub[table][0].append(f"{col} = ?")
                sub[table][1].append(value)
        for table, col, values in (("metric_places", "host", hosts), ("", "r.run_id", run_ids),
                                   ("metric_places", "hw_id", hw_ids)):
            if values is not None:
                values = list(values)
                if not values:
                    return []
                sub[table][0].append(f"{col} IN ({','.join('?' * len(values))})")
                sub[table][1].extend(values)
        for table, column in (("metric_keys", "m.key"), ("metric_places", "m.place")):
            conds, values = sub[table]
            if conds:
                where.append(f"{column} IN (SELECT id FROM {table} WHERE {' AND '.join(conds)})")
                params += values
        where += sub[""][0]
        params += sub[""][1]
        if since is not None:
            where.append("r.started_ts >= ?")
            params.append(float(since))
        if until is not None:
            where.append("r.started_ts < ?")
            params.append(float(until))
        sql = _POINT_SQL + (" WHERE " + " AND ".join(where) if where else "") + \
            " ORDER BY r.started_ts, r.id, m.device, m.id"

        def read() -> list[MetricPoint]:
            return [MetricPoint(run_id=r[0], host=r[1], sku=r[2], started=r[3], started_ts=float(r[4]), check=r[5],
                                name=r[6], device=r[7], value=r[8], unit=r[9], expected=r[10], threshold_op=r[11],
                                threshold_value=r[12], dtype=r[13], size_bytes=r[14], tags=json.loads(r[15]),
                                hw_kind=r[16], hw_id=r[17], hw_serial=r[18], rerun=bool(r[19]))
                    for r in self._execute(sql, params)]

        return self._retrying(read, write=False)

    def metric_series(self, host: str, metric: str, since: float | None = None, check: str | None = None,
                      device: str | None = None) -> list[MetricPoint]:
        """Values of ``metric`` on ``host`` over time, oldest first (every device, every tag set)."""
        return self.metric_points(metric=metric, hosts=[host], since=since, check=check, device=device)

    def hosts(self) -> list[str]:
        """Every host with a stored node run, sorted."""
        rows = self._retrying(lambda: self._execute(
            "SELECT DISTINCT host FROM runs WHERE kind = 'node' ORDER BY host"), write=False)
        return [r[0] for r in rows]

    def metric_names(self, host: str | None = None, hw_id: str | None = None) -> list[str]:
        """Every metric name stored (on ``host``, of hardware ``hw_id``, if given), sorted."""
        where = [f"{col} = ?" for col, v in (("host", host), ("hw_id", hw_id)) if v]
        params = [v for v in (host, hw_id) if v]
        sql = "SELECT DISTINCT name FROM metrics" + (" WHERE " + " AND ".join(where) if where else "") + \
            " ORDER BY name"
        return [r[0] for r in self._retrying(lambda: self._execute(sql, params), write=False)]

    def check_names(self) -> list[str]:
        """Every check name stored, sorted."""
        rows = self._retrying(lambda: self._execute("SELECT DISTINCT name FROM checks ORDER BY name"), write=False)
        return [r[0] for r in rows]

    def sightings(self, hw_ids: Sequence[str]) -> list[Sighting]:
        """Where each of ``hw_ids`` was (host and device), first seen first: a GPU's moves from host to host."""
        ids = list(hw_ids)
        if not ids:
            return []
        sql = (f"SELECT h.kind, h.hw_id, MAX(h.serial), h.host, h.device, MIN(r.started_ts), MAX(r.started_ts), "
               f"COUNT(DISTINCT r.id) FROM hardware h JOIN runs r ON r.id = h.run "
               f"WHERE h.hw_id IN ({','.join('?' * len(ids))}) GROUP BY h.kind, h.hw_id, h.host, h.device "
               f"ORDER BY MIN(r.started_ts), h.host, h.device")

        def read() -> list[Sighting]:
            out = []
            for kind, hid, serial, host, device, first, last, runs in self._execute(sql, ids):
                out.append(Sighting(kind=kind, hw_id=hid, serial=serial, host=host, device=device,
                                    first=epoch_to_iso(float(first)), last=epoch_to_iso(float(last)),
                                    first_ts=float(first), runs=int(runs)))
            return out

        return self._retrying(read, write=False)

    def hardware_count(self, kind: str) -> int:
        """How many distinct pieces of hardware of ``kind`` (gpu, nic, node) the history names."""
        rows = self._retrying(lambda: self._execute("SELECT COUNT(DISTINCT hw_id) FROM hardware WHERE kind = ?",
                                                    [kind]), write=False)
        return int(rows[0][0] or 0)
