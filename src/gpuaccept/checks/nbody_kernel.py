"""The fused n-body force kernel: one expression over all body pairs, compiled once per process.

:func:`fused_accelerations` is the softened all-pairs law of
:mod:`gpuaccept.checks.nbody` written as one torch expression, so that
``torch.compile`` (inductor) turns it into a single reduction kernel: on a GPU
a Triton kernel in which each program keeps a block of bodies ``i`` in
registers and streams blocks of bodies ``j`` through them (the tiling of the
CUDA sample ``nbody -benchmark``), on a CPU a vectorized C++ loop. No
``N x N`` temporary is ever written, so it is bound by arithmetic, not memory.
The eager fallback (:func:`gpuaccept.checks.nbody.accelerations`) runs where no
compiler is available. torch is imported inside functions only.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuaccept.errors import GpuacceptError

if TYPE_CHECKING:
    import torch

KERNELS = ("auto", "compiled", "eager")
RECOMPILE_LIMIT = 64  # one specialization per (device, N, dtype): 8 GPUs x 2 sizes x 2 dtypes fits
_CXX = ("c++", "g++", "clang++")


class KernelUnavailable(GpuacceptError):
    """The compiled kernel was asked for and cannot be built here."""


def fused_accelerations(pos: torch.Tensor, mass: torch.Tensor, softening2: float) -> torch.Tensor:
    """Softened acceleration ``(3, N)`` of every body from positions ``(3, N)`` and masses ``(N,)``.

    ``a_i = sum_j m_j r_ij / (|r_ij|^2 + eps^2)^(3/2)`` with ``r_ij = x_j - x_i``,
    as ``rsqrt`` cubed like the CUDA sample. Eagerly this materializes ``N x N``
    tensors; it is meant to be compiled (:func:`compiled_accelerations`).
    """
    import torch

    x, y, z = pos[0], pos[1], pos[2]
    dx = x[None, :] - x[:, None]
    dy = y[None, :] - y[:, None]
    dz = z[None, :] - z[:, None]
    inv = torch.rsqrt(dx * dx + dy * dy + dz * dz + softening2)
    w = mass[None, :] * (inv * inv * inv)
    return torch.stack(((dx * w).sum(1), (dy * w).sum(1), (dz * w).sum(1)))


@functools.lru_cache(maxsize=1)
def compiled_accelerations() -> Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]:
    """:func:`fused_accelerations` under ``torch.compile`` (one object per process; it compiles on first call
    for each device, size and dtype, and inductor's on-disk cache makes later processes faster)."""
    import torch
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed in torch 2.6
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(RECOMPILE_LIMIT, int(getattr(dynamo_config, name))))
    fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = torch.compile(
        fused_accelerations, dynamic=False, fullgraph=True)
    return fn


def compiler_missing(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot build a kernel for ``device`` (None when it should)."""
    if device.type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:
            return "this torch has no Triton support"
        return None if has_triton() else "Triton is not installed"
    if device.type == "cpu":
        import os

        cxx = os.environ.get("CXX")
        found = shutil.which(cxx) if cxx else next((c for c in _CXX if shutil.which(c)), None)
        return None if found else f"no C++ compiler ({cxx or ', '.join(_CXX)}) for inductor"
    return f"no fused kernel for {device.type}"


@dataclass
class Kernel:
    """The accelerations function a run uses, which path it is, and why (``note``)."""

    path: str  # "compiled" or "eager"
    note: str
    fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None  # None: the eager chunked path
    compile_s: float = 0.0  # seconds of the untimed first calls that compiled it
    strict: bool = False  # a failed compilation raises (True) or falls back to eager (False)

    def prepare(self, device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...], softening2: float) -> Kernel:
        """Compile for each of ``sizes`` bodies by calling once (untimed), adding to ``compile_s``.

        ``softening2`` must be the value the runs pass: dynamo specializes on a
        Python float, so another value would compile again, outside ``compile_s``.
        Returns this kernel, or an eager one whose note says why compilation
        failed (:class:`KernelUnavailable` when ``strict``).
        """
        if self.fn is None:
            return self
        import torch

        for n in dict.fromkeys(sizes):
            pos = torch.rand(3, n, device=device, dtype=dtype)
            mass = torch.full((n,), 1.0 / n, device=device, dtype=dtype)
            t0 = time.perf_counter()
            try:
                self.fn(pos, mass, softening2)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except Exception as exc:  # inductor, Triton and C++ compiler errors have no common base
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                why = f"torch.compile failed on {device}: {type(exc).__name__}: {first}"
                if self.strict:
                    raise KernelUnavailable(why) from exc
                return eager_kernel(f"eager kernel, memory-bound ({why})")
            finally:
                self.compile_s += time.perf_counter() - t0
        return self


def eager_kernel(note: str) -> Kernel:
    return Kernel("eager", note, None)


def choose_kernel(device: torch.device, mode: str) -> Kernel:
    """The kernel for ``mode`` (``auto``, ``compiled``, ``eager``) on ``device``, before any compilation.

    ``auto`` falls back to eager when no compiler is found; ``compiled`` raises
    :class:`KernelUnavailable` then.
    """
    if mode not in KERNELS:
        raise ValueError(f"kernel {mode!r} is not one of {', '.join(KERNELS)}")
    if mode == "eager":
        return eager_kernel("eager kernel (asked for)")
    why = compiler_missing(device)
    if why:
        if mode == "compiled":
            raise KernelUnavailable(f"torch.compile cannot run on {device}: {why}")
        return eager_kernel(f"eager kernel, memory-bound ({why})")
    return Kernel("compiled", "fused kernel (torch.compile)", compiled_accelerations(), strict=mode == "compiled")


