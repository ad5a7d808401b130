"""Which piece of hardware each result measured, read from a report; and hardware histories. Pure.

A node report names devices by their place in the run (``cuda:3``, ``mlx5_0:1``); the history
also keeps what each one *is*, so that a GPU moved to another host keeps its history and a
replaced part starts a new one (:class:`HwId`):

- ``gpu``: the NVML UUID (``GPU-...``) and board serial, from the env check's GPU inventory
  (``details.nvml.gpus``: each GPU's ``device``, else its ``cuda:N`` label worked out from the
  recorded ``CUDA_VISIBLE_DEVICES``) or a check's own ``details.gpus`` (``health``);
- ``nic``: the RDMA port GUID, from the env check's ``details.identity.nics`` or the fabric
  check's ``details.devices[].ports[]``;
- ``node``: the board serial (else the product serial) from the env check's
  ``details.identity.node``, for node-wide metrics (no device, or ``cpu``).

Where nothing names the hardware (a CPU run, a report without the env check, a board serial only
root may read) a result has no identity and is known by its host and device, as before.

:func:`hardware_units` splits stored values into one history per piece of hardware: along each
place (host and device) in time order, a new identity starts a new history (a replaced part),
a value without one belongs to the hardware around it in that place, and the histories of one
identity in several places are one (a part that moved).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

_NOT_AN_ID = frozenset({"", "unsupported", "unknown", "unreadable", "absent", "n/a", "none", "null"})
_MAX_LEN = 128


@dataclass(frozen=True)
class HwId:
    """One piece of hardware: ``kind`` (gpu, nic, node), ``id`` (GPU UUID, port GUID, board serial)
    and ``serial`` (GPU board serial, node product serial) where known."""

    kind: str
    id: str
    serial: str | None = None


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    return text if text.lower() not in _NOT_AN_ID and len(text) <= _MAX_LEN else None


def _gpu_id(value: Any) -> str | None:
    """A GPU UUID as stored: canonical where it is a well-formed UUID, else the text as recorded."""
    from gpuaccept.errors import InputError
    from gpuaccept.hw.identity import normalize_gpu_uuid

    text = _text(value)
    if text is None:
        return None
    try:
        return normalize_gpu_uuid(text)
    except InputError:
        return text


def _guid(value: Any) -> str | None:
    from gpuaccept.errors import InputError
    from gpuaccept.hw.identity import normalize_guid

    text = _text(value)
    if text is None:
        return None
    try:
        return normalize_guid(text)
    except InputError:
        return None


def _serial(value: Any) -> str | None:
    from gpuaccept.hw.identity import plausible_serial

    return plausible_serial(value)


@dataclass
class HardwareMap:
    """What the devices of one node report are: ``devices`` (label -> HwId, from every check),
    ``per_check`` (check name -> label -> HwId, what a check recorded itself) and ``node``."""

    devices: dict[str, HwId] = field(default_factory=dict)
    per_check: dict[str, dict[str, HwId]] = field(default_factory=dict)
    node: HwId | None = None

    def lookup(self, check: str, device: str | None) -> HwId | None:
        """The hardware a metric of ``check`` on ``device`` measured (None: not known)."""
        if device is None or device == "cpu":
            return self.node
        own = self.per_check.get(check)
        if own is not None and device in own:
            return own[device]
        return self.devices.get(device)

    def identities(self) -> list[tuple[HwId, str | None]]:
        """Every piece of hardware the report names, with its device label (None: the node)."""
        out: list[tuple[HwId, str | None]] = [(self.node, None)] if self.node is not None else []
        seen = {self.node}
        labelled = dict(self.devices)
        for own in self.per_check.values():
            for label, hw in own.items():
                labelled.setdefault(label, hw)
        for label in sorted(labelled):
            hw = labelled[label]
            if hw not in seen:
                seen.add(hw)
                out.append((hw, label))
        return out


def _env_gpus(details: Mapping[str, Any]) -> dict[str, HwId]:
    """label -> HwId of the env check's NVML inventory."""
    nvml = details.get("nvml")
    gpus = nvml.get("gpus") if isinstance(nvml, Mapping) else None
    if not isinstance(gpus, list):
        return {}
    entries = [g for g in gpus if isinstance(g, Mapping) and isinstance(g.get("index"), int)
               and not isinstance(g.get("index"), bool)]
    labels: dict[int, str | None] = {}
    if entries and all("device" in g for g in entries):
        labels = {g["index"]: g["device"] if isinstance(g["device"], str) else None for g in entries}
    elif entries:  # reports written before env recorded each GPU's label: work it out as CUDA would
        from gpuaccept.hw.gpumap import NvmlGpuId, device_labels

        visible = details.get("cuda_visible_devices")
        inventory = [NvmlGpuId(g["index"], _text(g.get("uuid")) or "", _text(g.get("pci_bus_id")) or "")
                     for g in entries]
        labels = dict(device_labels(visible if isinstance(visible, str) else None, inventory))
    out: dict[str, HwId] = {}
    for g in entries:
        label, uuid = labels.get(g["index"]), _gpu_id(g.get("uuid"))
        if label and uuid:
            out[label] = HwId("gpu", uuid, _serial(g.get("serial")))
    return out


def _check_gpus(details: Mapping[str, Any]) -> dict[str, HwId]:
    """label -> HwId of a check's own ``details.gpus`` (``health``: device, uuid, serial)."""
    gpus = details.get("gpus")
    out: dict[str, HwId] = {}
    if isinstance(gpus, list):
        for g in gpus:
            if isinstance(g, Mapping) and isinstance(g.get("device"), str):
                uuid = _gpu_id(g.get("uuid"))
                if uuid:
                    out[g["device"]] = HwId("gpu", uuid, _serial(g.get("serial")))
    return out


def _check_ports(details: Mapping[str, Any]) -> dict[str, HwId]:
    """port -> HwId of a check's ``details.devices[].ports[]`` (``fabric``: port, guid)."""
    out: dict[str, HwId] = {}
    devices = details.get("devices")
    if isinstance(devices, list):
        for dev in devices:
            ports = dev.get("ports") if isinstance(dev, Mapping) else None
            for p in ports if isinstance(ports, list) else []:
                if isinstance(p, Mapping) and isinstance(p.get("port"), str):
                    guid = _guid(p.get("guid"))
                    if guid:
                        out[p["port"]] = HwId("nic", guid)
    return out


def _identity(details: Mapping[str, Any]) -> tuple[HwId | None, dict[str, HwId]]:
    """(node, port -> HwId) from the env check's ``details.identity``."""
    from gpuaccept.hw.identity import node_hw_id

    ident = details.get("identity")
    if not isinstance(ident, Mapping):
        return None, {}
    node: HwId | None = None
    fields = ident.get("node")
    if isinstance(fields, Mapping):
        node_id, serial = node_hw_id(dict(fields))
        node = HwId("node", node_id, serial) if node_id else None
    ports: dict[str, HwId] = {}
    nics = ident.get("nics")
    for n in nics if isinstance(nics, list) else []:
        if isinstance(n, Mapping) and isinstance(n.get("port"), str):
            guid = _guid(n.get("guid"))
            if guid:
                ports[n["port"]] = HwId("nic", guid)
    return node, ports


def hardware_of_checks(checks: Iterable[tuple[str, Any]]) -> HardwareMap:
    """The :class:`HardwareMap` of a node report's checks, given as (name, details) pairs.

    The env check's inventory comes first; what another check recorded itself applies to its own
    metrics and fills in devices the env check did not name. Malformed details are ignored.
    """
    hw = HardwareMap()
    later: dict[str, HwId] = {}
    for name, details in checks:
        if not isinstance(details, Mapping):
            continue
        if name == "env":
            node, ports = _identity(details)
            hw.node = node or hw.node
            hw.devices.update(_env_gpus(details))
            hw.devices.update(ports)
            continue
        own = {**_check_gpus(details), **_check_ports(details)}
        if own:
            hw.per_check.setdefault(name, {}).update(own)
            for label, h in own.items():
                later.setdefault(label, h)
    for label, h in later.items():
        hw.devices.setdefault(label, h)
    return hw


def hardware_of_report(report: Mapping[str, Any]) -> HardwareMap:
    """The :class:`HardwareMap` of a node report dict (``NodeReport.to_dict()``)."""
    checks = report.get("checks")
    return hardware_of_checks((str(c.get("name")), c.get("details"))
                              for c in (checks if isinstance(checks, list) else []) if isinstance(c, Mapping))


# ---- hardware histories ----------------------------------------------------------------------------------------
class Placed(Protocol):
    """A stored value's place and identity (``MetricPoint`` has these)."""

    host: str
    device: str | None
    hw_kind: str | None
    hw_id: str | None
    started_ts: float
    run_id: str


Unit = tuple[str, str, str]
"""``(kind, id, "")`` for a piece of hardware (kind gpu, nic or node), ``("place", host, device)``
where none is known."""


def hardware_units(points: Sequence[Placed], key: Callable[[Any], Hashable] | None = None) -> list[Unit]:
    """The piece of hardware behind each point (rules in the module docstring), in input order.

    ``key(point)`` further splits the places (the series a value belongs to: check, metric, tags),
    so that one series' gap does not borrow another's identity.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i].started_ts, points[i].run_id))
    units: list[Unit | None] = [None] * len(points)
    current: dict[tuple[str, str, Hashable], Unit] = {}
    pending: dict[tuple[str, str, Hashable], list[int]] = {}
    for i in order:
        p = points[i]
        place = (p.host, p.device or "", key(p) if key is not None else None)
        if p.hw_id is None:
            known = current.get(place)
            if known is None:
                pending.setdefault(place, []).append(i)
            else:
                units[i] = known
            continue
        unit = current[place] = (p.hw_kind or "gpu", p.hw_id, "")
        for j in [*pending.pop(place, []), i]:
            units[j] = unit
    for place, idx in pending.items():
        for j in idx:
            units[j] = ("place", place[0], place[1])
    out = [u for u in units if u is not None]
    assert len(out) == len(points), "every point has a unit"
    return out
