"""The fault catalogue (gpuaccept/data/faults.yaml): the loader's validation and the pure functions (classify, the
ladder's next rung, NVML's recovery action taking precedence)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from gpuaccept import faults
from gpuaccept.errors import ConfigError
from gpuaccept.hw.xid import XID_MEANINGS, XID_SEVERITY
from gpuaccept.model import CheckResult, Metric, Status, Threshold

ENTRY: dict[str, Any] = {"code": "GA-RUN-000", "title": "t", "severity": "major", "part": "node", "origin": "node",
                         "ladder": ["rerun"], "evidence": "e", "match": [{"status": "fail"}]}


def doc(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"faults": [copy.deepcopy(ENTRY), *entries]}


def test_the_package_catalogue_loads_with_unique_codes() -> None:
    cat = faults.load()
    codes = [f.code for f in cat]
    assert len(codes) == len(set(codes)) > 40
    assert {"GA-MEM-001", "GA-XID-079", "GA-NET-004", "GA-PERF-010"} <= set(codes)
    assert all(step in faults.STEPS for f in cat for step in f.ladder)


@pytest.mark.parametrize(("change", "message"), [
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"ladder": ["rerun", "pray"]}, "unknown ladder step 'pray'"),
    ({"ladder": []}, "non-empty list"),
    ({"ladder": ["rerun", "rerun"]}, "each step once"),
    ({"code": "MEM-1"}, "GA-<AREA>-<NNN>"),
    ({"severity": "dire"}, "severity 'dire'"),
    ({"origin": "cosmic"}, "origin 'cosmic'"),
    ({"match": [{"chek": "health"}]}, "unknown match key 'chek'"),
    ({"match": [{"status": "warn"}]}, "a fail or an error"),
    ({"match": [{"reason": "("}]}, "match[0]"),
    ({"match": [{"xid": "79"}]}, "xid '79' is not a number"),
])
def test_malformed_entries_are_config_errors(change: dict[str, Any], message: str) -> None:
    bad = {**ENTRY, "code": "GA-TST-001", "match": [{"check": "x"}], **change}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        faults.parse(doc(bad))


def test_duplicate_codes_and_a_missing_key_are_errors() -> None:
    with pytest.raises(ConfigError, match="duplicate code GA-RUN-000"):
        faults.parse(doc(copy.deepcopy(ENTRY)))
    partial = {k: v for k, v in ENTRY.items() if k != "evidence"} | {"code": "GA-TST-002"}
    with pytest.raises(ConfigError, match="missing 'evidence'"):
        faults.parse(doc(partial))
    with pytest.raises(ConfigError, match="no GA-RUN-000"):
        faults.parse({"faults": [{**ENTRY, "code": "GA-TST-003"}]})
    with pytest.raises(ConfigError, match="one key"):
        faults.parse({"faults": [], "extra": 1})


def test_the_yaml_file_round_trips_through_parse() -> None:
    from importlib import resources

    text = resources.files("gpuaccept").joinpath("data", "faults.yaml").read_text()
    assert [f.code for f in faults.parse(yaml.safe_load(text))] == [f.code for f in faults.load()]


def result(name: str, status: Status, reason: str, **kw: Any) -> CheckResult:
    return CheckResult(name, status, reason, **kw)


@pytest.mark.parametrize(("res", "code"), [
    (result("health", Status.FAIL, "cuda:2: XID 79 (GPU has fallen off the bus)"), "GA-XID-079"),
    (result("health", Status.FAIL, "cuda:1: XID 13 (graphics engine), 48 x2 (double-bit (uncorrectable) ECC "
                                   "error)"), "GA-XID-048"),
    (result("health", Status.FAIL, "cuda:3: 2 volatile uncorrectable ECC error(s)"), "GA-MEM-001"),
    (result("health", Status.FAIL, "cuda:3: PCIe x8 < x16 max"), "GA-PCI-001"),
    (result("health", Status.FAIL, "cuda:0: something new"), "GA-GPU-000"),
    (result("compute", Status.FAIL, "slow", metrics=[Metric("gemm_bf16_tflops", 10.0, "TFLOP/s",
                                                            threshold=Threshold(">=", 100.0))]), "GA-PERF-010"),
    (result("compute", Status.FAIL, "slow", metrics=[Metric("gemm_bf16_tflops", 10.0, "TFLOP/s",
                                                            threshold=Threshold(">=", 100.0, source="baseline:x"))]),
     "GA-PERF-001"),
    (result("compute", Status.FAIL, "timed out after 30.0 s", details={"timeout": True}), "GA-RUN-001"),
    (result("memory", Status.ERROR, "check process died (SIGKILL) without a result"), "GA-RUN-002"),
    (result("disk_space", Status.ERROR, "paths is empty: nothing to check"), "GA-RUN-006"),
    (result("p2p", Status.FAIL, "NVLink errors rose under load: cuda:6 link 3 replay +12"), "GA-NVL-001"),
    (result("collectives", Status.FAIL, "NVLink errors rose under load: cuda:0 link 1 crc_flit +3"), "GA-NVL-001"),
    (result("p2p", Status.FAIL, "slowest pair cuda:0->cuda:3 180 GB/s"), "GA-PERF-018"),
    (result("reference_train", Status.FAIL, "cuda:1 departs from the other GPUs' curve at step 5"), "GA-PERF-019"),
    (result("reference_train", Status.FAIL, "final loss 3.1 above bound 2.7"), "GA-PERF-020"),
    (result("reference_train_ddp", Status.FAIL, "rank 1 straggles"), "GA-PERF-020"),
    (result("p2p_new_check", Status.FAIL, "anything"), faults.FALLBACK),
    (result("health", Status.FAIL, "cuda:0: whatever", details={"code": "GA-MEM-002"}), "GA-MEM-002"),
])
def test_classify_names_the_specific_code_first(res: CheckResult, code: str) -> None:
    fault = faults.classify(res)
    assert fault is not None and fault.code == code


def test_pass_warn_and_skip_carry_no_code() -> None:
    for status in (Status.PASS, Status.WARN, Status.SKIP):
        r = faults.with_fault(result("health", status, "cuda:0: XID 79 (GPU has fallen off the bus)"))
        assert r.fault is None and r.code == ""


def test_every_judged_xid_has_its_code_with_the_documented_meaning() -> None:
    titles = {f.code: f.title for f in faults.load()}
    for xid in XID_SEVERITY:
        code = f"GA-XID-{xid:03d}"
        assert code in titles, f"Xid {xid} ({XID_MEANINGS[xid]}) has no code {code} in faults.yaml"
        reason = f"cuda:0: XID {xid} ({XID_MEANINGS[xid]})"
        fault = faults.classify(result("health", Status.FAIL, reason))
        assert fault is not None and fault.code == code


def test_next_step_climbs_the_ladder_and_stays_on_its_last_rung() -> None:
    f = faults.by_code()["GA-XID-048"]
    assert [faults.next_step(f, n) for n in range(5)] == [
        "reset_gpu", "drain_for_service", "replace_part", "replace_part", "replace_part"]
    assert faults.next_step(faults.by_code()["GA-PERF-010"], 0) == "rerun"
    assert not faults.leaves_service("rerun") and faults.leaves_service("reset_gpu")


def _with_action(action: int | None) -> CheckResult:
    gpu: dict[str, Any] = {"index": 3, "ordinal": 3}
    if action is not None:
        gpu["gpu_recovery_action"] = action
    return result("health", Status.FAIL, "cuda:3: 2 volatile uncorrectable ECC error(s)",
                  details={"snapshot": {"gpus": [{"index": 0, "gpu_recovery_action": 0}, gpu]}})


def test_nvml_recovery_action_takes_precedence_for_a_live_gpu() -> None:
    mem = faults.by_code()["GA-MEM-001"]
    assert faults.first_step(mem, _with_action(None)) == "reset_gpu"
    assert faults.first_step(mem, _with_action(0)) == "reset_gpu"  # NONE: the ladder decides
    assert faults.first_step(mem, _with_action(2)) == "reboot_node"
    d = faults.describe(_with_action(2))
    assert d is not None and d["action"] == "reboot_node" and d["nvml_recovery_action"] == {"cuda:3": 2}
    assert d["devices"] == ["cuda:3"] and d["code"] == "GA-MEM-001"
    # a fault of another part (a disk) never takes a GPU's recovery action
    disk = faults.by_code()["GA-DSK-001"]
    assert faults.first_step(disk, _with_action(2)) == "drain_for_service"
    assert faults.nvml_step({"cuda:0": 1, "cuda:1": 2, "cuda:2": 0}) == "reboot_node"
    assert faults.nvml_step({}) is None


def test_the_fault_round_trips_through_report_json() -> None:
    r = faults.with_fault(result("health", Status.FAIL, "cuda:2: XID 79 (GPU has fallen off the bus)"))
    back = CheckResult.from_dict(r.to_dict())
    assert back.code == "GA-XID-079" and back.fault == r.fault
    old = {"name": "health", "status": "fail", "reason": "x", "duration_s": 0, "metrics": []}
    assert CheckResult.from_dict(old).fault is None  # a report written before codes existed still reads
