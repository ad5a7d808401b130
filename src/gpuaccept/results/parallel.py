"""Work on a fleet's node lines in worker processes, results in order (issue #27: fleet scale).

Reading a cluster report is mostly per-node CPU (parse, validate, build what the reader needs: about 10 ms a
node of an 8-GPU report), and the nodes are independent. :func:`ordered_chunks` cuts the items into chunks,
runs a function on each chunk in forked worker processes, and yields each chunk's result in the items' order,
with a bounded number of chunks in flight (memory holds a few chunks, not the cluster). An error from a chunk is
raised where that chunk's result would have come; an error from the items themselves (the reader of the
file) after the results of every chunk read before it, so the first problem in the file is the one reported,
as a one-process read would report it. Where processes cannot be forked (or this process runs threads), or
with one worker, the chunks run here, one after another.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from gpuaccept.errors import InputError

T = TypeVar("T")
R = TypeVar("R")

CHUNK = 16
"""Items a worker takes at a time (about 3 MB of node lines of an 8-GPU fleet)."""


def default_workers() -> int:
    """Worker processes: the CPUs this process may run on, at most 8; 1 (none) where processes cannot be
    forked, or this one runs threads (forking a process that runs threads could copy a held lock)."""
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return 1
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(8, os.cpu_count() or 1))


def _quiet() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to act on (it stops the pool)


def ordered_chunks(fn: Callable[[list[T]], R], items: Iterable[T], *, workers: int | None = None,
                   chunk: int = CHUNK, what: str = "the node lines") -> Iterator[R]:
    """``fn(chunk)`` for each run of ``chunk`` consecutive items, in order (see the module docstring).
    ``fn`` must be picklable (a module-level function, or a :func:`functools.partial` of one) when
    ``workers`` > 1. ``workers`` None: :func:`default_workers`. A worker that dies is an InputError."""
    n = default_workers() if workers is None else workers
    source = iter(items)
    chunks = iter(lambda: list(itertools.islice(source, chunk)), [])
    if n <= 1:
        yield from map(fn, chunks)
        return
    yield from _pooled(fn, chunks, n, what)


def _pooled(fn: Callable[[list[T]], R], chunks: Iterator[list[T]], workers: int, what: str) -> Iterator[R]:
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_quiet)
    ahead: collections.deque[Future[R]] = collections.deque()
    failed: BaseException | None = None

    def fill() -> None:
        nonlocal failed
        while failed is None and len(ahead) < 2 * workers:
            try:
                part = next(chunks)
            except StopIteration:
                return
            except Exception as exc:  # the reader's error: raised after the chunks read before it
                failed = exc
                return
            ahead.append(pool.submit(fn, part))

    try:
        fill()
        while ahead:
            done = ahead.popleft()
            fill()
            yield done.result()
        if failed is not None:
            raise failed
    except BrokenProcessPool as exc:
        raise InputError(f"a worker process reading {what} died ({exc})") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def flat(results: Iterable[list[Any]]) -> Iterator[Any]:
    """The items of each chunk's list, in order."""
    for part in results:
        yield from part
