"""Device resolution that never imports torch in the parent process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HIDDEN_CVD = ("", "-1", "none", "NoDevFiles")
"""``CUDA_VISIBLE_DEVICES`` values that hide every GPU (Slurm writes ``NoDevFiles`` for a job given none)."""


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


def visible_count(total: int, cuda_visible_devices: str | None) -> int:
    """How many CUDA devices a process sees of ``total`` GPUs under ``cuda_visible_devices`` (None: unset, all).

    Each listed GPU (index or ``GPU-`` UUID) counts once, at most ``total``; ``MIG-`` entries count
    one in all, as a CUDA process enumerates a single MIG instance (NVIDIA's MIG user guide,
    "CUDA_VISIBLE_DEVICES").
    """
    if cuda_visible_devices is None:
        return total
    if cuda_visible_devices.strip() in HIDDEN_CVD:
        return 0
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    mig = sum(1 for e in entries if e.lower().startswith("mig-"))
    return min(len(entries) - mig, total) + (1 if mig and total > 0 else 0)


def visible_gpu_count(env: Mapping[str, str]) -> int:
    """The GPUs a process started with ``env`` sees: the driver's count (:func:`nvidia_gpu_count`)
    narrowed by its ``CUDA_VISIBLE_DEVICES`` (``python -c "import torch; print(torch.cuda.device_count())"``).
    MIG on without ``CUDA_VISIBLE_DEVICES`` is not seen here: NVML's count of physical GPUs is used."""
    return visible_count(nvidia_gpu_count(), env.get("CUDA_VISIBLE_DEVICES"))


def resolve_device(requested: str) -> str:
    """``auto`` becomes ``cuda`` when the driver sees a GPU and CUDA_VISIBLE_DEVICES
    does not hide them all, else ``cpu``. ``cuda`` and ``cpu`` are returned as given."""
    if requested != "auto":
        return requested
    return "cuda" if visible_gpu_count(os.environ) > 0 else "cpu"


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
