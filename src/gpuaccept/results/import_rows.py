"""``history --import`` of a fleet: each node's rows made in worker processes (issue #27: fleet scale).

:func:`open_cluster_rows` reads a line-layout cluster report's node lines, and worker processes
(:func:`gpuaccept.results.load.map_valid_chunks`) parse and validate them 16 at a time and make each node's
rows (:func:`gpuaccept.results.rows.flatten_entry`) with its metrics split into keys, places and numbers
(:func:`gpuaccept.results.metricrows.split_metrics`), so that the one process that writes
(:meth:`gpuaccept.results.store.Store.add_cluster_stream`) only looks up ids and inserts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuaccept.model import ClusterReport
from gpuaccept.results.load import map_valid_chunks, open_cluster_lines
from gpuaccept.results.metricrows import split_metrics
from gpuaccept.results.parallel import flat
from gpuaccept.results.rows import Flattened, flatten_entry


def flatten_chunk(stored_at: str, part: list[tuple[int, str, dict[str, Any]]]) -> list[Flattened]:
    """:func:`flatten_entry` of each validated entry of a chunk, its metric rows split into keys, places and
    numbers (:func:`gpuaccept.results.metricrows.split_metrics`), in a worker process
    (:func:`gpuaccept.results.load.map_valid_chunks`), so that the one process that writes only looks up ids."""
    out = [flatten_entry(data, stored_at, n) for n, _at, data in part]
    for done in out:
        if done.flat is not None:
            split_metrics(done.flat)
    return out


def open_cluster_rows(path: Path, stored_at: str, *, workers: int | None = None
                      ) -> tuple[ClusterReport, Iterator[Flattened]]:
    """A line-layout cluster report's header and each node's rows, made in worker processes a chunk at a time
    and read back in the file's order (``history --import`` of a fleet); errors as a one-process read."""
    cluster, raw = open_cluster_lines(path)
    return cluster, flat(map_valid_chunks(raw, functools.partial(flatten_chunk, stored_at), workers=workers,
                                          what=f"the node lines of {path}"))
