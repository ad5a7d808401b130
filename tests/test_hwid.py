"""Which hardware each result measured (pure): the report's hardware map, the rows it gives, hardware histories."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.model import CheckResult, Metric, NodeReport, Status
from gpuaccept.results.analysis import analyze
from gpuaccept.results.analysis_cli import format_outlier
from gpuaccept.results.hwid import HwId, hardware_of_report, hardware_units
from gpuaccept.results.rows import METRIC_COLUMNS, flatten_node

DATA = Path(__file__).resolve().parent / "data"
HISTORY = DATA / "history" / "reports"
U = [f"GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c0{i}" for i in range(4)]


def _load(name: str) -> dict[str, Any]:
    return json.loads((HISTORY / name).read_text())


def _env(gpus: list[dict[str, Any]], visible: str | None = None, identity: Any = None) -> dict[str, Any]:
    details: dict[str, Any] = {"nvml": {"available": True, "gpus": gpus}, "cuda_visible_devices": visible}
    if identity is not None:
        details["identity"] = identity
    return {"name": "env", "status": "pass", "reason": "", "metrics": [], "details": details}


def test_recorded_report_names_its_gpus_node_and_port() -> None:
    hw = hardware_of_report(_load("20260925T142320Z-gpu-b-d4.json"))
    assert hw.lookup("compute", "cuda:1") == HwId("gpu", "GPU-5c1b7e2a-3d4f-4a61-9b8c-0e1f2a3b4c51", "1654922000151")
    assert hw.lookup("memory", "cpu") == hw.lookup("memory", None) == HwId("node", "OM241S700938", "S938432X3A17301")
    assert hw.devices["mlx5_0:1"] == HwId("nic", "0xb8599f03001ca7f6")
    assert hw.lookup("compute", "cuda:7") is None
    assert [(h.kind, d) for h, d in hw.identities()] == [("node", None), ("gpu", "cuda:0"), ("gpu", "cuda:1"),
                                                         ("nic", "mlx5_0:1")]


def test_report_of_the_previous_version_names_gpus_by_index() -> None:
    """No ``device`` per GPU, no identity: cuda:N is NVML index N (nothing hidden); the node has no id."""
    hw = hardware_of_report(_load("20260921T141320Z-gpu-a-d0.json"))
    assert hw.lookup("compute", "cuda:0") == HwId("gpu", "GPU-5c1b7e2a-3d4f-4a61-9b8c-0e1f2a3b4c50", None)
    assert hw.node is None and hw.lookup("memory", "cpu") is None


def test_old_reports_under_cuda_visible_devices_are_mapped_as_cuda_would() -> None:
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": U[i], "pci_bus_id": f"0000:{i:02x}:00.0"}
            for i in range(4)]
    hw = hardware_of_report({"checks": [_env(gpus, visible=f"3,{U[1]},{U[1][:12]}")]})  # an ambiguous prefix ends it
    assert {d: h.id for d, h in hw.devices.items()} == {"cuda:0": U[3], "cuda:1": U[1]}
    assert hardware_of_report({"checks": [_env(gpus, visible="NoDevFiles")]}).devices == {}
    # The label recorded by a newer env check wins over working it out.
    labelled = [dict(g, device=f"cuda:{3 - g['index']}") for g in gpus]
    assert hardware_of_report({"checks": [_env(labelled, visible="3,2,1,0")]}).devices["cuda:0"].id == U[3]


def test_checks_name_their_own_hardware() -> None:
    health = {"name": "health", "details": {"gpus": [{"device": "cuda:0", "uuid": U[2], "serial": "unsupported"}]}}
    fabric = {"name": "fabric", "details": {"devices": [{"name": "mlx5_0", "ports": [
        {"port": "mlx5_0:1", "guid": "0xb8599f03000ca7f6"}, {"port": "mlx5_0:2", "guid": None}]}]}}
    hw = hardware_of_report({"checks": [health, fabric]})
    assert hw.lookup("health", "cuda:0") == HwId("gpu", U[2]) and hw.lookup("compute", "cuda:0") == HwId("gpu", U[2])
    assert hw.lookup("fabric", "mlx5_0:1") == HwId("nic", "0xb8599f03000ca7f6")
    assert hw.lookup("fabric", "mlx5_0:2") is None
    # The env check's inventory is the reference for other checks; a check keeps what it saw itself.
    env = _env([{"index": 0, "device": "cuda:0", "uuid": U[0]}])
    hw = hardware_of_report({"checks": [health, env]})
    assert hw.lookup("compute", "cuda:0") == HwId("gpu", U[0]) and hw.lookup("health", "cuda:0") == HwId("gpu", U[2])


@pytest.mark.parametrize("details", [
    None, [], "text", {"nvml": "x"}, {"nvml": {"gpus": [None, 3, {"index": True}, {"index": 0, "uuid": 7}]}},
    {"nvml": {"gpus": [{"index": 0, "device": 5, "uuid": U[0]}]}}, {"identity": {"node": [], "nics": "x"}},
    {"identity": {"node": {"board_serial": 12}, "nics": [{"port": "a", "guid": "zz"}, 4]}},
    {"nvml": {"gpus": [{"index": 0, "uuid": "unsupported"}, {"index": 1, "uuid": ""}]}},
])
def test_malformed_details_name_nothing(details: Any) -> None:
    hw = hardware_of_report({"checks": [{"name": "env", "details": details}, {"name": "x", "details": details}]})
    assert hw.devices == {} and hw.node is None and hw.identities() == []
    assert hardware_of_report({"checks": "nope"}).identities() == []


def test_node_placeholders_and_unreadable_serials_are_no_identity() -> None:
    ident = {"node": {"board_serial": "unreadable", "product_serial": "To be filled by O.E.M."}, "nics": []}
    assert hardware_of_report({"checks": [_env([], identity=ident)]}).node is None
    ident["node"]["product_serial"] = "S938432X3A17254"
    assert hardware_of_report({"checks": [_env([], identity=ident)]}).node == \
        HwId("node", "S938432X3A17254", "S938432X3A17254")


def test_rows_carry_the_hardware_and_a_merged_check_of_another_host_does_not() -> None:
    rep = NodeReport.from_dict(_load("20260925T141320Z-gpu-a-d4.json"))
    rep.checks.append(CheckResult("collectives", Status.PASS, "", 1.0, [Metric("busbw", 1.0, "GB/s", device="cuda:1")],
                                  host="gpu-b"))
    flat = flatten_node(rep, "now")
    hw_cols = [METRIC_COLUMNS.index(c) for c in ("device", "hw_kind", "hw_id", "hw_serial")]
    rows = {(fc.row[0], m[hw_cols[0]]): tuple(m[i] for i in hw_cols[1:]) for fc in flat.checks for m in fc.metrics}
    assert rows[("compute", "cuda:1")] == ("gpu", "GPU-d41f0a9b-7c2e-4b8d-9e3f-6a5b4c3d2e10", "1654923001210")
    assert rows[("memory", "cpu")] == ("node", "OM234S600412", "S938432X3A17254")
    assert rows[("env", None)] == ("node", "OM234S600412", "S938432X3A17254")
    assert rows[("collectives", "cuda:1")] == (None, None, None)  # gpu-b's cuda:1 is not gpu-a's
    assert ("gpu-a", "gpu", "GPU-d41f0a9b-7c2e-4b8d-9e3f-6a5b4c3d2e10", "1654923001210", "cuda:1") in flat.hardware
    cpu = NodeReport.from_dict(json.loads((DATA / "reports" / "node-cpu.json").read_text()))
    flat = flatten_node(cpu, "now")  # a CPU run names no hardware, and nothing breaks
    assert flat.hardware == [] and all(m[-3:] == (None, None, None) for fc in flat.checks for m in fc.metrics)


@dataclass
class P:
    host: str
    device: str | None
    hw_id: str | None
    started_ts: float
    run_id: str = ""
    hw_kind: str | None = "gpu"


def test_hardware_units_follow_replacements_moves_and_gaps() -> None:
    pts = [P("a", "cuda:1", None, 0), P("a", "cuda:1", "X", 1), P("a", "cuda:1", None, 2),   # gap before and after X
           P("a", "cuda:1", "Y", 3), P("a", "cuda:1", None, 4),                             # Y replaced X
           P("b", "cuda:0", "X", 5),                                                        # X moved to b
           P("c", "cuda:0", None, 6), P("c", "cuda:0", None, 7)]                            # never named
    assert hardware_units(pts) == [("gpu", "X", ""), ("gpu", "X", ""), ("gpu", "X", ""), ("gpu", "Y", ""),
                                   ("gpu", "Y", ""), ("gpu", "X", ""), ("place", "c", "cuda:0"),
                                   ("place", "c", "cuda:0")]
    shuffled = [pts[i] for i in (5, 2, 7, 0, 4, 1, 6, 3)]  # the answer does not depend on the input order
    assert hardware_units(shuffled) == [hardware_units(pts)[i] for i in (5, 2, 7, 0, 4, 1, 6, 3)]


def test_outliers_name_the_gpu() -> None:
    cluster = json.loads((DATA / "reports" / "cluster-h100.json").read_text())
    from gpuaccept.model import ClusterReport

    result = analyze(ClusterReport.from_dict(cluster))
    slow = next(o for o in result["outliers"] if o["host"] == "gpu-node-01" and o["device"] == "cuda:2"
                and o["scope"] == "node")
    node01 = next(n["report"] for n in cluster["nodes"] if n["host"] == "gpu-node-01")
    env = next(c for c in node01["checks"] if c["name"] == "env")
    assert (slow["hw_kind"], slow["hw_id"]) == ("gpu", env["details"]["nvml"]["gpus"][2]["uuid"])
    assert f"gpu-node-01 cuda:2 [{slow['hw_id']}] compute/" in format_outlier(slow)
    whole = [o for o in result["outliers"] if o["device"] is None]
    assert all("hw_id" not in o for o in whole)  # the synthetic nodes name no board
