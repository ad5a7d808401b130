"""Fleet conformance: the collected configuration, the manifest (load, judge, capture) and the check, on the
healthy 8x H100 / 8x NDR node and its drift cases (tests/data/conformance/drift_cases.yaml)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuaccept.checks.conformance import evaluate_conformance
from gpuaccept.checks.conformance_manifest import capture, dump_manifest, judge, load_manifest, parse_manifest
from gpuaccept.errors import ConfigError
from gpuaccept.hw.conformance import Extras, NodeConfig, collect, read_sysfs_items
from gpuaccept.hw.nccl_stack import find_plugin, nccl_version
from gpuaccept.hw.nvml import snapshot_from_dict
from gpuaccept.hw.nvml_state import state_from_dict
from gpuaccept.hw.rdma import read_inventory
from gpuaccept.hw.rdma_keys import read_port_keys
from gpuaccept.hw.runtimes import read_runtimes
from gpuaccept.model import Status

DATA = Path(__file__).parent / "data"
CASES = yaml.safe_load((DATA / "conformance" / "drift_cases.yaml").read_text())


def _nvml(edits: dict[str, Any], default: Path = DATA / "nvml" / "healthy_h100_sxm_8x.json") -> dict[str, Any]:
    src = default.parent / edits["from"] if "from" in edits else default
    snap: dict[str, Any] = json.loads(src.read_text())
    for key, value in edits.items():
        if key == "from":
            continue
        parts = key.split(".")
        target: Any = snap
        for p in parts[:-1]:
            target = target[int(p)] if p.isdigit() else target[p]
        assert parts[-1] in target, key  # an edit changes a field the snapshot has
        target[parts[-1]] = value
    return snap


def node(tmp_path: Path, case: dict[str, Any] | None = None) -> NodeConfig:
    """The healthy node with the edits of ``case`` applied, collected."""
    case = case or {}
    root = tmp_path / "root"
    shutil.copytree(DATA / "sysfs" / "ndr_8x", root, symlinks=True)
    for rel, text in {**CASES["base"]["sysfs"], **case.get("sysfs", {})}.items():
        path = root / rel
        if text is None:
            assert path.exists(), rel
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{text}\n")
    for rel, text in {**CASES["base"]["nccl"], **case.get("nccl", {})}.items():
        path = root / rel
        if text is None:
            continue  # not on this node
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(text[3:]) if text.startswith("-> ") else path.write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, output in {**CASES["base"]["runtimes"], **case.get("runtimes", {})}.items():
        if output is not None:
            (bin_dir / tool).write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
            (bin_dir / tool).chmod(0o755)
    env = {**CASES["base"]["env"], **case.get("env", {}), "PATH": str(bin_dir)}
    snap = snapshot_from_dict(_nvml(case.get("nvml", {})))
    state = state_from_dict(_nvml(case.get("state", {}), DATA / "conformance" / "nvml_state_h100_8x.json"))
    extras = Extras(state, read_port_keys(root), nccl_version(env, root, modules={}, paths=[]), find_plugin(env, root),
                    read_runtimes(env, root))
    host = {"kernel": "5.15.0-105-generic", "os": "Ubuntu 22.04.4 LTS"}
    return collect(snap, read_inventory(root), {k: v for k, v in env.items() if k != "PATH"}, host,
                   read_sysfs_items(root), extras)


@pytest.fixture
def healthy(tmp_path: Path) -> NodeConfig:
    return node(tmp_path / "healthy")


def test_collect_names_every_part(healthy: NodeConfig) -> None:
    items = healthy.items
    assert items["gpu_count"] == 8 and items["driver_version"] == "550.54.15" and items["cuda_driver_version"] == "12.4"
    assert items["gpu.3.pcie_width_max"] == 16 and items["gpu.3.pcie_gen_max"] == 5
    assert items["gpu.0.nvlink_active"] == 18 and items["gpu.0.ecc_mode"] is True
    assert items["gpu.0.numa_node"] == 0 and items["gpu.7.numa_node"] == 1
    assert items["nic.mlx5_4.fw_ver"] == "28.39.1002" and items["nic.mlx5_4.board"] == "MT4129"
    assert items["nic.mlx5_0.port1.rate_gbps"] == 400.0 and items["nic.mlx5_0.port1.link_layer"] == "InfiniBand"
    assert items["nic.mlx5_0.numa_node"] == 0 and items["nic.mlx5_7.numa_node"] == 1
    assert items["peermem"] == "nvidia_peermem" and items["rdma_device_count"] == 8
    assert items["cpu_governor"] == "performance" and items["hugepages_total"] == 0 and items["bios_version"] == "1.4b"
    assert items["nccl_env.NCCL_IB_HCA"].startswith("=mlx5_0") and "nccl_env.PATH" not in items
    assert "gpu.0.uuid" not in items and healthy.ids["gpu.0.uuid"].startswith("GPU-")
    assert healthy.ids["nic.mlx5_0.node_guid"]
    assert items["gpu.5.vbios_version"] == "96.00.89.00.01" and items["gpu.0.persistence_mode"] is True
    assert items["gpu.1.app_clock_graphics_mhz"] == 1980 and items["gpu.1.app_clock_memory_mhz"] == 2619
    assert items["gpu.7.mig_mode"] is False and items["gpu.2.nvlink_speed_mbps"] == 26562
    assert items["gpu.6.fabric_state"] == "completed" and items["gpu.6.fabric_status"] == "success"
    assert items["nic.mlx5_3.port1.pkeys"] == "0xffff,0x8001"  # the empty slot 0x0000 is not a key
    assert items["nic.mlx5_0.port1.gid_prefix"] == "fe80:0000:0000:0000"
    assert healthy.ids["nic.mlx5_0.port1.gid0"] == "fe80:0000:0000:0000:b859:9f03:000c:a7f6"
    assert items["nccl_version"] == "2.21.5"
    assert healthy.sources["nccl_version"] == "library file name /usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5"
    assert items["nccl_net_plugin"] == "libnccl-net.so -> libnccl-net-ofi.so.1.9.1"
    assert items["runtime.nvidia_container_toolkit"] == "1.14.6" and items["runtime.enroot"] == "3.4.1"
    assert items["runtime.pyxis"] == "0.19.0-1"
    assert healthy.sources["runtime.pyxis"] == "dpkg package nvslurm-plugin-pyxis"
    assert "runtime.docker" not in items and healthy.absent["runtime.docker"].startswith("not installed (docker not")


def test_capture_then_judge_the_same_node_passes(healthy: NodeConfig, tmp_path: Path) -> None:
    manifest = capture(healthy.items, "qualified node")
    patterns = {r.pattern for r in manifest.rules}
    assert "gpu.*.pcie_width_max" in patterns and "nic.*.fw_ver" in patterns
    assert "nic.mlx5_0.numa_node" in patterns  # differs between NICs: kept per NIC
    path = tmp_path / "m.yaml"
    path.write_text(dump_manifest(manifest))
    loaded = load_manifest(path)
    assert judge(healthy.items, loaded) == []
    out = evaluate_conformance(healthy, loaded, manifest_path=str(path))
    assert out.status is Status.PASS and out.reason.startswith(f"conforms to {path}")


def test_no_manifest_records_only(healthy: NodeConfig) -> None:
    out = evaluate_conformance(healthy, None)
    assert out.status is Status.PASS and out.reason.startswith("no manifest: configuration recorded")
    assert out.details["conformance"]["items"]["gpu_count"] == 8


def test_cpu_only_says_so() -> None:
    out = evaluate_conformance(collect(None, None, {}, {"kernel": "6.1", "os": "Debian"}), None,
                               nvml_error="NVML not available")
    assert "CPU only" in out.reason and "NVML not available" in out.reason


@pytest.mark.parametrize("name", sorted(CASES["cases"]))
def test_each_drift_fails_naming_the_item(name: str, tmp_path: Path) -> None:
    case = CASES["cases"][name]
    manifest = capture(node(tmp_path / "ref").items)
    drifted = node(tmp_path / "drift", case)
    findings = judge(drifted.items, manifest)
    expected = case["item"] if isinstance(case["item"], list) else [case["item"]]
    assert [f.item for f in findings] == expected
    assert findings[0].status is Status.FAIL
    out = evaluate_conformance(drifted, manifest)
    assert out.status is Status.FAIL and out.reason.startswith(expected[0] + ":")


def test_finding_text_names_value_and_manifest(tmp_path: Path) -> None:
    manifest = capture(node(tmp_path / "ref").items)
    drifted = node(tmp_path / "d", CASES["cases"]["nic_firmware"])
    assert [f.message for f in judge(drifted.items, manifest)] == [
        "nic.mlx5_4.fw_ver: 28.41.1000, manifest 28.39.1002"]
    drifted = node(tmp_path / "x8", CASES["cases"]["gpu_x8_slot"])
    assert [f.message for f in judge(drifted.items, manifest)] == ["gpu.3.pcie_width: 8, manifest 16",
                                                                   "gpu.3.pcie_width_max: 8, manifest 16"]


def test_rollout_ranges_and_advisory(tmp_path: Path) -> None:
    drifted = node(tmp_path / "d", CASES["cases"]["nic_firmware"])
    m = parse_manifest({"conformance": 1, "items": {
        "nic.*.fw_ver": ["28.39.1002", "28.41.1000"],
        "nic.*.port*.rate_gbps": {"min": 400},
        "nccl_env.NCCL_IB_HCA": {"value": "mlx5", "advisory": True},
        "gpu.*.power_limit_w": {"min": 650, "max": 700}}}, "m.yaml")
    findings = judge(drifted.items, m)
    assert [(f.status, f.item) for f in findings] == [(Status.WARN, "nccl_env.NCCL_IB_HCA")]
    slow = node(tmp_path / "slow", CASES["cases"]["port_lower_rate"])
    assert [f.message for f in judge(slow.items, m) if f.status is Status.FAIL] == [
        "nic.mlx5_2.port1.rate_gbps: 200, manifest at least 400"]
    assert evaluate_conformance(drifted, m).status is Status.WARN


def test_item_missing_on_node_is_a_finding(healthy: NodeConfig) -> None:
    m = parse_manifest({"conformance": 1, "items": {"nic.mlx5_9.fw_ver": "28.39.1002"}}, "m.yaml")
    assert [f.message for f in judge(healthy.items, m)] == ["nic.mlx5_9.fw_ver: not on this node, manifest 28.39.1002"]


@pytest.mark.parametrize("data, message", [
    ({"conformance": 1, "itmes": {}}, "unknown key 'itmes' (did you mean 'items'?)"),
    ({"conformance": 2, "items": {"gpu_count": 8}}, "conformance: expected 1"),
    ({"conformance": 1, "items": {"gpu_cont": 8}}, "items.gpu_cont: no such item (did you mean 'gpu_count'?)"),
    ({"conformance": 1, "items": {"gpu.*.pcie_widht": 16}}, "did you mean 'gpu.*.pcie_width'?"),
    ({"conformance": 1, "items": {"gpu_count": "eight"}}, "items.gpu_count.value: expected an integer, got 'eight'"),
    ({"conformance": 1, "items": {"gpu_count": {"min": 8, "max": 4}}}, "impossible range, min 8 > max 4"),
    ({"conformance": 1, "items": {"driver_version": {"min": 5}}}, "a range needs a numeric item"),
    ({"conformance": 1, "items": {"gpu_count": {"vaule": 8}}}, "unknown key 'vaule' (did you mean 'value'?)"),
    ({"conformance": 1, "items": {"gpu_count": {"advisory": True}}}, "names no value, one_of, min or max"),
    ({"conformance": 1, "items": {"gpu_count": {"value": 8, "advisory": "yes"}}}, "expected true or false"),
    ([1, 2], "a conformance manifest is a mapping"),
])
def test_bad_manifests_are_one_line_config_errors(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_manifest(data, "m.yaml")
    text = str(err.value)
    assert message in text and text.startswith("m.yaml") and "\n" not in text


@pytest.mark.gpu
def test_a_real_gpu_node_is_collected_and_passes_its_own_capture() -> None:
    import os

    from gpuaccept.checks.conformance import read_config

    cfg, error = read_config("/", os.environ)
    assert error is None
    count = cfg.items["gpu_count"]
    assert isinstance(count, int) and count >= 1 and isinstance(cfg.items["gpu.0.name"], str)
    assert isinstance(cfg.items["driver_version"], str) and cfg.ids["gpu.0.uuid"].startswith("GPU-")
    assert judge(cfg.items, capture(cfg.items)) == []
