"""The fleet grid of a report: size sweeps (a metric measured at several sizes) and the heatmap of nodes by
metric, coloured only where the analysis compared that metric across nodes. Pure functions over
:class:`~gpuaccept.report.views.NodeView`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.model import Metric
from gpuaccept.report.views import NodeView, check_host, direction, fmt_bytes, fmt_tags, tags_key


def size_of(m: Metric) -> float | None:
    """The message size in bytes of a swept metric (its ``size_bytes`` tag), or None."""
    return _size(m.tags)


def _size(tags: dict[str, Any]) -> float | None:
    v = tags.get("size_bytes")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


@dataclass
class Sweep:
    """A metric measured over message sizes (collectives): one series per host and device.

    ``series`` maps a label (host, or ``host cuda:N``) to (size_bytes, value,
    expected) points sorted by size.
    """

    check: str
    name: str
    unit: str
    tags: dict[str, Any]
    series: dict[str, list[tuple[float, float, float | None]]] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        extra = fmt_tags(self.tags, skip=("op",))
        return f"{self.name}" + (f" ({extra})" if extra else "")


MIN_SWEEP_SIZES = 2
# Tags that change with the message size (an element count) or name the series (a rank), not the measurement.
_SWEEP_FREE_TAGS = ("size_bytes", "count", "nelems", "numel", "elements", "rank")


def sweeps(nodes: Sequence[NodeView]) -> list[Sweep]:
    """Metrics that vary over ``size_bytes`` with at least 2 sizes in one series, grouped for plotting.

    Groups are keyed by check, metric name and the other tags (an element
    count and the rank left out); each series is one host (with device and
    rank, when set). A metric measured at one size (a memory copy) is not a
    sweep. When bus bandwidths (``*_busbw_gbs``) are among them, only those are
    returned: algorithm bandwidth and time are the same measurement (nccl-tests
    plots busbw). A ``run --budget`` re-run is left out: its points would join the first pass's curve.
    """
    return GridBuilder.of(nodes).sweeps()


def swept_names(sweep_list: Sequence[Sweep]) -> set[tuple[str, str]]:
    """(check, metric) pairs that belong to a sweep."""
    return {(s.check, s.name) for s in sweep_list}


@dataclass(frozen=True)
class Column:
    """One metric column of the node × metric heatmap."""

    check: str
    name: str
    unit: str
    tags: str
    direction: int
    not_compared: str = ""
    """Why the nodes' values of this column were not compared ('' when they were): its cells are not coloured."""

    @property
    def label(self) -> str:
        return self.name + (f" [{self.tags}]" if self.tags else "")


@dataclass
class Heatmap:
    """Per node and metric column: the node's worst value across its GPUs and its ratio to the column median.

    ``cells[host][i]`` is (value, ratio to the median over nodes) or None.
    """

    columns: list[Column]
    hosts: list[str]
    cells: dict[str, list[tuple[float, float | None] | None]]
    hidden_constant: int = 0


_VOLATILE_TAGS = ("size_bytes", "size", "threads", "bytes_verified", "stat", "mode", "count", "rank")


def cross_node_coverage(analysis: dict[str, Any] | None) -> tuple[int, dict[tuple[str, str], str]]:
    """(min_nodes, {(check, metric): why not compared}) from an outlier analysis: a (check, metric) none of whose
    SKU groups was compared across nodes, and why; compared ones are left out."""
    analysis = analysis or {}
    policy = analysis.get("policy")
    min_nodes = policy.get("min_nodes", 3) if isinstance(policy, dict) else 3
    min_nodes = min_nodes if isinstance(min_nodes, int) else 3
    stats = analysis.get("stats")
    why: dict[tuple[str, str], str] = {}
    done: set[tuple[str, str]] = set()
    for g in stats.values() if isinstance(stats, dict) else []:
        if not isinstance(g, dict):
            continue
        key = (str(g.get("check")), str(g.get("metric")))
        if "compared" in g:
            ok = "cluster" in (g.get("compared") or [])
            reason = str((g.get("not_compared") or {}).get("cluster") or f"fewer than {min_nodes} nodes")
        else:  # an analysis stored before ``compared`` was recorded
            ok = isinstance(g.get("nodes"), int) and g["nodes"] >= min_nodes
            reason = f"fewer than {min_nodes} nodes"
        if ok:
            done.add(key)
        else:
            why.setdefault(key, reason)
    return min_nodes, {k: v for k, v in why.items() if k not in done}


def heatmap(nodes: Sequence[NodeView], max_columns: int = 80, min_nodes: int = 3,
            not_compared: dict[tuple[str, str], str] | None = None,
            sweep_list: Sequence[Sweep] | None = None) -> Heatmap:
    """A node × metric table for a cluster: one column per (check, metric, dtype/op) seen on two nodes or more.

    A column is compared across nodes (its cells coloured by their ratio to the median over nodes) only where
    the outlier analysis compared that metric across nodes: ``not_compared`` (from
    :func:`cross_node_coverage`) names those it did not, and why; a column seen on fewer than ``min_nodes``
    nodes is never compared. Its cells then carry no ratio, and the column says why.

    For a swept metric, the largest size measured on every node is used. The
    cell is the node's worst value over its devices (min where larger is
    better, max where smaller is better, median when unknown). Columns whose
    value is the same on every node are left out (counted in ``hidden_constant``), and so are
    ``run --budget`` re-runs (each node's first pass is compared).
    """
    return GridBuilder.of(nodes).heatmap(max_columns, min_nodes, not_compared, sweep_list)


class GridBuilder:
    """The inputs of :func:`sweeps`, :func:`heatmap` and the header's GPU count, gathered a node at a time
    (:meth:`add`), so that a fleet's nodes need not be held with every metric (``gpuaccept report`` of a cluster
    report in the line layout keeps only a slim copy of each healthy node, :mod:`gpuaccept.report.slim`).

    Holds per sweep series its (size_bytes, value, expected) points, per heatmap column and host the values
    (and sizes), and the first metric of each column (its unit and direction): floats, not metric objects.
    """

    def __init__(self) -> None:
        self.hosts: list[str] = []
        self.gpus: set[tuple[str, str]] = set()
        self._groups: dict[tuple[str, str, str], Sweep] = {}
        self._raw: dict[tuple[str, str, str], dict[str, list[tuple[float, float | None]]]] = {}
        self._units: dict[tuple[str, str, str], Metric] = {}
        self._memo: dict[Any, tuple[float | None, tuple[str, str, str], dict[str, Any], tuple[str, str, str]]] = {}

    def _keys(self, check: str, name: str, tags: dict[str, Any]) -> tuple[float | None, tuple[str, str, str],
                                                                      dict[str, Any], tuple[str, str, str]]:
        """(size, sweep group key, the group's tags, heatmap column key) of a metric, memoised by its check, name
        and tags (each tag's type too: ``1`` and ``True`` are told apart)."""
        memo_key: Any = (check, name, tuple(tags.items()), tuple(map(type, tags.values())))
        try:
            got = self._memo.get(memo_key)
        except TypeError:  # a tag value that is not hashable (not from a validated report): not memoised
            got, memo_key = None, None
        if got is None:
            other = {k: v for k, v in tags.items() if k not in _SWEEP_FREE_TAGS}
            stable = {k: v for k, v in tags.items() if k not in _VOLATILE_TAGS}
            hm_key = (check, name, fmt_tags(stable, skip=("op",) if "op" in stable and
                                            str(stable["op"]) in name else ()))
            got = (_size(tags), (check, name, tags_key(other)), other, hm_key)
            if memo_key is not None:
                self._memo[memo_key] = got
        return got

    def _take(self, check: str, host: str, node_host: str, rank0: int | None, value: float, device: str | None,
              expected: Any, tags: dict[str, Any], m: Metric | dict[str, Any]) -> None:
        """One metric of a first-pass check: ``host`` is the check's, ``m`` the Metric or its parsed JSON (made a
        Metric only when it is the first of its heatmap column)."""
        name = m.name if isinstance(m, Metric) else m["name"]
        size, group_key, other, hm_key = self._keys(check, name, tags)
        if size is not None:
            sw = self._groups.get(group_key)
            if sw is None:
                unit = m.unit if isinstance(m, Metric) else m["unit"]
                sw = self._groups[group_key] = Sweep(check, name, unit, other)
            rank = tags.get("rank", rank0)
            label = host + (f" {device}" if device else "") + (f" rank {rank}" if rank is not None else "")
            sw.series.setdefault(label, []).append((size, value, expected))
            sw.hosts[label] = host
        if math.isfinite(value):
            self._raw.setdefault(hm_key, {}).setdefault(node_host, []).append((value, size))
            if hm_key not in self._units:
                self._units[hm_key] = m if isinstance(m, Metric) else Metric.from_dict(m)

    def add(self, n: NodeView) -> None:
        """Take in one node (in report order); a ``run --budget`` re-run is left out of sweeps and heatmap."""
        self.hosts.append(n.host)
        for c in n.checks:
            host = check_host(c, n)
            rerun = c.is_rerun
            for m in c.metrics:
                if m.device and m.device.startswith("cuda"):
                    self.gpus.add((host, m.device))
                if not rerun:
                    self._take(c.name, host, n.host, c.rank, m.value, m.device, m.expected, m.tags, m)

    def add_parsed(self, host: str, report: dict[str, Any] | None) -> None:
        """:meth:`add` of a node from its validated entry's parsed JSON (``report``: None for a missing node),
        building no Metric objects but one per new heatmap column (read as ``Metric.from_dict`` reads it)."""
        self.hosts.append(host)
        for c in report.get("checks", []) if report is not None else []:
            chost = c.get("host") or host
            details = c.get("details")
            rerun = isinstance(details, dict) and "rerun" in details
            for d in c.get("metrics", []):
                device = d.get("device")
                if device and device.startswith("cuda"):
                    self.gpus.add((chost, device))
                if not rerun:
                    raw = d["value"]
                    self._take(c["name"], chost, host, c.get("rank"), float(raw) if raw is not None else math.nan,
                               device, d.get("expected"), d.get("tags", {}), d)

    def merge(self, later: GridBuilder) -> None:
        """Take in what ``later`` took in, as if its nodes had been added here after this one's (its nodes come
        after these in the report: a worker process's builder of the next chunk of nodes)."""
        self.hosts += later.hosts
        self.gpus |= later.gpus
        for key, sw in later._groups.items():
            mine = self._groups.get(key)
            if mine is None:
                self._groups[key] = sw
                continue
            for label, pts in sw.series.items():
                mine.series.setdefault(label, []).extend(pts)
            mine.hosts.update(sw.hosts)
        for hm_key, per_host in later._raw.items():
            row = self._raw.setdefault(hm_key, {})
            for host, vals in per_host.items():
                row.setdefault(host, []).extend(vals)
        for hm_key, m in later._units.items():
            self._units.setdefault(hm_key, m)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_memo": {}}  # the memo is rebuilt where it is needed, not sent back

    def sweeps(self) -> list[Sweep]:
        """What :func:`sweeps` returns for the nodes added."""
        out = []
        for sw in self._groups.values():
            for pts in sw.series.values():
                pts.sort(key=lambda p: p[0])
            if max(len({p[0] for p in pts}) for pts in sw.series.values()) >= MIN_SWEEP_SIZES:
                out.append(sw)
        busbw = [s for s in out if s.name.endswith("_busbw_gbs")]
        return busbw or out

    def heatmap(self, max_columns: int = 80, min_nodes: int = 3, not_compared: dict[tuple[str, str], str] | None = None,
                sweep_list: Sequence[Sweep] | None = None) -> Heatmap:
        """What :func:`heatmap` returns for the nodes added."""
        sweep_pairs = swept_names(self.sweeps() if sweep_list is None else sweep_list)
        columns: list[Column] = []
        cells: dict[str, list[tuple[float, float | None] | None]] = {h: [] for h in self.hosts}
        hidden = 0
        for key, per_host in self._raw.items():
            if len(per_host) < 2:
                continue
            check, name, tags = key
            sample = self._units[key]
            if (check, name) in sweep_pairs:
                common = set.intersection(*({s for _, s in vals if s is not None} for vals in per_host.values()))
                if not common:
                    continue
                size = max(common)
                per_host = {h: [(v, s) for v, s in vals if s == size] for h, vals in per_host.items()}
                tags = (tags + " " if tags else "") + f"size={fmt_bytes(size)}"
            dirn = direction(sample)
            node_values: dict[str, float] = {}
            for host, vals in per_host.items():
                xs = [v for v, _ in vals]
                node_values[host] = min(xs) if dirn > 0 else max(xs) if dirn < 0 else statistics.median(xs)
            if len(set(node_values.values())) == 1:
                hidden += 1
                continue
            if len(columns) >= max_columns:
                continue
            med = statistics.median(node_values.values())
            why = (f"fewer than {min_nodes} nodes" if len(node_values) < min_nodes
                   else (not_compared or {}).get((check, name), ""))
            columns.append(Column(check, name, sample.unit, tags, dirn, why))
            for host in self.hosts:
                v = node_values.get(host)
                cells[host].append(None if v is None else (v, v / med if med and not why else None))
        return Heatmap(columns=columns, hosts=list(self.hosts), cells=cells, hidden_constant=hidden)

    @classmethod
    def of(cls, nodes: Sequence[NodeView]) -> GridBuilder:
        """A builder that has taken in every one of ``nodes``."""
        b = cls()
        for n in nodes:
            b.add(n)
        return b
