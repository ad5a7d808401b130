"""Opening the history: a URL to a :class:`~gpuaccept.results.store.Store`, and storing one report.

The factory lives here, apart from the interface, so that :mod:`gpuaccept.results.store`
imports none of its implementations (SQLite, PostgreSQL) and they import only it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from gpuaccept.model import ClusterReport, NodeReport
from gpuaccept.results.dburl import DbUrl, parse_db_url, resolve_db_url
from gpuaccept.results.store import Store


@contextmanager
def _closing(store: Store) -> Iterator[Store]:
    try:
        yield store
    finally:
        store.close()


def open_store(url: str | DbUrl | None = None, retry_s: float = 120.0, read_only: bool = False) -> Store:
    """Open (creating or migrating as needed) the history at ``url``.

    ``None`` means ``$GPUACCEPT_DB`` or the default SQLite file. Raises
    UsageError for a bad URL, InputError for a database gpuaccept must not
    touch (foreign, corrupt, newer schema), StoreError when it cannot be reached.
    ``read_only`` (commands that only read) creates and migrates nothing: a missing SQLite
    file is an InputError, an existing one is opened with ``mode=ro``; a PostgreSQL session is
    read-only, and a missing or older history schema there is an InputError.
    """
    parsed = url if isinstance(url, DbUrl) else (resolve_db_url(None) if url is None else parse_db_url(url))
    if parsed.kind == "sqlite":
        from gpuaccept.results.store_sqlite import SqliteStore

        return SqliteStore(parsed, retry_s=retry_s, read_only=read_only)
    from gpuaccept.results.store_postgres import PostgresStore

    return PostgresStore(parsed, retry_s=retry_s, read_only=read_only)


def record_stream(source: Callable[[], tuple[ClusterReport, Iterable[Any]]], url: str | DbUrl | None = None) -> str:
    """:func:`record` of a cluster read a node at a time (:meth:`Store.add_cluster_stream`: ``source`` gives its
    header and node entries, and is called again when the write is retried); the note counts the nodes stored."""
    count = 0

    def counted() -> tuple[ClusterReport, Iterable[Any]]:
        nonlocal count
        header, entries = source()
        count = 0

        def each() -> Iterator[Any]:
            nonlocal count
            for entry in entries:
                count += 1
                yield entry
        return header, each()

    with _closing(open_store(url)) as store:
        run_id = store.add_cluster_stream(counted)
        return f"stored cluster run {run_id} ({count} nodes) in {store}"


def record(report: NodeReport | ClusterReport, url: str | DbUrl | None = None) -> str:
    """Store ``report`` in the history at ``url``; return a one-line note for the user.

    Call it only after the report is on disk: it raises GpuacceptError
    (StoreError, InputError, UsageError) on any failure, and the caller should
    print that as a warning naming where the report file is, not drop the report.
    """
    with _closing(open_store(url)) as store:
        if isinstance(report, ClusterReport):
            store.add_cluster_report(report)
            what = f"cluster run {report.run_id} ({len(report.nodes)} nodes)"
        else:
            store.add_node_report(report)
            what = f"run {report.run_id}"
        return f"stored {what} in {store}"
