"""Checks for the tests of the warm process (loaded through GPUACCEPT_PLUGINS or a test's registry).

``leaky`` changes every piece of process-wide state it can reach; ``probe`` (and ``probe2``, the
same under another name) reports that state, and who forked it, in its details; ``segv`` and
``exits`` end their process without a result, a segfault and an ``os._exit``; ``stuck`` hangs the
warm process before it forks; ``cuda_kernel`` runs a CUDA kernel (GPU only).
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

from gpuaccept.checks.base import Check, CheckContext, Outcome
from gpuaccept.model import Metric

#: a module global that ``leaky`` changes
MARK = "clean"


def _handler_name(sig: signal.Signals) -> str:
    handler = signal.getsignal(sig)
    return getattr(handler, "__name__", str(handler))


def process_state() -> dict[str, Any]:
    """What a check process inherits: compared between a forked and a freshly started one."""
    import torch

    cuda_initialized = torch.cuda.is_initialized()  # first: nothing here has touched CUDA yet
    return {
        "cuda_initialized": cuda_initialized,
        "env_leak": os.environ.get("GPUACCEPT_TEST_LEAK"),
        "cwd": os.getcwd(),
        "sys_path_leak": "/leaked" in sys.path,
        "mark": MARK,
        "sigterm": _handler_name(signal.SIGTERM),
        "sigint": _handler_name(signal.SIGINT),
        "sigchld": _handler_name(signal.SIGCHLD),
        "sigpipe": _handler_name(signal.SIGPIPE),
        "torch_threads": torch.get_num_threads(),
        "torch_seed": torch.initial_seed(),
        "torch_random": float(torch.rand(1).item()),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


class Probe(Check):
    name = "probe"
    tag = "ENV"
    summary = "reports its process's inherited state and its parent"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        state = process_state()
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        import numpy

        return Outcome.passed("probed", [Metric("probe_value", 1.0, "x", "cpu")], state=state, pid=os.getpid(),
                              parent=parent, random=random.random(), numpy_random=float(numpy.random.random()))


class Probe2(Probe):
    name = "probe2"


class Leaky(Check):
    name = "leaky"
    tag = "ENV"
    summary = "changes every piece of process-wide state it can reach, then passes"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        import numpy
        import torch

        global MARK
        os.environ["GPUACCEPT_TEST_LEAK"] = "leaked"
        os.environ["OMP_NUM_THREADS"] = "7"
        os.chdir("/")
        sys.path.append("/leaked")
        MARK = "leaked"
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN if sig != signal.SIGPIPE else signal.SIG_DFL)
        torch.set_num_threads(1)
        torch.manual_seed(1234)
        torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
        torch.set_float32_matmul_precision("medium")
        torch.use_deterministic_algorithms(True)
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        random.seed(1)
        numpy.random.seed(1)
        return Outcome.passed("changed what it could", [Metric("leaky_value", 1.0, "x", "cpu")],
                              state=process_state())


class Segv(Check):
    name = "segv"
    tag = "TRAIN"
    summary = "segfaults"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        print("about to segfault", flush=True)
        ctypes.string_at(0)
        return Outcome.passed("unreachable", [])


class Exits(Check):
    name = "exits"
    tag = "TRAIN"
    summary = "leaves with os._exit(3) before returning"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        print("leaving early", flush=True)
        os._exit(3)


class Stuck(Check):
    """Its warm import never ends, so the warm process hangs before it can fork the check."""

    name = "stuck"
    tag = "TRAIN"
    summary = "the warm process hangs importing what it asks for"
    profiles = ()
    warm_imports = ("tests.plugins.hang_import",)

    def run(self, ctx: CheckContext) -> Outcome:
        return Outcome.passed("started", [])


class CudaKernel(Check):
    """Runs one CUDA kernel in its process: where the warm process had started the CUDA driver before
    forking (``cuInit``, which ``torch.cuda.is_available()`` runs, unlike ``is_initialized``), it fails."""

    name = "cuda_kernel"
    tag = "ENV"
    summary = "runs a tiny CUDA kernel"
    profiles = ()
    warm_imports = ("torch._dynamo",)  # as train and ddp_train ask the warm process to import

    def run(self, ctx: CheckContext) -> Outcome:
        import torch

        from gpuaccept.checks.env import tiny_kernel

        before = torch.cuda.is_initialized()
        ok, error = tiny_kernel()
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if not ok:
            return Outcome.failed(f"no CUDA kernel ran here: {error or 'CUDA not available'}", parent=parent)
        return Outcome.passed("a CUDA kernel ran", [Metric("cuda_kernel_ok", 1.0, "bool", "cuda:0")],
                              parent=parent, cuda_initialized_before=before)


CHECKS = (Probe, Probe2, Leaky, Segv, Exits, Stuck, CudaKernel)
