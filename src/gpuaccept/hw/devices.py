"""Device resolution that never imports torch in the parent process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def nvidia_gpu_count() -> int:
    """Number of NVIDIA GPUs the driver sees (``nvidia-smi -L | wc -l``).

    Uses NVML when it loads, else counts ``/proc/driver/nvidia/gpus``; 0 when
    neither is present. Cheap: no torch import.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing, no driver, or an NVML error: fall back
        proc = Path("/proc/driver/nvidia/gpus")
        return len(list(proc.iterdir())) if proc.is_dir() else 0


def resolve_device(requested: str) -> str:
    """``auto`` becomes ``cuda`` when the driver sees a GPU and CUDA_VISIBLE_DEVICES
    does not hide them all, else ``cpu``. ``cuda`` and ``cpu`` are returned as given."""
    if requested != "auto":
        return requested
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return "cpu"
    return "cuda" if nvidia_gpu_count() > 0 else "cpu"


def torch_devices(ctx_device: str, gpus: list[int] | None) -> list[Any]:
    """The torch devices a check should use: ``cuda:i`` for each selected GPU, or ``cpu``.

    Raises RuntimeError with a clear message when CUDA was asked for but
    torch cannot use it. Imports torch.
    """
    import torch

    if ctx_device == "cpu":
        return [torch.device("cpu")]
    if not torch.cuda.is_available():
        raise RuntimeError(f"CUDA requested but torch {torch.__version__} cannot use it "
                           f"(torch.version.cuda={torch.version.cuda})")
    count = torch.cuda.device_count()
    selected = list(range(count)) if gpus is None else gpus
    bad = [i for i in selected if i < 0 or i >= count]
    if bad:
        raise RuntimeError(f"GPU index {bad[0]} does not exist: torch sees {count} GPU(s)")
    return [torch.device("cuda", i) for i in selected]
