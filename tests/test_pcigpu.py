"""GPUs on the PCI bus (recorded sysfs trees, tests/data/sysfs/build_trees.py) against what NVML and torch see:
GPUs there but unusable is a FAIL naming the cause; no GPU there is a CPU-only run that says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.env import evaluate_env
from gpuaccept.hw.pcigpu import allowed_gpus, cpu_only_reason, read_bus_gpus
from gpuaccept.model import Status

SYSFS = Path(__file__).parent / "data" / "sysfs"
HOST = {"host": "node01", "cpu_count": 224, "memory_total_bytes": 2 * 2**40}
NO_NVML = {"available": False, "error": "NVML not available: NVML Shared Library Not Found"}
CPU_TORCH = {"installed": True, "version": "2.13.0+cpu", "cuda": None, "hip": None, "cuda_available": False,
             "device_count": 0}


def torch_facts(count: int = 8, *, hip: str | None = None) -> dict[str, Any]:
    return {"installed": True, "version": "2.4.0+cu124", "cuda": None if hip else "12.4", "hip": hip,
            "cuda_available": True, "device_count": count, "kernel_ok": True}


def nvml_facts(buses: list[str]) -> dict[str, Any]:
    return {"available": True, "driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpu_count": len(buses),
            "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{b}:00.0"}
                     for i, b in enumerate(buses)]}


ALL8 = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def env_on(tree: str, device: str, tch: dict[str, Any], nvml: dict[str, Any], env: dict[str, str] | None = None):
    ctx = CheckContext(device=device, params={}, timeout_s=60)
    env = env or {}
    return evaluate_env(ctx, HOST, tch, nvml, env.get("CUDA_VISIBLE_DEVICES"), bus=read_bus_gpus(SYSFS / tree),
                        env=env)


def test_bus_counts_display_and_3d_controllers_of_gpu_vendors_only() -> None:
    gpus = read_bus_gpus(SYSFS / "gpu_8x")
    assert gpus is not None and [g.address for g in gpus] == [f"0000:{b}:00.0" for b in ALL8]
    assert {(g.vendor, g.class_code, g.driver) for g in gpus} == {("NVIDIA", "0x030200", "nvidia")}
    # the BMC's VGA, NVSwitches, an NVIDIA audio function and QEMU's emulated display are on that bus too
    assert read_bus_gpus(SYSFS / "no_gpu") == []
    amd = read_bus_gpus(SYSFS / "amd_8x")
    assert amd is not None and len(amd) == 8 and {(g.vendor, g.driver) for g in amd} == {("AMD", "amdgpu")}
    assert [g.driver for g in read_bus_gpus(SYSFS / "gpu_8x_unbound") or []] == [None] * 8
    assert read_bus_gpus(SYSFS / "no_such_tree") is None


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_gpus_on_the_bus_without_nvml_fail_whatever_the_device(device: str) -> None:
    out = env_on("gpu_8x", device, CPU_TORCH, NO_NVML)
    assert out.status is Status.FAIL
    assert "8 NVIDIA GPUs on the PCI bus but NVML is not available (NVML not available: NVML Shared Library " \
           "Not Found)" in out.reason
    assert "torch 2.13.0+cpu is not built for CUDA: it cannot use the 8 GPUs this job was given" in out.reason
    assert out.details["pci_gpus"][0] == {"address": "0000:18:00.0", "vendor": "NVIDIA", "device_id": "0x2330",
                                          "class": "0x030200", "driver": "nvidia"}
    assert next(m.value for m in out.metrics if m.name == "pci_gpu_count") == 8


def test_gpus_without_a_driver_fail_naming_them() -> None:
    out = env_on("gpu_8x_unbound", "cpu", CPU_TORCH, NO_NVML)
    assert out.status is Status.FAIL
    assert "8 of the 8 GPUs on the PCI bus have no GPU driver bound: 0000:18:00.0 (no driver)" in out.reason
    one = env_on("gpu_8x_one_unbound", "cuda", torch_facts(7), nvml_facts([b for b in ALL8 if b != "ab"]))
    assert one.status is Status.FAIL
    assert "1 of the 8 GPUs on the PCI bus has no GPU driver bound: 0000:ab:00.0 (no driver)" in one.reason
    assert "NVML sees 7 of the 8 NVIDIA GPUs on the PCI bus (not seen: 0000:ab:00.0)" in one.reason
    assert "CUDA sees 7 of the 8 GPUs this job was given" in one.reason


def test_cuda_or_nvml_seeing_fewer_than_the_job_was_given_fails() -> None:
    out = env_on("gpu_8x", "cuda", torch_facts(2), nvml_facts(ALL8), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert out.status is Status.FAIL
    assert "CUDA sees 2 of the 4 GPUs this job was given (CUDA_VISIBLE_DEVICES=0,1,2,3)" in out.reason
    out = env_on("gpu_8x", "cuda", torch_facts(4), nvml_facts(ALL8[:3]), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert out.status is Status.FAIL
    assert "NVML sees 3 GPUs, fewer than the 4 this job was given of the 8 NVIDIA GPUs on the PCI bus" in out.reason


def test_expect_gpus_caps_what_the_job_was_given() -> None:
    """A container runtime that narrows the GPUs without an environment variable (CDI): --expect-gpus says so."""
    ctx = CheckContext(device="cuda", params={}, timeout_s=60, expect_gpus=4)
    out = evaluate_env(ctx, HOST, torch_facts(4), nvml_facts(ALL8[:4]), None, bus=read_bus_gpus(SYSFS / "gpu_8x"),
                       env={})
    assert out.status is Status.PASS, out.reason
    assert env_on("gpu_8x", "cuda", torch_facts(4), nvml_facts(ALL8[:4])).status is Status.FAIL


@pytest.mark.parametrize(("env", "nvml", "torch_count"), [
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, ALL8, 4),  # Slurm: the node's NVML, 4 GPUs for the job
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}, ["18", "2a"], 2),  # a container given 2 GPUs
    # 2 MIG slices of GPU 0: NVML sees their parent, CUDA one slice (a process enumerates a single MIG instance)
    ({"NVIDIA_VISIBLE_DEVICES": "0:0,0:1", "CUDA_VISIBLE_DEVICES": "MIG-1a,MIG-2b"}, ["18"], 1),
])
def test_a_job_given_fewer_gpus_than_the_node_holds_passes(env: dict[str, str], nvml: list[str],
                                                           torch_count: int) -> None:
    out = env_on("gpu_8x", "cuda", torch_facts(torch_count), nvml_facts(nvml), env)
    assert out.status is Status.PASS, out.reason
    assert out.details["cpu_only"] is None and "CPU only" not in out.reason


def test_mig_on_without_a_mig_entry_needs_one_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuaccept.checks.env import nvml_info
    from tests.test_nvml import H100_SPEC, FakeNvml

    FakeNvml([dict(H100_SPEC, nvmlDeviceGetMigMode=(1, 1)), dict(H100_SPEC, nvmlDeviceGetMigMode=(0, 0)),
              dict(H100_SPEC)]).install(monkeypatch)
    assert nvml_info()["mig_gpus"] == 1  # on, off, not supported
    mig = {**nvml_facts(ALL8), "mig_gpus": 8}
    assert env_on("gpu_8x", "cuda", torch_facts(1), mig).status is Status.PASS
    out = env_on("gpu_8x", "cuda", torch_facts(1), nvml_facts(ALL8))
    assert out.status is Status.FAIL and "CUDA sees 1 of the 8 GPUs this job was given" in out.reason


def test_no_gpu_on_the_bus_is_a_cpu_only_pass() -> None:
    out = env_on("no_gpu", "cpu", CPU_TORCH, NO_NVML)
    assert out.status is Status.PASS, out.reason
    assert out.reason.startswith("CPU only: this node has no GPU (torch 2.13.0+cpu; NVML not available")
    assert out.details["cpu_only"] == "this node has no GPU" and out.details["pci_gpus"] == []


def test_a_job_given_no_gpu_and_device_cpu_are_cpu_only() -> None:
    out = env_on("gpu_8x", "cpu", CPU_TORCH, nvml_facts(ALL8), {"NVIDIA_VISIBLE_DEVICES": "void"})
    assert out.status is Status.PASS, out.reason
    assert out.details["cpu_only"] == "this job was given none of the node's 8 NVIDIA GPUs " \
                                      "(NVIDIA_VISIBLE_DEVICES=void)"
    usable = env_on("gpu_8x", "cpu", torch_facts(8), nvml_facts(ALL8))
    assert usable.status is Status.PASS, usable.reason
    assert usable.reason.endswith("; CPU only: --device cpu: the node's 8 NVIDIA GPUs were not tested")


def test_amd_gpus_need_a_rocm_torch() -> None:
    assert env_on("amd_8x", "cuda", torch_facts(8, hip="6.1"), NO_NVML).status is Status.PASS
    out = env_on("amd_8x", "cuda", torch_facts(8), NO_NVML)
    assert out.status is Status.FAIL and "torch 2.4.0+cu124 is not built for ROCm" in out.reason
    assert allowed_gpus(8, {"ROCR_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0"}, "AMD") == \
        (1, "CUDA_VISIBLE_DEVICES=0")


def test_cpu_only_reason_from_the_bus_alone() -> None:
    assert cpu_only_reason(read_bus_gpus(SYSFS / "no_gpu"), {}, "auto") == "this node has no GPU"
    gpus = read_bus_gpus(SYSFS / "gpu_8x")
    assert cpu_only_reason(gpus, {}, "cpu") == "--device cpu: the node's 8 NVIDIA GPUs were not tested"
    assert cpu_only_reason(gpus, {}, "auto") == "the node's 8 NVIDIA GPUs cannot be used (see env)"
    assert cpu_only_reason(gpus, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, "auto") == \
        "this job was given none of the node's 8 NVIDIA GPUs (CUDA_VISIBLE_DEVICES=NoDevFiles)"
    assert cpu_only_reason(None, {}, "auto") == "no GPU found (the PCI bus cannot be read here)"


@pytest.mark.gpu
def test_this_gpu_node_reads_its_bus_and_passes() -> None:
    """On a real GPU node: every GPU NVML sees is on the bus with the nvidia driver bound, and env passes on it."""
    import os

    from gpuaccept.checks.env import EnvCheck, nvml_info

    gpus = read_bus_gpus("/")
    nvml = nvml_info(os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert gpus is not None and len(gpus) >= nvml["gpu_count"] > 0
    assert {g.driver for g in gpus} == {"nvidia"}
    out = EnvCheck().run(CheckContext(device="cuda", params={}, timeout_s=60))
    assert out.status is not Status.FAIL, out.reason
    assert out.details["cpu_only"] is None
