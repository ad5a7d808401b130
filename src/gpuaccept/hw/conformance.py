"""A node's configuration as data: a flat map of named items, for fleet conformance (pure; no verdicts).

:func:`collect` takes what the readers already return (an NVML snapshot, :mod:`gpuaccept.hw.nvml`; the
sysfs inventory, :mod:`gpuaccept.hw.rdma`; the environment and the host facts) and names each item:

- node items: ``gpu_count``, ``driver_version``, ``cuda_driver_version``, ``kernel``, ``os``, ``peermem``,
  ``rdma_device_count``, ``bios_version``, ``cpu_governor``, ``clocksource``, ``hugepages_total``,
  ``nccl_version`` and ``nccl_net_plugin`` (:mod:`gpuaccept.hw.nccl_stack`);
- per GPU, keyed by NVML index: ``gpu.<i>.name``, ``.ecc_mode``, ``.power_limit_w``, ``.pcie_gen_max``,
  ``.pcie_width``, ``.pcie_width_max``, ``.nvlink_active`` (links up), ``.numa_node``, and from
  :mod:`gpuaccept.hw.nvml_state` ``.vbios_version``, ``.persistence_mode``, ``.app_clock_graphics_mhz``,
  ``.app_clock_memory_mhz``, ``.mig_mode``, ``.nvlink_speed_mbps``, ``.fabric_state``, ``.fabric_status``;
- per RDMA device: ``nic.<dev>.fw_ver``, ``.board`` (``hca_type``), ``.numa_node`` and per port
  ``nic.<dev>.port<N>.rate_gbps``, ``.link_layer``, ``.state``, ``.pkeys``, ``.gid_prefix``
  (:mod:`gpuaccept.hw.rdma_keys`);
- container runtimes: ``runtime.<tool>`` (:mod:`gpuaccept.hw.runtimes`);
- the NCCL environment: ``nccl_env.<NCCL_NAME>``.

What identifies a part (GPU UUID, NIC node GUID, a port's GID 0) goes to ``ids``, never to ``items``: it
differs on every node, so it is recorded, not judged. A value NVML or sysfs cannot give is left out (never
guessed); where the reason matters (a runtime not installed, no NCCL found) it is kept in ``absent``, and
where a value came from one of several places (the NCCL version) that place is kept in ``sources``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gpuaccept.hw.nvml import UNSUPPORTED, NvmlSnapshot
from gpuaccept.hw.nvml_state import NvmlState
from gpuaccept.hw.rdma import Inventory
from gpuaccept.hw.rdma_keys import PortKeys

Value = str | int | float | bool

NODE_ITEMS: Final[dict[str, str]] = {
    "gpu_count": "int", "driver_version": "str", "cuda_driver_version": "str", "kernel": "str", "os": "str",
    "peermem": "str", "rdma_device_count": "int", "bios_version": "str", "cpu_governor": "str",
    "clocksource": "str", "hugepages_total": "int", "nccl_version": "str", "nccl_net_plugin": "str",
}
"""Node-wide items and their kinds (``nvidia-smi --query-gpu=driver_version``, ``uname -r``, ``lsmod``...)."""
GPU_ITEMS: Final[dict[str, str]] = {
    "name": "str", "ecc_mode": "bool", "power_limit_w": "float", "pcie_gen_max": "int", "pcie_width": "int",
    "pcie_width_max": "int", "nvlink_active": "int", "numa_node": "int",
    "vbios_version": "str", "persistence_mode": "bool", "app_clock_graphics_mhz": "int", "app_clock_memory_mhz": "int",
    "mig_mode": "bool", "nvlink_speed_mbps": "int", "fabric_state": "str", "fabric_status": "str",
}
"""Per GPU (``nvidia-smi --query-gpu=name,ecc.mode.current,power.limit,pcie.link.gen.max,pcie.link.width.current,
pcie.link.width.max,vbios_version,persistence_mode,clocks.applications.graphics,clocks.applications.memory,
mig.mode.current``; ``nvidia-smi nvlink -s``; ``nvidia-smi -q`` Fabric; ``/sys/bus/pci/devices/<bdf>/numa_node``)."""
NIC_ITEMS: Final[dict[str, str]] = {"fw_ver": "str", "board": "str", "numa_node": "int"}
"""Per RDMA device (``ibv_devinfo``: fw_ver, hca_type; sysfs numa_node)."""
PORT_ITEMS: Final[dict[str, str]] = {"rate_gbps": "float", "link_layer": "str", "state": "str", "pkeys": "str",
                                     "gid_prefix": "str"}
"""Per RDMA port (``ibstat``: Rate, Link layer, State; ``ibv_devinfo -v``: the P_Key table; ``show_gids``)."""
RUNTIME_ITEMS: Final[tuple[str, ...]] = ("nvidia_container_toolkit", "enroot", "pyxis", "podman", "docker")
"""Container runtimes, ``runtime.<name>`` (``nvidia-ctk --version``, ``enroot version``, ...)."""

SYSFS_ITEMS: Final[dict[str, str]] = {
    "bios_version": "sys/class/dmi/id/bios_version",
    "cpu_governor": "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
    "clocksource": "sys/devices/system/clocksource/clocksource0/current_clocksource",
    "hugepages_total": "proc/sys/vm/nr_hugepages",
}
"""Node items read as one line below the root (``cat /sys/...``)."""


@dataclass
class NodeConfig:
    """``items``: item name -> value; ``ids``: the part identities (``gpu.<i>.uuid``, ``nic.<dev>.node_guid``)."""

    items: dict[str, Value] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"items": dict(sorted(self.items.items())), "ids": dict(sorted(self.ids.items())),
                "sources": dict(sorted(self.sources.items())), "absent": dict(sorted(self.absent.items()))}


@dataclass
class Extras:
    """What the newer readers return: NVML settings, ports' keys, NCCL, runtimes (None or empty: not read)."""

    state: NvmlState | None = None
    port_keys: list[PortKeys] | None = None
    nccl_version: tuple[str | None, str] | None = None
    nccl_plugin: tuple[str, str] | None = None
    runtimes: tuple[dict[str, str], dict[str, str], dict[str, str]] | None = None


def item_kind(name: str) -> str | None:
    """The kind (``str``, ``int``, ``float``, ``bool``) of an item name or pattern (``gpu.*.pcie_width``); None:
    no such item."""
    parts = name.split(".")
    if len(parts) == 1:
        return NODE_ITEMS.get(name)
    if parts[0] == "nccl_env" and len(parts) == 2:
        return "str" if parts[1].startswith("NCCL_") else None
    if parts[0] == "runtime" and len(parts) == 2:
        return "str" if parts[1] in RUNTIME_ITEMS else None
    if parts[0] == "gpu" and len(parts) == 3:
        return GPU_ITEMS.get(parts[2])
    if parts[0] == "nic" and len(parts) == 3:
        return NIC_ITEMS.get(parts[2])
    if parts[0] == "nic" and len(parts) == 4 and parts[2].startswith("port"):
        return PORT_ITEMS.get(parts[3])
    return None


def known_item_names() -> list[str]:
    """Every item name with ``*`` for the part, for did-you-mean hints."""
    return [*NODE_ITEMS, *(f"gpu.*.{f}" for f in GPU_ITEMS), *(f"nic.*.{f}" for f in NIC_ITEMS),
            *(f"nic.*.port*.{f}" for f in PORT_ITEMS), *(f"runtime.{r}" for r in RUNTIME_ITEMS), "nccl_env.NCCL_*"]


def _line(root: str | Path, rel: str) -> str | None:
    try:
        text = (Path(root) / rel).read_text(errors="replace").strip()
    except OSError:
        return None
    return text.splitlines()[0].strip() if text else None


def read_sysfs_items(root: str | Path = "/") -> dict[str, Value]:
    """The :data:`SYSFS_ITEMS` that exist below ``root`` (hugepages as an int)."""
    out: dict[str, Value] = {}
    for name, rel in SYSFS_ITEMS.items():
        text = _line(root, rel)
        if text is None:
            continue
        if NODE_ITEMS[name] == "int":
            if text.isdigit():
                out[name] = int(text)
        else:
            out[name] = text
    return out


def _bdf(bus_id: str) -> str:
    """NVML's ``00000000:5D:00.0`` as sysfs names it, ``0000:5d:00.0``."""
    dom, _, rest = bus_id.lower().partition(":")
    return f"{dom[-4:]}:{rest}" if rest else bus_id.lower()


def collect(snap: NvmlSnapshot | None, inv: Inventory | None, env: Mapping[str, str],
            host: Mapping[str, Any] | None = None, sysfs: Mapping[str, Value] | None = None,
            extras: Extras | None = None) -> NodeConfig:
    """The node's configuration from the readers' results (None: not read). ``host`` gives ``kernel`` and ``os``
    (:func:`gpuaccept.checks.env.host_info`); ``sysfs`` the items of :func:`read_sysfs_items`; ``extras`` the
    NVML settings, ports' keys, NCCL and runtimes (:func:`add_extras`). Pure."""
    cfg = NodeConfig()
    items, ids = cfg.items, cfg.ids
    for key in ("kernel", "os"):
        if host and isinstance(host.get(key), str):
            items[key] = host[key]
    items.update(sysfs or {})
    numa = {g.pci_address: g.numa_node for g in inv.gpus} if inv is not None else {}
    if snap is not None:
        items["gpu_count"] = snap.gpu_count
        for key in ("driver_version", "cuda_driver_version"):
            if getattr(snap, key) != UNSUPPORTED:
                items[key] = getattr(snap, key)
        for g in snap.gpus:
            p = f"gpu.{g.index}."
            values: dict[str, Any] = {
                "name": g.name, "ecc_mode": g.ecc_mode_current, "power_limit_w": g.power_limit_w,
                "pcie_gen_max": g.pcie_link_gen_max, "pcie_width": g.pcie_link_width,
                "pcie_width_max": g.pcie_link_width_max,
                "nvlink_active": (sum(1 for a in g.nvlink_active if a) if isinstance(g.nvlink_active, list)
                                  else UNSUPPORTED),
                "numa_node": numa.get(_bdf(g.pci_bus_id)) if g.pci_bus_id != UNSUPPORTED else None,
            }
            for f, v in values.items():
                if v is not None and v != UNSUPPORTED and not (f == "numa_node" and v < 0):
                    items[p + f] = float(v) if GPU_ITEMS[f] == "float" else v
            if g.uuid != UNSUPPORTED:
                ids[p + "uuid"] = g.uuid
    if inv is not None:
        items["rdma_device_count"] = len(inv.devices)
        items["peermem"] = inv.peermem or "absent"
        for d in inv.devices:
            p = f"nic.{d.name}."
            for f, v in (("fw_ver", d.fw_ver), ("board", d.hca_type), ("numa_node", d.numa_node)):
                if v is not None and not (f == "numa_node" and isinstance(v, int) and v < 0):
                    items[p + f] = v
            if d.node_guid:
                ids[p + "node_guid"] = d.node_guid
            for port in d.ports:
                q = f"{p}port{port.port}."
                for f, pv in (("rate_gbps", port.rate_gbps), ("link_layer", port.link_layer),
                              ("state", port.state)):
                    if pv is not None:
                        items[q + f] = pv
                if port.guid:
                    ids[q + "guid"] = port.guid
    for name in sorted(env):
        if name.startswith("NCCL_"):
            items[f"nccl_env.{name}"] = env[name]
    if extras is not None:
        add_extras(cfg, extras)
    return cfg


def add_extras(cfg: NodeConfig, x: Extras) -> None:
    """Add the items of ``x`` to ``cfg`` (pure): per GPU by NVML index, per port, NCCL, runtimes."""
    items = cfg.items
    for g in x.state.gpus if x.state is not None else []:
        for f in ("vbios_version", "persistence_mode", "app_clock_graphics_mhz", "app_clock_memory_mhz", "mig_mode",
                  "nvlink_speed_mbps", "fabric_state", "fabric_status"):
            v = getattr(g, f)
            if v != UNSUPPORTED and not (f.startswith("fabric") and g.fabric_state == "not_supported"):
                items[f"gpu.{g.index}.{f}"] = v
    for k in x.port_keys or []:
        q = f"nic.{k.device}.port{k.port}."
        if k.pkeys:
            items[q + "pkeys"] = ",".join(k.pkeys)
        if k.gid0:
            items[q + "gid_prefix"] = k.gid_prefix or ""
            cfg.ids[q + "gid0"] = k.gid0
    if x.nccl_version is not None:
        version, source = x.nccl_version
        if version:
            items["nccl_version"] = version
            cfg.sources["nccl_version"] = source
        else:
            cfg.absent["nccl_version"] = source
    if x.nccl_plugin is not None:
        items["nccl_net_plugin"], cfg.sources["nccl_net_plugin"] = x.nccl_plugin
    if x.runtimes is not None:
        versions, sources, absent = x.runtimes
        items.update(versions)
        cfg.sources.update(sources)
        cfg.absent.update(absent)
