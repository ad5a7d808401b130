"""The health check: evaluate_health on recorded-shape NVML fixtures, and run() on this machine."""

from __future__ import annotations

import copy
import ctypes
import json
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks.base import PROFILES, CheckContext, Outcome
from gpuaccept.checks.health import (
    CHECKS,
    LIMITS,
    HealthCheck,
    attach_kernel_xids,
    evaluate_health,
    event_reason_names,
)
from gpuaccept.hw.nvml import NvmlSnapshot, snapshot_from_dict
from gpuaccept.hw.xid import parse_kernel_xids
from gpuaccept.model import Status

DATA = Path(__file__).parent / "data" / "nvml"


def raw(name: str) -> dict[str, Any]:
    return copy.deepcopy(json.loads((DATA / f"{name}.json").read_text()))


def judge(d: dict[str, Any], **params: Any) -> Outcome:
    return evaluate_health(snapshot_from_dict(d), {**HealthCheck.defaults("standard"), **params})


def metric(out: Outcome, name: str, device: str) -> float:
    found = [m.value for m in out.metrics if m.name == name and m.device == device]
    assert len(found) == 1, (name, device, found)
    return found[0]


def problem_devices(out: Outcome) -> set[str]:
    return {p["device"] for p in out.details["problems"]}


# (fixture, status, devices with problems, substrings of the reason)
CASES = [
    ("healthy_h100_sxm_8x", Status.PASS, set(), ["8 GPU(s) healthy", "550.54.15"]),
    ("ecc_volatile_uncorrectable", Status.FAIL, {"cuda:3"}, ["cuda:3: 2 volatile uncorrectable ECC"]),
    ("row_remap_pending_failure", Status.FAIL, {"cuda:1", "cuda:6"},
     ["cuda:6: row remapping failed", "cuda:1:", "row remap pending"]),
    ("pcie_downgraded", Status.FAIL, {"cuda:3"}, ["cuda:3: PCIe x8 < x16 max", "gen4 < gen5"]),
    ("throttle_hw", Status.FAIL, {"cuda:2", "cuda:5", "cuda:6"},
     ["cuda:5: HW slowdown (10/10 samples), HW power brake", "HW thermal slowdown", "cuda:2: SW thermal slowdown"]),
    ("nvlink_down", Status.FAIL, {"cuda:4"}, ["cuda:4: NVLink 1/18 link(s) down (7)"]),
    ("unsupported_l40s_4x", Status.PASS, set(), ["4 GPU(s) healthy", "unsupported"]),
    ("gpu_lost", Status.FAIL, {"cuda:2"}, ["cuda:2: NVML: GPU is lost"]),
    ("handle_errors", Status.FAIL, {"cuda:2", "cuda:5"},
     ["cuda:2: NVML cannot open the GPU: Unknown Error", "cuda:5: NVML: Insufficient Permissions"]),
    ("hw_slowdown_samples", Status.FAIL, {"cuda:4"}, ["cuda:4: HW slowdown (7/10 samples)"]),
    ("xid_nvlink_memtemp", Status.FAIL, {"cuda:1", "cuda:2", "cuda:5", "cuda:6", "cuda:7"},
     ["cuda:1: XID 48 (double-bit (uncorrectable) ECC error)", "cuda:2: NVLink recovery errors 2 > 0 (link 3: 2)"]),
    ("visible_upper_half", Status.FAIL, {"cuda:1"}, ["cuda:1: 1 volatile uncorrectable ECC"]),
    # at rest the replays (12) and CRC errors (40) of cuda:6 are under health's 100; the recovery is not
    ("nvlink_errors_rising_after", Status.FAIL, {"cuda:2"}, ["cuda:2: NVLink recovery errors 1 > 0"]),
]


@pytest.mark.parametrize(("name", "status", "devices", "phrases"), CASES, ids=[c[0] for c in CASES])
def test_fixture_verdicts(name: str, status: Status, devices: set[str], phrases: list[str]) -> None:
    out = judge(raw(name))
    assert out.status == status, out.reason
    assert problem_devices(out) == devices
    for phrase in phrases:
        assert phrase in out.reason, (phrase, out.reason)


def test_fixtures_all_covered() -> None:
    assert {p.stem for p in DATA.glob("*.json")} == {c[0] for c in CASES}


def test_fail_problems_come_first_in_reason() -> None:
    out = judge(raw("throttle_hw"))  # cuda:2 only warns; cuda:5 and cuda:6 fail
    assert out.reason.index("cuda:5") < out.reason.index("cuda:2")
    assert out.reason.index("cuda:6") < out.reason.index("cuda:2")
    statuses = {p["device"]: p["status"] for p in out.details["problems"] if p["device"] == "cuda:2"}
    assert statuses == {"cuda:2": "warn"}


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_preset_thresholds_agree_with_status(name: str) -> None:
    """The engine re-judges metrics against their thresholds: that must never be worse than our own verdict."""
    out = judge(raw(name))
    rules = HealthCheck.thresholds
    for m in out.metrics:
        assert m.device is not None and m.device.startswith("cuda:")
        bounds = [m.threshold] if m.threshold else []
        bounds += [b for r in rules if r.matches(m) for b in [r.bound_for(m)] if b is not None]
        for b in bounds:
            if not b.met_by(m.value):
                assert b.severity.severity <= out.status.severity, (m, b, out.status)
                assert m.device in problem_devices(out), (m, out.reason)


def test_healthy_metrics() -> None:
    out = judge(raw("healthy_h100_sxm_8x"))
    for i in range(8):
        dev = f"cuda:{i}"
        assert metric(out, "ecc_volatile_uncorrectable", dev) == 0
        assert metric(out, "ecc_aggregate_uncorrectable", dev) == 0
        assert metric(out, "remapped_rows_pending", dev) == 0
        assert metric(out, "pcie_link_gen", dev) == 5 and metric(out, "pcie_link_width", dev) == 16
        assert metric(out, "nvlink_links_active", dev) == 18 and metric(out, "nvlink_links_down", dev) == 0
        assert 30 <= metric(out, "temperature_c", dev) <= 40
        assert metric(out, "power_w", dev) == pytest.approx(69.5 + i)
    temp = next(m for m in out.metrics if m.name == "temperature_c")
    assert temp.unit == "C" and temp.threshold is not None and temp.threshold.value == 89 - 5
    width = next(m for m in out.metrics if m.name == "pcie_link_width")
    assert width.expected == 16 and width.threshold is not None and width.threshold.severity == Status.FAIL
    power = next(m for m in out.metrics if m.name == "power_w")
    assert power.unit == "W" and power.threshold is not None and power.threshold.value == 700.0
    # H100 has no page retirement (row remapping instead): listed as unsupported, not failed
    assert out.details["unsupported"]["cuda:0"]["retired_pages_pending"] == "Not Supported"
    assert not any(m.name.startswith("retired_pages") for m in out.metrics)


def test_unsupported_fields_listed_never_fail() -> None:
    out = judge(raw("unsupported_l40s_4x"))
    assert out.status == Status.PASS
    unsup = out.details["unsupported"]
    assert set(unsup) == {"cuda:0", "cuda:1", "cuda:2", "cuda:3"}
    assert unsup["cuda:1"]["ecc_volatile_uncorrectable"] == "Not Supported"
    assert unsup["cuda:1"]["retired_pages_pending"] == "Insufficient Permissions"
    names = {m.name for m in out.metrics}
    assert "ecc_volatile_uncorrectable" not in names and "nvlink_links_active" not in names
    assert {"temperature_c", "power_w", "pcie_link_gen", "pcie_link_width"} <= names
    temp = next(m for m in out.metrics if m.name == "temperature_c")
    assert temp.threshold is None  # no slowdown threshold reported: not judged
    # the reason names the fields (each once, whichever GPUs lack it), so a reader need not open the details
    fields = list(dict.fromkeys(f for per_gpu in unsup.values() for f in per_gpu))
    count = sum(len(per_gpu) for per_gpu in unsup.values())
    assert out.reason.endswith(f"; {count} NVML field(s) unsupported: {', '.join(fields[:4])}"
                               f"{f' and {len(fields) - 4} more' if len(fields) > 4 else ''} (details.unsupported)")
    assert out.reason == ("4 GPU(s) healthy (driver 535.183.01, CUDA 12.2); 92 NVML field(s) unsupported: serial, "
                          "ecc_mode_current, ecc_mode_pending, ecc_volatile_uncorrectable and 19 more "
                          "(details.unsupported)")


def test_idle_pcie_gen_drop_is_noted_not_judged() -> None:
    d = raw("unsupported_l40s_4x")  # idle at gen1 of gen4
    out = judge(d)
    assert out.status == Status.PASS
    assert "while idle" in out.details["notes"]["cuda:0"][0]
    gen = next(m for m in out.metrics if m.name == "pcie_link_gen" and m.device == "cuda:0")
    assert gen.value == 1 and gen.expected == 4 and gen.threshold is None
    strict = judge(d, pcie_strict=True)
    assert strict.status == Status.FAIL and "cuda:0: PCIe gen1 < gen4 max" in strict.reason


def test_busy_pcie_gen_drop_warns_or_fails_when_strict() -> None:
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][6].update(pcie_link_gen=3, clocks_event_reasons=0)
    assert judge(d).status == Status.WARN and "cuda:6: PCIe gen3 < gen5 max" in judge(d).reason
    assert judge(d, pcie_strict=True).status == Status.FAIL


def test_slot_below_gpu_generation_warns() -> None:
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][0].update(pcie_link_gen=4, pcie_link_gen_max=4)  # gen5 GPU in a gen4 slot
    out = judge(d)
    assert out.status == Status.WARN and "cuda:0: PCIe slot limits the link to gen4" in out.reason


def test_sku_width_used_when_slot_is_narrow() -> None:
    d = raw("unsupported_l40s_4x")  # L40S: x16 per skus.yaml, gen_gpu_max unsupported
    d["gpus"][2].update(pcie_link_width=8, pcie_link_width_max=8)
    out = judge(d)
    assert out.status == Status.WARN and "cuda:2: PCIe slot limits the link to x8 (GPU supports x16)" in out.reason


def test_remap_pending_alone_warns() -> None:
    d = raw("row_remap_pending_failure")
    d["gpus"][6].update(remapped_rows_failure=False)
    d["gpus"][6]["ecc_aggregate_uncorrectable"] = 0
    d["gpus"][1]["ecc_aggregate_uncorrectable"] = 0
    out = judge(d)
    assert out.status == Status.WARN
    assert out.reason == "cuda:1: row remap pending (reset the GPU)"
    assert metric(out, "remapped_rows_pending", "cuda:1") == 1


def test_aggregate_ecc_alone_warns_and_retired_pages_pending_warns() -> None:
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][7]["ecc_aggregate_uncorrectable"] = 4
    out = judge(d)
    assert out.status == Status.WARN and "cuda:7: 4 lifetime uncorrectable ECC error(s)" == out.reason
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][0].update(retired_pages_pending=True, retired_pages_sbe=2, retired_pages_dbe=1)
    out = judge(d)
    assert out.status == Status.WARN and "page retirement pending" in out.reason
    assert metric(out, "retired_pages_dbe", "cuda:0") == 1


@pytest.mark.parametrize(("temp", "margin", "status"), [(84, 5.0, Status.PASS), (85, 5.0, Status.WARN),
                                                         (85, 3.0, Status.PASS), (88, 0.0, Status.PASS)])
def test_temperature_margin(temp: int, margin: float, status: Status) -> None:
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][1]["temperature_c"] = temp  # slowdown 89 C
    out = judge(d, temp_margin_c=margin)
    assert out.status == status, out.reason
    if status == Status.WARN:
        assert out.reason.startswith("cuda:1: 85 C within 5 C of slowdown 89 C")


def test_power_over_limit_warns() -> None:
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][2]["power_draw_w"] = 712.4
    out = judge(d)
    assert out.status == Status.WARN and out.reason == "cuda:2: power 712 W > limit 700 W"


def test_power_limit_below_spec_is_noted() -> None:
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][3]["power_limit_w"] = 500.0
    out = judge(d)
    assert out.status == Status.PASS
    assert "500 W below the 700 W spec" in out.details["notes"]["cuda:3"][0]
    lim = next(m for m in out.metrics if m.name == "power_limit_w" and m.device == "cuda:3")
    assert lim.value == 500.0 and lim.expected == 700.0


def test_sw_power_cap_and_idle_bits_ignored() -> None:
    d = raw("healthy_h100_sxm_8x")
    for g in d["gpus"]:
        g["clocks_event_reasons"] = 0x1 | 0x2 | 0x4 | 0x10 | 0x100
    assert judge(d).status == Status.PASS


def test_ecc_disabled_and_pending_mode() -> None:
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][0].update(ecc_mode_current=False, ecc_mode_pending=False)
    assert judge(d).status == Status.WARN and "cuda:0: ECC disabled" in judge(d).reason
    assert judge(d, require_ecc=False).status == Status.PASS
    d["gpus"][0].update(ecc_mode_pending=True)
    assert "ECC mode change to on pending" in judge(d, require_ecc=False).reason


def test_nvlink_all_down_is_unused_not_failed() -> None:
    d = raw("healthy_h100_sxm_8x")
    for g in d["gpus"]:
        g["nvlink_active"] = [False] * 4
    out = judge(d)
    assert out.status == Status.PASS
    assert metric(out, "nvlink_links_active", "cuda:0") == 0
    assert not any(m.name == "nvlink_links_down" for m in out.metrics)
    assert "NVLink unused" in out.details["notes"]["cuda:0"][0]


def test_nvlink_param_disables_link_check() -> None:
    assert judge(raw("nvlink_down"), nvlink=False).status == Status.PASS


def test_reason_truncates_after_four_gpus() -> None:
    d = raw("healthy_h100_sxm_8x")
    for g in d["gpus"]:
        g["ecc_volatile_uncorrectable"] = 1
    out = judge(d)
    assert out.status == Status.FAIL
    assert "cuda:3" in out.reason and "cuda:4" not in out.reason and out.reason.endswith("+4 more GPU(s)")
    assert len(out.details["problems"]) == 8


def test_no_gpu_skips_needing_gpu() -> None:
    out = evaluate_health(NvmlSnapshot(driver_version="550.54.15"), HealthCheck.defaults("quick"))
    assert out.status == Status.SKIP and out.needs_gpu and "no GPU" in out.reason


def test_event_reason_names() -> None:
    assert event_reason_names(0) == []
    assert event_reason_names(0x88) == ["hw_slowdown", "hw_power_brake"]
    assert event_reason_names(0x1 | 0x20) == ["gpu_idle", "sw_thermal"]
    assert event_reason_names(0x8000 | 0x40) == ["hw_thermal", "0x8000"]


def test_details_per_gpu() -> None:
    out = judge(raw("throttle_hw"))
    gpus = {g["device"]: g for g in out.details["gpus"]}
    assert gpus["cuda:5"]["clocks_event_reasons"] == ["hw_slowdown", "hw_power_brake"]
    assert gpus["cuda:0"]["clocks_event_reasons"] == ["sw_power_cap"]
    assert gpus["cuda:0"]["nvlink_active"] == "18/18"
    assert gpus["cuda:0"]["uuid"].startswith("GPU-")


def test_check_declaration() -> None:
    assert CHECKS == (HealthCheck,)
    assert HealthCheck.name == "health" and HealthCheck.tag == "HEALTH" and HealthCheck.key_metric
    for profile in PROFILES:
        values = HealthCheck.defaults(profile)
        for p in HealthCheck.params:
            assert p.coerce(values[p.name], "test", p.name) == values[p.name]
        assert HealthCheck.timeout_s[profile] > 0


def test_unknown_handle_error_fails_not_passes() -> None:
    d = raw("healthy_h100_sxm_8x")
    d["gpus"][3] = {"index": 3, "ordinal": 3, "errors": {"handle": "Unknown Error"}}
    out = judge(d)
    assert out.status == Status.FAIL and out.reason == "cuda:3: NVML cannot open the GPU: Unknown Error"
    assert out.details["unsupported"]["cuda:3"]["handle"] == "Unknown Error"


def test_no_permission_alone_is_a_skip_saying_how_to_fix() -> None:
    d = raw("handle_errors")
    d["gpus"][2] = raw("healthy_h100_sxm_8x")["gpus"][2]
    out = judge(d)
    assert out.status == Status.SKIP and not out.needs_gpu
    assert out.reason.startswith("cuda:5: NVML: Insufficient Permissions to open the GPU (run as a user")
    assert [p["status"] for p in out.details["problems"]] == ["skip"]


def test_transient_hw_slowdown_is_noted_majority_fails() -> None:
    out = judge(raw("hw_slowdown_samples"))
    assert "cuda:0" not in problem_devices(out)
    assert out.details["notes"]["cuda:0"] == ["HW slowdown in 2/10 samples (transient, e.g. a clock change)"]
    d = raw("hw_slowdown_samples")
    d["gpus"][4]["clocks_event_reasons_samples"] = [8] * 5 + [0] * 5  # exactly half: not a majority
    assert judge(d).status == Status.PASS
    d["gpus"][4]["clocks_event_reasons_samples"] = [0] * 9 + [0x80]  # power brake: one sample suffices
    assert judge(d).reason == "cuda:4: HW power brake"


def test_old_snapshot_without_samples_judges_its_single_read() -> None:
    d = raw("healthy_h100_sxm_8x")
    del d["gpus"][2]["clocks_event_reasons_samples"]
    d["gpus"][2]["clocks_event_reasons"] = 0x8
    assert judge(d).reason == "cuda:2: HW slowdown"


def test_xids_nvlink_counters_memory_temperature() -> None:
    out = judge(raw("xid_nvlink_memtemp"))
    by_dev = {p["device"]: (p["status"], p["message"]) for p in out.details["problems"]}
    assert by_dev["cuda:5"] == ("warn", "XID 94 (contained ECC error)")
    assert by_dev["cuda:6"] == ("warn", "NVLink replay errors 140 > 100 (link 11: 140)")
    assert by_dev["cuda:7"] == ("warn", "memory temperature 88 C > 85 C")
    assert "cuda:3" not in by_dev  # XID 13 and 31: application faults, named only
    assert out.details["notes"]["cuda:3"] == [
        "XID 13 (graphics engine exception (usually an application fault)), "
        "31 (GPU memory page fault (usually an application fault)) (not judged)"]
    assert metric(out, "xid_fail_count", "cuda:1") == 1 and metric(out, "xid_fail_count", "cuda:0") == 0
    assert metric(out, "nvlink_recovery_errors", "cuda:2") == 2
    assert metric(out, "memory_temperature_c", "cuda:0") == 33


def test_memory_temperature_unsupported_is_not_judged() -> None:
    out = judge(raw("unsupported_l40s_4x"))
    assert not any(m.name == "memory_temperature_c" for m in out.metrics)
    assert out.details["unsupported"]["cuda:0"]["memory_temperature_c"] == "Not Supported"


def test_limits_are_the_default_thresholds() -> None:
    rules = {r.metric: r for r in HealthCheck.thresholds}
    for name, (bound, sev) in LIMITS.items():
        assert rules[name].max == bound and rules[name].severity == sev


def test_metrics_labelled_by_torch_ordinal_tagged_with_uuid_and_pci() -> None:
    out = judge(raw("visible_upper_half"))  # CUDA_VISIBLE_DEVICES=4,5,6,7
    assert {m.device for m in out.metrics} == {"cuda:0", "cuda:1", "cuda:2", "cuda:3"}
    m = next(m for m in out.metrics if m.name == "ecc_volatile_uncorrectable" and m.device == "cuda:1")
    assert m.tags == {"uuid": "GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c05", "pci_bus_id": "00000000:AB:00.0"}
    gpus = {g["device"]: g for g in out.details["gpus"]}
    assert gpus["cuda:1"]["nvml_index"] == 5 and out.details["cuda_visible_devices"] == "4,5,6,7"


def test_kernel_log_xids_attached_by_pci_bus_id() -> None:
    snap = snapshot_from_dict(raw("healthy_h100_sxm_8x"))
    attach_kernel_xids(snap, parse_kernel_xids((DATA.parent / "kmsg" / "dmesg_h100.txt").read_text()))
    assert snap.gpus[7].xid_kernel_log == [79] and snap.gpus[3].xid_kernel_log == [74]
    assert snap.gpus[0].xid_kernel_log == []
    out = evaluate_health(snap, HealthCheck.defaults("standard"))
    assert out.status == Status.FAIL
    assert "cuda:3: XID 74 (NVLink error)" in out.reason and "cuda:7: XID 79 (GPU has fallen off the bus)" in out.reason
    unread = snapshot_from_dict(raw("healthy_h100_sxm_8x"))
    attach_kernel_xids(unread, None, "/dev/kmsg: Operation not permitted; dmesg: read kernel buffer failed")
    out = evaluate_health(unread, HealthCheck.defaults("standard"))
    assert out.status == Status.PASS
    assert out.details["unsupported"]["cuda:0"]["xid_kernel_log"].startswith("/dev/kmsg: Operation not permitted")


def nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(nvml_library_present(), reason="the NVML library is present here")
def test_run_without_nvml_skips() -> None:
    out = HealthCheck().run(CheckContext(device="cpu", params=HealthCheck.defaults("quick"), profile="quick"))
    assert out.status == Status.SKIP and out.needs_gpu
    assert out.reason.startswith("NVML not available")


@pytest.mark.gpu
def test_run_on_gpu() -> None:
    out = HealthCheck().run(CheckContext(device="cuda", params=HealthCheck.defaults("quick"), gpus=[0],
                                         profile="quick", verbose=True))
    assert out.status != Status.SKIP, out.reason
    assert {m.device for m in out.metrics} == {"cuda:0"}
    assert any(m.name == "temperature_c" for m in out.metrics)
    assert out.details["gpus"][0]["name"].startswith("NVIDIA")
    assert snapshot_from_dict(out.details["snapshot"]).gpus[0].index == 0
