"""GPU settings that define a node's configuration, read from NVML (for fleet conformance; no GPU load).

Each field names its ``nvidia-smi`` equivalent:

- ``vbios_version``: ``nvidia-smi --query-gpu=vbios_version`` (``nvmlDeviceGetVbiosVersion``);
- ``persistence_mode``: ``--query-gpu=persistence_mode`` (``nvmlDeviceGetPersistenceMode``);
- ``app_clock_graphics_mhz`` / ``app_clock_memory_mhz``: ``--query-gpu=clocks.applications.graphics,
  clocks.applications.memory`` (``nvmlDeviceGetApplicationsClock``, MHz);
- ``mig_mode``: ``--query-gpu=mig.mode.current`` (``nvmlDeviceGetMigMode``, the current mode);
- ``nvlink_speed_mbps``: the common speed of the GPU's NVLink links, ``nvidia-smi nvlink -s``
  (``nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON)``, MB/s per link and direction);
- ``fabric_state`` / ``fabric_status``: the NVLink/NVSwitch fabric registration, ``nvidia-smi -q`` "Fabric"
  (``nvmlDeviceGetGpuFabricInfo``): ``completed`` once the fabric manager has set the GPU up; ``not_started``
  or ``in_progress`` while it has not (the fabric manager down); ``not_supported`` on a GPU without a fabric.

A field NVML cannot give is "unsupported" with NVML's message under ``errors`` (never guessed).
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

from gpuaccept.errors import InputError
from gpuaccept.hw.nvml import UNSUPPORTED, Unsupported, _Reader, open_nvml

FABRIC_STATES: Final[dict[int, str]] = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
"""``NVML_GPU_FABRIC_STATE_*`` values as the words the configuration uses."""
NVLINK_SPEED_FIELD: Final = 90
"""``NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON`` (nvml.h)."""


@dataclass
class GpuState:
    """One GPU's settings (see the module docstring for each field's ``nvidia-smi`` query)."""

    index: int
    vbios_version: str | Unsupported = UNSUPPORTED
    persistence_mode: bool | Unsupported = UNSUPPORTED
    app_clock_graphics_mhz: int | Unsupported = UNSUPPORTED
    app_clock_memory_mhz: int | Unsupported = UNSUPPORTED
    mig_mode: bool | Unsupported = UNSUPPORTED
    nvlink_speed_mbps: int | Unsupported = UNSUPPORTED
    fabric_state: str | Unsupported = UNSUPPORTED
    fabric_status: str | Unsupported = UNSUPPORTED
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class NvmlState:
    """The settings of every GPU NVML sees, by NVML index."""

    gpus: list[GpuState] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_KINDS: Final[dict[str, type]] = {
    "vbios_version": str, "persistence_mode": bool, "app_clock_graphics_mhz": int, "app_clock_memory_mhz": int,
    "mig_mode": bool, "nvlink_speed_mbps": int, "fabric_state": str, "fabric_status": str,
}


def state_from_dict(d: Any) -> NvmlState:
    """An :class:`NvmlState` from its ``to_dict`` form (a recorded snapshot); InputError on malformed data."""
    if not isinstance(d, dict) or not isinstance(d.get("gpus"), list):
        raise InputError("NVML state: expected an object with a list 'gpus'")
    gpus = []
    for i, g in enumerate(d["gpus"]):
        if not isinstance(g, dict) or not isinstance(g.get("index"), int):
            raise InputError(f"NVML state gpus[{i}]: expected a mapping with an integer 'index'")
        values: dict[str, Any] = {"index": g["index"]}
        for name, kind in _KINDS.items():
            v = g.get(name, UNSUPPORTED)
            if v != UNSUPPORTED and (type(v) is not kind):
                raise InputError(f"NVML state gpus[{i}].{name}: expected {kind.__name__} or 'unsupported', "
                                 f"got {v!r}")
            values[name] = v
        errors = g.get("errors", {})
        if not isinstance(errors, dict) or not all(isinstance(v, str) for v in errors.values()):
            raise InputError(f"NVML state gpus[{i}].errors: expected a mapping of text")
        gpus.append(GpuState(**values, errors=dict(errors)))
    return NvmlState(gpus)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvlink_speed(nvml: Any, handle: Any, r: _Reader) -> int | Unsupported:
    field_id = getattr(nvml, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", NVLINK_SPEED_FIELD)
    values = r.call("nvlink_speed_mbps", "nvmlDeviceGetFieldValues", handle, [field_id])
    if values == UNSUPPORTED:
        return UNSUPPORTED
    v = values[0]
    if v.nvmlReturn != 0:
        r.errors["nvlink_speed_mbps"] = f"NVML return {v.nvmlReturn}"
        return UNSUPPORTED
    speed = int(v.value.uiVal)
    if speed == 0:  # no NVLink on this GPU
        r.errors["nvlink_speed_mbps"] = "no NVLink"
        return UNSUPPORTED
    return speed


def _fabric_info(nvml: Any, handle: Any, r: _Reader) -> Any:
    """``nvmlDeviceGetGpuFabricInfo(handle, byref(c_nvmlGpuFabricInfo_t))``: nvidia-ml-py fills the caller's
    structure (``state``, ``status``) and returns NVML_SUCCESS; UNSUPPORTED where NVML or the binding cannot."""
    struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is None:
        r.errors["fabric_state"] = "c_nvmlGpuFabricInfo_t not in this nvidia-ml-py"
        return UNSUPPORTED
    info = struct()
    if r.call("fabric_state", "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info)) == UNSUPPORTED:
        return UNSUPPORTED
    return info


def read_gpu_state(nvml: Any, index: int, handle: Any) -> GpuState:
    """One GPU's settings from an open NVML ``handle``; each NVML error becomes "unsupported"."""
    g = GpuState(index=index)
    r = _Reader(nvml, g.errors)
    vbios = r.call("vbios_version", "nvmlDeviceGetVbiosVersion", handle)
    g.vbios_version = UNSUPPORTED if vbios == UNSUPPORTED else _text(vbios)
    pm = r.call("persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
    g.persistence_mode = UNSUPPORTED if pm == UNSUPPORTED else bool(pm)
    for name, clock in (("app_clock_graphics_mhz", nvml.NVML_CLOCK_GRAPHICS), ("app_clock_memory_mhz",
                                                                                 nvml.NVML_CLOCK_MEM)):
        mhz = r.call(name, "nvmlDeviceGetApplicationsClock", handle, clock)
        setattr(g, name, UNSUPPORTED if mhz == UNSUPPORTED else int(mhz))
    mig = r.call("mig_mode", "nvmlDeviceGetMigMode", handle)
    g.mig_mode = UNSUPPORTED if mig == UNSUPPORTED else bool(mig[0])
    g.nvlink_speed_mbps = _nvlink_speed(nvml, handle, r)
    fabric = _fabric_info(nvml, handle, r)
    if fabric != UNSUPPORTED:
        g.fabric_state = FABRIC_STATES.get(int(fabric.state), f"state {int(fabric.state)}")
        g.fabric_status = "success" if int(fabric.status) == 0 else f"NVML return {int(fabric.status)}"
    return g


def read_state() -> NvmlState:
    """The settings of every GPU NVML sees, in one NVML session (NvmlUnavailable when NVML cannot load)."""
    nvml = open_nvml()
    try:
        gpus = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            g = GpuState(index=index)
            handle = _Reader(nvml, g.errors).call("handle", "nvmlDeviceGetHandleByIndex", index)
            gpus.append(g if handle == UNSUPPORTED else read_gpu_state(nvml, index, handle))
        return NvmlState(gpus)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
