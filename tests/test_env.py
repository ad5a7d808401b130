"""The env check: parsers on sample text, cuda_compat, evaluate_env on synthetic facts, run() on this machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks.base import PROFILES, CheckContext, Outcome
from gpuaccept.checks.env import (
    CHECKS,
    EnvCheck,
    cuda_compat,
    evaluate_env,
    nvml_info,
    parse_cpu_model,
    parse_meminfo,
    parse_os_release,
    parse_version,
    tiny_kernel,
    visible_gpu_count,
)
from gpuaccept.hw.devices import nvidia_gpu_count
from gpuaccept.model import Status

OS_RELEASE = '''PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
# a comment
VERSION_ID="22.04"
ID=ubuntu
HOME_URL='https://www.ubuntu.com/'
garbage line
'''

MEMINFO = """MemTotal:       2113455688 kB
MemFree:        2050000000 kB
HugePages_Total:       0
HugePages_Size:     2048 kB
Broken:
"""

CPUINFO_X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654  96-Core Processor
processor\t: 1
model name\t: AMD EPYC 9654  96-Core Processor
"""

CPUINFO_ARM = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""


def ctx(device: str = "cpu", **kw: Any) -> CheckContext:
    return CheckContext(device=device, params=EnvCheck.defaults("quick"), profile="quick", **kw)


def metric(out: Outcome, name: str) -> float:
    return next(m.value for m in out.metrics if m.name == name)


# ---------------------------------------------------------------- parsers


def test_parse_os_release() -> None:
    d = parse_os_release(OS_RELEASE)
    assert d["PRETTY_NAME"] == "Ubuntu 22.04.4 LTS"
    assert d["ID"] == "ubuntu" and d["VERSION_ID"] == "22.04"
    assert d["HOME_URL"] == "https://www.ubuntu.com/"
    assert "# a comment" not in d and "garbage line" not in d
    assert parse_os_release("") == {}


def test_parse_meminfo() -> None:
    d = parse_meminfo(MEMINFO)
    assert d["MemTotal"] == 2113455688 * 1024
    assert d["HugePages_Total"] == 0  # a count, not kB
    assert d["HugePages_Size"] == 2048 * 1024
    assert "Broken" not in d
    assert parse_meminfo("nonsense") == {}


def test_parse_cpu_model() -> None:
    assert parse_cpu_model(CPUINFO_X86) == "AMD EPYC 9654 96-Core Processor"  # whitespace collapsed
    assert parse_cpu_model(CPUINFO_ARM) is None
    assert parse_cpu_model("Hardware\t: BCM2835\n") == "BCM2835"
    assert parse_cpu_model("model name\t:\n") is None


@pytest.mark.parametrize(("text", "parsed"), [("12.4", (12, 4)), ("12", (12, 0)), ("11.8.89", (11, 8)),
                                              (None, None), ("", None), ("cuda", None), ("12.x", None)])
def test_parse_version(text: str | None, parsed: tuple[int, int] | None) -> None:
    assert parse_version(text) == parsed


@pytest.mark.parametrize(("driver", "runtime", "status"), [
    ("12.4", "12.1", Status.PASS),
    ("12.4", "12.4", Status.PASS),
    ("13.0", "12.8", Status.PASS),
    ("12.2", "12.4", Status.WARN),   # minor version compatibility
    ("12.0", "12.8", Status.WARN),
    ("11.8", "12.1", Status.FAIL),   # major too old
    ("12.8", "13.0", Status.FAIL),
    (None, "12.4", Status.SKIP),     # no NVML
    ("12.4", None, Status.SKIP),     # CPU build of torch
    ("unsupported", "12.4", Status.SKIP),
])
def test_cuda_compat(driver: str | None, runtime: str | None, status: Status) -> None:
    got, reason = cuda_compat(driver, runtime)
    assert got == status, reason
    if status == Status.FAIL:
        assert "upgrade the driver" in reason and str(driver) in reason and str(runtime) in reason


@pytest.mark.parametrize(("driver", "runtime", "available", "kernel", "status", "says"), [
    # driver older by a major version: forward compatibility (cuda-compat) decides
    ("12.2", "12.8", True, True, Status.WARN, "minor version"),     # minor compat, whatever the kernel
    ("12.2", "13.0", True, True, Status.WARN, "cuda-compat"),       # NGC container on an older driver
    ("11.8", "12.4", True, True, Status.WARN, "/usr/local/cuda/compat"),
    ("12.2", "13.0", True, False, Status.FAIL, "tiny kernel failed"),
    ("12.2", "13.0", True, None, Status.FAIL, "no kernel was tried"),
    ("12.2", "13.0", False, None, Status.FAIL, "cannot use CUDA"),
    ("12.2", "13.0", None, None, Status.FAIL, "upgrade the driver"),
    ("12.2", "13.0", False, True, Status.FAIL, "cannot use CUDA"),  # inconsistent facts: not excused
    # driver new enough: the kernel does not change the version verdict
    ("13.0", "12.8", True, True, Status.PASS, ">="),
    ("13.0", "12.8", True, False, Status.PASS, ">="),
    (None, "13.0", True, True, Status.SKIP, "not compared"),
])
def test_cuda_compat_forward_compatibility_table(driver: str | None, runtime: str, available: bool | None,
                                                 kernel: bool | None, status: Status, says: str) -> None:
    got, reason = cuda_compat(driver, runtime, available, kernel)
    assert got == status, reason
    assert says in reason
    if status == Status.WARN and driver and driver.split(".")[0] != runtime.split(".")[0]:
        assert "cuda-compat" in reason and "forward compatibility" in reason


def test_forward_compatible_container_warns_instead_of_failing() -> None:
    tch = dict(torch_facts(cuda="13.0"), kernel_ok=True, kernel_error=None)
    out = evaluate_env(ctx("cuda", expect_gpus=8), HOST, tch, nvml_facts(driver_cuda="12.2"), None)
    assert out.status == Status.WARN, out.reason
    assert "cuda-compat" in out.reason and "12.2" in out.reason and "13.0" in out.reason


def test_kernel_failure_fails_even_with_a_new_enough_driver() -> None:
    tch = dict(torch_facts(cuda="12.4"), kernel_ok=False, kernel_error="CUDA error: no kernel image is available")
    out = evaluate_env(ctx("cuda"), HOST, tch, nvml_facts(driver_cuda="12.4"), None)
    assert out.status == Status.FAIL and "tiny kernel failed: CUDA error: no kernel image" in out.reason
    old = evaluate_env(ctx("cuda"), HOST, dict(tch, cuda="13.0"), nvml_facts(driver_cuda="12.2"), None)
    assert old.status == Status.FAIL and old.reason.count("tiny kernel failed") == 1


def test_tiny_kernel_without_cuda_is_not_known() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert tiny_kernel() == (None, None)


@pytest.mark.parametrize(("cvd", "visible"), [(None, 8), ("0,1", 2), ("", 0), ("-1", 0), ("NoDevFiles", 0),
                                              ("GPU-aaaa,GPU-bbbb,GPU-cccc", 3), ("0,1,2,3,4,5,6,7,8,9", 8),
                                              ("3", 1)])
def test_visible_gpu_count(cvd: str | None, visible: int) -> None:
    assert visible_gpu_count(8, cvd) == visible


# ---------------------------------------------------------------- evaluate_env on synthetic facts

HOST = {"host": "node01", "cpu_count": 224, "memory_total_bytes": 2 * 2**40, "python": "3.11.7"}


def torch_facts(count: int = 8, cuda: str | None = "12.4", available: bool = True) -> dict[str, Any]:
    return {"installed": True, "version": "2.4.0+cu124", "cuda": cuda, "cuda_available": available,
            "device_count": count}


def nvml_facts(count: int = 8, driver_cuda: str = "12.4") -> dict[str, Any]:
    return {"available": True, "driver_version": "550.54.15", "cuda_driver_version": driver_cuda, "gpu_count": count,
            "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(count)]}


def test_gpu_node_passes() -> None:
    out = evaluate_env(ctx("cuda", expect_gpus=8), HOST, torch_facts(), nvml_facts(), None)
    assert out.status == Status.PASS, out.reason
    assert out.reason.startswith("8x NVIDIA H100 80GB HBM3, driver 550.54.15 (CUDA 12.4), torch 2.4.0+cu124")
    assert metric(out, "gpu_count") == 8 and metric(out, "cpu_count") == 224
    assert metric(out, "host_memory_gib") == 2048
    assert next(m for m in out.metrics if m.name == "gpu_count").expected == 8


def test_expected_gpu_count_mismatch_fails() -> None:
    out = evaluate_env(ctx("cuda", expect_gpus=8), HOST, torch_facts(7), nvml_facts(7), None)
    assert out.status == Status.FAIL and out.reason == "expected 8 GPUs, found 7"


def test_torch_and_nvml_disagree_fails_on_cuda_only() -> None:
    out = evaluate_env(ctx("cuda"), HOST, torch_facts(7), nvml_facts(8), None)
    assert out.status == Status.FAIL and "NVML sees 8 GPUs" in out.reason and "torch sees 7" in out.reason
    assert evaluate_env(ctx("cpu"), HOST, torch_facts(7), nvml_facts(8), None).status == Status.PASS


def test_cuda_visible_devices_respected() -> None:
    out = evaluate_env(ctx("cuda", expect_gpus=2), HOST, torch_facts(2), nvml_facts(8), "2,5")
    assert out.status == Status.PASS, out.reason
    assert metric(out, "gpu_count") == 2 and out.details["cuda_visible_devices"] == "2,5"


def test_driver_cuda_too_old() -> None:
    warn = evaluate_env(ctx("cuda"), HOST, torch_facts(), nvml_facts(driver_cuda="12.2"), None)
    assert warn.status == Status.WARN and "minor version compatibility" in warn.reason
    fail = evaluate_env(ctx("cuda"), HOST, torch_facts(cuda="12.4"), nvml_facts(driver_cuda="11.8"), None)
    assert fail.status == Status.FAIL and "upgrade the driver" in fail.reason


def test_torch_missing() -> None:
    missing = {"installed": False, "error": "No module named 'torch'"}
    cpu = evaluate_env(ctx("cpu"), HOST, missing, {"available": False, "error": "NVML not available: x"}, None)
    assert cpu.status == Status.PASS and "torch not installed" in cpu.reason
    gpu = evaluate_env(ctx("cuda"), HOST, missing, nvml_facts(), None)
    assert gpu.status == Status.FAIL and "torch does not import" in gpu.reason


def test_cpu_torch_on_gpu_node_with_cuda_device_fails() -> None:
    out = evaluate_env(ctx("cuda"), HOST, torch_facts(0, cuda=None, available=False), nvml_facts(), None)
    assert out.status == Status.FAIL and "cannot use CUDA" in out.reason


def test_require_gpu_without_gpu_fails() -> None:
    out = evaluate_env(ctx("cpu", require_gpu=True), HOST, torch_facts(0, cuda=None, available=False),
                       {"available": False, "error": "NVML not available: NVML Shared Library Not Found"}, None)
    assert out.status == Status.FAIL and "a GPU is required" in out.reason and "Shared Library" in out.reason


def test_worst_problem_first() -> None:
    out = evaluate_env(ctx("cuda", expect_gpus=8), HOST, torch_facts(7), nvml_facts(7, driver_cuda="12.2"), None)
    assert out.status == Status.FAIL
    assert out.reason.startswith("expected 8 GPUs, found 7") and "minor version" in out.reason


def test_nvml_info_under_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_nvml import H100_SPEC, FakeNvml

    FakeNvml([dict(H100_SPEC), dict(H100_SPEC, nvmlDeviceGetName="Mystery GPU 9000")]).install(monkeypatch)
    info = nvml_info()
    assert info["available"] and info["gpu_count"] == 2 and info["cuda_driver_version"] == "12.4"
    assert [g["sku"] for g in info["gpus"]] == ["h100_sxm", None]
    assert info["gpus"][0]["pci_bus_id"] == "00000000:18:00.0"
    out = evaluate_env(ctx("cpu", expect_gpus=2), HOST, torch_facts(0, cuda=None, available=False), info, None)
    assert out.status == Status.PASS and out.reason.endswith("; CPU only: --device cpu: the GPUs were not tested") \
        and metric(out, "gpu_count") == 2
    # what identifies each GPU, and the label its metrics carry in this run
    assert [(g["device"], g["uuid"], g["serial"]) for g in info["gpus"]] == [
        ("cuda:0", "GPU-00000000-1111-2222-3333-444444444444", "1654922012345"),
        ("cuda:1", "GPU-00000000-1111-2222-3333-444444444444", "1654922012345")]


def test_gpu_labels_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_nvml import H100_SPEC, FakeNvml

    uuids = [f"GPU-00000000-1111-2222-3333-44444444444{i}" for i in range(4)]
    FakeNvml([dict(H100_SPEC, nvmlDeviceGetUUID=u, nvmlDeviceGetSerial=f"16549220{i}") for i, u in enumerate(uuids)]
             ).install(monkeypatch)
    info = nvml_info(f"{uuids[3]},2")
    assert [(g["index"], g["device"], g["serial"]) for g in info["gpus"]] == [
        (0, None, "165492200"), (1, None, "165492201"), (2, "cuda:1", "165492202"), (3, "cuda:0", "165492203")]
    assert [g["device"] for g in nvml_info("NoDevFiles")["gpus"]] == [None] * 4


def test_identity_is_recorded_and_never_judged() -> None:
    ident = {"node": {"board_serial": "unreadable", "product_name": "SYS-821GE-TNHR"},
             "nics": [{"port": "mlx5_0:1", "guid": "0xb8599f03000ca7f6", "node_guid": None}]}
    out = evaluate_env(ctx("cuda", expect_gpus=8), HOST, torch_facts(), nvml_facts(), None, ident)
    assert out.status == Status.PASS and out.details["identity"] == ident
    assert "identity" not in evaluate_env(ctx("cuda"), HOST, torch_facts(), nvml_facts(), None).details


# ---------------------------------------------------------------- this machine

no_gpu = pytest.mark.skipif(nvidia_gpu_count() > 0, reason="this machine has a GPU")


@no_gpu
def test_run_on_cpu_machine() -> None:
    import torch

    out = EnvCheck().run(ctx("cpu"))
    assert out.status == Status.PASS, out.reason
    assert out.reason.startswith(f"CPU only: this node has no GPU (torch {torch.__version__}; NVML not available: ")
    assert out.details["cpu_only"] == "this node has no GPU" and out.details["pci_gpus"] == []
    assert metric(out, "gpu_count") == 0
    assert metric(out, "cpu_count") == os.cpu_count()
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kib = int(next(line.split()[1] for line in meminfo if line.startswith("MemTotal:")))
    assert metric(out, "host_memory_gib") == pytest.approx(mem_kib / 2**20, abs=0.01)
    d = out.details
    assert d["python"] == platform.python_version()
    assert d["torch"]["version"] == torch.__version__ and d["torch"]["cuda"] == torch.version.cuda
    assert d["kernel"] == platform.release() and d["host"]
    assert d["nvml"]["available"] is False
    assert set(d["identity"]) == {"node", "nics"} and "board_serial" in d["identity"]["node"]
    assert d["os"]  # PRETTY_NAME or platform string
    assert {m.unit for m in out.metrics} == {"count", "GiB"}


@no_gpu
def test_run_expecting_gpus_on_cpu_machine_fails() -> None:
    out = EnvCheck().run(ctx("cpu", expect_gpus=8))
    assert out.status == Status.FAIL and out.reason.startswith("expected 8 GPUs, found 0")


@no_gpu
def test_run_cuda_device_on_cpu_machine_fails() -> None:
    out = EnvCheck().run(ctx("cuda"))
    assert out.status == Status.FAIL and "cannot use CUDA" in out.reason


def test_check_declaration() -> None:
    assert CHECKS == (EnvCheck,)
    assert EnvCheck.name == "env" and EnvCheck.tag == "ENV" and EnvCheck.key_metric == "gpu_count"
    for profile in PROFILES:
        assert EnvCheck.defaults(profile) == {"pci_root": "/"} and EnvCheck.timeout_s[profile] > 0


def test_check_modules_do_not_import_torch() -> None:
    code = ("import sys, gpuaccept.checks.env, gpuaccept.checks.health, gpuaccept.hw.nvml; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.gpu
def test_tiny_kernel_runs_on_gpu() -> None:
    assert tiny_kernel() == (True, None)


@pytest.mark.gpu
def test_run_on_gpu() -> None:
    import torch

    out = EnvCheck().run(ctx("cuda"))
    assert out.status in (Status.PASS, Status.WARN), out.reason
    assert metric(out, "gpu_count") == torch.cuda.device_count()
    assert out.details["torch"]["cuda_available"] is True
    assert out.details["torch"]["kernel_ok"] is True, out.details["torch"].get("kernel_error")
    assert out.details["nvml"]["available"] is True and out.details["nvml"]["gpus"]
    # every GPU torch sees is named by its NVML UUID under the label its metrics carry
    from gpuaccept.checks.collectives_expect import nvml_uuid

    labelled = {g["device"]: g["uuid"] for g in out.details["nvml"]["gpus"] if g["device"]}
    assert labelled == {f"cuda:{i}": nvml_uuid(torch.cuda.get_device_properties(i))
                        for i in range(torch.cuda.device_count())}
