"""Reference curves in a fleet baseline: the ``reference_train`` check's per-step digests per software stack.

A GPU that computes a training run correctly gives the same per-step loss and gradient bits as every other
GPU of its model under the same driver, CUDA, torch and cuBLAS, for the same run configuration. A baseline
keeps, per (configuration, stack), the digest sequence held by more than half of the fleet's devices::

    curves:
      - check: reference_train
        config: 3f2a9c1e0b7d                   # the check's details.config_key (task, model, steps, lr, dtype)
        stack: {gpu: NVIDIA H100 80GB HBM3, driver: 550.54.15, cuda: "12.4", torch: 2.4.0, cublas: 12.4.5.8}
        digests: [9c0e..., 41d7..., ...]        # one per step
        devices: 64                             # devices that agreed on it
        nodes: 8

Judging a later run (``run --baseline``, ``baseline apply``): each device whose configuration and stack have
an entry gets ``reftrain_fleet_match`` (1 when its digests equal the fleet's, else 0, threshold ``min 1``,
tag ``departs_at_step``), so one node alone is judged against the fleet's curve. Pure functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuaccept.errors import ConfigError
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold

CHECK = "reference_train"
STACK_KEYS = ("gpu", "driver", "cuda", "torch", "cublas")
_ENTRY_KEYS = ("check", "config", "stack", "digests", "devices", "nodes")


@dataclass(frozen=True)
class CurveEntry:
    """The fleet's digest sequence for one run configuration on one software stack."""

    config: str
    stack: tuple[tuple[str, str], ...]
    digests: tuple[str, ...]
    devices: int
    nodes: int
    check: str = CHECK

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "config": self.config, "stack": dict(self.stack), "digests": list(self.digests),
                "devices": self.devices, "nodes": self.nodes}


def stack_tuple(stack: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The stack as a sorted tuple of its :data:`STACK_KEYS` (missing ones ``unknown``)."""
    return tuple((k, str(stack.get(k, "unknown"))) for k in STACK_KEYS)


def device_curves(check: CheckResult) -> Iterator[tuple[str, str, tuple[tuple[str, str], ...], list[str]]]:
    """``(device, config, stack, digests)`` of each device of a reference_train result (its first run)."""
    d = check.details
    config, stacks, devices = d.get("config_key"), d.get("stack"), d.get("devices")
    if check.name != CHECK or not isinstance(config, str) or not isinstance(stacks, dict) \
            or not isinstance(devices, dict):
        return
    for dev, runs in devices.items():
        if not isinstance(runs, dict) or not runs or not isinstance(stacks.get(dev), dict):
            continue
        first = next(iter(runs.values()))
        digests = first.get("digests") if isinstance(first, dict) else None
        if isinstance(digests, list) and all(isinstance(x, str) for x in digests):
            yield dev, config, stack_tuple(stacks[dev]), digests


@dataclass
class CurveLearner:
    """Collects devices' curves report by report; :meth:`entries` gives the majority curve per key."""

    seen: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[str, tuple[str, ...]]]] = field(
        default_factory=dict)

    def add(self, report: NodeReport) -> None:
        for check in report.checks:
            if check.status in (Status.SKIP, Status.ERROR):
                continue
            for _dev, config, stack, digests in device_curves(check):
                self.seen.setdefault((config, stack), []).append((report.host or "", tuple(digests)))

    def tap(self, reports: Iterable[NodeReport]) -> Iterator[NodeReport]:
        """``reports`` passed through, each added on the way (so a stream is read once)."""
        for r in reports:
            self.add(r)
            yield r

    def entries(self) -> tuple[CurveEntry, ...]:
        """Per key, the sequence more than half the devices hold; keys without such a majority are left out."""
        out = []
        for (config, stack), rows in sorted(self.seen.items()):
            top, n = Counter(d for _, d in rows).most_common(1)[0]
            if 2 * n > len(rows):
                out.append(CurveEntry(config, stack, top, n, len({h for h, d in rows if d == top})))
        return tuple(out)


def parse_curves(raw: Any, source: str) -> tuple[CurveEntry, ...]:
    """The ``curves`` list of a baseline file; :class:`ConfigError` naming the key on any problem."""
    if not isinstance(raw, list):
        raise ConfigError(source, "curves", "expected a list of curve entries")
    out: list[CurveEntry] = []
    for i, item in enumerate(raw):
        key = f"curves[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(source, key, "expected a mapping with config, stack and digests")
        unknown = sorted(str(k) for k in set(item) - set(_ENTRY_KEYS))
        if unknown:
            raise ConfigError(source, f"{key}.{unknown[0]}", f"unknown key; allowed: {', '.join(_ENTRY_KEYS)}")
        if item.get("check", CHECK) != CHECK:
            raise ConfigError(source, f"{key}.check", f"only {CHECK} has curves")
        config, stack, digests = item.get("config"), item.get("stack"), item.get("digests")
        if not isinstance(config, str) or not config:
            raise ConfigError(source, f"{key}.config", "must be a non-empty string (the check's config_key)")
        if not isinstance(stack, dict) or set(map(str, stack)) - set(STACK_KEYS):
            raise ConfigError(source, f"{key}.stack", f"must be a mapping with keys among {', '.join(STACK_KEYS)}")
        if not isinstance(digests, list) or not digests or not all(isinstance(x, str) for x in digests):
            raise ConfigError(source, f"{key}.digests", "must be a non-empty list of hex digests")
        counts = []
        for name in ("devices", "nodes"):
            v = item.get(name, 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(source, f"{key}.{name}", "must be a whole number >= 0")
            counts.append(v)
        out.append(CurveEntry(config, stack_tuple(stack), tuple(digests), counts[0], counts[1]))
    return tuple(out)


def judge_curves(check: CheckResult, curves: Iterable[CurveEntry], label: str) -> list[Metric]:
    """Append ``reftrain_fleet_match`` to ``check.metrics`` for each device with a fleet curve (see the module
    doc), record the departures in ``check.details["baseline_curves"]``, and return the new metrics."""
    check.metrics[:] = [m for m in check.metrics if m.name != "reftrain_fleet_match"]  # judged once
    index = {(c.config, c.stack): c for c in curves}
    added: list[Metric] = []
    departed: list[str] = []
    for dev, config, stack, digests in list(device_curves(check)):
        entry = index.get((config, stack))
        if entry is None:
            continue
        step = next((i for i, (a, b) in enumerate(zip(digests, entry.digests, strict=False)) if a != b), None)
        if step is None and len(digests) != len(entry.digests):
            step = min(len(digests), len(entry.digests))
        tags: dict[str, str | int | float] = {"fleet_devices": entry.devices}
        if step is not None:
            tags["departs_at_step"] = step
            departed.append(f"{dev} departs from the fleet's curve ({entry.devices} devices) at step {step}")
        where = f", departs at step {step}" if step is not None else ""
        m = Metric("reftrain_fleet_match", 0.0 if step is not None else 1.0, "bool", dev, tags=tags,
                   threshold=Threshold(">=", 1.0, Status.FAIL, f"baseline:{label}:curves{where}"))
        check.metrics.append(m)
        added.append(m)
    if added:
        check.details["baseline_curves"] = {"compared": len(added), "departed": departed}
    return added
