"""The ``env`` check: what this node is (host, OS, CPU, memory, Python, torch, driver, GPUs).

Everything found goes into ``details`` for the report, with what identifies the hardware (the
history keeps results under it, :mod:`gpuaccept.results.hwid`): each GPU's UUID, serial and the
``cuda:N`` label it has in this run (``details.nvml.gpus``), the node's DMI board and product
names and serials (``details.identity.node``; ``"unreadable"`` where only root may read them) and
each RDMA port's GUID (``details.identity.nics``). The verdicts are the the verdicts are the
driver/CUDA compatibility (:func:`cuda_compat`, which a tiny kernel informs), the expected GPU count
(``--expect-gpus``), NVML and torch agreeing on the GPU count, and
``--require-gpu``.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import PROFILES, Check, CheckContext, Outcome, Param, ThresholdRule
from gpuaccept.hw.devices import visible_count
from gpuaccept.hw.pcigpu import BusGpu, judge_bus, read_bus_gpus
from gpuaccept.model import Metric, Status, worst


def parse_os_release(text: str) -> dict[str, str]:
    """Key/value pairs of ``/etc/os-release`` (quotes removed, comments skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1].replace('\\"', '"')
        out[key.strip()] = value
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per key (``MemTotal: 24683656 kB`` -> 25276063744); counts stay counts."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts or not parts[0].isdigit():
            continue
        value = int(parts[0])
        if len(parts) > 1 and parts[1].lower() == "kb":
            value *= 1024
        out[key.strip()] = value
    return out


def parse_cpu_model(text: str) -> str | None:
    """The CPU model from ``/proc/cpuinfo`` (``model name`` on x86, ``Model name``/``Hardware`` elsewhere)."""
    for key in ("model name", "Model name", "cpu model", "Hardware", "Processor"):
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return " ".join(value.split())
    return None


def parse_version(v: str | None) -> tuple[int, int] | None:
    """``"12.4"`` -> (12, 4); ``"12"`` -> (12, 0); None or garbage -> None."""
    if not v:
        return None
    parts = v.strip().split(".")
    try:
        major = int(parts[0])
        minor = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    except ValueError:
        return None
    return major, minor


COMPAT_PACKAGE = "cuda-compat"
COMPAT_DIR = "/usr/local/cuda/compat"


def cuda_compat(driver_cuda: str | None, torch_cuda: str | None, cuda_available: bool | None = None,
                kernel_ok: bool | None = None) -> tuple[Status, str]:
    """Can this driver run torch's CUDA runtime? (``nvidia-smi`` "CUDA Version" vs ``torch.version.cuda``).

    ``cuda_available`` is ``torch.cuda.is_available()`` and ``kernel_ok`` whether a
    tiny kernel ran (None: not known). The table, driver vs runtime version:

    * either unknown: SKIP (not judged);
    * driver newer or equal: PASS;
    * same major, older minor: WARN (minor version compatibility runs it, but
      features needing the newer driver, e.g. JIT of newer PTX, are unavailable);
    * older major, CUDA available and a kernel ran: WARN, forward compatibility
      (the ``cuda-compat`` package, ``/usr/local/cuda/compat``, as NGC containers
      ship it for datacenter GPUs) supplies the newer user-mode driver;
    * older major otherwise: FAIL (the runtime refuses to start, or its kernels fail).
    """
    drv, rt = parse_version(driver_cuda), parse_version(torch_cuda)
    if drv is None or rt is None:
        return Status.SKIP, f"driver CUDA {driver_cuda or 'unknown'}, torch CUDA {torch_cuda or 'none'}: not compared"
    if drv >= rt:
        return Status.PASS, f"driver CUDA {driver_cuda} >= torch CUDA {torch_cuda}"
    if drv[0] == rt[0]:
        return Status.WARN, (f"driver CUDA {driver_cuda} < torch CUDA {torch_cuda}: minor version "
                             f"compatibility, some features unavailable")
    if cuda_available and kernel_ok:
        return Status.WARN, (f"driver CUDA {driver_cuda} < torch CUDA {torch_cuda}, but CUDA works: forward "
                             f"compatibility through the {COMPAT_PACKAGE} package ({COMPAT_DIR}; datacenter GPUs "
                             f"only); upgrade the driver to leave it")
    if cuda_available and kernel_ok is False:
        why = "torch reports CUDA available but a tiny kernel failed"
    elif cuda_available:
        why = "torch reports CUDA available but no kernel was tried"
    else:
        why = "torch cannot use CUDA"
    return Status.FAIL, (f"driver supports CUDA {driver_cuda} < torch's CUDA {torch_cuda} runtime ({why}): "
                         f"upgrade the driver, or install the {COMPAT_PACKAGE} package matching torch's CUDA "
                         f"on a datacenter GPU")


def tiny_kernel() -> tuple[bool | None, str | None]:
    """Run one small kernel on the current CUDA device (``python -c "import torch; torch.ones(1,device='cuda')+1"``).

    (True, None) when it ran and gave the right answer, (False, error) when not,
    (None, None) when torch or CUDA is not available. Imports torch.
    """
    try:
        import torch
    except ImportError:
        return None, None
    try:
        if not torch.cuda.is_available():
            return None, None
        got = float((torch.ones(4, device="cuda") * 2 + 1).sum().item())
    except Exception as exc:  # a driver/runtime mismatch surfaces here as a RuntimeError
        return False, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (True, None) if got == 12.0 else (False, f"wrong result {got} (expected 12)")


def visible_gpu_count(nvml_count: int, cuda_visible_devices: str | None) -> int:
    """How many of ``nvml_count`` GPUs CUDA can see under ``CUDA_VISIBLE_DEVICES`` (unset: all)."""
    return visible_count(nvml_count, cuda_visible_devices)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _cudnn_text(v: int | None) -> str | None:
    """cuDNN's integer version (90100 -> "9.1.0"; 8902 -> "8.9.2")."""
    if not v:
        return None
    if v >= 10000:
        return f"{v // 10000}.{(v // 100) % 100}.{v % 100}"
    return f"{v // 1000}.{(v // 100) % 10}.{v % 100}"


def torch_info() -> dict[str, Any]:
    """torch, CUDA runtime, cuDNN and NCCL versions and torch's GPU count (``python -m torch.utils.collect_env``).

    When CUDA is available, ``kernel_ok``/``kernel_error`` say whether :func:`tiny_kernel` ran.

    ``{"installed": False, "error": ...}`` when torch does not import.
    """
    try:
        import torch
    except ImportError as exc:
        return {"installed": False, "error": str(exc)}
    info: dict[str, Any] = {"installed": True, "version": torch.__version__, "cuda": torch.version.cuda,
                            "hip": getattr(torch.version, "hip", None)}
    try:
        info["cudnn"] = _cudnn_text(torch.backends.cudnn.version())
    except Exception as exc:  # a broken cuDNN install raises here
        info["cudnn"] = None
        info["cudnn_error"] = str(exc)
    try:
        nccl = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # CPU builds have no NCCL
        info["nccl"] = None
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        info["device_count"] = int(torch.cuda.device_count())
    except Exception as exc:
        info["cuda_available"], info["device_count"], info["cuda_error"] = False, 0, str(exc)
    if info["cuda_available"]:
        info["kernel_ok"], info["kernel_error"] = tiny_kernel()
    return info


def host_info() -> dict[str, Any]:
    """Host, OS, kernel, CPU and memory (``hostnamectl``, ``lscpu``, ``free -b``)."""
    os_release = parse_os_release(_read("/etc/os-release"))
    mem = parse_meminfo(_read("/proc/meminfo"))
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "host": socket.gethostname(),
        "os": os_release.get("PRETTY_NAME") or platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": parse_cpu_model(_read("/proc/cpuinfo")) or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count() or 0,
        "cpu_affinity": affinity,
        "memory_total_bytes": mem.get("MemTotal"),
        "python": platform.python_version(),
        "python_executable": sys.executable,
    }


def nvml_info(cuda_visible_devices: str | None = None) -> dict[str, Any]:
    """Driver versions and GPU list from NVML
    (``nvidia-smi --query-gpu=index,name,uuid,serial,pci.bus_id,memory.total``).

    Each GPU's ``device`` is its ``cuda:N`` label under ``cuda_visible_devices`` (None: hidden from CUDA).
    """
    from gpuaccept.errors import InputError
    from gpuaccept.hw.gpumap import NvmlGpuId, device_labels
    from gpuaccept.hw.nvml import UNSUPPORTED, NvmlUnavailable, read_snapshot

    try:
        snap = read_snapshot()
    except (NvmlUnavailable, InputError) as exc:
        return {"available": False, "error": str(exc)}
    labels = device_labels(cuda_visible_devices, [
        NvmlGpuId(g.index, g.uuid if g.uuid != UNSUPPORTED else "", g.pci_bus_id if g.pci_bus_id != UNSUPPORTED
                  else "") for g in snap.gpus])
    return {
        "available": True,
        "mig_gpus": _mig_gpus(),
        "driver_version": snap.driver_version,
        "nvml_version": snap.nvml_version,
        "cuda_driver_version": snap.cuda_driver_version,
        "gpu_count": snap.gpu_count,
        "gpus": [{"index": g.index, "device": labels.get(g.index), "name": g.name, "uuid": g.uuid,
                  "serial": g.serial, "pci_bus_id": g.pci_bus_id, "memory_total_bytes": g.memory_total_bytes,
                  "sku": _sku_id(g.name)} for g in snap.gpus],
    }


def _mig_gpus() -> int | None:
    """How many GPUs have MIG on (``nvidia-smi --query-gpu=mig.mode.current``); None when NVML cannot say."""
    from gpuaccept.hw.nvml import NvmlUnavailable, open_nvml
    from gpuaccept.hw.nvml_ext import mig_enabled

    try:
        nvml = open_nvml()
    except NvmlUnavailable:
        return None
    try:
        modes = [mig_enabled(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    except nvml.NVMLError:
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return sum(1 for m in modes if m)


def identity_info(root: str = "/") -> dict[str, Any]:
    """What identifies this node and its RDMA ports: DMI names and serials (``dmidecode -s
    baseboard-serial-number``; ``"unreadable"`` or ``"absent"`` where they cannot be read) and
    each port's GUID (``ibstat``)."""
    from gpuaccept.hw.identity import read_nic_identities, read_node_identity

    return {"node": read_node_identity(root), "nics": read_nic_identities(root)}


def _sku_id(name: str) -> str | None:
    """The ``skus.yaml`` id of a GPU name (None when unknown or the SKU table is unreadable)."""
    from gpuaccept.errors import GpuacceptError

    try:
        from gpuaccept.hw.sku import match_sku

        sku = match_sku(name)
    except (ImportError, OSError, GpuacceptError):
        return None
    return sku.id if sku is not None else None


def evaluate_env(ctx: CheckContext, host: dict[str, Any], tch: dict[str, Any], nvml: dict[str, Any],
                 cuda_visible_devices: str | None, identity: dict[str, Any] | None = None, *,
                 bus: list[BusGpu] | None = None, env: Mapping[str, str] | None = None) -> Outcome:
    """The env verdicts from collected facts (``tch``: :func:`torch_info`, ``nvml``: :func:`nvml_info`,
    ``identity``: :func:`identity_info`, recorded as it is and never judged; ``bus``: the GPUs on the PCI
    bus, :func:`gpuaccept.hw.pcigpu.read_bus_gpus`, None when not read; ``env``: the process environment,
    default ``CUDA_VISIBLE_DEVICES`` alone). GPUs on the bus that this job may use but cannot are a FAIL
    whatever the device (:func:`gpuaccept.hw.pcigpu.judge_bus`); a run that uses no GPU says "CPU only" and why.

    Pure, so every branch is testable on any machine.
    """
    cuda = ctx.device == "cuda"
    nvml_count = int(nvml["gpu_count"]) if nvml.get("available") else None
    torch_count = int(tch.get("device_count", 0)) if tch.get("installed") else None
    if nvml_count is not None:
        gpu_count = visible_gpu_count(nvml_count, cuda_visible_devices)
    else:
        gpu_count = torch_count or 0
    if env is None:
        env = {} if cuda_visible_devices is None else {"CUDA_VISIBLE_DEVICES": cuda_visible_devices}
    on_bus = judge_bus(bus, nvml, tch, env, ctx.device, ctx.expect_gpus)
    problems: list[tuple[Status, str]] = list(on_bus.problems)

    if ctx.expect_gpus is not None and gpu_count != ctx.expect_gpus:
        problems.append((Status.FAIL, f"expected {ctx.expect_gpus} GPUs, found {gpu_count}"))
    if ctx.require_gpu and gpu_count == 0:
        why = nvml.get("error") or "the driver sees none"
        problems.append((Status.FAIL, f"no GPU found but a GPU is required ({why})"))
    if cuda and not on_bus.problems:  # the bus's verdict already names why torch cannot use the GPUs
        if not tch.get("installed"):
            problems.append((Status.FAIL, f"device is cuda but torch does not import: {tch.get('error')}"))
        elif not tch.get("cuda_available"):
            problems.append((Status.FAIL, f"device is cuda but torch {tch.get('version')} cannot use CUDA "
                                          f"(torch.version.cuda={tch.get('cuda')})"))
        elif nvml_count is not None and torch_count != gpu_count and not (nvml.get("mig_gpus") and torch_count):
            # with MIG on, CUDA enumerates a single MIG instance per process: NVML's GPU count is not CUDA's
            problems.append((Status.FAIL, f"NVML sees {gpu_count} GPUs (CUDA_VISIBLE_DEVICES applied) "
                                          f"but torch sees {torch_count}"))
    compat_status, compat_reason = cuda_compat(nvml.get("cuda_driver_version") if nvml.get("available") else None,
                                               tch.get("cuda"), tch.get("cuda_available"), tch.get("kernel_ok"))
    if tch.get("kernel_ok") is False and compat_status != Status.FAIL:
        problems.append((Status.FAIL, f"torch reports CUDA available but a tiny kernel failed: "
                                      f"{tch.get('kernel_error')}"))
    if compat_status in (Status.FAIL, Status.WARN):
        problems.append((compat_status, compat_reason))

    metrics = [
        Metric("gpu_count", float(gpu_count), "count", expected=(float(ctx.expect_gpus)
                                                                 if ctx.expect_gpus is not None else None)),
        Metric("cpu_count", float(host.get("cpu_count") or 0), "count"),
    ]
    if bus is not None:  # lspci -d ::0300 -d ::0302 -d ::0380, NVIDIA and AMD
        metrics.append(Metric("pci_gpu_count", float(len(bus)), "count"))
    if host.get("memory_total_bytes"):
        metrics.append(Metric("host_memory_gib", round(host["memory_total_bytes"] / 2**30, 2), "GiB"))
    details: dict[str, Any] = {**host, "torch": tch, "nvml": nvml, "cuda_visible_devices": cuda_visible_devices,
                               "cuda_compat": compat_reason, "cpu_only": on_bus.cpu_only,
                               "pci_gpus": None if bus is None else [g.to_dict() for g in bus]}
    if identity is not None:
        details["identity"] = identity
    torch_text = f"torch {tch['version']}" if tch.get("installed") else "torch not installed"
    if problems:
        status = worst(*(s for s, _ in problems))
        ordered = sorted(problems, key=lambda p: -p[0].severity)
        return Outcome(status, "; ".join(m for _, m in ordered), metrics, details)
    if gpu_count == 0:
        why = on_bus.cpu_only or "no GPU"
        nv = "" if nvml_count is not None else f"; {nvml.get('error')}"
        return Outcome(Status.PASS, f"CPU only: {why} ({torch_text}{nv})", metrics, details)
    names = sorted({str(g["name"]) for g in nvml.get("gpus", [])}) or ["GPU"]
    reason = (f"{gpu_count}x {'/'.join(names)}, driver {nvml.get('driver_version')} "
              f"(CUDA {nvml.get('cuda_driver_version')}), {torch_text}")
    if tch.get("cuda"):
        reason += f" (CUDA {tch['cuda']})"
    if not cuda:
        reason += f"; CPU only: {on_bus.cpu_only or 'device cpu'}"
    return Outcome(Status.PASS, reason, metrics, details)


class EnvCheck(Check):
    """Records the software and hardware environment and checks the GPU count and driver/CUDA match."""

    name = "env"
    tag = "ENV"
    measures = False  # it takes stock; a run in which only env passed measured nothing
    summary = ("host, OS, CPU, memory, Python/torch/CUDA/cuDNN/NCCL, driver, GPU inventory; GPU UUIDs and serials, "
               "board serial and RDMA port GUIDs")
    params: ClassVar[tuple[Param, ...]] = (
        Param("pci_root", "str", "/", "filesystem root under which the GPUs on the PCI bus are read "
                                      "(<root>/sys/bus/pci/devices; a recorded tree in tests)"),
    )
    profiles: ClassVar[tuple[str, ...]] = PROFILES  # burnin too: the inventory and health around a long load
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {p: {} for p in PROFILES}
    thresholds: ClassVar[tuple[ThresholdRule, ...]] = ()
    timeout_s: ClassVar[dict[str, float]] = {"quick": 60.0, "standard": 60.0, "full": 120.0, "burnin": 120.0}
    key_metric = "gpu_count"
    metrics = ("gpu_count", "cpu_count", "host_memory_gib", "pci_gpu_count")
    imports_beside = True  # takes stock; a tiny kernel, not timed

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.env(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return evaluate_env(ctx, host_info(), torch_info(), nvml_info(visible), visible, identity_info(),
                            bus=read_bus_gpus(str(ctx.params.get("pci_root", "/"))), env=os.environ)


CHECKS = (EnvCheck,)
