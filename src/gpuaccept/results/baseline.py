"""Fleet baselines: the file model and strict YAML loading (learning: ``baseline_learn``; judging: ``baseline_judge``).

A baseline file holds, per SKU (``skus.yaml`` id, ``cpu``, or a slug of an
unknown GPU's name), the robust centre of each metric as a fleet measured it,
and optionally the declarative thresholds to judge by::

    schema: 1
    source: {created: "2025-01-31T12:00:00Z", nodes: 64, runs: 120, tool: gpuaccept 0.1.0}
    skus:
      h100_sxm:
        metrics:
          - {metric: gemm_bf16_tflops, dtype: bf16, value: 745.2, unit: TFLOP/s, mad: 6.1, n: 512}
          - {metric: allreduce_busbw_gbs, size_bytes: 1073741824, value: 362.0, unit: GB/s, mad: 2.0, n: 64}
    thresholds:                       # optional; last matching rule wins, as in a config file
      - {metric: "*", max_z: 5}
      - {metric: "gemm_*_tflops", min_fraction: 0.95}
      - {metric: "train_step_ms", sku: "h100_*", max_fraction: 1.1, severity: warn}
    curves: [...]                     # optional; reference_train's per-step digests (baseline_curves)

An entry's ``value`` is the median and ``mad`` the median absolute deviation
(same unit) of ``n`` samples left after outlier trimming; ``dtype`` and
``size_bytes``, when present, must equal the metric's tags of that name.

A **threshold rule** has a ``metric`` glob, an optional ``sku`` glob and
exactly one bound: ``min``/``max`` (absolute, in the metric's unit),
``min_fraction``/``max_fraction`` (of the baseline value) or ``max_z``: at
most that many robust deviations (``mad / 0.6745``, MAD floored at 1 % of the
value) from the baseline on the metric's bad side (below for throughput,
above for latency and errors, either side when unknown; see
:func:`gpuaccept.results.samples.direction`). Rules are data, never code.
Without rules, :data:`DEFAULT_RULES` applies (``max_z: 5``).

Every parse error is a :class:`~gpuaccept.errors.ConfigError` naming the
file, the key (``skus.h100_sxm.metrics[2].mad``) and the reason.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuaccept.errors import ConfigError
from gpuaccept.model import Metric, Status
from gpuaccept.results.baseline_curves import CurveEntry, parse_curves
from gpuaccept.results.samples import direction
from gpuaccept.results.stats import DEFAULT_REL_FLOOR, bound_at_z

SCHEMA = 1
_TOP_KEYS = ("schema", "source", "skus", "thresholds", "curves")
_SOURCE_KEYS = ("created", "nodes", "runs", "tool", "from", "trim_z", "note")
_ENTRY_KEYS = ("metric", "value", "unit", "mad", "n", "dtype", "size_bytes", "nodes", "runs", "dropped")
_BOUND_KEYS = ("min", "max", "min_fraction", "max_fraction", "max_z")
_RULE_KEYS = ("metric", "sku", "severity", *_BOUND_KEYS)


# ---------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class BaselineEntry:
    """One metric's fleet reference for one SKU (``value``/``mad`` in ``unit``)."""

    metric: str
    value: float
    unit: str
    mad: float
    n: int
    dtype: str | None = None
    size_bytes: int | None = None
    nodes: int | None = None
    runs: int | None = None
    dropped: int = 0

    def matches(self, metric: Metric) -> bool:
        """Same name and unit, and the entry's ``dtype``/``size_bytes`` (when set) equal the metric's tags."""
        if metric.name != self.metric or metric.unit != self.unit:
            return False
        if self.dtype is not None and metric.tags.get("dtype") != self.dtype:
            return False
        return self.size_bytes is None or as_int(metric.tags.get("size_bytes")) == self.size_bytes

    @property
    def specificity(self) -> int:
        return (self.dtype is not None) + (self.size_bytes is not None)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"metric": self.metric}
        if self.dtype is not None:
            d["dtype"] = self.dtype
        if self.size_bytes is not None:
            d["size_bytes"] = self.size_bytes
        d.update(value=rounded(self.value), unit=self.unit, mad=rounded(self.mad), n=self.n)
        for k in ("nodes", "runs"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.dropped:
            d["dropped"] = self.dropped
        return d


def as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def rounded(x: float) -> float:
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class BaselineRule:
    """A declarative bound on metrics matching ``metric`` (glob) on SKUs matching ``sku`` (glob)."""

    metric: str
    sku: str = "*"
    min: float | None = None
    max: float | None = None
    min_fraction: float | None = None
    max_fraction: float | None = None
    max_z: float | None = None
    severity: Status = Status.FAIL

    def __post_init__(self) -> None:
        set_bounds = [k for k in _BOUND_KEYS if getattr(self, k) is not None]
        if len(set_bounds) != 1:
            raise ValueError(f"a rule needs exactly one of {', '.join(_BOUND_KEYS)}, got {set_bounds or 'none'}")
        object.__setattr__(self, set_bounds[0], float(getattr(self, set_bounds[0])))

    @property
    def bound_key(self) -> str:
        return next(k for k in _BOUND_KEYS if getattr(self, k) is not None)

    @property
    def bound_value(self) -> float:
        return float(getattr(self, self.bound_key))

    def matches(self, metric: Metric, sku: str) -> bool:
        return fnmatch.fnmatchcase(metric.name, self.metric) and fnmatch.fnmatchcase(sku, self.sku)

    def describe(self) -> str:
        where = f" on {self.sku}" if self.sku != "*" else ""
        return f"{self.metric}{where}: {self.bound_key} {self.bound_value:g} ({self.severity.value})"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"metric": self.metric}
        if self.sku != "*":
            d["sku"] = self.sku
        d[self.bound_key] = self.bound_value
        if self.severity is not Status.FAIL:
            d["severity"] = self.severity.value
        return d

    def bound(self, metric: Metric, entry: BaselineEntry | None, *, rel_floor: float = DEFAULT_REL_FLOOR
              ) -> tuple[str, float] | None:
        """(op, value) of this rule for ``metric`` against ``entry``; None when it cannot apply."""
        key, v = self.bound_key, self.bound_value
        if key == "min":
            return ">=", v
        if key == "max":
            return "<=", v
        if entry is None:
            return None
        if key == "min_fraction":
            return ">=", v * entry.value
        if key == "max_fraction":
            return "<=", v * entry.value
        side = direction(metric.name, metric.unit) or "both"
        if side == "both":
            side = "low" if metric.value < entry.value else "high"
        if side == "low":
            return ">=", bound_at_z(entry.value, entry.mad, -v, rel_floor=rel_floor)
        return "<=", bound_at_z(entry.value, entry.mad, v, rel_floor=rel_floor)


DEFAULT_RULES: tuple[BaselineRule, ...] = (BaselineRule(metric="*", max_z=5.0),)
"""Used when neither the caller nor the baseline file gives rules: fail beyond 5 robust deviations."""


@dataclass
class Baseline:
    """A parsed baseline: entries per SKU, where they came from, and optional rules."""

    skus: dict[str, tuple[BaselineEntry, ...]]
    created: str | None = None
    nodes: int | None = None
    runs: int | None = None
    tool: str | None = None
    origin: tuple[str, ...] = ()
    trim_z: float | None = None
    note: str | None = None
    thresholds: tuple[BaselineRule, ...] = ()
    path: str = "<baseline>"
    #: reference_train's per-step digest sequences per configuration and stack (:mod:`.baseline_curves`)
    curves: tuple[CurveEntry, ...] = ()
    _index: dict[tuple[str, str], list[BaselineEntry]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for sku, entries in self.skus.items():
            for e in entries:
                self._index.setdefault((sku, e.metric), []).append(e)
        for lst in self._index.values():
            lst.sort(key=lambda e: -e.specificity)

    def __len__(self) -> int:
        return sum(len(v) for v in self.skus.values())

    def lookup(self, sku: str, metric: Metric) -> BaselineEntry | None:
        """The most specific entry of ``sku`` matching ``metric`` (dtype and size before neither)."""
        for e in self._index.get((sku, metric.name), ()):
            if e.matches(metric):
                return e
        return None

    def rules(self, override: Sequence[BaselineRule] | None = None) -> tuple[BaselineRule, ...]:
        """``override`` if given, else the file's thresholds, else :data:`DEFAULT_RULES`."""
        if override is not None:
            return tuple(override)
        return self.thresholds or DEFAULT_RULES

    def to_dict(self) -> dict[str, Any]:
        source: dict[str, Any] = {}
        for key, val in (("created", self.created), ("nodes", self.nodes), ("runs", self.runs),
                         ("tool", self.tool), ("trim_z", self.trim_z), ("note", self.note)):
            if val is not None:
                source[key] = val
        if self.origin:
            source["from"] = list(self.origin)
        d: dict[str, Any] = {"schema": SCHEMA, "source": source,
                             "skus": {sku: {"metrics": [e.to_dict() for e in entries]}
                                      for sku, entries in sorted(self.skus.items())}}
        if self.thresholds:
            d["thresholds"] = [r.to_dict() for r in self.thresholds]
        if self.curves:
            d["curves"] = [c.to_dict() for c in self.curves]
        return d

    def to_yaml(self) -> str:
        head = ("# gpuaccept baseline: per SKU, the median (value) and median absolute deviation (mad)\n"
                "# of each metric over a fleet. Load with `gpuaccept run --baseline FILE`.\n")
        return head + yaml.safe_dump(self.to_dict(), sort_keys=False, width=120)


# ---------------------------------------------------------------------------------------------- parsing


def _err(source: str, key: str, reason: str) -> ConfigError:
    return ConfigError(source, key, reason)


def _mapping(raw: Any, source: str, key: str, allowed: Sequence[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _err(source, key, f"expected a mapping, got {type(raw).__name__}")
    for k in raw:
        if k not in allowed:
            where = f"{key}.{k}" if key else str(k)
            raise _err(source, where, f"unknown key; allowed: {', '.join(allowed)}")
    return raw


def _number(raw: Any, source: str, key: str, *, minimum: float | None = None, positive: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise _err(source, key, f"expected a finite number, got {raw!r}")
    if positive and not raw > 0:
        raise _err(source, key, f"must be > 0, got {raw!r}")
    if minimum is not None and raw < minimum:
        raise _err(source, key, f"must be >= {minimum:g}, got {raw!r}")
    return float(raw)


def _int(raw: Any, source: str, key: str, *, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _err(source, key, f"expected an integer, got {raw!r}")
    if raw < minimum:
        raise _err(source, key, f"must be >= {minimum}, got {raw!r}")
    return raw


def _text(raw: Any, source: str, key: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise _err(source, key, f"expected a non-empty string, got {raw!r}")
    return raw


def parse_rule(raw: Any, source: str, key: str) -> BaselineRule:
    """One threshold rule from YAML data (see the module docstring)."""
    d = _mapping(raw, source, key, _RULE_KEYS)
    metric = _text(d.get("metric"), source, f"{key}.metric")
    sku = _text(d.get("sku", "*"), source, f"{key}.sku")
    bounds = [k for k in _BOUND_KEYS if k in d]
    if len(bounds) != 1:
        raise _err(source, key, f"needs exactly one of {', '.join(_BOUND_KEYS)}, got "
                                f"{', '.join(bounds) or 'none'}")
    bkey = bounds[0]
    positive = bkey != "min" and bkey != "max"
    value = _number(d[bkey], source, f"{key}.{bkey}", positive=positive)
    sev = d.get("severity", "fail")
    if sev not in ("fail", "warn"):
        raise _err(source, f"{key}.severity", f"must be 'fail' or 'warn', got {sev!r}")
    return BaselineRule(metric=metric, sku=sku, severity=Status(sev), **{bkey: value})


def parse_rules(raw: Any, source: str, key: str = "thresholds") -> tuple[BaselineRule, ...]:
    if not isinstance(raw, list):
        raise _err(source, key, f"expected a list of rules, got {type(raw).__name__}")
    return tuple(parse_rule(r, source, f"{key}[{i}]") for i, r in enumerate(raw))


def _parse_entry(raw: Any, source: str, key: str) -> BaselineEntry:
    d = _mapping(raw, source, key, _ENTRY_KEYS)
    for req in ("metric", "value", "unit", "mad", "n"):
        if req not in d:
            raise _err(source, f"{key}.{req}", "required key is missing")
    dtype = d.get("dtype")
    size = d.get("size_bytes")
    n = _int(d["n"], source, f"{key}.n", minimum=1)
    return BaselineEntry(
        metric=_text(d["metric"], source, f"{key}.metric"),
        value=_number(d["value"], source, f"{key}.value"),
        unit=_text(d["unit"], source, f"{key}.unit"),
        mad=_number(d["mad"], source, f"{key}.mad", minimum=0),
        n=n,
        dtype=_text(dtype, source, f"{key}.dtype") if dtype is not None else None,
        size_bytes=_int(size, source, f"{key}.size_bytes", minimum=0) if size is not None else None,
        nodes=_int(d["nodes"], source, f"{key}.nodes", minimum=1) if "nodes" in d else None,
        runs=_int(d["runs"], source, f"{key}.runs", minimum=1) if "runs" in d else None,
        dropped=_int(d.get("dropped", 0), source, f"{key}.dropped", minimum=0),
    )


def parse_baseline(data: Any, source: str) -> Baseline:
    """Validate a parsed YAML document and build the :class:`Baseline`."""
    top = _mapping(data, source, "", _TOP_KEYS)
    if "schema" not in top:
        raise _err(source, "schema", "required key is missing (this gpuaccept writes schema: 1)")
    schema = _int(top["schema"], source, "schema", minimum=1)
    if schema > SCHEMA:
        raise _err(source, "schema", f"schema {schema} is newer than this gpuaccept reads ({SCHEMA}); upgrade it")
    src = _mapping(top.get("source") or {}, source, "source", _SOURCE_KEYS)
    created = src.get("created")
    if isinstance(created, (_dt.datetime, _dt.date)):
        created = created.isoformat()
    raw_skus = top.get("skus")
    if not isinstance(raw_skus, dict):
        raise _err(source, "skus", "expected a mapping of SKU id to {metrics: [...]}")
    skus: dict[str, tuple[BaselineEntry, ...]] = {}
    for sku, body in raw_skus.items():
        where = f"skus.{sku}"
        if not isinstance(sku, str) or not sku.strip():
            raise _err(source, where, "a SKU id must be a non-empty string (e.g. h100_sxm, cpu)")
        b = _mapping(body, source, where, ("metrics",))
        raw_metrics = b.get("metrics")
        if not isinstance(raw_metrics, list):
            raise _err(source, f"{where}.metrics", "expected a list of metric entries")
        entries = [_parse_entry(e, source, f"{where}.metrics[{i}]") for i, e in enumerate(raw_metrics)]
        seen: dict[tuple[str, str | None, int | None], int] = {}
        for i, e in enumerate(entries):
            ident = (e.metric, e.dtype, e.size_bytes)
            if ident in seen:
                raise _err(source, f"{where}.metrics[{i}]", f"duplicate of metrics[{seen[ident]}] "
                                                            f"(same metric, dtype and size_bytes)")
            seen[ident] = i
        skus[sku] = tuple(entries)
    origin = src.get("from", [])
    if not isinstance(origin, list) or not all(isinstance(o, str) for o in origin):
        raise _err(source, "source.from", "expected a list of strings")
    return Baseline(
        skus=skus,
        created=str(created) if created is not None else None,
        nodes=_int(src["nodes"], source, "source.nodes", minimum=0) if "nodes" in src else None,
        runs=_int(src["runs"], source, "source.runs", minimum=0) if "runs" in src else None,
        tool=_text(src["tool"], source, "source.tool") if "tool" in src else None,
        origin=tuple(origin),
        trim_z=_number(src["trim_z"], source, "source.trim_z", positive=True) if "trim_z" in src else None,
        note=_text(src["note"], source, "source.note") if "note" in src else None,
        thresholds=parse_rules(top["thresholds"], source) if "thresholds" in top else (),
        path=source,
        curves=parse_curves(top["curves"], source) if "curves" in top else (),
    )


def _load_yaml(path: str | Path) -> tuple[Any, str]:
    """The YAML data of ``path`` (bounded in size and nesting, every number finite) and its name."""
    from gpuaccept.inputs import BadInput, load_yaml_file

    try:
        return load_yaml_file(path, "baseline or threshold file"), str(path)
    except BadInput as exc:
        raise exc.as_config_error() from None


def load_baseline(path: str | Path) -> Baseline:
    """Read and validate a baseline file; :class:`ConfigError` on any problem."""
    data, source = _load_yaml(path)
    return parse_baseline(data, source)


def load_rules(path: str | Path) -> tuple[BaselineRule, ...]:
    """Threshold rules from a YAML file holding ``thresholds: [...]`` (a baseline file works too)."""
    data, source = _load_yaml(path)
    top = _mapping(data, source, "", _TOP_KEYS)
    if "thresholds" not in top:
        raise _err(source, "thresholds", "required key is missing (a list of rules)")
    return parse_rules(top["thresholds"], source)


def summary(baseline: Baseline) -> Mapping[str, Any]:
    """Counts for a one-line description: SKUs, entries, nodes, runs."""
    return {"skus": len(baseline.skus), "metrics": len(baseline), "nodes": baseline.nodes, "runs": baseline.runs}
