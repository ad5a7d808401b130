"""``gpuaccept report`` of a fleet in bounded memory (issue #27): a cluster report in the line layout read a node
at a time, each healthy node kept as a slim copy.

:func:`load_slim` streams the nodes (:func:`gpuaccept.results.load.open_cluster`: each validated as before)
through a :class:`~gpuaccept.report.grid.GridBuilder` (the sweeps, heatmap and GPU count of the HTML page, as
floats) and keeps of each node only what the Markdown and HTML renderers read of a cluster of more than
:data:`FULL_UP_TO` nodes:

* a node that needs a look (missing, not successful, a failed, errored or warned check, flagged by the stored
  outlier analysis, or with a check run on another host) is kept whole: its tables and details are shown;
* every other node keeps its report's fields and each check's name, status, reason, time, rank, host and fault,
  with only the metrics read of a healthy node (the measured-but-not-judged figures, which make its state, and
  those of :data:`KEEP_METRICS`, for training against GEMM) and the details of :data:`KEEP_DETAILS` (the SKU,
  the configuration, the training dtype; of other checks only the re-run mark).

The first :data:`FULL_UP_TO` nodes are held whole until a further node shows that the cluster is a fleet; after
them, a healthy node's dropped metrics are never built as objects (the grid takes them from the parsed JSON). The
rendered text is the same as from the whole report (tests/test_report_slim.py compares them byte for byte).
"""

from __future__ import annotations

import functools
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuaccept.model import CheckResult, ClusterReport, NodeEntry, NodeState, Status, Verdict, is_not_judged
from gpuaccept.report.grid import GridBuilder
from gpuaccept.report.html_fleet import FLEET_NODES
from gpuaccept.report.views import NodeView, OutlierIndex, outliers
from gpuaccept.results.load import entry_from_dict

FULL_UP_TO = FLEET_NODES
"""Clusters of at most this many nodes are held whole (their pages show every node in full)."""
KEEP_METRICS = frozenset({"compute", "reference_train"})
"""Checks whose metrics a healthy node keeps (the Markdown report's training against the GEMM rate)."""
KEEP_DETAILS = frozenset({"env", "conformance", "reference_train"})
"""Checks whose details a healthy node keeps (GPU SKU, configuration drift, training dtype)."""
_BAD = (Status.FAIL, Status.ERROR, Status.WARN)


def needs_whole(entry: NodeEntry, flagged: AbstractSet[str]) -> bool:
    """Whether ``entry`` is shown in detail on a fleet's page, so kept whole."""
    rep = entry.report
    if rep is None or entry.state is not NodeState.REPORTED or entry.host in flagged:
        return True
    if rep.verdict is not Verdict.SUCCESS:
        return True
    return any(c.status in _BAD or (c.host is not None and c.host != entry.host) for c in rep.checks)


def _slim_check(c: CheckResult) -> CheckResult:
    metrics = list(c.metrics) if c.name in KEEP_METRICS else [m for m in c.metrics if is_not_judged(m)]
    if c.name in KEEP_DETAILS:
        details = c.details
    else:
        details = {"rerun": c.details["rerun"]} if isinstance(c.details, dict) and "rerun" in c.details else {}
    return replace(c, metrics=metrics, details=details)


def slim_entry(entry: NodeEntry) -> NodeEntry:
    """``entry`` with each check cut to what a fleet's page reads of a healthy node."""
    if entry.report is None:
        return entry
    return replace(entry, report=replace(entry.report, checks=[_slim_check(c) for c in entry.report.checks]))


def _not_judged_dict(m: dict[str, Any]) -> bool:
    """:func:`~gpuaccept.model.is_not_judged` of a metric's parsed JSON (as ``Metric.from_dict`` reads it)."""
    return m.get("performance") is True and not m.get("threshold") and m.get("expected") is None


def _lean(data: dict[str, Any]) -> dict[str, Any]:
    """A node entry's parsed JSON with the metrics a slim node drops left out (shallow copies; ``data`` intact)."""
    rep = data.get("report")
    if not isinstance(rep, dict):
        return data
    checks = [c if c.get("name") in KEEP_METRICS else {**c, "metrics": [m for m in c.get("metrics", [])
                                                                          if _not_judged_dict(m)]}
              for c in rep.get("checks", [])]
    return {**data, "report": {**rep, "checks": checks}}


def view_of(entry: NodeEntry) -> NodeView:
    """The node as :func:`gpuaccept.report.views.node_views` sees it."""
    rep = entry.report if entry.state is NodeState.REPORTED else None
    return NodeView(entry.host, rep, entry.reason or ("" if rep is not None else "no report"), entry.node_rank)


def load_slim(path: Path, *, grid: bool = True, workers: int | None = None
              ) -> tuple[ClusterReport, GridBuilder | None] | None:
    """The cluster report at ``path`` (a line-layout file) with slim healthy nodes, and the grid gathered from
    every node in full; None when its header holds no outlier analysis (the caller reads it whole and analyses
    it). ``grid=False``: no grid gathered (the Markdown report has no sweeps or heatmap). The nodes are read,
    validated and cut in worker processes, a chunk at a time (:func:`gpuaccept.results.load.open_cluster_chunks`;
    ``workers`` None: one per CPU, at most 8). InputError (exit 2, one line naming the file and line) when
    malformed, as for a whole read."""
    from gpuaccept.results.load import map_valid_chunks, open_cluster_lines

    cluster, raw = open_cluster_lines(path)
    if not cluster.analysis:
        getattr(raw, "close", lambda: None)()
        return None
    flagged = frozenset(OutlierIndex(outliers(cluster)).hosts())
    chunks = map_valid_chunks(raw, functools.partial(_slim_chunk, flagged, grid), workers=workers,
                              what=f"the node lines of {path}")
    builder = GridBuilder() if grid else None
    nodes = cluster.nodes
    held: list[int] = []  # positions of healthy nodes still whole while the cluster is small
    for part, got in chunks:
        if builder is not None and got is not None:
            builder.merge(got)
        for entry, whole in part:
            if not whole and len(nodes) < FULL_UP_TO:
                held.append(len(nodes))
            nodes.append(entry)
            if len(nodes) > FULL_UP_TO and held:
                for i in held:
                    nodes[i] = slim_entry(nodes[i])
                held = []
    return cluster, builder


def _slim_chunk(flagged: frozenset[str], grid: bool, part: list[tuple[int, str, dict[str, Any]]]
                ) -> tuple[list[tuple[NodeEntry, bool]], GridBuilder | None]:
    """In a worker: each node of ``part`` as :func:`load_slim` keeps it (whole while it may be among the first
    :data:`FULL_UP_TO`, then slim unless it :func:`needs_whole`; the metrics a slim node drops are never built
    as objects), whether it is kept whole, and the grid of the chunk's nodes."""
    builder = GridBuilder() if grid else None
    out = []
    for n, at, data in part:
        if n >= FULL_UP_TO:  # a fleet
            entry = entry_from_dict(_lean(data), at)
            whole = needs_whole(entry, flagged)
            entry = entry_from_dict(data, at) if whole else slim_entry(entry)
        else:
            entry = entry_from_dict(data, at)
            whole = needs_whole(entry, flagged)
        if builder is not None:
            builder.add_parsed(entry.host, data["report"] if entry.state is NodeState.REPORTED else None)
        out.append((entry, whole))
    return out, builder
