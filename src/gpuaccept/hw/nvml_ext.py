"""NVML readings beyond one query per field: NVLink error counters, memory temperature, XID events, sampling.

Helpers of :mod:`gpuaccept.hw.nvml`, taking the ``pynvml`` module object so a
recorded fake can stand in for it. Each returns plain data plus the NVML
message of what could not be read; none raises an NVMLError.
Names and constants checked against nvidia-ml-py 13.615's ``pynvml``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

NVLINK_COUNTERS: Final[dict[str, str]] = {
    "nvlink_crc_flit_errors": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "nvlink_replay_errors": "NVML_NVLINK_ERROR_DL_REPLAY",
    "nvlink_recovery_errors": "NVML_NVLINK_ERROR_DL_RECOVERY",
}
"""Snapshot field -> ``nvmlNvLinkErrorCounter_t`` (``nvidia-smi nvlink -e``: CRC flit, replay, recovery)."""

MAX_TEMP_C: Final = 200
"""Readings above this many C (or at 0 C) are not a sensor value and read as unsupported."""

MAX_XID_EVENTS: Final = 1000
"""Events drained per read at most (a storm of XIDs must not hang the check)."""


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def mig_enabled(nvml: Any, handle: Any) -> bool | None:
    """Whether MIG is on for the GPU at ``handle`` (``nvidia-smi --query-gpu=mig.mode.current``); None where
    NVML cannot say (not supported, an older NVML)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except (AttributeError, TypeError, ValueError, nvml.NVMLError):
        return None
    return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


def read_nvlink_errors(nvml: Any, handle: Any, active: list[bool]) -> tuple[dict[str, dict[str, int]], str]:
    """Per-link error counters of the active links: ``{field: {"<link>": count}}`` (``nvidia-smi nvlink -e``).

    Counts are since driver load or the last ``nvidia-smi nvlink -re``. Links
    NVML rejects are left out; the second value is the NVML message when no
    link could be read ("" otherwise).
    """
    fn = getattr(nvml, "nvmlDeviceGetNvLinkErrorCounter", None)
    if fn is None:
        return {}, "nvmlDeviceGetNvLinkErrorCounter not in this nvidia-ml-py"
    out: dict[str, dict[str, int]] = {}
    last = "no active link"
    for name, const in NVLINK_COUNTERS.items():
        counts: dict[str, int] = {}
        for link, up in enumerate(active):
            if not up:
                continue
            try:
                value = int(fn(handle, link, getattr(nvml, const)))
            except nvml.NVMLError as exc:
                last = _message(exc)
                continue
            if 0 <= value < 2**63:
                counts[str(link)] = value
        if counts:
            out[name] = counts
    return out, ("" if out else last)


VALUE_FIELDS: Final[dict[str, str]] = {
    "NVML_VALUE_TYPE_DOUBLE": "dVal", "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal", "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal", "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
}
"""``nvmlValueType_t`` constant -> ``c_nvmlValue_t`` member. An older binding lacks the newest
constants (UNSIGNED_SHORT): those types then read as unknown, never as an AttributeError."""


def field_value(nvml: Any, value: Any) -> float | None:
    """The number in one ``c_nvmlFieldValue_t`` by its ``valueType``, None for a type unknown to this binding."""
    by_type = {getattr(nvml, const): member for const, member in VALUE_FIELDS.items() if hasattr(nvml, const)}
    attr = by_type.get(int(value.valueType))
    return None if attr is None else float(getattr(value.value, attr))


def read_memory_temperature(nvml: Any, handle: Any) -> tuple[int | None, str]:
    """HBM/GDDR temperature in C (``nvidia-smi --query-gpu=temperature.memory``), or None and why.

    Read as field ``NVML_FI_DEV_MEMORY_TEMP`` with ``nvmlDeviceGetFieldValues``;
    a per-field error, 0 C (GPUs without a memory sensor report "N/A", some as
    0) or a value over :data:`MAX_TEMP_C` reads as unsupported.
    """
    fn = getattr(nvml, "nvmlDeviceGetFieldValues", None)
    if fn is None or not hasattr(nvml, "NVML_FI_DEV_MEMORY_TEMP"):
        return None, "nvmlDeviceGetFieldValues not in this nvidia-ml-py"
    try:
        values = fn(handle, [nvml.NVML_FI_DEV_MEMORY_TEMP])
    except nvml.NVMLError as exc:
        return None, _message(exc)
    v = values[0]
    if int(v.nvmlReturn) != nvml.NVML_SUCCESS:
        return None, _message(nvml.NVMLError(int(v.nvmlReturn)))
    temp = field_value(nvml, v)
    if temp is None:
        return None, f"unknown NVML value type {int(v.valueType)}"
    if not 0 < temp <= MAX_TEMP_C or temp != temp:
        return None, f"no memory temperature sensor (reported {temp:g} C)"
    return int(temp), ""


def read_recovery_action(nvml: Any, handle: Any) -> tuple[int | None, str]:
    """The driver's recovery action for the GPU (``nvmlDeviceGetGpuRecoveryAction``, read as field
    ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset,
    5 recover the IMEX domain, 6 bus reset, 7 system reboot; or None and why (an older driver or binding)."""
    fn = getattr(nvml, "nvmlDeviceGetFieldValues", None)
    const = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if fn is None or const is None:
        return None, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION not in this nvidia-ml-py"
    try:
        values = fn(handle, [const])
    except nvml.NVMLError as exc:
        return None, _message(exc)
    v = values[0]
    if int(v.nvmlReturn) != nvml.NVML_SUCCESS:
        return None, _message(nvml.NVMLError(int(v.nvmlReturn)))
    action = field_value(nvml, v)
    if action is None or action not in range(8):
        return None, f"unknown recovery action {action}"
    return int(action), ""


class XidWatch:
    """Critical-XID events of some GPUs (``nvmlEventTypeXidCriticalError``), collected with zero-timeout waits.

    NVML delivers only the events raised after registration: open the watch
    first, do the rest of the reading, then :meth:`drain`. Past XIDs are in the
    kernel log (:mod:`gpuaccept.hw.xid`).
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.evset: Any = None
        self.error = ""
        try:
            self.evset = nvml.nvmlEventSetCreate()
        except (nvml.NVMLError, AttributeError) as exc:
            self.error = _message(exc)

    def register(self, handle: Any) -> str:
        """Watch ``handle``; "" on success, else the NVML message (e.g. "Not Supported")."""
        if self.evset is None:
            return self.error or "no NVML event set"
        try:
            self.nvml.nvmlDeviceRegisterEvents(handle, self.nvml.nvmlEventTypeXidCriticalError, self.evset)
        except (self.nvml.NVMLError, AttributeError) as exc:
            return _message(exc)
        return ""

    def drain(self, uuid_of: Callable[[Any], str]) -> tuple[dict[str, list[int]], str]:
        """XIDs pending now, by the UUID of the GPU that raised them; the NVML message if a wait failed."""
        found: dict[str, list[int]] = {}
        if self.evset is None:
            return found, self.error
        nvml, error = self.nvml, ""
        try:
            for _ in range(MAX_XID_EVENTS):
                try:
                    data = nvml.nvmlEventSetWait_v2(self.evset, 0)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                        error = _message(exc)
                    break
                if int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
                    found.setdefault(uuid_of(data.device), []).append(int(data.eventData))
        finally:
            try:
                nvml.nvmlEventSetFree(self.evset)
            except nvml.NVMLError:
                pass
            self.evset = None
        return found, error


def sample_reasons(read: Callable[[], list[int | None]], first: list[int | None], sample_s: float,
                   interval_s: float, sleep: Callable[[float], None] = time.sleep) -> list[list[int]]:
    """Clock event reason masks of several GPUs over ``sample_s`` seconds, one sample every ``interval_s``.

    ``first`` is the sample already taken (None: unsupported on that GPU);
    ``read`` returns one more mask per GPU. A GPU keeps only its samples up to
    its first failed read. About ``sample_s / interval_s`` samples, at least one.
    """
    samples: list[list[int]] = [[m] if m is not None else [] for m in first]
    alive = [m is not None for m in first]
    extra = max(0, round(sample_s / interval_s) - 1) if interval_s > 0 else 0
    for _ in range(extra):
        if not any(alive):
            break
        sleep(interval_s)
        for i, m in enumerate(read()):
            if not alive[i]:
                continue
            if m is None:
                alive[i] = False
            else:
                samples[i].append(m)
    return samples
