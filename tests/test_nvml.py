"""The NVML reader: JSON round trips, "unsupported" as a value, and the reader against a fake NVML library.

The fake library reuses nvidia-ml-py's real error classes and constants and
only replaces the C calls, so the reader's error handling is exercised
exactly as on a node; the real library is used where a GPU is present.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuaccept.errors import InputError
from gpuaccept.hw import nvml
from gpuaccept.hw.nvml import (
    UNSUPPORTED,
    GpuSnapshot,
    NvmlSnapshot,
    NvmlUnavailable,
    format_cuda_version,
    read_snapshot,
    snapshot_from_dict,
)

FIXTURES = sorted((Path(__file__).parent / "data" / "nvml").glob("*.json"))


def nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------- JSON form


def test_fixtures_exist() -> None:
    assert len(FIXTURES) >= 7, FIXTURES


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_round_trip(path: Path) -> None:
    raw = json.loads(path.read_text())
    snap = snapshot_from_dict(raw)
    assert snap.to_dict() == raw  # fixtures are in the exact shape to_dict produces
    again = snapshot_from_dict(json.loads(json.dumps(snap.to_dict())))
    assert again == snap
    assert all(isinstance(g, GpuSnapshot) for g in snap.gpus)
    assert [g.index for g in snap.gpus] == sorted(g.index for g in snap.gpus)


def test_missing_fields_read_as_unsupported() -> None:
    snap = snapshot_from_dict({"driver_version": "550.54.15", "gpus": [{"index": 0, "name": "NVIDIA H100",
                                                                       "temperature_c": 40}]})
    g = snap.gpus[0]
    assert g.name == "NVIDIA H100" and g.temperature_c == 40
    assert g.ecc_volatile_uncorrectable == UNSUPPORTED
    assert g.nvlink_active == UNSUPPORTED
    assert snap.cuda_driver_version == UNSUPPORTED
    assert snap.gpu_count == 1  # defaults to the GPUs listed
    unsupported = g.unsupported_fields()
    assert "ecc_volatile_uncorrectable" in unsupported and "temperature_c" not in unsupported
    assert "name" not in unsupported and "index" not in unsupported
    assert g.to_dict()["power_draw_w"] == "unsupported"


def test_power_read_as_float_from_json_int() -> None:
    g = snapshot_from_dict({"gpus": [{"index": 0, "power_draw_w": 300, "power_limit_w": 700}]}).gpus[0]
    assert g.power_draw_w == 300.0 and isinstance(g.power_draw_w, float)


@pytest.mark.parametrize("gpu", [
    {"index": 0, "ecc_volatile_uncorrectable": "3"},          # a string that is not "unsupported"
    {"index": 0, "ecc_volatile_uncorrectable": True},         # a bool is not a count
    {"index": 0, "remapped_rows_pending": 1},                 # an int is not a flag
    {"index": 0, "nvlink_active": [True, "up"]},
    {"index": 0, "errors": {"name": 3}},
    {"index": 0, "errors": "unsupported"},                    # errors is always a mapping
    {"name": "NVIDIA H100"},                                  # no index
    {"index": "0"},
])
def test_malformed_gpu_rejected(gpu: dict[str, Any]) -> None:
    with pytest.raises(InputError):
        snapshot_from_dict({"gpus": [gpu]})


def test_malformed_snapshot_rejected() -> None:
    with pytest.raises(InputError):
        not_a_mapping: Any = []
        snapshot_from_dict(not_a_mapping)
    with pytest.raises(InputError):
        snapshot_from_dict({"gpus": {"0": {}}})
    with pytest.raises(InputError, match="gpus\\[1\\]"):
        snapshot_from_dict({"gpus": [{"index": 0}, {"index": 1, "temperature_c": "hot"}]})


@pytest.mark.parametrize(("raw", "text"), [(12040, "12.4"), (11080, "11.8"), (12000, "12.0"), (13010, "13.1")])
def test_format_cuda_version(raw: int, text: str) -> None:
    assert format_cuda_version(raw) == text


# ---------------------------------------------------------------- reader against a fake NVML


class Err:
    """A spec value that makes the fake raise the real pynvml error for ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code


H100_SPEC: dict[str, Any] = {
    "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
    "nvmlDeviceGetUUID": "GPU-00000000-1111-2222-3333-444444444444",
    "nvmlDeviceGetSerial": "1654922012345",
    "nvmlDeviceGetPciInfo": types.SimpleNamespace(busId=b"00000000:18:00.0"),
    "nvmlDeviceGetMemoryInfo": types.SimpleNamespace(total=85520809984, used=566755328),
    "nvmlDeviceGetEccMode": [1, 1],
    "nvmlDeviceGetTotalEccErrors": lambda etype, ctype: {(1, 0): 2, (0, 0): 5, (1, 1): 3, (0, 1): 40}[(etype, ctype)],
    "nvmlDeviceGetRetiredPagesPendingStatus": Err(pynvml.NVML_ERROR_NOT_SUPPORTED),
    "nvmlDeviceGetRetiredPages": Err(pynvml.NVML_ERROR_NO_PERMISSION),
    "nvmlDeviceGetRemappedRows": (4, 1, 1, 0),
    "nvmlDeviceGetCurrPcieLinkGeneration": 4,
    "nvmlDeviceGetMaxPcieLinkGeneration": 5,
    "nvmlDeviceGetCurrPcieLinkWidth": 8,
    "nvmlDeviceGetMaxPcieLinkWidth": 16,
    "nvmlDeviceGetCurrentClocksEventReasons": 0x88,
    "nvmlDeviceGetTemperature": 45,
    "nvmlDeviceGetTemperatureThreshold": lambda which: {pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
                                                        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92}[which],
    "nvmlDeviceGetPowerUsage": 350500,
    "nvmlDeviceGetEnforcedPowerLimit": 700000,
    "nvmlDeviceGetNvLinkState": lambda link: [1, 1, 0, 1][link] if link < 4 else Err(
        pynvml.NVML_ERROR_INVALID_ARGUMENT),
    # replay count = link number, so per-link placement is visible; link 2 is down and never asked
    "nvmlDeviceGetNvLinkErrorCounter": lambda link, counter: {
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY: link,
        pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: 0}[counter] if link != 2 else Err(pynvml.NVML_ERROR_INVALID_ARGUMENT),
    # memory temperature 47 C; recovery action 0 (none)
    "nvmlDeviceGetFieldValues": lambda ids: [field_value(pynvml.NVML_SUCCESS, 47 * (
        i != pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)) for i in ids],
    "events": None,  # nvmlDeviceRegisterEvents: None accepts; an Err rejects; absent: Not Supported
}

DEVICE_FUNCS = (*(k for k in H100_SPEC if k.startswith("nvml")), "nvmlDeviceGetGpuMaxPcieLinkGeneration",
                "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetMigMode")


def field_value(ret: int, value: int) -> types.SimpleNamespace:
    """A ``c_nvmlFieldValue_t`` as nvmlDeviceGetFieldValues returns it (unsigned int value)."""
    return types.SimpleNamespace(nvmlReturn=ret, valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                 value=types.SimpleNamespace(uiVal=value))


class FakeNvml:
    """Installs a fake ``pynvml`` module: per-GPU specs map a function name to a value, an Err or a callable."""

    def __init__(self, gpus: list[dict[str, Any] | Err], *, init_error: int | None = None,
                 omit: tuple[str, ...] = (), shutdown_error: int | None = None) -> None:
        self.gpus = gpus
        self.shutdown_error = shutdown_error
        self.init_error = init_error
        self.shutdowns = 0
        self.calls: list[tuple[Any, ...]] = []  # (function, *args) of the calls that take arguments
        self.registered: list[tuple[int, int]] = []  # (handle, event types) registered on the event set
        self.pending: list[Any] = []
        self.freed = 0
        self.module = types.ModuleType("pynvml")
        for name, value in vars(pynvml).items():
            if name.startswith(("NVML", "nvmlEventType")):  # constants and the NVMLError class family
                setattr(self.module, name, value)
        m = self.module
        m.nvmlInit = self._init  # type: ignore[attr-defined]
        m.nvmlShutdown = self._shutdown  # type: ignore[attr-defined]
        m.nvmlSystemGetDriverVersion = lambda: "550.54.15"  # type: ignore[attr-defined]
        m.nvmlSystemGetNVMLVersion = lambda: b"12.550.54.15"  # type: ignore[attr-defined]
        m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12040  # type: ignore[attr-defined]
        m.nvmlDeviceGetCount = lambda: len(self.gpus)  # type: ignore[attr-defined]
        m.nvmlDeviceGetHandleByIndex = self._handle  # type: ignore[attr-defined]
        m.nvmlDeviceGetHandleByUUID = self._handle_by_uuid  # type: ignore[attr-defined]
        m.nvmlEventSetCreate = lambda: "evset"  # type: ignore[attr-defined]
        m.nvmlDeviceRegisterEvents = self._register  # type: ignore[attr-defined]
        m.nvmlEventSetWait_v2 = self._wait  # type: ignore[attr-defined]
        m.nvmlEventSetFree = self._free  # type: ignore[attr-defined]
        for fn in DEVICE_FUNCS:
            if fn not in omit:
                setattr(m, fn, self._device_fn(fn))

    @staticmethod
    def _raise_or(value: Any) -> Any:
        if isinstance(value, Err):
            raise pynvml.NVMLError(value.code)
        return value

    def _init(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def _shutdown(self) -> None:
        self.shutdowns += 1
        if self.shutdown_error is not None:
            raise pynvml.NVMLError(self.shutdown_error)

    def _handle(self, index: int) -> int:
        self.calls.append(("nvmlDeviceGetHandleByIndex", index))
        self._raise_or(self.gpus[index])
        return index

    def _handle_by_uuid(self, uuid: str) -> int:
        self.calls.append(("nvmlDeviceGetHandleByUUID", uuid))
        for i, spec in enumerate(self.gpus):
            if isinstance(spec, dict) and spec.get("nvmlDeviceGetUUID") == uuid:
                return self._raise_or(spec.get("handle_by_uuid", i))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _register(self, handle: int, types_: int, evset: str) -> None:
        assert evset == "evset"
        spec = self.gpus[handle]
        assert isinstance(spec, dict)
        self._raise_or(spec.get("events", Err(pynvml.NVML_ERROR_NOT_SUPPORTED)))
        self.registered.append((handle, types_))
        for xid in spec.get("xids", []):  # raised while the snapshot is taken, i.e. after registration
            self.pending.append(types.SimpleNamespace(device=handle, eventType=pynvml.nvmlEventTypeXidCriticalError,
                                                      eventData=xid))

    def _wait(self, evset: str, timeout_ms: int) -> Any:
        assert evset == "evset" and timeout_ms == 0  # never block
        if not self.pending:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.pending.pop(0)

    def _free(self, evset: str) -> None:
        self.freed += 1

    def _device_fn(self, name: str) -> Any:
        def fn(handle: int, *args: Any) -> Any:
            self.calls.append((name, handle, *args))
            spec = self.gpus[handle]
            assert isinstance(spec, dict)
            if name not in spec:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            value = spec[name]
            if callable(value):
                value = value(*args)
            return self._raise_or(value)
        return fn

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        monkeypatch.setitem(sys.modules, "pynvml", self.module)
        return self


def test_reader_values_and_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([dict(H100_SPEC), Err(pynvml.NVML_ERROR_GPU_IS_LOST)]).install(monkeypatch)
    snap = read_snapshot()
    assert fake.shutdowns == 1
    assert (snap.driver_version, snap.nvml_version, snap.cuda_driver_version) == ("550.54.15", "12.550.54.15",
                                                                                  "12.4")
    assert snap.gpu_count == 2
    g = snap.gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3" and g.pci_bus_id == "00000000:18:00.0"
    assert (g.uuid, g.serial) == ("GPU-00000000-1111-2222-3333-444444444444", "1654922012345")
    assert (g.memory_total_bytes, g.memory_used_bytes) == (85520809984, 566755328)
    assert (g.ecc_mode_current, g.ecc_mode_pending) == (True, True)
    assert (g.ecc_volatile_uncorrectable, g.ecc_volatile_correctable) == (2, 5)
    assert (g.ecc_aggregate_uncorrectable, g.ecc_aggregate_correctable) == (3, 40)
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable) == (4, 1)
    assert (g.remapped_rows_pending, g.remapped_rows_failure) == (True, False)
    assert (g.pcie_link_gen, g.pcie_link_gen_max, g.pcie_link_width, g.pcie_link_width_max) == (4, 5, 8, 16)
    assert g.clocks_event_reasons == 0x88
    assert (g.temperature_c, g.temperature_slowdown_c, g.temperature_shutdown_c) == (45, 89, 92)
    assert (g.power_draw_w, g.power_limit_w) == (350.5, 700.0)  # mW -> W
    assert g.nvlink_active == [True, True, False, True]  # stops at INVALID_ARGUMENT on link 4
    # unsupported values, with NVML's own message kept
    assert g.retired_pages_pending == UNSUPPORTED and g.errors["retired_pages_pending"] == "Not Supported"
    assert g.retired_pages_sbe == UNSUPPORTED and g.errors["retired_pages_sbe"] == "Insufficient Permissions"
    assert g.pcie_link_gen_gpu_max == UNSUPPORTED  # not in the spec: Not Supported
    assert set(g.unsupported_fields()) == {"retired_pages_pending", "retired_pages_sbe", "retired_pages_dbe",
                                           "pcie_link_gen_gpu_max", "xid_kernel_log"}  # the kernel log is not NVML's
    assert g.memory_temperature_c == 47 and g.xid_events == [] and g.ordinal is None and g.device == "cuda:0"
    assert g.gpu_recovery_action == 0
    assert g.nvlink_replay_errors == {"0": 0, "1": 1, "3": 3}  # active links only; link 2 is down
    assert g.nvlink_crc_flit_errors == {"0": 0, "1": 0, "3": 0} and g.nvlink_recovery_errors == g.nvlink_crc_flit_errors
    assert g.clocks_event_reasons_samples == [0x88]  # sample_s=0: the single read
    # a lost GPU is a record, not a crash
    lost = snap.gpus[1]
    assert lost.index == 1 and lost.name == UNSUPPORTED and lost.errors == {"handle": "GPU is lost"}
    assert snapshot_from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


def test_reader_all_unsupported_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([{}]).install(monkeypatch)
    g = read_snapshot().gpus[0]
    assert g.nvlink_active == UNSUPPORTED  # link 0 rejected: no NVLink at all
    assert g.serial == UNSUPPORTED and g.errors["serial"] == "Not Supported"  # GeForce boards have none
    assert g.remapped_rows_failure == UNSUPPORTED and g.errors["remapped_rows_failure"] == "Not Supported"
    assert g.memory_used_bytes == UNSUPPORTED and "memory_used_bytes" in g.errors
    assert set(g.unsupported_fields()) == {f for f in nvml._GPU_KINDS if f not in ("index", "errors", "ordinal")}
    assert set(g.errors) == set(g.unsupported_fields()) - {"xid_kernel_log"}  # filled by the health check


def test_reader_old_binding_falls_back_to_throttle_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = {"nvmlDeviceGetCurrentClocksThrottleReasons": 0x40}
    FakeNvml([spec], omit=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetNvLinkState")).install(
        monkeypatch)
    g = read_snapshot().gpus[0]
    assert g.clocks_event_reasons == 0x40
    assert "clocks_event_reasons" not in g.errors
    assert g.nvlink_active == UNSUPPORTED and "not in this nvidia-ml-py" in g.errors["nvlink_active"]


def test_reader_selects_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([dict(H100_SPEC), dict(H100_SPEC), dict(H100_SPEC)]).install(monkeypatch)
    snap = read_snapshot([2, 0])
    assert [g.index for g in snap.gpus] == [2, 0] and snap.gpu_count == 3
    with pytest.raises(InputError, match="GPU index 3 does not exist"):
        read_snapshot([3])
    assert fake.shutdowns == 2  # shut down after the error too


def test_reader_survives_shutdown_error(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([dict(H100_SPEC)], shutdown_error=pynvml.NVML_ERROR_UNINITIALIZED).install(monkeypatch)
    assert read_snapshot().gpus[0].temperature_c == 45


def test_reader_init_failure_is_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    with pytest.raises(NvmlUnavailable, match="NVML not available: Driver Not Loaded"):
        read_snapshot()


def test_main_dump_is_replayable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    FakeNvml([dict(H100_SPEC)]).install(monkeypatch)
    assert nvml.main(["--dump"]) == 0
    snap = snapshot_from_dict(json.loads(capsys.readouterr().out))
    assert snap.gpus[0].name == "NVIDIA H100 80GB HBM3" and snap.gpus[0].power_draw_w == 350.5
    assert nvml.main([]) == 0
    assert "PCIe gen4/x8" in capsys.readouterr().out


# ---------------------------------------------------------------- this machine


@pytest.mark.skipif(nvml_library_present(), reason="the NVML library is present here")
def test_read_snapshot_without_driver() -> None:
    with pytest.raises(NvmlUnavailable, match="NVML not available: NVML Shared Library Not Found"):
        read_snapshot()


@pytest.mark.skipif(nvml_library_present(), reason="the NVML library is present here")
def test_dump_cli_without_driver() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuaccept.hw.nvml", "--dump"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "NVML not available" in proc.stderr and proc.stdout == ""


def test_memory_temperature_with_a_binding_lacking_newer_value_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-ml-py before NVML_VALUE_TYPE_UNSIGNED_SHORT (or an old ``pynvml`` package shadowing it):
    the field still reads, and a value of a type the binding does not know is unsupported, not a crash."""
    fake = FakeNvml([h100(0), h100(1, nvmlDeviceGetFieldValues=lambda ids: [types.SimpleNamespace(
        nvmlReturn=pynvml.NVML_SUCCESS, valueType=6, value=types.SimpleNamespace(usVal=40))])])
    del fake.module.NVML_VALUE_TYPE_UNSIGNED_SHORT  # type: ignore[attr-defined]
    fake.install(monkeypatch)
    g0, g1 = nvml.read_snapshot().gpus
    assert g0.memory_temperature_c == 47
    assert g1.memory_temperature_c == UNSUPPORTED and "unknown NVML value type 6" in g1.errors["memory_temperature_c"]
    assert g1.temperature_c == 45  # the rest of the GPU is read as before


@pytest.mark.gpu
def test_read_snapshot_on_gpu() -> None:
    import os

    import torch

    snap = read_snapshot()
    assert isinstance(snap, NvmlSnapshot) and snap.gpu_count >= 1
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        assert snap.gpu_count == torch.cuda.device_count()
    assert snap.driver_version != UNSUPPORTED and snap.cuda_driver_version != UNSUPPORTED
    for g in snap.gpus:
        assert isinstance(g.name, str) and g.name != UNSUPPORTED
        assert isinstance(g.memory_total_bytes, int) and g.memory_total_bytes > 2**30
        assert isinstance(g.uuid, str) and g.uuid.startswith("GPU-")
    assert snapshot_from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES, sampling, XID events


def h100(i: int, **extra: Any) -> dict[str, Any]:
    return {**H100_SPEC, "nvmlDeviceGetUUID": f"GPU-00000000-1111-2222-3333-44444444440{i}",
            "nvmlDeviceGetPciInfo": types.SimpleNamespace(busId=f"00000000:{0x18 + 0x10 * i:02X}:00.0".encode()),
            **extra}


def test_visible_gpus_opened_by_uuid_and_labelled_by_ordinal(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([h100(i) for i in range(8)]).install(monkeypatch)
    snap = nvml.read_visible_snapshot("4,5,6,7", [0, 1], sample_s=0)  # --gpus 0,1 in a job given GPUs 4-7
    assert [(g.ordinal, g.index, g.device) for g in snap.gpus] == [(0, 4, "cuda:0"), (1, 5, "cuda:1")]
    assert snap.gpu_count == 8 and snap.cuda_visible_devices == "4,5,6,7"
    opened = [c[1] for c in fake.calls if c[0] == "nvmlDeviceGetHandleByUUID"]
    assert opened == ["GPU-00000000-1111-2222-3333-444444444404", "GPU-00000000-1111-2222-3333-444444444405"]
    read = {c[1] for c in fake.calls if c[0] == "nvmlDeviceGetTemperature"}
    assert read == {4, 5}  # GPUs 0 and 1 (another job's) are never read
    assert snapshot_from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


def test_visible_default_is_only_the_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([h100(i) for i in range(4)]).install(monkeypatch)
    snap = nvml.read_visible_snapshot("GPU-00000000-1111-2222-3333-444444444403,GPU-00000000-1111-2222-3333-4444444444",
                                      sample_s=0)
    assert [g.index for g in snap.gpus] == [3]  # the ambiguous prefix ends enumeration
    assert [g.index for g in nvml.read_visible_snapshot(None, sample_s=0).gpus] == [0, 1, 2, 3]
    with pytest.raises(InputError, match="GPU index 1 does not exist: 1 GPU"):
        nvml.read_visible_snapshot("2", [1], sample_s=0)


def test_handle_error_by_uuid_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([h100(0), h100(1, handle_by_uuid=Err(pynvml.NVML_ERROR_UNKNOWN)),
              h100(2, handle_by_uuid=Err(pynvml.NVML_ERROR_NO_PERMISSION))]).install(monkeypatch)
    gpus = nvml.read_visible_snapshot(None, sample_s=0).gpus
    assert gpus[1].errors == {"handle": "Unknown Error"} and gpus[1].uuid.endswith("01")
    assert gpus[2].errors == {"handle": "Insufficient Permissions"}
    assert gpus[0].temperature_c == 45


def test_clock_reasons_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    masks = iter([0x8, 0x8, 0, 0, 0x8, 0, 0, 0, 0, 0])
    spec = h100(0, nvmlDeviceGetCurrentClocksEventReasons=lambda: next(masks))
    FakeNvml([spec, h100(1)]).install(monkeypatch)
    slept: list[float] = []
    snap = nvml.read_visible_snapshot(None, sample_s=1.0, interval_s=0.1, sleep=slept.append)
    assert slept == [0.1] * 9
    assert snap.gpus[0].clocks_event_reasons_samples == [0x8, 0x8, 0, 0, 0x8, 0, 0, 0, 0, 0]
    assert snap.gpus[0].clocks_event_reasons == 0x8 and snap.gpus[1].clocks_event_reasons_samples == [0x88] * 10


def test_xid_events_registered_and_drained(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([h100(0), h100(1, xids=[79, 48]), {k: v for k, v in h100(2).items() if k != "events"}]
                    ).install(monkeypatch)
    gpus = nvml.read_visible_snapshot(None, sample_s=0).gpus
    assert fake.registered == [(0, pynvml.nvmlEventTypeXidCriticalError), (1, pynvml.nvmlEventTypeXidCriticalError)]
    assert gpus[0].xid_events == [] and gpus[1].xid_events == [79, 48]
    assert gpus[2].xid_events == UNSUPPORTED and gpus[2].errors["xid_events"] == "Not Supported"
    assert fake.freed == 1


def test_memory_temperature_field_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([h100(0, nvmlDeviceGetFieldValues=lambda ids: [field_value(pynvml.NVML_ERROR_NOT_SUPPORTED, 0)]),
              h100(1, nvmlDeviceGetFieldValues=lambda ids: [field_value(pynvml.NVML_SUCCESS, 0)])]).install(monkeypatch)
    g0, g1 = nvml.read_snapshot().gpus
    assert g0.memory_temperature_c == UNSUPPORTED and g0.errors["memory_temperature_c"] == "Not Supported"
    assert g1.memory_temperature_c == UNSUPPORTED and "reported 0 C" in g1.errors["memory_temperature_c"]


@pytest.mark.gpu
def test_visible_mapping_agrees_with_torch() -> None:
    """Each torch ordinal's UUID (``torch.cuda.get_device_properties(i).uuid``) is the GPU NVML opened for it."""
    import os

    import torch

    snap = nvml.read_visible_snapshot(os.environ.get("CUDA_VISIBLE_DEVICES"), sample_s=0.2)
    assert len(snap.gpus) == torch.cuda.device_count()
    for g in snap.gpus:
        assert g.ordinal is not None
        assert str(g.uuid).removeprefix("GPU-") == str(torch.cuda.get_device_properties(g.ordinal).uuid)
        assert isinstance(g.clocks_event_reasons_samples, list) and g.clocks_event_reasons_samples


def test_gpu_recovery_action_read_from_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """``nvmlDeviceGetGpuRecoveryAction`` as field 230: 2 (node reboot) kept; a value NVML does not define, or the
    field's error, reads as unsupported with the reason."""
    def fields(action: int, ret: int = pynvml.NVML_SUCCESS) -> Any:
        return lambda ids: [field_value(ret, action) if i == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
                            else field_value(pynvml.NVML_SUCCESS, 47) for i in ids]

    FakeNvml([h100(0, nvmlDeviceGetFieldValues=fields(2)), h100(1, nvmlDeviceGetFieldValues=fields(99)),
              h100(2, nvmlDeviceGetFieldValues=fields(0, pynvml.NVML_ERROR_NOT_SUPPORTED))]).install(monkeypatch)
    g0, g1, g2 = nvml.read_snapshot().gpus
    assert g0.gpu_recovery_action == 2 and g0.memory_temperature_c == 47
    assert g1.gpu_recovery_action == UNSUPPORTED and "unknown recovery action" in g1.errors["gpu_recovery_action"]
    assert g2.gpu_recovery_action == UNSUPPORTED and g2.errors["gpu_recovery_action"] == "Not Supported"
    assert nvml.gpu_from_dict(g0.to_dict()).gpu_recovery_action == 2
