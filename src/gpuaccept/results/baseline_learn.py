"""Learning a fleet baseline from reports: robust medians per SKU, metric, dtype and size, outliers trimmed."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence

import numpy as np

from gpuaccept.model import ClusterReport, NodeReport
from gpuaccept.results.baseline import Baseline, BaselineEntry, as_int
from gpuaccept.results.baseline_curves import CurveEntry, CurveLearner
from gpuaccept.results.samples import Samples, collect, node_reports
from gpuaccept.results.stats import trim_outliers


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def learn_baseline(reports: Iterable[NodeReport | ClusterReport], *, trim_z: float = 3.5, min_samples: int = 3,
                   origin: Sequence[str] = (), created: str | None = None) -> Baseline:
    """Learn a baseline from a fleet's reports (node reports, or cluster reports' nodes).

    Samples are grouped by SKU, metric, unit, ``dtype`` tag and -- for metrics
    measured at several sizes in one run on one device, like collective sweeps
    -- the ``size_bytes`` tag. Per group, values with |robust z| > ``trim_z``
    are dropped and the median recomputed until none is dropped; groups left
    with fewer than ``min_samples`` values are omitted. Metrics that are never
    judged (instantaneous power, ...), skipped or errored checks and
    non-finite values are ignored. ``runs`` counts node reports. reference_train's per-step digests become
    the baseline's ``curves`` (:class:`~gpuaccept.results.baseline_curves.CurveLearner`).
    """
    learner = CurveLearner()
    s = collect(learner.tap(node_reports(reports)))
    return learn_baseline_samples(s, trim_z=trim_z, min_samples=min_samples, origin=origin, created=created,
                                  curves=learner.entries())


def learn_baseline_samples(s: Samples, *, trim_z: float = 3.5, min_samples: int = 3, origin: Sequence[str] = (),
                           created: str | None = None, curves: Sequence[CurveEntry] = ()) -> Baseline:
    """:func:`learn_baseline` of already collected samples (one node per node report, e.g. a cluster report's
    metrics table, :mod:`gpuaccept.results.columns`); ``curves``: reference_train's learnt curves, if any."""
    if not trim_z > 0 or min_samples < 1:
        raise ValueError("trim_z must be > 0 and min_samples >= 1")
    host_ids: dict[str, int] = {}
    host_of_node = np.array([host_ids.setdefault(h, len(host_ids)) for h, _ in s.nodes], dtype=np.int64)
    entries: dict[str, list[BaselineEntry]] = {}
    if len(s):
        # Per (key, sku) pair: the group identity without size, and the key's size_bytes (or -1).
        n_sku = len(s.skus)
        idents: dict[tuple[str, str, str, str | None], int] = {}
        pair_codes, pair_of_row = np.unique(s.key.astype(np.int64) * n_sku + s.sku, return_inverse=True)
        pair_group = np.empty(pair_codes.size, dtype=np.int64)
        for i, code in enumerate(pair_codes.tolist()):
            key = s.keys[code // n_sku]
            dtype = dict(key.tags).get("dtype")
            ident = (s.skus[code % n_sku], key.metric, key.unit, dtype if isinstance(dtype, str) else None)
            pair_group[i] = idents.setdefault(ident, len(idents))
        group = pair_group[pair_of_row.reshape(-1)]
        size_of_key = np.array([_size_tag(k.tags) for k in s.keys], dtype=np.int64)
        size = size_of_key[s.key]

        # A group is a sweep when one (report, device) measured it at more than one size.
        where = (group * len(s.nodes) + s.node) * len(s.devices) + s.device
        order = np.lexsort((size, where))
        w, sz = where[order], size[order]
        new_size = np.ones(w.size, dtype=bool)
        new_size[1:] = (w[1:] != w[:-1]) | (sz[1:] != sz[:-1])
        second_size = new_size.copy()
        second_size[1:] &= w[1:] == w[:-1]
        second_size[0] = False
        sweeps = np.unique(group[order][second_size])
        size_key = np.where(np.isin(group, sweeps), size, -1)

        # Final groups: (group, size or -1), rows sorted by them.
        order = np.lexsort((size_key, group))
        g_sorted, s_sorted = group[order], size_key[order]
        starts = np.flatnonzero(np.r_[True, (g_sorted[1:] != g_sorted[:-1]) | (s_sorted[1:] != s_sorted[:-1])])
        ends = np.r_[starts[1:], order.size]
        ident_list = list(idents)
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            rows = order[a:b]
            t = trim_outliers(s.value[rows], max_z=trim_z)
            if t.n < min_samples:
                continue
            sku, metric, unit, dtype = ident_list[int(g_sorted[a])]
            size_bytes = int(s_sorted[a])
            entries.setdefault(sku, []).append(BaselineEntry(
                metric=metric, value=t.center, unit=unit, mad=t.mad, n=t.n, dtype=dtype,
                size_bytes=size_bytes if size_bytes >= 0 else None,
                nodes=int(np.unique(host_of_node[s.node[rows]]).size), runs=int(np.unique(s.node[rows]).size),
                dropped=t.dropped))
    skus: dict[str, tuple[BaselineEntry, ...]] = {}
    for sku in sorted(entries):
        skus[sku] = tuple(sorted(entries[sku], key=lambda e: (e.metric, e.dtype or "",
                                                              -1 if e.size_bytes is None else e.size_bytes)))
    return Baseline(skus=skus, created=created or _now(), nodes=len(host_ids), runs=len(s.nodes), tool=_tool(),
                    origin=tuple(origin), trim_z=trim_z, curves=tuple(curves))


def _size_tag(tags: tuple[tuple[str, str | int | float], ...]) -> int:
    size = as_int(dict(tags).get("size_bytes"))
    return size if size is not None and size >= 0 else -1


def _tool() -> str:
    try:
        from gpuaccept import __version__
    except ImportError:  # pragma: no cover - the package always has one
        return "gpuaccept"
    return f"gpuaccept {__version__}"
