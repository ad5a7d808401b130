"""The fabric check on recorded sysfs trees (tests/data/sysfs, kernel layout), and end to end through the CLI."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks import registry
from gpuaccept.checks.base import SUITE_PROFILES, CheckContext
from gpuaccept.checks.fabric import FabricCheck, evaluate_fabric, expected_rates
from gpuaccept.errors import InputError
from gpuaccept.hw.nccl_env import parse_list
from gpuaccept.hw.rdma import (
    Snapshot,
    diff,
    locality,
    parse_counter,
    parse_rate,
    parse_state,
    read_inventory,
    read_snapshot,
)
from gpuaccept.model import Status
from gpuaccept.node.judge import Judgement, judge
from tests.helpers import gpuaccept, only_run_dir, validate_report

DATA = Path(__file__).parent / "data" / "sysfs"


def tree(name: str) -> str:
    return str(DATA / name)


def run_judged(name: str, env: dict[str, str] | None = None, later: str | None = None,
               **params: Any) -> tuple[Judgement, dict[str, Any]]:
    """evaluate_fabric on a tree (deltas from ``name`` to ``later`` when given), then the default thresholds."""
    inv = read_inventory(tree(name))
    deltas = None
    if later is not None:
        before = read_snapshot(tree(name), clock=lambda: 100.0)
        deltas = diff(before, read_snapshot(tree(later), clock=lambda: 105.0))
    out = evaluate_fabric(inv, deltas, env or {}, {**FabricCheck.defaults("standard"), **params})
    return judge(out, FabricCheck.thresholds), out.details


def values(j: Judgement, name: str) -> dict[str | None, float]:
    return {m.device: m.value for m in j.metrics if m.name == name}


# ---- parsers


def test_parsers_read_the_kernel_formats() -> None:
    assert parse_state("4: ACTIVE\n", "f") == (4, "ACTIVE")
    assert parse_state("5: LinkUp\n", "f") == (5, "LinkUp")
    assert parse_state("4: PortConfigurationTraining", "f")[1] == "PortConfigurationTraining"
    assert parse_rate("400 Gb/sec (4X NDR)\n", "f") == (400.0, 4, "NDR")
    assert parse_rate("2.5 Gb/sec (1X SDR)", "f") == (2.5, 1, "SDR")
    assert parse_rate("10 Gb/sec (4X)", "f") == (10.0, 4, None)
    assert parse_counter("18446744073709551615\n", "f") == 2**64 - 1


@pytest.mark.parametrize(("fn", "text"), [
    (parse_state, "ACTIVE"), (parse_state, ""), (parse_rate, "fast"), (parse_rate, "0 Gb/sec (4X NDR)"),
    (parse_rate, "99999 Gb/sec (4X NDR)"), (parse_rate, "nan Gb/sec"), (parse_counter, "-3"),
    (parse_counter, "1e5"), (parse_counter, str(2**64)),
])
def test_parsers_reject_malformed_text_naming_the_file(fn: Any, text: str) -> None:
    with pytest.raises(InputError, match="/sys/x/rate"):
        fn(text, "/sys/x/rate")


def test_inventory_of_a_healthy_ndr_node() -> None:
    inv = read_inventory(tree("ndr_8x"))
    assert [d.name for d in inv.devices] == [f"mlx5_{i}" for i in range(8)]
    assert inv.errors == [] and inv.peermem == "nvidia_peermem"
    p = inv.devices[0].ports[0]
    assert (p.key, p.state, p.phys_state, p.rate_gbps, p.width, p.speed, p.link_layer) == \
        ("mlx5_0:1", "ACTIVE", "LinkUp", 400.0, 4, "NDR", "InfiniBand")
    assert inv.devices[1].ports[0].counters["link_downed"] == 1
    assert (inv.devices[0].pci_address, inv.devices[0].numa_node) == ("0000:0c:00.0", 0)
    assert inv.devices[0].netdevs == ["ibp12s0"] and "ibp12s0" in inv.netdevs
    assert len(inv.gpus) == 8 and all(g.device_id == "0x2330" for g in inv.gpus)  # the host bridge is not a GPU


def test_locality_pairs_each_gpu_with_the_nics_on_its_numa_node() -> None:
    loc = {row["gpu"]: row for row in locality(read_inventory(tree("ndr_8x")))}
    assert loc["0000:18:00.0"]["local_nics"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert loc["0000:db:00.0"] == {"gpu": "0000:db:00.0", "numa_node": 1,
                                   "local_nics": ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]}


def test_malformed_files_are_reported_by_name_and_do_not_crash() -> None:
    inv = read_inventory(tree("malformed"))
    joined = "\n".join(inv.errors)
    for part in ("mlx5_0/ports/1/rate: cannot parse rate 'fast'", "counters/symbol_error", "counters/port_rcv_errors",
                 "mlx5_1/device/numa_node", "mlx5_1/ports/1/state: cannot parse port state 'ACTIVE'"):
        assert part in joined, part
    j, _ = run_judged("malformed")
    assert j.status is Status.FAIL  # mlx5_1's state is unknown, so the port is not up
    assert "mlx5_0/ports/1/rate" in j.reason
    assert values(j, "rdma_port_up") == {"mlx5_0:1": 1.0, "mlx5_1:1": 0.0}
    assert "rdma_port_rate_gbps" not in {m.name for m in j.metrics if m.device == "mlx5_0:1"}
    assert all(math.isfinite(m.value) for m in j.metrics)


# ---- verdicts on recorded trees


@pytest.mark.parametrize(("name", "rate"), [("hdr_8x", 200.0), ("ndr_8x", 400.0)])
def test_healthy_nodes_pass(name: str, rate: float) -> None:
    j, details = run_judged(name, later=name, expect_ports=8)
    assert j.status is Status.PASS, j.reason
    assert j.reason.startswith(f"8/8 RDMA port(s) up (8x {rate:g} Gb/s InfiniBand); 8 GPU(s), GPUDirect RDMA "
                               "module nvidia_peermem"), j.reason
    assert set(values(j, "rdma_port_rate_gbps").values()) == {rate}
    assert values(j, "rdma_ports_active") == {None: 8.0}
    assert values(j, "rdma_link_downed_total")["mlx5_1:1"] == 1.0  # a flap at boot is recorded, not judged
    assert set(values(j, "rdma_symbol_error_delta").values()) == {0.0}
    assert details["expected_rate_gbps"] == {"InfiniBand": rate}
    assert details["counter_deltas"] == {}
    assert len(details["locality"]) == 8


def test_a_port_down_fails_and_names_the_port() -> None:
    j, details = run_judged("ndr_4x_port_down")
    assert j.status is Status.FAIL
    assert "rdma_port_up on mlx5_3:1 0 < 1" in j.reason and "down: mlx5_3:1 DOWN/Disabled" in j.reason
    assert "mlx5_3:1" not in values(j, "rdma_port_rate_gbps")  # a down port's rate is not judged twice
    assert details["expected_rate_gbps"] == {"InfiniBand": 400.0}


def test_a_port_down_can_be_ignored() -> None:
    j, details = run_judged("ndr_4x_port_down", ignore=["mlx5_3"])
    assert j.status is Status.PASS, j.reason
    assert details["ignored_ports"] == ["mlx5_3:1"]


def test_a_degraded_rate_fails_against_the_majority() -> None:
    j, _ = run_judged("ndr_4x_degraded")
    assert j.status is Status.FAIL
    assert "rdma_port_rate_gbps on mlx5_1:1 200 < 400 Gb/s" in j.reason
    rate = next(m for m in j.metrics if m.name == "rdma_port_rate_gbps" and m.device == "mlx5_1:1")
    assert rate.expected == 400.0 and rate.tags["hca"] == "mlx5_1"


def test_configured_rate_and_port_count_beat_the_majority() -> None:
    j, _ = run_judged("hdr_8x", expect_rate_gbps=400.0)
    assert j.status is Status.FAIL and "rdma_port_rate_gbps on mlx5_0:1 200 < 400 Gb/s" in j.reason
    j, _ = run_judged("ndr_4x", expect_ports=8)
    assert j.status is Status.FAIL and "rdma_ports_active 4 < 8 count" in j.reason


def test_majority_rate_breaks_ties_upward() -> None:
    inv = read_inventory(tree("ndr_4x_degraded"))
    ports = inv.ports[:2]  # one at 400, one at 200
    assert expected_rates(ports, 0.0) == {"InfiniBand": 400.0}
    assert expected_rates(ports, 100.0) == {"InfiniBand": 100.0}


def test_rising_counters_are_tied_to_the_port_that_carried_them() -> None:
    j, details = run_judged("ndr_4x", later="ndr_4x_later")
    assert j.status is Status.FAIL  # link_downed rose: a FAIL; symbol errors and receive errors: WARNs
    assert "rdma_link_downed_delta on mlx5_2:1 2 > 0 count" in j.reason
    assert details["counter_deltas"] == {"mlx5_2:1": {"symbol_error": 4031, "link_downed": 2, "port_rcv_errors": 17}}
    delta = next(m for m in j.metrics if m.name == "rdma_symbol_error_delta" and m.device == "mlx5_2:1")
    assert delta.value == 4031 and delta.tags["interval_s"] == 5.0
    assert values(j, "rdma_symbol_error_delta")["mlx5_1:1"] == 0.0  # old errors on mlx5_1 did not rise


def test_snapshot_diff_is_a_plain_value() -> None:
    before = read_snapshot(tree("ndr_4x"), clock=lambda: 10.0)
    after = Snapshot.from_dict(read_snapshot(tree("ndr_4x_later"), clock=lambda: 12.5).to_dict())
    d = diff(before, after)
    assert set(d) == {"mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"}
    assert d["mlx5_2:1"].rising() == {"symbol_error": 4031, "link_downed": 2, "port_rcv_errors": 17}
    assert d["mlx5_2:1"].interval_s == 2.5 and d["mlx5_0:1"].rising() == {}
    back = diff(after, before)  # counters cleared between reads: the later value, flagged
    assert set(back["mlx5_2:1"].reset) == {"symbol_error", "link_downed", "port_rcv_errors"}
    gone = diff(before, Snapshot(13.0, {}))
    assert all(x.vanished for x in gone.values())


def test_roce_without_peermem_warns_with_the_cost() -> None:
    j, details = run_judged("roce_2x", later="roce_2x")
    assert j.status is Status.WARN
    assert "nvidia_peermem is not loaded" in j.reason and "host memory" in j.reason
    assert "2/2 RDMA port(s) up (2x 200 Gb/s Ethernet)" in j.reason
    port = details["devices"][0]["ports"][0]
    assert port["gid_types"] == ["IB/RoCE v1", "RoCE v2"] and port["netdevs"] == ["ens1f0np0"]
    assert "rdma_symbol_error_total" not in {m.name for m in j.metrics}  # RoCE ports have no symbol_error
    j, _ = run_judged("roce_2x", require_peermem=False)
    assert j.status is Status.PASS, j.reason


def test_required_link_layer() -> None:
    j, _ = run_judged("roce_2x", link_layer="infiniband", require_peermem=False)
    assert j.status is Status.FAIL and "mlx5_0:1 link layer is Ethernet, expected infiniband" in j.reason
    j, _ = run_judged("roce_2x", link_layer="ethernet", require_peermem=False)
    assert j.status is Status.PASS


def test_no_rdma_devices_is_a_skip_with_the_reason() -> None:
    j, _ = run_judged("no_rdma")
    assert j.status is Status.SKIP
    assert "no RDMA devices under" in j.reason and "sys/class/infiniband" in j.reason


# ---- NCCL selection lists


def test_nccl_list_syntax() -> None:
    sel = parse_list("^=mlx5_3,mlx5_4:1", ports=True)
    assert sel.exclude and sel.exact and [e.text() for e in sel.entries] == ["mlx5_3", "mlx5_4:1"]
    assert not sel.selects("mlx5_3", 1) and not sel.selects("mlx5_4", 1) and sel.selects("mlx5_4", 2)
    assert sel.selects("mlx5_30", 1)  # exact: mlx5_30 is not mlx5_3
    prefix = parse_list("mlx5", ports=True)
    assert prefix.selects("mlx5_7", 1) and not prefix.selects("ib0")
    for bad in ("mlx5_0:x", ",mlx5_0", "=", "^"):
        with pytest.raises(ValueError):
            parse_list(bad, ports=True)
    with pytest.raises(ValueError, match="port"):
        parse_list("eth0:1", ports=False)


@pytest.mark.parametrize(("env", "status", "phrase"), [
    ({"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1"}, Status.PASS, ""),
    ({"NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_IB_HCA": "=mlx5_0,mlx5_3"}, Status.PASS, ""),
    ({"NCCL_SOCKET_IFNAME": "ib"}, Status.PASS, ""),  # a prefix of ibp12s0...
    ({"NCCL_SOCKET_IFNAME": "=ib"}, Status.FAIL, "selects none of this node's interfaces"),
    ({"NCCL_SOCKET_IFNAME": "eth0,bond0"}, Status.WARN, "NCCL_SOCKET_IFNAME item 'bond0' matches no interface"),
    ({"NCCL_IB_HCA": "mlx5_0:2"}, Status.FAIL, "NCCL_IB_HCA='mlx5_0:2' selects no RDMA port here"),
    ({"NCCL_IB_HCA": "mlx5_0:1,mlx5_9:1"}, Status.WARN, "NCCL_IB_HCA item 'mlx5_9:1' matches no RDMA device port"),
    ({"NCCL_IB_HCA": "^mlx5"}, Status.FAIL, "selects no RDMA port"),
    ({"NCCL_IB_HCA": "mlx5_0:one"}, Status.FAIL, "bad port suffix"),
])
def test_nccl_env_is_checked_against_this_node(env: dict[str, str], status: Status, phrase: str) -> None:
    j, details = run_judged("ndr_4x", env=env)
    assert j.status is status, j.reason
    assert phrase in j.reason
    assert details["nccl_env"] == env


def test_nccl_hcas_named_on_a_node_without_rdma_fail_instead_of_skipping() -> None:
    j, _ = run_judged("no_rdma", env={"NCCL_IB_HCA": "mlx5_0"})
    assert j.status is Status.FAIL and "no RDMA devices" in j.reason


# ---- the check class and the CLI


def test_registered_in_every_profile_with_thresholds_as_data() -> None:
    assert registry()["fabric"] is FabricCheck
    assert FabricCheck.profiles == SUITE_PROFILES
    assert [FabricCheck.defaults(p)["sample_s"] for p in SUITE_PROFILES] == [1.0, 5.0, 30.0]
    assert "rdma_link_downed_delta <= 0 (fail)" in [r.describe() for r in FabricCheck.thresholds]


def test_run_samples_counters_and_refuses_a_missing_root(tmp_path: Path) -> None:
    ctx = CheckContext("cpu", {**FabricCheck.defaults("quick"), "root": tree("ndr_4x"), "sample_s": 0.05})
    out = FabricCheck().run(ctx)
    assert out.status is Status.PASS and any(m.name == "rdma_link_downed_delta" for m in out.metrics)
    ctx.params["root"] = str(tmp_path / "nowhere")
    assert FabricCheck().run(ctx).status is Status.FAIL


def _cli(tmp_path: Path, root: str | None) -> dict[str, Any]:
    args = ["run", "--checks", "fabric", "--device", "cpu", "--profile", "quick", "--report-dir",
            str(tmp_path / "rep"), "--no-history"]
    if root is not None:
        cfg = tmp_path / "site.yaml"
        cfg.write_text(f"checks:\n  fabric:\n    params: {{root: '{root}', sample_s: 0.2}}\n")
        args += ["--config", str(cfg)]
    r = gpuaccept(*args, NCCL_SOCKET_IFNAME="", NCCL_IB_HCA="")
    report = validate_report(only_run_dir(tmp_path / "rep") / "report.json")
    report["_rc"] = r.returncode
    report["_stdout"] = r.stdout
    return report


@pytest.mark.skipif(Path("/sys/class/infiniband").exists(), reason="this machine has RDMA devices")
def test_cli_on_this_machine_skips_with_the_reason(tmp_path: Path) -> None:
    report = _cli(tmp_path, None)
    check = report["checks"][0]
    assert report["_rc"] == 5 and check["status"] == "skip", report["_stdout"]  # skipped alone: nothing measured
    assert "no RDMA devices under /sys/class/infiniband" in check["reason"]
    assert "[FABRIC] fabric: SKIP" in report["_stdout"]


@pytest.mark.parametrize(("name", "rc", "status"), [("ndr_8x", 0, "pass"), ("ndr_4x_port_down", 1, "fail")])
def test_cli_on_a_planted_tree(tmp_path: Path, name: str, rc: int, status: str) -> None:
    planted = tmp_path / "sysroot"
    shutil.copytree(DATA / name, planted, symlinks=True)
    report = _cli(tmp_path, str(planted))
    check = report["checks"][0]
    assert (report["_rc"], check["status"]) == (rc, status), check["reason"]
    assert check["details"]["root"] == str(planted)
    if status == "fail":
        up = next(m for m in check["metrics"] if m["name"] == "rdma_port_up" and m["device"] == "mlx5_3:1")
        assert up["value"] == 0 and up["threshold"]["op"] == ">="
