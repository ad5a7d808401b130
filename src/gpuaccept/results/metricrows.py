"""Metric rows as the history stores them since schema v6: ids and numbers (issue #27: fleet scale).

A flattened metric row (``run``, ``check_id``, then :data:`~gpuaccept.results.rows.METRIC_COLUMNS`) is split
into its *key* (what was measured: check, name, unit, tags, dtype, size; a ``metric_keys`` row shared by
every node and run), its *place* (host, device and the hardware measured; a ``metric_places`` row shared by
every run of that device) and a ``metric_values`` row of ids and numbers. The ``metrics`` view joins them back
into the rows as before. Keys and places are looked up, and the missing ones bulk-inserted, once per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from operator import itemgetter
from typing import Any

from gpuaccept.results.rows import METRIC_COLUMNS, SplitMetrics

KEY_COLUMNS = ("check_name", "name", "unit", "tags_json", "dtype", "size_bytes")
PLACE_COLUMNS = ("host", "device", "hw_kind", "hw_id", "hw_serial")
VALUE_COLUMNS = ("run", "check_id", "key", "place", "value", "expected", "threshold_op", "threshold_value", "rerun")

_FLAT = ("run", "check_id", *METRIC_COLUMNS)
_key_of = itemgetter(*(_FLAT.index(c) for c in KEY_COLUMNS))
_place_of = itemgetter(*(_FLAT.index(c) for c in PLACE_COLUMNS))
_numbers_of = itemgetter(*(_FLAT.index(c) for c in ("value", "expected", "threshold_op", "threshold_value")))
_RERUN = _FLAT.index("rerun")

Execute = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
BulkInsert = Callable[[str, Sequence[str], Sequence[Sequence[Any]]], None]


def _ids(execute: Execute, bulk_insert: BulkInsert, table: str, cols: tuple[str, ...],
         wanted: Collection[tuple[Any, ...]]) -> dict[tuple[Any, ...], int]:
    """Id of every tuple in ``wanted`` (``cols`` of ``table``), inserting those not there yet, in ``wanted``'s
    order. Looked up by the first column (indexed), 500 values a query."""
    def fetch() -> dict[tuple[Any, ...], int]:
        firsts = sorted({w[0] for w in wanted})
        found: dict[tuple[Any, ...], int] = {}
        for i in range(0, len(firsts), 500):
            part = firsts[i:i + 500]
            rows = execute(f"SELECT id, {', '.join(cols)} FROM {table} WHERE {cols[0]} IN "
                           f"({', '.join('?' * len(part))}) ORDER BY id", part)
            for row in rows:
                found.setdefault(tuple(row[1:]), int(row[0]))
        return found

    ids = fetch()
    missing = [w for w in wanted if w not in ids]
    if missing:
        bulk_insert(table, cols, missing)
        ids = fetch()
    return ids


def value_rows(flat: Iterable[Sequence[Any]], execute: Execute, bulk_insert: BulkInsert) -> list[tuple[Any, ...]]:
    """``metric_values`` rows (:data:`VALUE_COLUMNS`) of flattened metric rows, their keys and places looked up
    or inserted (inside the caller's transaction)."""
    rows = list(flat)
    if not rows:
        return []
    keys = _ids(execute, bulk_insert, "metric_keys", KEY_COLUMNS, {_key_of(r) for r in rows})
    places = _ids(execute, bulk_insert, "metric_places", PLACE_COLUMNS, {_place_of(r) for r in rows})
    return [(r[0], r[1], keys[_key_of(r)], places[_place_of(r)], *_numbers_of(r), int(bool(r[_RERUN])))
            for r in rows]


def split_value_rows(parts: Sequence[tuple[int, Sequence[int], SplitMetrics]], execute: Execute,
                     bulk_insert: BulkInsert, known: dict[tuple[Any, ...], int] | None = None,
                     first_id: int | None = None) -> list[tuple[Any, ...]]:
    """:func:`value_rows` of node runs whose metrics were split (``flatten_node_data(split=True)``): ``parts``
    gives each run's id, its checks' ids in order and its :class:`SplitMetrics`. The same rows in the same order,
    each led by its id when ``first_id`` is given (numbered from it). Runs whose splits share one ``keys`` list
    (a worker's chunk) have it looked up once; new keys are inserted in its order (the report's, so each run's
    rows come in key order); ``known``: key ids already looked up in this transaction (only the others are
    looked up; they are added to it)."""
    lists = {id(split.keys): split.keys for _run, _checks, split in parts}
    key_ids = known if known is not None else {}
    new = dict.fromkeys(k for keys in lists.values() for k in keys if k not in key_ids)
    if new:
        key_ids.update(_ids(execute, bulk_insert, "metric_keys", KEY_COLUMNS, new))
    wanted_places: dict[tuple[Any, ...], None] = {}
    for _run, _checks, split in parts:
        wanted_places.update(dict.fromkeys(split.places))
    if not wanted_places:
        return []
    place_ids = _ids(execute, bulk_insert, "metric_places", PLACE_COLUMNS, wanted_places)
    kids = {i: [key_ids[k] for k in keys] for i, keys in lists.items()}
    out: list[tuple[Any, ...]] = []
    n = first_id
    for run_pk, check_pks, split in parts:
        kid = kids[id(split.keys)]
        pid = [place_ids[p] for p in split.places]
        for check_pk, rows in zip(check_pks, split.checks, strict=True):
            if n is None:
                out += [(run_pk, check_pk, kid[r[0]], pid[r[1]], r[2], r[3], r[4], r[5], r[6]) for r in rows]
            else:
                out += [(i, run_pk, check_pk, kid[r[0]], pid[r[1]], r[2], r[3], r[4], r[5], r[6])
                        for i, r in enumerate(rows, n)]
                n += len(rows)
    return out
