"""NVML readings as plain data: one snapshot of the driver and each GPU's health counters.

This layer has no UI and no verdicts (those live in ``checks/health.py``). A
field NVML cannot report on this GPU or driver (Not Supported, Insufficient
Permissions, Function Not Found, ...) holds the string ``"unsupported"`` and
the NVML message is kept in the GPU's ``errors`` map: "unsupported" is a
value, never an exception. Only a missing NVML (no driver, no library) raises,
as :class:`NvmlUnavailable`.

Snapshots convert to and from JSON dicts (:meth:`NvmlSnapshot.to_dict`,
:func:`snapshot_from_dict`) so that real nodes can be recorded and replayed
in tests::

    python -m gpuaccept.hw.nvml --dump > node.json      # every GPU
    python -m gpuaccept.hw.nvml --dump --gpus 0,3       # NVML indices 0 and 3
    python -m gpuaccept.hw.nvml --dump --visible        # the GPUs CUDA_VISIBLE_DEVICES shows

NVML indices follow PCI bus order and ignore ``CUDA_VISIBLE_DEVICES``;
:func:`read_visible_snapshot` maps torch ordinals to NVML GPUs by UUID
(:mod:`gpuaccept.hw.gpumap`) and labels each GPU with its ordinal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpuaccept.errors import GpuacceptError, InputError
from gpuaccept.hw.gpumap import NvmlGpuId, map_visible_devices, select_ordinals
from gpuaccept.hw.nvml_ext import (
    XidWatch,
    read_memory_temperature,
    read_nvlink_errors,
    read_recovery_action,
    sample_reasons,
)

UNSUPPORTED: Final = "unsupported"
Unsupported = Literal["unsupported"]

NVLINK_LINKS: Final = 18
"""Links probed (0..17): NVLink 4 on H100 SXM has 18; probing stops at the first unsupported link."""

FATAL_NVML_ERRORS: Final = frozenset({"GPU is lost", "GPU requires restart"})
"""NVML messages that mean the GPU itself is broken, not that a query is unsupported."""


class NvmlUnavailable(GpuacceptError):
    """NVML could not be loaded or initialised (no driver, no library, version mismatch)."""


def open_nvml() -> Any:
    """The ``pynvml`` module with NVML initialised (the caller shuts it down); NvmlUnavailable otherwise."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"NVML not available: nvidia-ml-py is not installed ({exc})") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML not available: {exc}") from exc
    return pynvml


@dataclass
class GpuSnapshot:
    """One GPU as NVML reports it (``nvidia-smi -q -i N``). Every field but ``index`` may be "unsupported".

    Units: bytes, degrees C, W (NVML reports mW). ECC counts are
    ``nvmlDeviceGetTotalEccErrors`` (volatile: since driver load; aggregate:
    lifetime). ``clocks_event_reasons`` is the raw ``nvmlClocksEventReason*``
    bitmask. ``pcie_link_*_max`` is the best link this GPU *and slot* allow;
    ``pcie_link_gen_gpu_max`` is the GPU's own maximum. ``nvlink_active`` has
    one bool per NVLink link. ``errors`` maps each unsupported field to the NVML message.
    ``serial`` is the board serial (``nvidia-smi --query-gpu=serial``; datacenter GPUs only).

    ``ordinal`` is the torch CUDA ordinal when the GPU was selected through
    ``CUDA_VISIBLE_DEVICES`` (None: unknown, label by NVML index).
    ``clocks_event_reasons_samples`` holds the masks sampled over about a
    second (the first is ``clocks_event_reasons``). ``memory_temperature_c``
    is the HBM sensor (C). ``nvlink_*_errors`` map an active link's number
    (as a string) to its counter (``nvidia-smi nvlink -e``). ``xid_events``
    are the critical XIDs NVML reported while the snapshot was taken;
    ``xid_kernel_log`` the XIDs the kernel log holds for this GPU (filled by
    the health check, not by NVML).
    """

    index: int
    name: str | Unsupported = UNSUPPORTED
    uuid: str | Unsupported = UNSUPPORTED
    serial: str | Unsupported = UNSUPPORTED
    pci_bus_id: str | Unsupported = UNSUPPORTED
    memory_total_bytes: int | Unsupported = UNSUPPORTED
    memory_used_bytes: int | Unsupported = UNSUPPORTED
    ecc_mode_current: bool | Unsupported = UNSUPPORTED
    ecc_mode_pending: bool | Unsupported = UNSUPPORTED
    ecc_volatile_uncorrectable: int | Unsupported = UNSUPPORTED
    ecc_volatile_correctable: int | Unsupported = UNSUPPORTED
    ecc_aggregate_uncorrectable: int | Unsupported = UNSUPPORTED
    ecc_aggregate_correctable: int | Unsupported = UNSUPPORTED
    retired_pages_pending: bool | Unsupported = UNSUPPORTED
    retired_pages_sbe: int | Unsupported = UNSUPPORTED
    retired_pages_dbe: int | Unsupported = UNSUPPORTED
    remapped_rows_correctable: int | Unsupported = UNSUPPORTED
    remapped_rows_uncorrectable: int | Unsupported = UNSUPPORTED
    remapped_rows_pending: bool | Unsupported = UNSUPPORTED
    remapped_rows_failure: bool | Unsupported = UNSUPPORTED
    pcie_link_gen: int | Unsupported = UNSUPPORTED
    pcie_link_gen_max: int | Unsupported = UNSUPPORTED
    pcie_link_gen_gpu_max: int | Unsupported = UNSUPPORTED
    pcie_link_width: int | Unsupported = UNSUPPORTED
    pcie_link_width_max: int | Unsupported = UNSUPPORTED
    clocks_event_reasons: int | Unsupported = UNSUPPORTED
    temperature_c: int | Unsupported = UNSUPPORTED
    temperature_slowdown_c: int | Unsupported = UNSUPPORTED
    temperature_shutdown_c: int | Unsupported = UNSUPPORTED
    power_draw_w: float | Unsupported = UNSUPPORTED
    power_limit_w: float | Unsupported = UNSUPPORTED
    nvlink_active: list[bool] | Unsupported = UNSUPPORTED
    ordinal: int | None = None
    clocks_event_reasons_samples: list[int] | Unsupported = UNSUPPORTED
    memory_temperature_c: int | Unsupported = UNSUPPORTED
    nvlink_crc_flit_errors: dict[str, int] | Unsupported = UNSUPPORTED
    nvlink_replay_errors: dict[str, int] | Unsupported = UNSUPPORTED
    nvlink_recovery_errors: dict[str, int] | Unsupported = UNSUPPORTED
    xid_events: list[int] | Unsupported = UNSUPPORTED
    xid_kernel_log: list[int] | Unsupported = UNSUPPORTED
    gpu_recovery_action: int | Unsupported = UNSUPPORTED  # nvmlDeviceGetGpuRecoveryAction (0 none, 1 reset, ...)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def device(self) -> str:
        """The label used in metrics and reasons: ``cuda:<torch ordinal>``, else ``cuda:<NVML index>``."""
        return f"cuda:{self.index if self.ordinal is None else self.ordinal}"

    def unsupported_fields(self) -> list[str]:
        """Names of the fields NVML could not report."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) == UNSUPPORTED]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class NvmlSnapshot:
    """Driver-wide versions and the selected GPUs (``nvidia-smi -q``).

    ``cuda_driver_version`` is the newest CUDA version the driver supports
    ("12.4", the "CUDA Version" in the ``nvidia-smi`` banner); ``gpu_count`` is
    every GPU NVML sees, even when ``gpus`` holds only a selection;
    ``cuda_visible_devices`` the value the selection was mapped from (None: unset or not used).
    """

    driver_version: str | Unsupported = UNSUPPORTED
    nvml_version: str | Unsupported = UNSUPPORTED
    cuda_driver_version: str | Unsupported = UNSUPPORTED
    gpu_count: int = 0
    cuda_visible_devices: str | None = None
    gpus: list[GpuSnapshot] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Field kinds for validating recorded snapshots: "list" is a list of bools, "dict" maps str to str.
_GPU_KINDS: dict[str, str] = {
    "index": "int", "name": "str", "uuid": "str", "serial": "str", "pci_bus_id": "str",
    "memory_total_bytes": "int", "memory_used_bytes": "int",
    "ecc_mode_current": "bool", "ecc_mode_pending": "bool",
    "ecc_volatile_uncorrectable": "int", "ecc_volatile_correctable": "int",
    "ecc_aggregate_uncorrectable": "int", "ecc_aggregate_correctable": "int",
    "retired_pages_pending": "bool", "retired_pages_sbe": "int", "retired_pages_dbe": "int",
    "remapped_rows_correctable": "int", "remapped_rows_uncorrectable": "int",
    "remapped_rows_pending": "bool", "remapped_rows_failure": "bool",
    "pcie_link_gen": "int", "pcie_link_gen_max": "int", "pcie_link_gen_gpu_max": "int",
    "pcie_link_width": "int", "pcie_link_width_max": "int",
    "clocks_event_reasons": "int",
    "temperature_c": "int", "temperature_slowdown_c": "int", "temperature_shutdown_c": "int",
    "power_draw_w": "float", "power_limit_w": "float",
    "nvlink_active": "list", "ordinal": "optint", "clocks_event_reasons_samples": "intlist",
    "memory_temperature_c": "int", "nvlink_crc_flit_errors": "intmap", "nvlink_replay_errors": "intmap",
    "nvlink_recovery_errors": "intmap", "xid_events": "intlist", "xid_kernel_log": "intlist", "errors": "dict",
    "gpu_recovery_action": "int"}
_SNAPSHOT_KINDS: dict[str, str] = {
    "driver_version": "str", "nvml_version": "str", "cuda_driver_version": "str",
    "gpu_count": "int", "cuda_visible_devices": "optstr", "errors": "dict",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _kind_ok(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return _is_int(value)
    if kind == "optint":
        return value is None or (_is_int(value) and value >= 0)
    if kind == "optstr":
        return value is None or isinstance(value, str)
    if kind == "intlist":
        return isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)
    if kind == "intmap":
        return isinstance(value, dict) and all(isinstance(k, str) and k.isdigit() and _is_int(v) and v >= 0
                                               for k, v in value.items())
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "list":
        return isinstance(value, list) and all(isinstance(v, bool) for v in value)
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _fields_from(d: dict[str, Any], kinds: dict[str, str], where: str) -> dict[str, Any]:
    """Validated constructor arguments; absent fields stay at their defaults ("unsupported")."""
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        if name not in d:
            continue
        value = d[name]
        if value == UNSUPPORTED and kind not in ("dict", "str", "optint", "optstr"):
            out[name] = UNSUPPORTED
            continue
        if not _kind_ok(value, kind):
            raise InputError(f"NVML snapshot {where}.{name}: expected {kind} or {UNSUPPORTED!r}, got {value!r}")
        out[name] = float(value) if kind == "float" else value
    return out


def gpu_from_dict(d: dict[str, Any], where: str = "gpus[?]") -> GpuSnapshot:
    """A :class:`GpuSnapshot` from its ``to_dict`` form; raises InputError on malformed data."""
    if not isinstance(d, dict) or not isinstance(d.get("index"), int):
        raise InputError(f"NVML snapshot {where}: expected a mapping with an integer 'index'")
    return GpuSnapshot(**_fields_from(d, _GPU_KINDS, where))


def snapshot_from_dict(d: dict[str, Any]) -> NvmlSnapshot:
    """An :class:`NvmlSnapshot` from its ``to_dict`` form (e.g. a recorded ``--dump``).

    Missing fields read as "unsupported"; wrongly typed ones raise InputError.
    """
    if not isinstance(d, dict):
        raise InputError("NVML snapshot: expected a JSON object")
    raw_gpus = d.get("gpus", [])
    if not isinstance(raw_gpus, list):
        raise InputError("NVML snapshot gpus: expected a list")
    gpus = [gpu_from_dict(g, f"gpus[{i}]") for i, g in enumerate(raw_gpus)]
    fields = _fields_from(d, _SNAPSHOT_KINDS, "snapshot")
    fields.setdefault("gpu_count", len(gpus))
    return NvmlSnapshot(gpus=gpus, **fields)


def format_cuda_version(v: int) -> str:
    """NVML's integer CUDA version (12040) as "12.4" (``nvidia-smi`` banner form)."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _Reader:
    """Calls NVML getters, turning each NVMLError into "unsupported" plus a recorded message."""

    def __init__(self, nvml: Any, errors: dict[str, str]) -> None:
        self.nvml = nvml
        self.errors = errors

    def get(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self.errors[name] = str(exc) or type(exc).__name__
        except (AttributeError, TypeError) as exc:  # a binding missing, or of another shape: one field, not the run
            self.errors[name] = ("not in this nvidia-ml-py: " if isinstance(exc, AttributeError) else f"this nvidia-"
                                 f"ml-py's {getattr(fn, '__name__', 'binding')} took other arguments: ") + str(exc)
        return UNSUPPORTED

    def call(self, name: str, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            self.errors[name] = f"{fn_name} not in this nvidia-ml-py"
            return UNSUPPORTED
        return self.get(name, fn, *args)


def _map(value: Any, fn: Callable[[Any], Any]) -> Any:
    return UNSUPPORTED if value == UNSUPPORTED else fn(value)


def _open(nvml: Any, index: int, uuid: str = "", ordinal: int | None = None) -> tuple[GpuSnapshot, Any]:
    """The GPU's (still empty) snapshot and its handle, opened by UUID when known, else by NVML index.

    A handle that cannot be opened ("GPU is lost", "Unknown Error",
    "Insufficient Permissions") is recorded as ``errors["handle"]`` and the
    handle returned is "unsupported".
    """
    g = GpuSnapshot(index=index, ordinal=ordinal)
    r = _Reader(nvml, g.errors)
    if uuid:
        g.uuid = uuid
        return g, r.call("handle", "nvmlDeviceGetHandleByUUID", uuid)
    return g, r.get("handle", nvml.nvmlDeviceGetHandleByIndex, index)


def _read_gpu(nvml: Any, g: GpuSnapshot, handle: Any) -> GpuSnapshot:
    """Fill ``g`` from an open ``handle`` (``nvidia-smi -q -i <uuid>``)."""
    errors = g.errors
    r = _Reader(nvml, errors)
    g.name = _map(r.call("name", "nvmlDeviceGetName", handle), _text)
    g.uuid = _map(r.call("uuid", "nvmlDeviceGetUUID", handle), _text)
    g.serial = _map(r.call("serial", "nvmlDeviceGetSerial", handle), _text)
    pci = r.call("pci_bus_id", "nvmlDeviceGetPciInfo", handle)
    g.pci_bus_id = _map(pci, lambda p: _text(p.busId))
    mem = r.call("memory_total_bytes", "nvmlDeviceGetMemoryInfo", handle)
    if mem != UNSUPPORTED:
        g.memory_total_bytes, g.memory_used_bytes = int(mem.total), int(mem.used)
    else:
        errors["memory_used_bytes"] = errors["memory_total_bytes"]

    ecc = r.call("ecc_mode_current", "nvmlDeviceGetEccMode", handle)
    if ecc != UNSUPPORTED:
        g.ecc_mode_current, g.ecc_mode_pending = bool(ecc[0]), bool(ecc[1])
    else:
        errors["ecc_mode_pending"] = errors["ecc_mode_current"]
    unc, cor = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    vol, agg = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
    g.ecc_volatile_uncorrectable = _map(r.call("ecc_volatile_uncorrectable", "nvmlDeviceGetTotalEccErrors",
                                               handle, unc, vol), int)
    g.ecc_volatile_correctable = _map(r.call("ecc_volatile_correctable", "nvmlDeviceGetTotalEccErrors",
                                             handle, cor, vol), int)
    g.ecc_aggregate_uncorrectable = _map(r.call("ecc_aggregate_uncorrectable", "nvmlDeviceGetTotalEccErrors",
                                                handle, unc, agg), int)
    g.ecc_aggregate_correctable = _map(r.call("ecc_aggregate_correctable", "nvmlDeviceGetTotalEccErrors",
                                              handle, cor, agg), int)

    g.retired_pages_pending = _map(r.call("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus",
                                          handle), bool)
    g.retired_pages_sbe = _map(r.call("retired_pages_sbe", "nvmlDeviceGetRetiredPages", handle,
                                      nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS), len)
    g.retired_pages_dbe = _map(r.call("retired_pages_dbe", "nvmlDeviceGetRetiredPages", handle,
                                      nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR), len)
    rows = r.call("remapped_rows", "nvmlDeviceGetRemappedRows", handle)
    if rows != UNSUPPORTED:
        corr, uncorr, pending, failure = rows
        g.remapped_rows_correctable, g.remapped_rows_uncorrectable = int(corr), int(uncorr)
        g.remapped_rows_pending, g.remapped_rows_failure = bool(pending), bool(failure)
    else:
        msg = errors.pop("remapped_rows")
        for name in ("correctable", "uncorrectable", "pending", "failure"):
            errors[f"remapped_rows_{name}"] = msg

    g.pcie_link_gen = _map(r.call("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration", handle), int)
    g.pcie_link_gen_max = _map(r.call("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", handle), int)
    g.pcie_link_gen_gpu_max = _map(r.call("pcie_link_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration",
                                          handle), int)
    g.pcie_link_width = _map(r.call("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", handle), int)
    g.pcie_link_width_max = _map(r.call("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", handle), int)

    reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
    if not hasattr(nvml, reasons_fn):
        reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
    reasons = r.call("clocks_event_reasons", reasons_fn, handle)
    if reasons == UNSUPPORTED and reasons_fn.endswith("EventReasons") and hasattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"):  # driver older than the binding
        errors.pop("clocks_event_reasons", None)
        reasons = r.call("clocks_event_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    g.clocks_event_reasons = _map(reasons, int)

    g.temperature_c = _map(r.call("temperature_c", "nvmlDeviceGetTemperature", handle,
                                  nvml.NVML_TEMPERATURE_GPU), int)
    g.temperature_slowdown_c = _map(r.call("temperature_slowdown_c", "nvmlDeviceGetTemperatureThreshold", handle,
                                           nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), int)
    g.temperature_shutdown_c = _map(r.call("temperature_shutdown_c", "nvmlDeviceGetTemperatureThreshold", handle,
                                           nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN), int)
    g.power_draw_w = _map(r.call("power_draw_w", "nvmlDeviceGetPowerUsage", handle), lambda mw: mw / 1000.0)
    g.power_limit_w = _map(r.call("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", handle),
                           lambda mw: mw / 1000.0)
    g.nvlink_active = _read_nvlink(nvml, handle, errors)
    if isinstance(g.nvlink_active, list):
        counters, why = read_nvlink_errors(nvml, handle, g.nvlink_active)
        g.nvlink_crc_flit_errors = counters.get("nvlink_crc_flit_errors", UNSUPPORTED)
        g.nvlink_replay_errors = counters.get("nvlink_replay_errors", UNSUPPORTED)
        g.nvlink_recovery_errors = counters.get("nvlink_recovery_errors", UNSUPPORTED)
    else:
        why = "NVLink not supported"
    for name in ("nvlink_crc_flit_errors", "nvlink_replay_errors", "nvlink_recovery_errors"):
        if getattr(g, name) == UNSUPPORTED:
            errors[name] = why or "Not Supported"
    action, why = read_recovery_action(nvml, handle)
    g.gpu_recovery_action = UNSUPPORTED if action is None else action
    errors.update({"gpu_recovery_action": why} if action is None else {})
    temp, why = read_memory_temperature(nvml, handle)
    if temp is None:
        errors["memory_temperature_c"] = why
    else:
        g.memory_temperature_c = temp
    return g


def _reasons_now(nvml: Any, handle: Any) -> int | None:
    """The current clock event reason mask (newer binding name first), None when NVML rejects both."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nvml, name, None)
        if fn is not None:
            try:
                return int(fn(handle))
            except nvml.NVMLError:
                continue
    return None


def _read_nvlink(nvml: Any, handle: Any, errors: dict[str, str]) -> list[bool] | Unsupported:
    """Link states 0..17 (``nvidia-smi nvlink --status``); stops at the first link NVML rejects."""
    fn = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    if fn is None:
        errors["nvlink_active"] = "nvmlDeviceGetNvLinkState not in this nvidia-ml-py"
        return UNSUPPORTED
    states: list[bool] = []
    for link in range(NVLINK_LINKS):
        try:
            states.append(bool(fn(handle, link) == nvml.NVML_FEATURE_ENABLED))
        except nvml.NVMLError as exc:
            if not states:
                errors["nvlink_active"] = str(exc) or type(exc).__name__
                return UNSUPPORTED
            break
    return states


@dataclass(frozen=True)
class _Target:
    index: int
    uuid: str = ""
    ordinal: int | None = None


def inventory(nvml: Any, count: int, with_mig: bool) -> list[NvmlGpuId]:
    """Index, UUID and bus id of every GPU (``nvidia-smi -L``); UUID "" where the handle fails."""
    out: list[NvmlGpuId] = []
    for i in range(count):
        errs: dict[str, str] = {}
        r = _Reader(nvml, errs)
        h = r.get("handle", nvml.nvmlDeviceGetHandleByIndex, i)
        uuid = _map(r.call("uuid", "nvmlDeviceGetUUID", h), _text) if h != UNSUPPORTED else UNSUPPORTED
        pci = _map(r.call("pci", "nvmlDeviceGetPciInfo", h), lambda p: _text(p.busId)) if uuid != UNSUPPORTED \
            else UNSUPPORTED
        migs: list[str] = []
        if with_mig and uuid != UNSUPPORTED:
            n = r.call("mig", "nvmlDeviceGetMaxMigDeviceCount", h)
            for j in range(n if isinstance(n, int) else 0):
                mh = r.call("mig", "nvmlDeviceGetMigDeviceHandleByIndex", h, j)
                mu = r.call("mig", "nvmlDeviceGetUUID", mh) if mh != UNSUPPORTED else UNSUPPORTED
                if mu != UNSUPPORTED:
                    migs.append(_text(mu))
        out.append(NvmlGpuId(i, uuid if isinstance(uuid, str) and uuid != UNSUPPORTED else "",
                             pci if isinstance(pci, str) and pci != UNSUPPORTED else "", tuple(migs)))
    return out


def _session(pick: Callable[[Any, int], list[_Target]], sample_s: float, interval_s: float,
             sleep: Callable[[float], None], visible: str | None = None) -> NvmlSnapshot:
    """One NVML session: versions, the GPUs ``pick(nvml, count)`` selects, XID events and clock samples."""
    pynvml = open_nvml()
    try:
        errors: dict[str, str] = {}
        r = _Reader(pynvml, errors)
        snap = NvmlSnapshot(errors=errors, cuda_visible_devices=visible)
        snap.driver_version = _map(r.call("driver_version", "nvmlSystemGetDriverVersion"), _text)
        snap.nvml_version = _map(r.call("nvml_version", "nvmlSystemGetNVMLVersion"), _text)
        cuda = r.call("cuda_driver_version", "nvmlSystemGetCudaDriverVersion_v2")
        if cuda == UNSUPPORTED:
            errors.pop("cuda_driver_version", None)
            cuda = r.call("cuda_driver_version", "nvmlSystemGetCudaDriverVersion")
        snap.cuda_driver_version = _map(cuda, format_cuda_version)
        try:
            snap.gpu_count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML not available: cannot count GPUs: {exc}") from exc
        opened = [_open(pynvml, t.index, t.uuid, t.ordinal) for t in pick(pynvml, snap.gpu_count)]
        watch = XidWatch(pynvml)  # before any reading: NVML reports only XIDs raised after this
        for g, h in opened:
            if h != UNSUPPORTED:
                why = watch.register(h)
                if why:
                    g.errors["xid_events"] = why
                else:
                    g.xid_events = []
        snap.gpus = [_read_gpu(pynvml, g, h) if h != UNSUPPORTED else g for g, h in opened]
        _sample(pynvml, opened, sample_s, interval_s, sleep)
        found, why = watch.drain(lambda dev: _text(pynvml.nvmlDeviceGetUUID(dev)))
        for g in snap.gpus:
            if isinstance(g.xid_events, list):
                g.xid_events = found.get(str(g.uuid), [])
                if why:
                    g.errors["xid_events"] = why
                    g.xid_events = UNSUPPORTED
        return snap
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _sample(nvml: Any, opened: list[tuple[GpuSnapshot, Any]], sample_s: float, interval_s: float,
            sleep: Callable[[float], None]) -> None:
    """Fill ``clocks_event_reasons_samples``: the first read plus one every ``interval_s`` for ``sample_s``."""
    def read() -> list[int | None]:
        return [_reasons_now(nvml, h) if isinstance(g.clocks_event_reasons, int) else None for g, h in opened]

    first = [g.clocks_event_reasons if isinstance(g.clocks_event_reasons, int) else None for g, _ in opened]
    for (g, h), samples in zip(opened, sample_reasons(read, first, sample_s, interval_s, sleep), strict=True):
        if samples:
            g.clocks_event_reasons_samples = samples
        elif h != UNSUPPORTED:
            g.errors["clocks_event_reasons_samples"] = g.errors.get("clocks_event_reasons", "Not Supported")


def read_snapshot(indices: list[int] | None = None, *, sample_s: float = 0.0, interval_s: float = 0.1,
                  sleep: Callable[[float], None] = time.sleep) -> NvmlSnapshot:
    """Read driver versions and the GPUs at NVML ``indices`` (None: all) in one NVML session.

    Clock event reasons are sampled for ``sample_s`` seconds (0: one sample).
    Raises :class:`NvmlUnavailable` when NVML cannot load ("NVML not available:
    NVML Shared Library Not Found") and :class:`InputError` for an index NVML
    does not have. Per-field failures become "unsupported", never exceptions.
    """
    def pick(_nvml: Any, count: int) -> list[_Target]:
        selected = list(range(count)) if indices is None else list(indices)
        bad = [i for i in selected if not 0 <= i < count]
        if bad:
            raise InputError(f"GPU index {bad[0]} does not exist: NVML sees {count} GPU(s)")
        return [_Target(i) for i in selected]

    return _session(pick, sample_s, interval_s, sleep)


def read_visible_snapshot(visible: str | None, ordinals: list[int] | None = None, *, sample_s: float = 1.0,
                          interval_s: float = 0.1, sleep: Callable[[float], None] = time.sleep) -> NvmlSnapshot:
    """The GPUs torch sees as ``cuda:<ordinal>`` under ``CUDA_VISIBLE_DEVICES=visible``, opened by UUID.

    ``ordinals`` are torch ordinals (``--gpus``; None: every visible GPU).
    Each GPU's ``ordinal`` is set; ``gpu_count`` is still every GPU NVML sees.
    Raises as :func:`read_snapshot`, and InputError for an ordinal not visible.
    """
    def pick(nvml: Any, count: int) -> list[_Target]:
        inv = inventory(nvml, count, with_mig="mig-" in (visible or "").lower())
        chosen = select_ordinals(map_visible_devices(visible, inv), ordinals)
        return [_Target(v.index, v.uuid, v.ordinal) for v in chosen]

    return _session(pick, sample_s, interval_s, sleep, visible)


def _summary_line(g: GpuSnapshot) -> str:
    mem = g.memory_total_bytes
    mem_s = f"{mem / 2**30:.0f} GiB" if isinstance(mem, int) else UNSUPPORTED
    return (f"{g.index}: {g.name} {g.pci_bus_id} {mem_s} PCIe gen{g.pcie_link_gen}/x{g.pcie_link_width} "
            f"{g.temperature_c} C {g.power_draw_w} W")


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuaccept.hw.nvml [--dump] [--gpus 0,1]``: print a snapshot (JSON with --dump)."""
    ap = argparse.ArgumentParser(prog="python -m gpuaccept.hw.nvml", description="Print an NVML snapshot of this node.")
    ap.add_argument("--dump", action="store_true", help="print the snapshot as JSON (the test-fixture format)")
    ap.add_argument("--gpus", default=None, help="comma-separated NVML indices (default all; torch's with --visible)")
    ap.add_argument("--visible", action="store_true", help="select through CUDA_VISIBLE_DEVICES, by UUID")
    ap.add_argument("--sample-s", type=float, default=1.0, help="seconds to sample clock event reasons (default 1)")
    args = ap.parse_args(argv)
    indices = [int(x) for x in args.gpus.split(",") if x.strip()] if args.gpus else None
    try:
        if args.visible:
            snap = read_visible_snapshot(os.environ.get("CUDA_VISIBLE_DEVICES"), indices, sample_s=args.sample_s)
        else:
            snap = read_snapshot(indices, sample_s=args.sample_s)
    except (NvmlUnavailable, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.dump:
        print(json.dumps(snap.to_dict(), indent=2))
    else:
        print(f"driver {snap.driver_version}, CUDA {snap.cuda_driver_version}, {snap.gpu_count} GPU(s)")
        for g in snap.gpus:
            print(_summary_line(g))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
