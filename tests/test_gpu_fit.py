"""GPU buffer sizes in a configuration against the selected GPUs' memory, before anything runs.

The comparison (:func:`gpuaccept.node.suite.check_gpu_fit`) is pure and is fed
GpuMemory rows directly; the NVML reader (:mod:`gpuaccept.hw.gpumem`) is fed
the recorded fixtures under ``tests/data/nvml`` through the fake NVML library
of ``test_nvml`` (nvidia-ml-py's real errors, only the C calls replaced): no
GPU exists on the machines these tests run on, and NVML is that boundary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuaccept.checks import registry
from gpuaccept.errors import ConfigError, InputError
from gpuaccept.hw.gpumem import GpuMemory, read_gpu_memory
from gpuaccept.hw.nvml import NvmlUnavailable
from gpuaccept.node.config import parse_config
from gpuaccept.node.suite import RunOptions, check_gpu_fit, plan_suite
from tests.cli_inproc import run_main
from tests.test_nvml import Err, FakeNvml

NVML_DATA = Path(__file__).parent / "data" / "nvml"
H100_MIB = 85520809984 >> 20  # 81559: "NVIDIA H100 80GB HBM3" in the fixtures
L40S_MIB = 46068
H100 = GpuMemory("cuda:0", "NVIDIA H100 80GB HBM3", H100_MIB)


def fits(params: dict[str, dict[str, Any]], gpus: list[GpuMemory], device: str = "cuda") -> None:
    """check_gpu_fit for a config setting ``params`` ({check: {param: value}}), every check of it planned."""
    reg = registry()
    cfg = parse_config({"checks": {name: {"params": p} for name, p in params.items()}}, "site.yaml", reg)
    plan = plan_suite(RunOptions(checks=list(params)), cfg, reg, device)
    check_gpu_fit(plan, cfg, reg, gpus)


def too_big(params: dict[str, dict[str, Any]], gpus: list[GpuMemory]) -> str:
    with pytest.raises(ConfigError) as info:
        fits(params, gpus)
    assert "\n" not in str(info.value)
    return str(info.value)


# ---------------------------------------------------------------- the pure comparison

def test_memory_buffers_fit_up_to_the_gpu_total() -> None:
    fits({"memory": {"size_mib": H100_MIB // 2}}, [H100])  # two buffers: 81558 MiB of 81559
    line = too_big({"memory": {"size_mib": H100_MIB // 2 + 1}}, [H100])
    assert line == ("site.yaml: checks.memory.params.size_mib: size_mib 40780 needs 81560 MiB of GPU memory "
                    "(2 buffers of 40780 MiB), more than cuda:0 (NVIDIA H100 80GB HBM3, the smallest selected GPU) "
                    "has: 81559 MiB")


def test_the_smallest_selected_gpu_wins() -> None:
    gpus = [H100, GpuMemory("cuda:1", "NVIDIA L40S", L40S_MIB), GpuMemory("cuda:2", "NVIDIA H200", 143771)]
    line = too_big({"memtest": {"chunk_mib": 10000}}, gpus)  # 5 x 10000 fits an H100, not the L40S
    assert "checks.memtest.params.chunk_mib" in line and "50000 MiB" in line and "5 buffers" in line
    assert "cuda:1 (NVIDIA L40S" in line and f"{L40S_MIB} MiB" in line
    fits({"memtest": {"chunk_mib": 9000}}, gpus)


def test_no_gpu_information_checks_nothing() -> None:
    huge = {"memory": {"size_mib": 1 << 20}}
    fits(huge, [])
    fits(huge, [GpuMemory("cuda:0", "NVML GPU 0", None)])
    fits(huge, [H100], device="cpu")  # a CPU run ignores GPU sizes
    # A GPU of unknown size is left out; the known ones still count.
    unknown = GpuMemory("cuda:0", "NVML GPU 0", None)
    assert "cuda:1" in too_big(huge, [unknown, dataclasses.replace(H100, device="cuda:1")])


def test_only_sizes_the_configuration_sets_are_checked() -> None:
    tiny = [GpuMemory("cuda:0", "tiny", 100)]
    fits({"memory": {"iterations": 3}}, tiny)  # the built-in 2 x 1024 MiB adapts (memory shrinks it)
    assert "host_mib 101 needs 101 MiB" in too_big({"memory": {"host_mib": 101}}, tiny)


def test_compute_counts_the_gemm_operands_of_the_widest_dtype() -> None:
    # 4 A/B pairs and C of 40960 x 40960 (1600 MiB per fp32 matrix): fp32 9 x 6400 MiB, bf16 half that
    l40s = [GpuMemory("cuda:0", "NVIDIA L40S", L40S_MIB)]
    fits({"compute": {"size": 40960, "dtypes": ["bf16", "fp8"]}}, l40s)
    line = too_big({"compute": {"size": 40960, "dtypes": ["bf16", "fp32"]}}, l40s)
    assert "checks.compute.params.size: size 40960 needs 57600 MiB" in line
    assert "4 A/B pairs and C of 40960 x 40960 fp32" in line
    # buffers alone can make the default size (8192: 256 MiB per fp32 matrix) too big
    fits({"compute": {"buffers": 89, "dtypes": ["fp32"]}}, l40s)
    assert "checks.compute.params.buffers: buffers 90 needs 46336 MiB" in too_big(
        {"compute": {"buffers": 90, "dtypes": ["fp32"]}}, l40s)
    # both named when both are set: 2 pairs and C of 16384 x 16384 fp64 are 5 x 2048 MiB
    assert "size 16384, buffers 2 need 10240 MiB" in too_big(
        {"compute": {"size": 16384, "buffers": 2, "dtypes": ["fp64"]}}, [GpuMemory("cuda:0", "small", 10239)])


def test_every_declared_gpu_size_is_an_int_in_mib_with_buffers() -> None:
    declared = {(name, p.name, p.gpu_buffers) for name, cls in registry().items() for p in cls.params
                if p.gpu_memory_mib}
    assert declared == {("memory", "size_mib", 2), ("memory", "host_mib", 1), ("memtest", "chunk_mib", 5),
                        ("p2p", "size_mib", 2)}
    assert all(registry()[n].param(p).kind == "int" for n, p, _ in declared)  # type: ignore[union-attr]


# ---------------------------------------------------------------- the NVML reader on recorded fixtures

_CODES = {"GPU is lost": pynvml.NVML_ERROR_GPU_IS_LOST, "Unknown Error": pynvml.NVML_ERROR_UNKNOWN,
          "Insufficient Permissions": pynvml.NVML_ERROR_NO_PERMISSION}


def fake_from(name: str) -> FakeNvml:
    """A fake NVML answering name, UUID, bus id and memory as the recorded snapshot ``name`` does."""
    snap = json.loads((NVML_DATA / name).read_text())
    specs: list[dict[str, Any] | Err] = [
        {"nvmlDeviceGetUUID": f"GPU-not-recorded-{i}", "nvmlDeviceGetName": "not recorded"}
        for i in range(snap["gpu_count"])]
    for g in snap["gpus"]:
        if "handle" in g["errors"]:
            specs[g["index"]] = Err(_CODES[g["errors"]["handle"]])
            continue
        spec: dict[str, Any] = {"nvmlDeviceGetUUID": g["uuid"], "nvmlDeviceGetName": g["name"],
                                "nvmlDeviceGetPciInfo": types.SimpleNamespace(busId=g["pci_bus_id"].encode())}
        if isinstance(g["memory_total_bytes"], int):
            spec["nvmlDeviceGetMemoryInfo"] = types.SimpleNamespace(total=g["memory_total_bytes"],
                                                                     used=g["memory_used_bytes"])
        specs[g["index"]] = spec
    return FakeNvml(specs)


def test_reader_on_a_recorded_h100_node(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_from("healthy_h100_sxm_8x.json").install(monkeypatch)
    assert read_gpu_memory(None, None) == [GpuMemory(f"cuda:{i}", "NVIDIA H100 80GB HBM3", H100_MIB) for i in range(8)]
    assert [g.device for g in read_gpu_memory(None, [3, 0])] == ["cuda:3", "cuda:0"]
    with pytest.raises(InputError, match="GPU index 8 does not exist"):
        read_gpu_memory(None, [8])


def test_reader_on_a_recorded_l40s_node(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_from("unsupported_l40s_4x.json").install(monkeypatch)
    gpus = read_gpu_memory(None, None)
    assert {g.total_mib for g in gpus} == {L40S_MIB} and len(gpus) == 4
    assert "NVIDIA L40S" in too_big({"memory": {"size_mib": 24000}}, gpus)
    fits({"memory": {"size_mib": 24000}}, [H100])


def test_reader_reads_only_the_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_from("visible_upper_half.json").install(monkeypatch)
    gpus = read_gpu_memory("4,5,6,7", [1])
    assert gpus == [GpuMemory("cuda:1", "NVIDIA H100 80GB HBM3", H100_MIB)]
    assert [c[1] for c in fake.calls if c[0] == "nvmlDeviceGetMemoryInfo"] == [5]  # NVML 5 is cuda:1


def test_reader_leaves_unreadable_gpus_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_from("handle_errors.json").install(monkeypatch)  # GPU 2 "Unknown Error", 5 "Insufficient Permissions"
    gpus = read_gpu_memory(None, None)
    assert [g.device for g in gpus if g.total_mib is None] == ["cuda:2", "cuda:5"]
    assert "cuda:0" in too_big({"memory": {"size_mib": 50000}}, gpus)


def test_reader_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        read_gpu_memory(None, None)


def test_reader_reads_a_mig_instance_not_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_from("healthy_h100_sxm_8x.json").install(monkeypatch)
    m, mig = fake.module, "MIG-5c09a2b1-0000-1111-2222-333344445555"
    gpu_uuid, by_uuid, mem = m.nvmlDeviceGetUUID, m.nvmlDeviceGetHandleByUUID, m.nvmlDeviceGetMemoryInfo
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 1 if h == 1 else 0  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, j: "mig"  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: mig if h == "mig" else gpu_uuid(h)  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByUUID = lambda u: "mig" if u == mig else by_uuid(u)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = (  # type: ignore[attr-defined]
        lambda h: types.SimpleNamespace(total=10 << 30, used=0) if h == "mig" else mem(h))
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3 MIG 1g.10gb"  # type: ignore[attr-defined]
    assert read_gpu_memory(mig, None) == [GpuMemory("cuda:0", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10240)]


# ---------------------------------------------------------------- gpuaccept run

def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return str(path)


def test_run_refuses_a_buffer_larger_than_the_gpu_before_anything_runs(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_from("healthy_h100_sxm_8x.json").install(monkeypatch)
    cfg = _config(tmp_path, "checks: {memory: {params: {size_mib: 60000}}}\n")
    for plan in (["--plan"], ["--report-dir", str(tmp_path / "reports")]):
        line = run_main("run", *plan, "--checks", "memory", "--gpus", "0,1", "--config", cfg).one_line_error()
        assert "site.yaml: checks.memory.params.size_mib: size_mib 60000 needs 120000 MiB" in line
        assert f"cuda:0 (NVIDIA H100 80GB HBM3, the smallest selected GPU) has: {H100_MIB} MiB" in line
    assert not (tmp_path / "reports").exists()
    ok = run_main("run", "--plan", "--checks", "memory", "--config",
                  _config(tmp_path, "checks: {memory: {params: {size_mib: 40000}}}\n"))
    assert ok.rc == 0 and json.loads(ok.out)["device"] == "cuda", ok.err


def test_run_on_cpu_ignores_gpu_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_from("healthy_h100_sxm_8x.json").install(monkeypatch)
    cfg = _config(tmp_path, "checks: {memory: {params: {size_mib: 60000}}}\n")
    r = run_main("run", "--plan", "--device", "cpu", "--checks", "memory", "--config", cfg)
    assert r.rc == 0, r.err


def test_run_without_nvml_leaves_gpu_sizes_to_the_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    cfg = _config(tmp_path, "checks: {memory: {params: {size_mib: 60000}}}\n")
    r = run_main("run", "--plan", "--device", "cuda", "--checks", "memory", "--config", cfg)
    assert r.rc == 0, r.err


@pytest.mark.gpu
def test_reader_agrees_with_torch_on_a_gpu() -> None:
    import torch

    gpus = read_gpu_memory(os.environ.get("CUDA_VISIBLE_DEVICES"), None)
    seen = [torch.cuda.get_device_properties(i).total_memory >> 20 for i in range(torch.cuda.device_count())]
    assert len(gpus) == len(seen)
    for g, usable in zip(gpus, seen, strict=True):  # NVML's total also counts what the driver reserves
        assert g.total_mib is not None and usable <= g.total_mib <= usable * 1.02, (g, usable)
