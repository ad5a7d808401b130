"""RDMA fabric facts read from sysfs: devices, ports, counters, GPUs, netdevs, GPUDirect module.

Everything is read below a root directory (``/`` on a real node, a recorded tree in tests), so
every function here is a pure function of files. The layout is the kernel's documented ABI,
``Documentation/ABI/stable/sysfs-class-infiniband``:

- ``/sys/class/infiniband/<dev>/ports/<n>/state``: ``"4: ACTIVE"`` (DOWN, INIT, ARMED, ACTIVE,
  ACTIVE_DEFER); ``phys_state``: ``"5: LinkUp"`` (Sleep, Polling, Disabled, ..., LinkUp);
  ``rate``: active width x speed, ``"400 Gb/sec (4X NDR)"`` (``"2.5 Gb/sec (1X SDR)"``);
  ``link_layer``: ``InfiniBand`` or ``Ethernet`` (RoCE);
- ``ports/<n>/counters/<name>``: the PMA PortCounters as decimal integers (``symbol_error``,
  ``link_downed``, ``port_rcv_errors``, ``excessive_buffer_overrun_errors``, ...; ``port_xmit_data``
  and ``port_rcv_data`` count octets divided by 4);
- ``ports/<n>/gid_attrs/types/<i>`` (``"IB/RoCE v1"`` or ``"RoCE v2"``) and ``gid_attrs/ndevs/<i>``
  (the netdev behind a RoCE GID); ``ports/<n>/gids/0``, whose low 64 bits are the port GUID, and
  ``node_guid`` (``b859:9f03:00d4:a7f6``) of the device;
- ``/sys/class/infiniband/<dev>/device``: a link to the PCI function, whose ``numa_node`` is the
  NUMA node (-1: none) and ``net/`` its netdevs;
- ``/sys/bus/pci/devices/<bdf>/{vendor,class,device,numa_node}`` for the GPUs (NVIDIA vendor
  ``0x10de``, class ``0x0302xx`` 3D controller or ``0x0300xx`` VGA);
- ``/sys/class/net/<if>`` for the network interfaces, ``/sys/module/<name>`` for loaded modules.

Equivalent commands: ``ibstat``, ``ibv_devinfo -v``, ``perfquery`` (counters), ``ibdev2netdev``,
``lspci -d 10de:``, ``lsmod | grep peermem``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaccept.errors import InputError
from gpuaccept.hw.identity import guid_of_gid, normalize_guid

IB_CLASS = "sys/class/infiniband"
NET_CLASS = "sys/class/net"
PCI_DEVICES = "sys/bus/pci/devices"
MODULES = "sys/module"
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0302", "0x0300")

ERROR_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
)
"""The PortCounters read for health; the data counters (``port_xmit_data``...) are read too."""
DATA_COUNTERS = ("port_xmit_data", "port_rcv_data")
MAX_RATE_GBPS = 10_000.0
MAX_COUNTER = 2**64 - 1

_STATE_RE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec(?:\s*\((\d+)X\s*([A-Za-z0-9]*)\))?\s*$")


def parse_state(text: str, path: str) -> tuple[int, str]:
    """``"4: ACTIVE"`` -> ``(4, "ACTIVE")`` (``state`` and ``phys_state`` files); InputError naming ``path``."""
    m = _STATE_RE.match(text)
    if not m:
        raise InputError(f"{path}: cannot parse port state {text.strip()[:60]!r} (expected e.g. '4: ACTIVE')")
    return int(m.group(1)), m.group(2)


def parse_rate(text: str, path: str) -> tuple[float, int | None, str | None]:
    """``"400 Gb/sec (4X NDR)"`` -> ``(400.0, 4, "NDR")`` in Gb/s (``cat .../ports/1/rate``).

    The speed is None for SDR, which the kernel prints without a name (``"10 Gb/sec (4X)"``).
    InputError naming ``path`` for text that is not a finite rate in (0, 10000] Gb/s.
    """
    m = _RATE_RE.match(text)
    if not m:
        raise InputError(f"{path}: cannot parse rate {text.strip()[:60]!r} (expected e.g. '400 Gb/sec (4X NDR)')")
    gbps = float(m.group(1))
    if not math.isfinite(gbps) or not 0.0 < gbps <= MAX_RATE_GBPS:
        raise InputError(f"{path}: rate {gbps:g} Gb/s is out of range (0, {MAX_RATE_GBPS:g}]")
    width = int(m.group(2)) if m.group(2) else None
    return gbps, width, (m.group(3) or None)


def parse_counter(text: str, path: str) -> int:
    """A counter file's decimal value, 0 <= n < 2**64; InputError naming ``path`` otherwise."""
    s = text.strip()
    if not s.isdigit():
        raise InputError(f"{path}: counter is not a non-negative integer: {s[:40]!r}")
    n = int(s)
    if n > MAX_COUNTER:
        raise InputError(f"{path}: counter {n} exceeds 64 bits")
    return n


def parse_numa(text: str, path: str) -> int:
    """``numa_node`` (-1 when the platform has no NUMA information)."""
    s = text.strip()
    try:
        n = int(s)
    except ValueError:
        raise InputError(f"{path}: numa_node is not an integer: {s[:40]!r}") from None
    if not -1 <= n < 4096:
        raise InputError(f"{path}: numa_node {n} is out of range")
    return n


def _text(path: Path) -> str | None:
    """A sysfs file's text, None when absent or unreadable (some drivers return EINVAL on read)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _names(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir())
    except OSError:
        return []


@dataclass
class RdmaPort:
    """One port of one RDMA device (``ibstat <dev> <port>``)."""

    device: str
    port: int
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    width: int | None = None
    speed: str | None = None
    link_layer: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    gid_types: list[str] = field(default_factory=list)
    gid_netdevs: list[str] = field(default_factory=list)
    guid: str | None = None
    """The port GUID (``0x`` + 16 hex digits, ``ibstat``'s "Port GUID"): the low 64 bits of GID 0."""

    @property
    def key(self) -> str:
        """``mlx5_0:1``, the form NCCL_IB_HCA uses."""
        return f"{self.device}:{self.port}"

    @property
    def up(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.key, "state": self.state, "phys_state": self.phys_state, "rate_gbps": self.rate_gbps,
                "width": self.width, "speed": self.speed, "link_layer": self.link_layer,
                "counters": dict(self.counters), "gid_types": sorted(set(self.gid_types)),
                "netdevs": sorted(set(self.gid_netdevs)), "guid": self.guid}


@dataclass
class RdmaDevice:
    """One RDMA device (``ibv_devinfo -d <dev>``) and the PCI function behind it."""

    name: str
    pci_address: str | None = None
    numa_node: int | None = None
    netdevs: list[str] = field(default_factory=list)
    fw_ver: str | None = None
    hca_type: str | None = None
    ports: list[RdmaPort] = field(default_factory=list)
    node_guid: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pci_address": self.pci_address, "numa_node": self.numa_node,
                "netdevs": self.netdevs, "fw_ver": self.fw_ver, "hca_type": self.hca_type,
                "node_guid": self.node_guid,
                "ports": [p.to_dict() for p in self.ports]}


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA GPU as PCI sees it (``lspci -d 10de: -D``)."""

    pci_address: str
    device_id: str | None
    numa_node: int | None


@dataclass
class Inventory:
    """What a node's sysfs says about its fabric. ``errors`` name each file that could not be read."""

    root: str
    devices: list[RdmaDevice] = field(default_factory=list)
    gpus: list[PciGpu] = field(default_factory=list)
    netdevs: list[str] = field(default_factory=list)
    peermem: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def ports(self) -> list[RdmaPort]:
        return [p for d in self.devices for p in d.ports]


def _read_port(dev: str, pdir: Path, errors: list[str]) -> RdmaPort:
    port = RdmaPort(dev, int(pdir.name))
    for attr in ("state", "phys_state"):
        raw = _text(pdir / attr)
        if raw is None:
            errors.append(f"{pdir / attr}: missing or unreadable")
            continue
        try:
            setattr(port, attr, parse_state(raw, str(pdir / attr))[1])
        except InputError as exc:
            errors.append(str(exc))
    raw = _text(pdir / "rate")
    if raw is None:
        errors.append(f"{pdir / 'rate'}: missing or unreadable")
    else:
        try:
            port.rate_gbps, port.width, port.speed = parse_rate(raw, str(pdir / "rate"))
        except InputError as exc:
            errors.append(str(exc))
    layer = _text(pdir / "link_layer")
    port.link_layer = layer.strip() if layer else None
    gid = _text(pdir / "gids" / "0")
    port.guid = guid_of_gid(gid) if gid else None
    port.counters = _read_counters(pdir / "counters", errors)
    for idx in _names(pdir / "gid_attrs" / "types"):
        t = _text(pdir / "gid_attrs" / "types" / idx)  # reads of unused GID slots fail: not an error
        if t and t.strip():
            port.gid_types.append(t.strip())
    for idx in _names(pdir / "gid_attrs" / "ndevs"):
        n = _text(pdir / "gid_attrs" / "ndevs" / idx)
        if n and n.strip():
            port.gid_netdevs.append(n.strip())
    return port


def _read_counters(cdir: Path, errors: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in (*ERROR_COUNTERS, *DATA_COUNTERS):
        raw = _text(cdir / name)
        if raw is None:
            continue  # not every driver has every counter (RoCE ports often lack symbol_error)
        try:
            out[name] = parse_counter(raw, str(cdir / name))
        except InputError as exc:
            errors.append(str(exc))
    return out


def _read_device(ddir: Path, errors: list[str]) -> RdmaDevice:
    dev = RdmaDevice(ddir.name)
    link = ddir / "device"
    if link.exists():
        dev.pci_address = link.resolve().name
        raw = _text(link / "numa_node")
        if raw is not None:
            try:
                dev.numa_node = parse_numa(raw, str(link / "numa_node"))
            except InputError as exc:
                errors.append(str(exc))
        dev.netdevs = _names(link / "net")
    for attr in ("fw_ver", "hca_type"):
        raw = _text(ddir / attr)
        setattr(dev, attr, raw.strip() if raw else None)
    raw = _text(ddir / "node_guid")
    try:
        dev.node_guid = normalize_guid(raw) if raw else None
    except InputError:  # all zero (none assigned) or garbage: no identity, not a fabric fault
        dev.node_guid = None
    for pname in _names(ddir / "ports"):
        if not pname.isdigit():
            errors.append(f"{ddir / 'ports' / pname}: port directory is not a number")
            continue
        dev.ports.append(_read_port(dev.name, ddir / "ports" / pname, errors))
    dev.ports.sort(key=lambda p: p.port)
    return dev


def read_gpus(root: str | Path, errors: list[str] | None = None) -> list[PciGpu]:
    """NVIDIA GPUs under ``<root>/sys/bus/pci/devices`` (``lspci -d 10de: -D``), NVSwitches left out."""
    errors = [] if errors is None else errors
    base = Path(root) / PCI_DEVICES
    gpus = []
    for bdf in _names(base):
        d = base / bdf
        vendor, cls = _text(d / "vendor"), _text(d / "class")
        if not vendor or vendor.strip().lower() != NVIDIA_VENDOR or not cls:
            continue
        if not cls.strip().lower().startswith(GPU_CLASSES):
            continue
        numa = None
        raw = _text(d / "numa_node")
        if raw is not None:
            try:
                numa = parse_numa(raw, str(d / "numa_node"))
            except InputError as exc:
                errors.append(str(exc))
        dev_id = _text(d / "device")
        gpus.append(PciGpu(bdf, dev_id.strip() if dev_id else None, numa))
    return gpus


def read_inventory(root: str | Path = "/") -> Inventory:
    """Every RDMA device and port, the GPUs, netdevs and the GPUDirect RDMA module under ``root``.

    ``ibstat`` + ``lspci`` + ``ip link`` + ``lsmod``. Never raises for a malformed file: the
    reason, naming the file, goes into ``Inventory.errors``.
    """
    inv = Inventory(str(root))
    base = Path(root) / IB_CLASS
    for name in _names(base):
        inv.devices.append(_read_device(base / name, inv.errors))
    inv.gpus = read_gpus(root, inv.errors)
    inv.netdevs = _names(Path(root) / NET_CLASS)
    inv.peermem = next((m for m in PEERMEM_MODULES if (Path(root) / MODULES / m).is_dir()), None)
    return inv


# ---- counter snapshots: take one before and one after a run, diff them per port


@dataclass(frozen=True)
class Snapshot:
    """Every port's counters at one moment (``perfquery`` on each port). ``taken_s`` is monotonic."""

    taken_s: float
    ports: dict[str, dict[str, int]]

    def to_dict(self) -> dict[str, Any]:
        return {"taken_s": self.taken_s, "ports": {k: dict(v) for k, v in self.ports.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Snapshot:
        return cls(float(d["taken_s"]), {str(k): {str(c): int(n) for c, n in v.items()} for k, v in d["ports"].items()})


@dataclass(frozen=True)
class PortDelta:
    """How much each counter of one port rose between two snapshots.

    ``reset`` names counters that went down (cleared with ``perfquery -R``, or the driver
    reloaded): their delta is the later value, a lower bound. ``vanished``: the port was in
    the first snapshot only.
    """

    port: str
    interval_s: float
    deltas: dict[str, int]
    reset: tuple[str, ...] = ()
    vanished: bool = False

    def rising(self, names: tuple[str, ...] = ERROR_COUNTERS) -> dict[str, int]:
        """The error counters that rose."""
        return {k: v for k, v in self.deltas.items() if k in names and v > 0}


def read_snapshot(root: str | Path = "/", clock: Callable[[], float] = time.monotonic,
                  errors: list[str] | None = None) -> Snapshot:
    """The counters of every port under ``root``. Unreadable counters are left out; a counter file that
    does not hold a counter is named in ``errors`` when given. Never raises for a file's content."""
    base = Path(root) / IB_CLASS
    ports: dict[str, dict[str, int]] = {}
    errors = [] if errors is None else errors
    for dev in _names(base):
        for pname in _names(base / dev / "ports"):
            if pname.isdigit():
                ports[f"{dev}:{pname}"] = _read_counters(base / dev / "ports" / pname / "counters", errors)
    return Snapshot(clock(), ports)


def diff(before: Snapshot, after: Snapshot) -> dict[str, PortDelta]:
    """Per-port counter deltas from ``before`` to ``after`` (ports in ``before``; new ports left out)."""
    interval = max(0.0, after.taken_s - before.taken_s)
    out: dict[str, PortDelta] = {}
    for key, old in before.ports.items():
        new = after.ports.get(key)
        if new is None:
            out[key] = PortDelta(key, interval, {}, vanished=True)
            continue
        deltas, reset = {}, []
        for name, value in new.items():
            if name not in old:
                continue
            if value < old[name]:
                reset.append(name)
                deltas[name] = value
            else:
                deltas[name] = value - old[name]
        out[key] = PortDelta(key, interval, deltas, tuple(reset))
    return out


# ---- GPU <-> NIC locality


def locality(inv: Inventory) -> list[dict[str, Any]]:
    """For each GPU, its NUMA node and the RDMA devices on the same node (``nvidia-smi topo -m``, NUMA part).

    A GPU or NIC whose NUMA node is unknown (-1 or no file) has no local NICs listed.
    """
    out = []
    for g in inv.gpus:
        known = g.numa_node is not None and g.numa_node >= 0
        local = [d.name for d in inv.devices if known and d.numa_node == g.numa_node]
        out.append({"gpu": g.pci_address, "numa_node": g.numa_node, "local_nics": local})
    return out
