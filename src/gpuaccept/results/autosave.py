"""Storing finished reports in the history from ``run``, ``launch`` and ``gather``.

The report file is always written first; a history that cannot be opened or
written costs a warning, never the measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from gpuaccept.errors import GpuacceptError
from gpuaccept.model import ClusterReport, NodeReport, Verdict

DB_HELP = ("history database URL: sqlite:///PATH or postgresql://USER@HOST[:PORT]/DB "
           "(default: $GPUACCEPT_DB, else ~/.local/share/gpuaccept/history.db)")


def add_history_options(parser: argparse.ArgumentParser | Any) -> None:
    """``--db URL`` and ``--no-history`` on a parser or argument group."""
    parser.add_argument("--db", default=None, metavar="URL", help=DB_HELP)
    parser.add_argument("--no-history", action="store_true", help="do not store this run in the history")


def save(report: NodeReport | ClusterReport, args: argparse.Namespace, where: Path) -> bool:
    """Store ``report`` unless ``--no-history``; print one line to stderr either way. Never raises."""
    return store(report, where, db=getattr(args, "db", None), off=bool(getattr(args, "no_history", False)))


def save_stream(source: Callable[[], tuple[ClusterReport, Iterable[Any]]], verdict: Verdict,
                args: argparse.Namespace, where: Path) -> bool:
    """:func:`save` of a cluster (of ``verdict``) read a node at a time: ``source()`` gives its header and node
    entries (:meth:`gpuaccept.results.store.Store.add_cluster_stream`), so storing holds a batch of nodes, not
    the cluster."""
    if getattr(args, "no_history", False):
        return False
    from gpuaccept.results.history import record_stream

    return _store(lambda db: record_stream(source, db), verdict, where, db=getattr(args, "db", None))


def store(report: NodeReport | ClusterReport, where: Path, *, db: str | None, off: bool = False) -> bool:
    """Store ``report`` in the history at ``db`` (None: the default one) unless ``off``; print one line to stderr
    either way (``where``: the report on disk, named when it could not be stored). Never raises. A stop signal
    that comes while the row is written waits for it (:func:`deferred_stop`), and is then acted on for a run that
    had finished (an interrupted run is already stopping)."""
    if off:
        return False
    from gpuaccept.results.history import record

    return _store(lambda url: record(report, url), report.verdict, where, db=db)


def _store(do: Callable[[str | None], str], verdict: Verdict, where: Path, *, db: str | None) -> bool:
    with deferred_stop() as caught:
        try:
            note = do(db)
        except GpuacceptError as exc:
            print(f"gpuaccept: warning: not stored in the history ({exc}); the report is in {where}",
                  file=sys.stderr)
            note = ""
    if caught and verdict is not Verdict.INTERRUPTED:  # a finished run's stop comes after its row
        signal.raise_signal(caught[0])
    if note:
        print(f"[RESULT] {note}", file=sys.stderr, flush=True)
    return bool(note)


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred_stop() -> Iterator[list[int]]:
    """SIGINT, SIGTERM and SIGHUP noted (in the list yielded), not acted on, while the history row is written:
    a second stop during a wait for a locked database must not lose the row. Outside the main thread: nothing."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    old = {sig: signal.getsignal(sig) for sig in STOPS}
    for sig in STOPS:
        signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
