"""Outliers among the GPUs of a node and among the nodes of a cluster: robust z-scores, vectorised.

Three comparisons, all per SKU and per metric key (check, metric, unit, tags;
see :mod:`gpuaccept.results.samples`):

- ``scope: node`` -- a GPU against the median of its siblings (the other
  devices of the node with the same key; at least ``min_siblings`` GPUs in
  all). The spread is the *pooled* sibling spread of the SKU across the
  whole input -- the median over every GPU of its distance to its siblings'
  median -- or the floor if larger. A single node's own MAD of eight values
  is too noisy to judge by: it is often twice or half the true spread.
- ``scope: cluster`` with ``device: null`` -- a node's median over its GPUs
  against the medians of the other nodes of its SKU (at least ``min_nodes``):
  the whole node is slow (power cap, cooling, a bad riser).
- ``scope: cluster`` with a device -- one sample against every sample of the
  SKU: node-wide and CPU metrics, single-GPU nodes, and GPUs of a node whose
  siblings are just as bad. Not repeated for a GPU already listed against its
  siblings, nor for the GPUs of a node listed as a whole when all of them
  are far out (then the node's entry says it all).

A value is an outlier when its robust z-score (:mod:`gpuaccept.results.stats`)
is at least ``max_z`` on the metric's bad side (:func:`samples.direction`).
The default ``max_z`` is 5, not the textbook 3.5: a 1,000-node report holds
400,000 values, and at 3.5 about 1 in 4,300 healthy normal values would be
flagged (~90 false outliers a run); at 5, about 1 in 3.5 million. In the
tests' simulations (32 nodes x 8 GPUs, 1-2 % noise), a GPU at 80 % of its
siblings scores |z| between 6 and 15, and 4 of 1,000 healthy fleets had one
value at |z| >= 5 (none at 5.5): the spread of a small fleet is itself noisy.

:func:`analyze` returns the plain dict stored in ``ClusterReport.analysis``::

    {"outliers": [{"host", "device", "check", "metric", "tags", "value", "median", "mad", "z",
                   "direction": "low"|"high", "scope": "node"|"cluster",
                   "sku", "unit", "deviation", "deviation_fraction", "gpus"?,
                   "hw_kind"?, "hw_id"?, "hw_serial"?}],
     "stats": {"<sku>/<metric>[tags]": {"median", "mad", "n", "nodes", "unit", "check", "metric",
                                        "sku", "tags", "direction", "compared", "not_compared"}},
     "coverage": {"groups", "compared", "fully", "partly", "not_compared"},
     "policy": {"max_z", "rel_floor", "min_siblings", "min_nodes"}, "nodes": int, "samples": int}

``compared`` lists the comparisons a group had (``node``, ``cluster``) and
``not_compared`` those it could not have, and why (fewer than ``min_nodes``
nodes, fewer than ``min_siblings`` GPUs in any node); ``coverage`` sums them
up (:mod:`gpuaccept.results.coverage`): no outlier in a group never compared is not a clean result.

A stats key is ``<sku>/<metric>``, followed by ``[k=v,...]`` only where
groups that would share it differ (check, unit, tags: a size sweep). In an
outlier, ``median`` is the reference it was compared with (its siblings', the
nodes' or the fleet's median), ``mad`` is the spread actually used (floored), so that
``z == 0.6745 * (value - median) / mad``; ``deviation`` is ``value - median``
in the metric's unit and ``deviation_fraction`` that over ``|median|``.
``gpus`` (node medians only) is how many GPUs the median is over. ``hw_kind``,
``hw_id`` and ``hw_serial`` name the hardware the outlier is (the GPU's UUID and
serial, the port's GUID; the node's board serial for a node-wide value) where the
report says (:mod:`gpuaccept.results.hwid`), so the part can be found after it
moves. Outliers are sorted by |z|, largest first. Pure: no I/O, the reports are not modified.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpuaccept.model import ClusterReport, NodeReport
from gpuaccept.results.coverage import coverage_of_group, coverage_summary
from gpuaccept.results.samples import SampleKey, Samples, collect
from gpuaccept.results.stats import DEFAULT_ABS_FLOOR, DEFAULT_REL_FLOOR, Z_CONST, group_loo_median, group_median

_DIR_CODE = {"low": 0, "high": 1, "both": 2}


@dataclass(frozen=True)
class OutlierPolicy:
    """When a value is an outlier (see the module docstring for the reasoning behind the defaults).

    ``max_z``: robust z-score at or beyond which a value is flagged;
    ``rel_floor``: the MAD is never below this fraction of |median|;
    ``min_siblings``: GPUs of one SKU a node needs for the within-node comparison;
    ``min_nodes``: nodes of one SKU needed for the cross-node comparisons.
    """

    max_z: float = 5.0
    rel_floor: float = DEFAULT_REL_FLOOR
    abs_floor: float = DEFAULT_ABS_FLOOR
    min_siblings: int = 3
    min_nodes: int = 3

    def __post_init__(self) -> None:
        if not self.max_z > 0:
            raise ValueError(f"max_z must be > 0, got {self.max_z}")
        if self.rel_floor < 0 or self.abs_floor <= 0:
            raise ValueError("rel_floor must be >= 0 and abs_floor > 0")
        if self.min_siblings < 3 or self.min_nodes < 3:
            raise ValueError("min_siblings and min_nodes must be >= 3 (two values cannot tell which is odd)")


def _dense(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique codes, inverse): dense group labels for non-negative integer codes, as ``np.unique`` gives them.
    Codes within a few times their count of 0 are counted, not sorted (a fleet's 2.8 M samples: the sort was
    a fifth of ``analyze``, and grew faster than the fleet)."""
    top = int(codes.max()) + 1 if codes.size else 0
    if codes.size and codes.min() >= 0 and top <= 4 * codes.size + (1 << 20):
        present = np.bincount(codes, minlength=top) > 0
        label = np.cumsum(present) - 1
        return np.flatnonzero(present).astype(codes.dtype), label[codes].astype(np.intp)
    uniq, inv = np.unique(codes, return_inverse=True)
    return uniq, inv.reshape(-1).astype(np.intp)


def _scale(center: np.ndarray, *spreads: np.ndarray, policy: OutlierPolicy) -> np.ndarray:
    s = np.maximum(policy.rel_floor * np.abs(center), policy.abs_floor)
    for sp in spreads:
        s = np.maximum(s, np.nan_to_num(sp, nan=0.0))
    return s


def _bad(z: np.ndarray, dir_code: np.ndarray, max_z: float) -> np.ndarray:
    """Mask of z-scores at least ``max_z`` on the bad side (0 low, 1 high, 2 both)."""
    return np.where(dir_code == 0, z <= -max_z, np.where(dir_code == 1, z >= max_z, np.abs(z) >= max_z))


def _labels(s: Samples, gk_key: np.ndarray, gk_sku: np.ndarray) -> list[str]:
    """``<sku>/<metric>``, plus ``[k=v,...]`` of what tells apart groups that would share that name."""
    base = [f"{s.skus[sk]}/{s.keys[k].metric}" for k, sk in zip(gk_key.tolist(), gk_sku.tolist(), strict=True)]
    by_base: dict[str, list[int]] = {}
    for i, b in enumerate(base):
        by_base.setdefault(b, []).append(i)
    out = list(base)
    for b, idx in by_base.items():
        if len(idx) == 1:
            continue
        keys = [s.keys[int(gk_key[i])] for i in idx]
        items = [{"check": k.check, "unit": k.unit, **dict(k.tags)} for k in keys]
        names = sorted({n for it in items for n in it})
        differ = [n for n in names if len({repr(it.get(n)) for it in items}) > 1]
        seen: set[str] = set()
        for i, it in zip(idx, items, strict=True):
            label = f"{b}[{','.join(f'{n}={it.get(n)}' for n in differ)}]"
            while label in seen:
                label += "'"
            seen.add(label)
            out[i] = label
    return out


def _outlier(s: Samples, key: SampleKey, sku: int, node: int, device: str | None, value: float, median: float,
             spread: float, z: float, scope: str) -> dict[str, Any]:
    dev = value - median
    out: dict[str, Any] = {
        "host": s.nodes[node][0], "device": device, "check": key.check, "metric": key.metric,
        "tags": dict(key.tags), "value": value, "median": median, "mad": spread, "z": round(z, 3),
        "direction": "low" if value < median else "high", "scope": scope,
        "sku": s.skus[sku], "unit": key.unit, "deviation": dev,
        "deviation_fraction": round(dev / abs(median), 5) if median else None,
    }
    hw = s.hardware[node].lookup(key.check, device) if node < len(s.hardware) else None
    if hw is not None:
        out.update(hw_kind=hw.kind, hw_id=hw.id, hw_serial=hw.serial)
    return out


def analyze_samples(s: Samples, policy: OutlierPolicy | None = None) -> dict[str, Any]:
    """The analysis dict (module docstring) of already collected samples. Values near the float range's ends
    (a hostile ``-1e308``) give infinite deviations, judged as such, without numpy's overflow warnings."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _analyze_samples(s, policy)


def _analyze_samples(s: Samples, policy: OutlierPolicy | None) -> dict[str, Any]:
    pol = policy or OutlierPolicy()
    result: dict[str, Any] = {"outliers": [], "stats": {}, "policy": {k: v for k, v in asdict(pol).items()
                                                                      if k != "abs_floor"},
                              "nodes": len(s.nodes), "samples": len(s)}
    if not len(s):
        result["coverage"] = coverage_summary([])
        return result
    n_nodes, n_sku = max(len(s.nodes), 1), max(len(s.skus), 1)
    value = s.value
    dir_of_key = np.array([_DIR_CODE[k.direction or "both"] for k in s.keys], dtype=np.int8)

    # Fleet statistics per (key, sku).
    gk_codes, gk = _dense(s.key * n_sku + s.sku)
    n_g = gk_codes.size
    gk_key, gk_sku = gk_codes // n_sku, gk_codes % n_sku
    med_c, cnt_c = group_median(value, gk, n_g)
    mad_c, _ = group_median(np.abs(value - med_c[gk]), gk, n_g)
    node_codes, _ = _dense(gk.astype(np.int64) * n_nodes + s.node)
    nodes_per_g = np.bincount(node_codes // n_nodes, minlength=n_g)
    dir_g = dir_of_key[gk_key]

    labels = _labels(s, gk_key, gk_sku)
    gpu_rows = s.is_gpu()
    has_gpu = np.bincount(gk[gpu_rows], minlength=n_g) > 0
    sib_codes, sib = _dense(gk[gpu_rows].astype(np.int64) * n_nodes + s.node[gpu_rows])
    most_gpus = np.zeros(n_g, dtype=np.intp)
    np.maximum.at(most_gpus, sib_codes // n_nodes, np.bincount(sib, minlength=sib_codes.size))
    for g in range(n_g):
        key = s.keys[int(gk_key[g])]
        result["stats"][labels[g]] = {
            "median": float(med_c[g]), "mad": float(mad_c[g]), "n": int(cnt_c[g]), "nodes": int(nodes_per_g[g]),
            "unit": key.unit, "check": key.check, "metric": key.metric, "sku": s.skus[int(gk_sku[g])],
            "tags": dict(key.tags), "direction": key.direction,
            **coverage_of_group(int(nodes_per_g[g]), int(most_gpus[g]) if has_gpu[g] else None, pol.min_nodes,
                                pol.min_siblings),
        }
    result["coverage"] = coverage_summary(result["stats"].values())

    outliers: list[dict[str, Any]] = []

    # Across the cluster: each sample against every sample of its SKU (listed last, below).
    spread_c = _scale(med_c[gk], mad_c[gk], policy=pol)
    z_c = Z_CONST * (value - med_c[gk]) / spread_c
    hit_c = (nodes_per_g[gk] >= pol.min_nodes) & _bad(z_c, dir_g[gk], pol.max_z)
    covered = np.zeros(value.size, dtype=bool)     # rows already listed, or summed up by their node's entry

    # Within a node: each GPU against its siblings.
    gpu_idx = np.flatnonzero(s.is_gpu())
    if gpu_idx.size:
        g_of = gk[gpu_idx]
        sub_codes, sub = _dense(g_of.astype(np.int64) * n_nodes + s.node[gpu_idx])
        n_sub = sub_codes.size
        v = value[gpu_idx]
        med_n, cnt_n = group_median(v, sub, n_sub)
        siblings = group_loo_median(v, sub, n_sub)
        dev = v - siblings
        eligible = cnt_n[sub] >= pol.min_siblings
        pooled = np.zeros(n_g)
        if eligible.any():
            pooled_e, cnt_e = group_median(np.abs(dev[eligible]), g_of[eligible], n_g)
            pooled = np.where(cnt_e > 0, pooled_e, 0.0)
        spread = _scale(siblings, pooled[g_of], policy=pol)
        z = Z_CONST * dev / spread
        hit = eligible & _bad(z, dir_g[g_of], pol.max_z)
        covered[gpu_idx[hit]] = True
        for i in np.flatnonzero(hit).tolist():
            row = int(gpu_idx[i])
            outliers.append(_outlier(s, s.keys[int(s.key[row])], int(s.sku[row]), int(s.node[row]),
                                     s.devices[int(s.device[row])], float(v[i]), float(siblings[i]),
                                     float(spread[i]), float(z[i]), "node"))

        # Across nodes: each node's median over its GPUs against the other nodes' medians.
        sub_g, sub_node = sub_codes // n_nodes, sub_codes % n_nodes
        med_a, cnt_a = group_median(med_n, sub_g, n_g)
        mad_a, _ = group_median(np.abs(med_n - med_a[sub_g]), sub_g, n_g)
        spread_a = _scale(med_a[sub_g], mad_a[sub_g], policy=pol)
        z_a = Z_CONST * (med_n - med_a[sub_g]) / spread_a
        hit_a = (cnt_n >= 2) & (cnt_a[sub_g] >= pol.min_nodes) & _bad(z_a, dir_g[sub_g], pol.max_z)
        # When every GPU of a flagged node is itself far out, the node's entry says it all.
        far = np.bincount(sub, weights=hit_c[gpu_idx].astype(np.float64), minlength=n_sub)
        whole = hit_a & (far >= cnt_n)
        covered[gpu_idx[whole[sub]]] = True
        for j in np.flatnonzero(hit_a).tolist():
            g, node = int(sub_g[j]), int(sub_node[j])
            entry = _outlier(s, s.keys[int(gk_key[g])], int(gk_sku[g]), node, None, float(med_n[j]),
                             float(med_a[g]), float(spread_a[j]), float(z_a[j]), "cluster")
            entry["gpus"] = int(cnt_n[j])
            outliers.append(entry)

    for row in np.flatnonzero(hit_c & ~covered).tolist():
        g, node = int(gk[row]), int(s.node[row])
        outliers.append(_outlier(s, s.keys[int(s.key[row])], int(s.sku[row]), node, s.devices[int(s.device[row])],
                                 float(value[row]), float(med_c[g]), float(spread_c[row]), float(z_c[row]),
                                 "cluster"))

    outliers.sort(key=lambda o: (-abs(o["z"]), o["host"], o["device"] or "", o["metric"]))
    result["outliers"] = outliers
    return result


def analyze(reports: ClusterReport | NodeReport | Iterable[NodeReport | ClusterReport],
            policy: OutlierPolicy | None = None) -> dict[str, Any]:
    """Outliers and per-SKU statistics of a cluster report, one node report, or several of either."""
    items: Iterable[NodeReport | ClusterReport]
    items = [reports] if isinstance(reports, (ClusterReport, NodeReport)) else reports
    return analyze_samples(collect(items), policy)


def with_analysis(cluster: ClusterReport, policy: OutlierPolicy | None = None) -> ClusterReport:
    """A copy of ``cluster`` whose ``analysis`` is :func:`analyze` of it (node reports shared, not copied)."""
    from dataclasses import replace

    return replace(cluster, analysis=analyze(cluster, policy))
