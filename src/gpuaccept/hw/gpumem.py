"""Total memory of the GPUs a run selects, read through NVML before anything runs (no torch).

``gpuaccept run`` compares the GPU buffer sizes a configuration asks for with
these totals (:func:`gpuaccept.node.suite.check_gpu_fit`). The GPUs are the torch
ordinals of ``--gpus`` mapped through ``CUDA_VISIBLE_DEVICES`` by UUID
(:mod:`gpuaccept.hw.gpumap`), so a job given GPUs 4-7 reads GPUs 4-7; a MIG
instance reports its own memory, not its parent GPU's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from gpuaccept.hw.gpumap import VisibleGpu, map_visible_devices, select_ordinals
from gpuaccept.hw.nvml import NvmlUnavailable, inventory, open_nvml

MIB = 1 << 20


@dataclass(frozen=True)
class GpuMemory:
    """One selected GPU: ``device`` its torch label (``cuda:0``), ``name`` as NVML says it, ``total_mib``
    its total memory in MiB (None: NVML could not tell)."""

    device: str
    name: str
    total_mib: int | None


def read_gpu_memory(visible: str | None, ordinals: list[int] | None) -> list[GpuMemory]:
    """The memory of the GPUs torch will see as ``cuda:<ordinal>`` (``ordinals``: ``--gpus``; None: all)
    under ``CUDA_VISIBLE_DEVICES=visible`` (None: unset), in one NVML session.

    Raises :class:`NvmlUnavailable` when NVML cannot load or count GPUs and
    InputError for an ordinal that is not visible. A GPU whose handle or
    memory cannot be read has ``total_mib`` None.
    """
    pynvml = open_nvml()
    try:
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML not available: cannot count GPUs: {exc}") from exc
        inv = inventory(pynvml, count, with_mig="mig-" in (visible or "").lower())
        return [_memory(pynvml, v) for v in select_ordinals(map_visible_devices(visible, inv), ordinals)]
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _memory(nvml: Any, gpu: VisibleGpu) -> GpuMemory:
    """``gpu``'s name and total memory, opened by its MIG or GPU UUID (by NVML index when it has none)."""
    try:
        uuid = gpu.mig_uuid or gpu.uuid
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except (nvml.NVMLError, AttributeError):
        return GpuMemory(gpu.device, f"NVML GPU {gpu.index}", None)
    try:
        name = nvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
    except (nvml.NVMLError, AttributeError):
        name = f"NVML GPU {gpu.index}"
    return GpuMemory(gpu.device, name, total // MIB)
