"""The conformance readers added for issue 29: NVML settings (replayed through a fake pynvml from the recorded
state, the boundary this machine cannot reach), P_Keys and GIDs from sysfs trees, NCCL and its net plugin from
library trees, container runtimes from real scripts on PATH (with the timeout), and the fleet view of them."""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuaccept.checks.conformance import evaluate_conformance
from gpuaccept.hw.conformance import Extras, collect
from gpuaccept.hw.nccl_stack import find_plugin, nccl_version, plugin_file_name
from gpuaccept.hw.nvml import UNSUPPORTED
from gpuaccept.hw.nvml_state import NvmlState, read_gpu_state, state_from_dict
from gpuaccept.hw.rdma_keys import parse_gid, parse_pkey, read_port_keys
from gpuaccept.hw.runtimes import RUNTIMES, parse_dpkg_status, parse_version, read_runtimes
from gpuaccept.model import CheckResult, NodeReport, Status, Verdict
from gpuaccept.results.conformance_fleet import configs_of_reports, drift_lines, fleet_drift
from tests.test_conformance import CASES, node

DATA = Path(__file__).parent / "data" / "conformance"
STATE = json.loads((DATA / "nvml_state_h100_8x.json").read_text())
STATES = {v: k for k, v in {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}.items()}


def _fake_nvml(g: dict[str, Any], missing: tuple[str, ...] = ()) -> Any:
    """A pynvml module that answers each call with the recorded GPU's value (NOT_SUPPORTED for ``missing``). Each
    call's arguments are bound to the real nvidia-ml-py function's signature (a TypeError, as the real binding
    gives, when they differ); the fabric call fills the caller's ``c_nvmlGpuFabricInfo_t`` as NVML does."""
    m = types.ModuleType("pynvml")
    for name, value in vars(pynvml).items():
        if name.startswith("NVML"):
            setattr(m, name, value)
    m.c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t  # type: ignore[attr-defined]

    def answer(name: str, binding: str, value: Callable[..., Any]) -> Any:
        real = inspect.signature(getattr(pynvml, binding))

        def fn(*args: Any) -> Any:
            real.bind(*args)
            if name in missing:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return value(*args)
        setattr(m, binding, fn)
        return fn

    def fabric(_handle: Any, ref: Any) -> int:
        info = ref._obj  # what ctypes.byref points at: the caller's structure
        assert isinstance(info, pynvml.c_nvmlGpuFabricInfo_t)
        info.state, info.status = STATES[g["fabric_state"]], 0
        return int(pynvml.NVML_SUCCESS)

    clocks = {pynvml.NVML_CLOCK_GRAPHICS: g["app_clock_graphics_mhz"], pynvml.NVML_CLOCK_MEM: g["app_clock_memory_mhz"]}
    field = types.SimpleNamespace(nvmlReturn=0, value=types.SimpleNamespace(uiVal=g["nvlink_speed_mbps"]))
    answer("vbios", "nvmlDeviceGetVbiosVersion", lambda h: g["vbios_version"])
    answer("pm", "nvmlDeviceGetPersistenceMode", lambda h: int(g["persistence_mode"]))
    answer("clocks", "nvmlDeviceGetApplicationsClock", lambda h, c: clocks[c])
    answer("mig", "nvmlDeviceGetMigMode", lambda h: [int(g["mig_mode"]), 0])
    answer("nvlink", "nvmlDeviceGetFieldValues", lambda h, ids: [field for _ in ids])
    answer("fabric", "nvmlDeviceGetGpuFabricInfo", fabric)
    return m


def test_the_nvml_reader_gives_back_the_recorded_state() -> None:
    for g in STATE["gpus"]:
        got = read_gpu_state(_fake_nvml(g), g["index"], handle=g["index"])
        assert NvmlState([got]).to_dict()["gpus"][0] == g
    assert state_from_dict(STATE).to_dict() == STATE


def test_what_nvml_cannot_give_is_unsupported_and_left_out() -> None:
    g = {**STATE["gpus"][0], "fabric_state": "not_supported"}
    got = read_gpu_state(_fake_nvml(g, missing=("vbios", "nvlink")), 0, handle=0)
    assert got.vbios_version == UNSUPPORTED and "Not Supported" in got.errors["vbios_version"]
    assert got.fabric_state == "not_supported"
    items = collect(None, None, {}, extras=Extras(state=NvmlState([got]))).items
    assert "gpu.0.vbios_version" not in items and "gpu.0.nvlink_speed_mbps" not in items
    assert "gpu.0.fabric_state" not in items  # a GPU without a fabric has no fabric item
    assert items["gpu.0.persistence_mode"] is True


def test_a_binding_that_takes_other_arguments_costs_its_field_not_the_run() -> None:
    """nvidia-ml-py's signatures change between releases (the fabric call took one argument in the code and two in
    the binding, which crashed the conformance check on a real H200): such a field is unsupported, with the reason."""
    g = STATE["gpus"][0]
    m = _fake_nvml(g)
    m.nvmlDeviceGetVbiosVersion = lambda: "no handle taken"  # a binding of another shape
    got = read_gpu_state(m, 0, handle=0)
    assert got.vbios_version == UNSUPPORTED
    assert got.errors["vbios_version"].startswith("this nvidia-ml-py's <lambda> took other arguments: ")
    assert got.fabric_state == g["fabric_state"] and got.persistence_mode == g["persistence_mode"]


def test_a_malformed_recorded_state_is_refused() -> None:
    from gpuaccept.errors import InputError

    with pytest.raises(InputError, match=r"gpus\[0\].persistence_mode: expected bool"):
        state_from_dict({"gpus": [{"index": 0, "persistence_mode": "on"}]})


@pytest.mark.parametrize("text, key", [("0xffff\n", "0xffff"), ("0x8001", "0x8001"), ("0x0000", None),
                                       ("0x8000", None), ("ffff", None), ("0x7FFF", "0x7fff")])
def test_parse_pkey(text: str, key: str | None) -> None:
    assert parse_pkey(text) == key


def test_parse_gid() -> None:
    assert parse_gid("FE80:0000:0000:0000:b859:9f03:000c:a7f6\n") == "fe80:0000:0000:0000:b859:9f03:000c:a7f6"
    assert parse_gid("0000:0000:0000:0000:0000:0000:0000:0000") is None and parse_gid("fe80::1") is None


def test_port_keys_never_follow_a_link(tmp_path: Path) -> None:
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "pkeys").mkdir(parents=True)
    (port / "pkeys/0").write_text("0xffff\n")
    (tmp_path / "elsewhere").write_text("0x8001\n")
    (port / "pkeys/1").symlink_to(tmp_path / "elsewhere")
    (port / "pkeys/junk").write_text("0x8002\n")
    [keys] = read_port_keys(tmp_path)
    assert (keys.device, keys.port, keys.pkeys, keys.gid0) == ("mlx5_0", 1, ("0xffff",), None)


def _lib(root: Path, rel: str, link: str | None = None) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(link) if link else path.write_text("")


def test_the_plugin_is_found_where_nccl_looks(tmp_path: Path) -> None:
    assert plugin_file_name({}) == "libnccl-net.so"
    assert plugin_file_name({"NCCL_NET_PLUGIN": "aws-ofi"}) == "libnccl-net-aws-ofi.so"
    assert plugin_file_name({"NCCL_NET_PLUGIN": "/x/../libevil.so"}) is None
    _lib(tmp_path, "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", "libnccl-net.so.0.0.0")
    _lib(tmp_path, "/site/lib/libnccl-net-aws-ofi.so")
    assert find_plugin({}, tmp_path) == ("none", "no libnccl-net.so in LD_LIBRARY_PATH, /etc/ld.so.conf.d or the "
                                                 "standard library directories")
    (tmp_path / "etc/ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf.d/hpcx.conf").write_text("# HPC-X\n/opt/hpcx/nccl_rdma_sharp_plugin/lib\n")
    assert find_plugin({}, tmp_path) == ("libnccl-net.so -> libnccl-net.so.0.0.0",
                                         "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so")
    env = {"NCCL_NET_PLUGIN": "aws-ofi", "LD_LIBRARY_PATH": "relative/lib:/site/lib"}
    assert find_plugin(env, tmp_path) == ("libnccl-net-aws-ofi.so", "/site/lib/libnccl-net-aws-ofi.so")


def test_the_nccl_version_says_where_it_came_from(tmp_path: Path) -> None:
    assert nccl_version({}, tmp_path, modules={}, paths=[])[0] is None
    header = tmp_path / "usr/include/nccl.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 18\n#define NCCL_PATCH 1\n#define NCCL_SUFFIX \"\"\n")
    assert nccl_version({}, tmp_path, modules={}) == ("2.18.1", "header /usr/include/nccl.h")
    _lib(tmp_path, "/usr/local/lib/libnccl.so.2.20.5")
    assert nccl_version({}, tmp_path, modules={}) == ("2.20.5", "library file name /usr/local/lib/libnccl.so.2.20.5")
    # a pip-installed torch loads the NCCL of the nvidia-nccl-cu12 package: its dist-info is read
    info = tmp_path / "site/nvidia_nccl_cu12-2.21.5.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: 2.21.5\n")
    assert nccl_version({}, tmp_path, modules={}, paths=[str(tmp_path / "site")]) == (
        "2.21.5", "pip package nvidia-nccl-cu12")
    # torch, when the process has imported it, is the NCCL a torch job loads (its own wheel's): asked first
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 23, 4))))
    assert nccl_version({}, tmp_path, modules={"torch": torch}, paths=[str(tmp_path / "site")]) == (
        "2.23.4", "torch.cuda.nccl.version()")


def test_runtime_version_outputs_parse() -> None:
    rt = {r.item: r for r in RUNTIMES}
    assert parse_version(rt["docker"], "Docker version 24.0.7, build afdd53b\n") == "24.0.7"
    assert parse_version(rt["podman"], "podman version 4.9.3\n") == "4.9.3"
    assert parse_version(rt["nvidia_container_toolkit"],
                         "cli-version: 1.14.6\nlib-version: 1.14.6\nbuild date: 2024-02-01\n") == "1.14.6"
    assert parse_version(rt["enroot"], "3.4.1\n") == "3.4.1" and parse_version(rt["enroot"], "usage") is None
    status = "Package: docker-ce\nStatus: deinstall ok config-files\nVersion: 5:24.0.7-1\n\nPackage: podman\n" \
             "Status: install ok installed\nVersion: 4.6.2\n"
    assert parse_dpkg_status(status, ("docker-ce", "podman")) == {"podman": "4.6.2"}


def test_a_hanging_runtime_is_bounded_and_named(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text("#!/bin/sh\nsleep 30\n")
    (bin_dir / "podman").chmod(0o755)
    versions, _, absent = read_runtimes({"PATH": str(bin_dir)}, tmp_path, timeout_s=0.5)
    assert "runtime.podman" not in versions
    assert absent["runtime.podman"] == "podman --version gave no version (failed or ran past 0.5 s)"
    assert absent["runtime.docker"] == "not installed (docker not on PATH, no docker-ce/docker.io/moby-engine package)"


def test_a_manifest_naming_an_absent_runtime_fails_saying_why(tmp_path: Path) -> None:
    from gpuaccept.checks.conformance_manifest import parse_manifest

    cfg = node(tmp_path, CASES["cases"]["no_enroot"])
    m = parse_manifest({"conformance": 1, "items": {"runtime.enroot": "3.4.1"}}, "m.yaml")
    out = evaluate_conformance(cfg, m)
    assert out.status is Status.FAIL
    assert out.reason == ("runtime.enroot: not on this node (not installed (enroot not on PATH, no enroot package)), "
                          "manifest 3.4.1")


@pytest.mark.parametrize("case, item, line", [
    ("vbios_other", "gpu.5.vbios_version", "gpu.5.vbios_version 96.00.74.00.1C, majority 96.00.89.00.01 (4 of 5)"),
    ("persistence_off", "gpu.0.persistence_mode", "gpu.0.persistence_mode false, majority true (4 of 5)"),
    ("other_pkey", "nic.mlx5_3.port1.pkeys", "nic.mlx5_3.port1.pkeys 0xffff,0x8002, majority 0xffff,0x8001"),
    ("fabric_in_progress", "gpu.6.fabric_state", "gpu.6.fabric_state in_progress, majority completed (4 of 5)"),
])
def test_the_fleet_view_names_the_node_and_the_new_item(case: str, item: str, line: str, tmp_path: Path) -> None:
    reports = []
    for i in range(5):
        cfg = node(tmp_path / str(i), CASES["cases"][case] if i == 2 else None)
        out = evaluate_conformance(cfg, None)
        reports.append(NodeReport("r1", f"node{i:02d}", "standard", "2026-11-28T08:00:00Z", verdict=Verdict.SUCCESS,
                                  checks=[CheckResult("conformance", out.status, out.reason, details=out.details)]))
    drift = fleet_drift(configs_of_reports(reports))
    assert [(n["host"], [i["item"] for i in n["items"]]) for n in drift["odd"]] == [("node02", [item])]
    assert line in drift_lines(drift)[0] and drift_lines(drift)[0].startswith("node02 ")


@pytest.mark.gpu
def test_a_real_gpu_gives_its_settings() -> None:
    from gpuaccept.hw.nvml_state import read_state

    state = read_state()
    g = state.gpus[0]
    assert isinstance(g.vbios_version, str) and g.vbios_version != UNSUPPORTED
    assert isinstance(g.persistence_mode, bool)
    assert g.fabric_state == UNSUPPORTED or g.fabric_state in ("not_supported", "not_started", "in_progress",
                                                               "completed")
    assert state_from_dict(json.loads(json.dumps(state.to_dict()))).to_dict() == state.to_dict()
