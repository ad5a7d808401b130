"""Metrics of many reports as columns of numbers, with each metric's SKU and bad direction.

Baselines and the outlier analysis read reports the same way: every finite
metric of a check that ran (not ``skip`` or ``error``) becomes one sample with
its node, SKU, device and a key (check, metric name, unit and the tags that
define what was measured). A ``run --budget`` deeper re-run
(:attr:`~gpuaccept.model.CheckResult.is_rerun`) is not a sample: it is a second
measurement, at another depth, of a node that already looked suspect, and would
count that node twice and pull the fleet's statistics toward its own.
:class:`Samples` holds them as numpy columns so the statistics run vectorised
over a thousand nodes at once.

**SKU of a metric** (:class:`SkuResolver`): ``device: cpu`` is ``cpu``; a GPU
device takes the SKU the check itself recorded (``details.sku[device]``,
``details.devices[device].sku|name``, ``details.gpus[].device/sku|name``, or a
threshold whose source is ``sku:<id>``), else the env check's GPU inventory
(``details.nvml.gpus``; all alike: that SKU, else by index ``cuda:N`` -> N).
A node-wide metric (no device) takes the node's SKU: its GPUs' SKU when they
are alike, ``mixed`` when not, ``cpu`` when it has none. A GPU name that
``skus.yaml`` does not know becomes a slug of the name (``nvidia_a800_80gb``)
so that unknown models are never pooled together.

**Bad direction** (:func:`direction`): ``low`` (throughput, bandwidth,
capacity, link width: low is bad), ``high`` (errors, latency, time,
temperature: high is bad), ``both`` (unknown: either side may be bad) or
``None`` (not comparable across GPUs or runs, e.g. instantaneous power draw:
never judged). Names are matched first (:data:`NAME_DIRECTIONS`), then units
(:data:`UNIT_DIRECTIONS`, and any unit ending in ``/s`` is a rate: low).
"""

from __future__ import annotations

import fnmatch
import math
import re
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from gpuaccept.model import CheckResult, ClusterReport, Metric, NodeReport, Status
from gpuaccept.results.hwid import HardwareMap, hardware_of_checks

Direction = Literal["low", "high", "both"]

NAME_DIRECTIONS: tuple[tuple[str, Direction | None], ...] = (
    ("power_w", None),                 # instantaneous draw: depends on what the GPU was doing
    ("memtest_bytes_tested", None),    # depends on free memory at the time
    ("train_loss_first", None),        # random initialisation
    ("*error*", "high"),
    ("ecc_*", "high"),
    ("retired_pages_*", "high"),
    ("remapped_rows_*", "high"),
    ("*xid*", "high"),
    ("*_down", "high"),
    ("*throttl*", "high"),
    ("*latency*", "high"),
    ("*_ms", "high"),
    ("train_loss_last", "high"),
    ("train_loss_drop", "low"),
    ("temperature_c", "high"),
    ("gpu_count", "low"),
    ("*_links_active", "low"),
    ("pcie_link_*", "low"),
    ("power_limit_w", "low"),
)
"""First matching glob wins."""

UNIT_DIRECTIONS: Mapping[str, Direction] = {
    "TFLOP/s": "low", "GFLOP/s": "low", "GB/s": "low", "GiB/s": "low", "MB/s": "low", "Gbit/s": "low",
    "GiB": "low", "bytes": "low", "fraction": "low",
    "ms": "high", "s": "high", "us": "high", "ns": "high", "C": "high",
}

IGNORED_TAGS = frozenset({"stat", "bytes_verified"})
"""Tags that describe how a number was taken rather than what was measured: not part of a key."""

_SKIPPED_STATUSES = (Status.SKIP, Status.ERROR)
_SLUG_RE = re.compile(r"[^a-z0-9]+")


@lru_cache(maxsize=4096)
def direction(name: str, unit: str) -> Direction | None:
    """Which side of the centre is bad for metric ``name`` in ``unit`` (None: never judged)."""
    for pattern, d in NAME_DIRECTIONS:
        if fnmatch.fnmatchcase(name, pattern):
            return d
    if unit in UNIT_DIRECTIONS:
        return UNIT_DIRECTIONS[unit]
    if unit.endswith("/s"):
        return "low"
    return "both"


NONNEGATIVE_UNITS = frozenset({"count", "bytes", "GiB", "MiB", "KiB", "B", "W", "C", "ms", "s", "us", "ns", "fraction",
                               "%", "bool"})
"""Units whose values are never below 0 (besides every rate, a unit ending in ``/s``)."""


@lru_cache(maxsize=4096)
def domain(name: str, unit: str) -> tuple[float, float]:
    """The values metric ``name`` in ``unit`` can take: ``(0, 1)`` for a fraction, ``(0, 100)`` for a
    percentage, ``(0, inf)`` for rates (``*/s``), times, sizes, counts, power and temperature, else unbounded."""
    if unit == "fraction":
        return 0.0, 1.0
    if unit == "%":
        return 0.0, 100.0
    if unit in NONNEGATIVE_UNITS or unit.endswith("/s") or name == "temperature_c":
        return 0.0, math.inf
    return -math.inf, math.inf


def clamp_to_domain(op: str, value: float, name: str, unit: str) -> tuple[float, bool]:
    """``value`` of a bound ``op`` (``>=``/``<=``) moved into the metric's :func:`domain`, and whether it
    now sits on the domain's edge on the side it bounds (a lower bound at the floor, an upper bound at the
    ceiling: a bound every possible value meets)."""
    lo, hi = domain(name, unit)
    v = min(max(value, lo), hi)
    vacuous = (op == ">=" and v <= lo) or (op == "<=" and v >= hi)
    return v, vacuous


def slug(text: str) -> str:
    """``"NVIDIA A800 80GB PCIe"`` -> ``"nvidia_a800_80gb_pcie"``."""
    return _SLUG_RE.sub("_", text.lower()).strip("_") or "unknown"


@lru_cache(maxsize=256)
def sku_of_name(gpu_name: str) -> str:
    """The ``skus.yaml`` id for a GPU name, else a slug of the name."""
    from gpuaccept.errors import GpuacceptError
    from gpuaccept.hw.sku import match_sku

    try:
        sku = match_sku(gpu_name)
    except GpuacceptError:
        sku = None
    return sku.id if sku is not None else slug(gpu_name)


def _gpu_label(entry: Mapping[str, Any]) -> str | None:
    sku = entry.get("sku")
    if isinstance(sku, str) and sku:
        return sku
    name = entry.get("name")
    if isinstance(name, str) and name and name != "unsupported":
        return sku_of_name(name)
    return None


def _check_skus(check: CheckResult) -> dict[str, str]:
    """Device -> SKU as the check recorded it in its details."""
    out: dict[str, str] = {}
    d = check.details
    skus = d.get("sku")
    if isinstance(skus, dict):
        out.update({k: v for k, v in skus.items() if isinstance(k, str) and isinstance(v, str) and v})
    devices = d.get("devices")
    if isinstance(devices, dict):
        for dev, info in devices.items():
            if isinstance(dev, str) and isinstance(info, dict) and dev not in out:
                label = _gpu_label(info)
                if label:
                    out[dev] = label
    gpus = d.get("gpus")
    if isinstance(gpus, list):
        for info in gpus:
            if isinstance(info, dict) and isinstance(info.get("device"), str) and info["device"] not in out:
                label = _gpu_label(info)
                if label:
                    out[info["device"]] = label
    return out


class SkuResolver:
    """The SKU of each metric of one node report (rules in the module docstring)."""

    def __init__(self, report: NodeReport) -> None:
        self.inventory: list[str | None] = []
        for check in report.checks:
            if check.name != "env":
                continue
            nvml = check.details.get("nvml")
            gpus = nvml.get("gpus") if isinstance(nvml, dict) else None
            if isinstance(gpus, list):
                self.inventory = [_gpu_label(g) if isinstance(g, dict) else None for g in gpus]
        self._per_check = {id(c): _check_skus(c) for c in report.checks}
        known = {s for s in self.inventory if s}
        if not known:
            for m in self._per_check.values():
                known.update(m.values())
        self.gpu_sku: str | None = known.pop() if len(known) == 1 else ("mixed" if known else None)
        self.node_sku = self.gpu_sku or "cpu"

    def for_device(self, check: CheckResult, device: str | None, metric: Metric | None = None) -> str:
        """SKU of ``device`` (``cuda:N``, ``cpu`` or None for node-wide) as seen by ``check``."""
        if device is None:
            return self.node_sku
        if device == "cpu":
            return "cpu"
        per_check = self._per_check.get(id(check))
        if per_check is None:  # a check not (yet) in the report, e.g. the one being judged
            per_check = self._per_check[id(check)] = _check_skus(check)
        recorded = per_check.get(device)
        if recorded:
            return recorded
        if metric is not None and metric.threshold is not None and metric.threshold.source.startswith("sku:"):
            return metric.threshold.source[4:]
        if self.gpu_sku is not None and self.gpu_sku != "mixed":
            return self.gpu_sku
        index = device.rpartition(":")[2]
        if index.isdigit() and int(index) < len(self.inventory):
            return self.inventory[int(index)] or "unknown"
        return "unknown"


def tag_key(tags: Mapping[str, str | int | float]) -> tuple[tuple[str, str | int | float], ...]:
    """The tags that define what was measured, as a sorted tuple (see :data:`IGNORED_TAGS`)."""
    if not tags:
        return ()
    return tuple(sorted((k, v) for k, v in tags.items() if k not in IGNORED_TAGS))


@dataclass(frozen=True)
class SampleKey:
    """What a sample measured: the check, the metric name and unit, and the defining tags."""

    check: str
    metric: str
    unit: str
    tags: tuple[tuple[str, str | int | float], ...]

    @property
    def direction(self) -> Direction | None:
        return direction(self.metric, self.unit)


@dataclass
class Samples:
    """Column store of metric samples. Row ``i`` is one metric of one node's report.

    ``value`` (float64), ``key``/``sku``/``node``/``device`` (int indices into
    ``keys``/``skus``/``nodes``/``devices``). ``nodes`` holds ``(host, run_id)``;
    device index 0 is ``None`` (node-wide). ``hardware[node]`` says what each device of that
    node is (:mod:`gpuaccept.results.hwid`).
    """

    value: np.ndarray
    key: np.ndarray
    sku: np.ndarray
    node: np.ndarray
    device: np.ndarray
    keys: list[SampleKey]
    skus: list[str]
    nodes: list[tuple[str, str]]
    devices: list[str | None]
    hardware: list[HardwareMap] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.value.size)

    def is_gpu(self) -> np.ndarray:
        """Mask of samples taken on one GPU (device set and not ``cpu``)."""
        gpu_dev = np.array([d is not None and d != "cpu" for d in self.devices], dtype=bool)
        return gpu_dev[self.device]


@dataclass
class NodeSamples:
    """One node report's judged, finite metrics, numbered within the node (raw keys and (SKU, device) places in
    order of first appearance): what :meth:`Builder.add_node` numbers fleet-wide. Small and picklable, so that
    it can be made where the report was read."""

    host: str
    run_id: str
    hardware: HardwareMap
    raws: list[tuple[Any, ...]]              # (check, metric, unit, *tag items) as written in the report
    places: list[tuple[str, str | None]]     # (SKU, device)
    value: array = field(default_factory=lambda: array("d"))
    raw: array = field(default_factory=lambda: array("q"))    # index into raws, per value
    place: array = field(default_factory=lambda: array("q"))  # index into places, per value


def node_samples(report: NodeReport) -> NodeSamples:
    """The :class:`NodeSamples` of ``report`` (rules in the module docstring); the hot loop touches each metric
    once."""
    resolver = SkuResolver(report)
    local: dict[tuple[Any, ...], int] = {}  # raw -> index into raws, -1 never judged
    places: dict[tuple[str, str | None], int] = {}
    out = NodeSamples(report.host, report.run_id, hardware_of_checks((c.name, c.details) for c in report.checks),
                      [], [])
    raws = out.raws
    add_value, add_raw, add_place = out.value.append, out.raw.append, out.place.append
    isfinite = math.isfinite
    for check in report.checks:
        if check.status in _SKIPPED_STATUSES or not check.metrics or check.is_rerun:
            continue
        cname = check.name
        dev_place: dict[str | None, int] = {}
        for m in check.metrics:
            v = m.value
            if not isfinite(v):
                continue
            tags = m.tags
            raw = (cname, m.name, m.unit, *tags.items()) if tags else (cname, m.name, m.unit)
            try:
                rid = local.get(raw)
            except TypeError:  # a tag value that is not a scalar (a hand-written report): use its text
                text_tags: dict[str, str | int | float] = {k: repr(t) for k, t in tags.items()}
                raw = (cname, m.name, m.unit, *text_tags.items())
                m = Metric(m.name, v, m.unit, m.device, m.expected, m.threshold, text_tags)
                rid = local.get(raw)
            if rid is None:
                rid = local[raw] = -1 if direction(m.name, m.unit) is None else len(raws)
                if rid >= 0:
                    raws.append(raw)
            if rid < 0:
                continue
            pid = dev_place.get(m.device)
            if pid is None:
                label = resolver.for_device(check, m.device, m)
                pid = dev_place[m.device] = places.setdefault((label, m.device), len(places))
            add_value(v)
            add_raw(rid)
            add_place(pid)
    out.places = list(places)
    return out


class Builder:
    """Accumulates samples node by node (:class:`NodeSamples`), numbering keys and places fleet-wide in order
    of first appearance."""

    def __init__(self) -> None:
        self.values = array("d")  # 8 bytes a sample, not a float object and a pointer (a fleet has millions)
        self.key = array("q")
        self.place = array("q")
        self.node = array("q")
        self.keys: dict[SampleKey, int] = {}
        self.raw_keys: dict[tuple[Any, ...], int] = {}   # as written in the report -> key id
        self.skus: dict[str, int] = {}
        self.devices: dict[str | None, int] = {None: 0}
        self.places: dict[tuple[int, int], int] = {}     # (sku id, device id) -> place id
        self.nodes: list[tuple[str, str]] = []
        self.hardware: list[HardwareMap] = []

    def _key_id(self, raw: tuple[Any, ...]) -> int:
        k = SampleKey(raw[0], raw[1], raw[2], tag_key(dict(raw[3:])))
        kid = self.raw_keys[raw] = self.keys.setdefault(k, len(self.keys))
        return kid

    def add_report(self, report: NodeReport) -> None:
        self.add_node(node_samples(report))

    def add_node(self, ns: NodeSamples) -> None:
        node_id = len(self.nodes)
        self.nodes.append((ns.host, ns.run_id))
        self.hardware.append(ns.hardware)
        raw_keys = self.raw_keys
        kmap = np.array([raw_keys[r] if r in raw_keys else self._key_id(r) for r in ns.raws] or [0], dtype=np.int64)
        pmap = np.array([self.places.setdefault((self.skus.setdefault(label, len(self.skus)),
                                                 self.devices.setdefault(dev, len(self.devices))), len(self.places))
                         for label, dev in ns.places] or [0], dtype=np.int64)
        self.values.extend(ns.value)
        self.key.frombytes(kmap[np.frombuffer(ns.raw, dtype=np.int64)].tobytes())
        self.place.frombytes(pmap[np.frombuffer(ns.place, dtype=np.int64)].tobytes())
        self.node.extend(array("q", [node_id]) * len(ns.value))

    def build(self) -> Samples:
        n = len(self.values)
        place_sku = np.array([sd[0] for sd in self.places] or [0], dtype=np.intp)
        place_dev = np.array([sd[1] for sd in self.places] or [0], dtype=np.intp)
        place = np.frombuffer(self.place, dtype=np.int64, count=n).astype(np.intp)
        return Samples(value=np.frombuffer(self.values, dtype=np.float64, count=n).copy(),
                       key=np.frombuffer(self.key, dtype=np.int64, count=n).astype(np.intp),
                       sku=place_sku[place], node=np.frombuffer(self.node, dtype=np.int64, count=n).astype(np.intp),
                       device=place_dev[place], keys=list(self.keys), skus=list(self.skus), nodes=self.nodes,
                       devices=list(self.devices), hardware=self.hardware)


def node_reports(reports: Iterable[NodeReport | ClusterReport]) -> Iterator[NodeReport]:
    """Node reports of a mix of node and cluster reports (a missing node has none)."""
    for r in reports:
        if isinstance(r, ClusterReport):
            yield from (n.report for n in r.nodes if n.report is not None)
        else:
            yield r


def collect(reports: Iterable[NodeReport | ClusterReport]) -> Samples:
    """Every judged, finite metric of ``reports`` as :class:`Samples`."""
    b = Builder()
    for report in node_reports(reports):
        b.add_report(report)
    return b.build()
