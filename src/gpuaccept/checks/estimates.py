"""Rough run times of the built-in checks, for ``gpuaccept run --budget`` (pure; seconds).

Each function takes a check's parameter values, the device (``cuda`` or ``cpu``) and the number of
selected GPUs, and returns the seconds the check's own work should take, its process start left out
(:mod:`gpuaccept.node.budget` adds that). The rates are deliberately low: a CPU figure is about what a
2-core VM shared with other work gave, a GPU figure well below what a datacenter GPU sustains, so a
faster machine finishes early rather than late. They choose between depths; the run's deadline, not
these figures, is what keeps a run inside its window.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

#: GEMM rates, FLOP/s: on a CPU core pair (any dtype), and on one GPU per dtype
CPU_GEMM_FLOPS = 2e9
GPU_GEMM_FLOPS = {"fp64": 10e12, "fp32": 15e12, "tf32": 60e12, "fp16": 150e12, "bf16": 150e12, "fp8": 300e12}
#: nbody interaction rates (20 FLOP each), FLOP/s: the compiled kernel and the eager (memory-bound) path
NBODY_FLOPS = {("cpu", "compiled"): 10e9, ("cpu", "eager"): 0.15e9,
               ("cuda", "compiled"): 5e12, ("cuda", "eager"): 0.5e12}
NBODY_COMPILE_S = {"cpu": 20.0, "cuda": 40.0}
#: bytes/s: STREAM as torch runs it on a CPU, a GPU's device copy, a pinned PCIe copy, a memtest pattern
CPU_STREAM_BPS = 2e9
GPU_COPY_BPS = 1e12
PCIE_BPS = 10e9
CPU_MEMTEST_BPS = 0.2e9
GPU_MEMTEST_BPS = 100e9
GPU_MEMORY_BYTES = 80e9
"""What a GPU is taken to hold where the estimate cannot know (memtest tests a fraction of what is free)."""
#: a collective: latency (s) and bus bandwidth (bytes/s), gloo on CPU and NCCL on GPUs
COLL_LATENCY_S = {"cpu": 0.5e-3, "cuda": 50e-6}
COLL_BPS = {"cpu": 0.15e9, "cuda": 20e9}
#: a training step of the small MLPs (train, ddp_train): fixed seconds plus seconds per batch x hidden^2
STEP_FIXED_S = {"cpu": 0.015, "cuda": 0.005}
STEP_PER_UNIT_S = {"cpu": 1e-10, "cuda": 1e-12}


def env(params: dict[str, Any], device: str, gpus: int) -> float:
    """Host, driver, torch and NVML facts (torch's CUDA start counted)."""
    return 3.0 + 0.2 * gpus


def health(params: dict[str, Any], device: str, gpus: int) -> float:
    """NVML's start (slow per GPU without persistence mode), ``sample_s`` of clock-event samples, the
    kernel log."""
    return 1.0 + float(params["sample_s"]) + 0.5 * gpus


def fabric(params: dict[str, Any], device: str, gpus: int) -> float:
    """Two reads of sysfs ``sample_s`` apart."""
    return 1.0 + float(params["sample_s"])


def disk_space(params: dict[str, Any], device: str, gpus: int) -> float:
    """One ``statvfs`` per path."""
    return 0.5


def gemm_s(n: int, dtype: str, device: str) -> float:
    """Seconds of one N x N x N GEMM."""
    rate = CPU_GEMM_FLOPS if device == "cpu" else GPU_GEMM_FLOPS.get(dtype, 15e12)
    return 2.0 * n ** 3 / rate


def compute(params: dict[str, Any], device: str, gpus: int, cpu_dtypes: Sequence[str]) -> float:
    """Per dtype and measurement (each GPU alone, then all at once): the warm-up at its longest, then the
    timed windows."""
    on_gpu = device == "cuda"
    dtypes = [d for d in dict.fromkeys(params["dtypes"]) if on_gpu or d in cpu_dtypes]
    n = int(params["size"] if on_gpu else params["cpu_size"])
    runs = (gpus if params["per_gpu"] or gpus <= 1 else 0) + (1 if params["concurrent"] and gpus > 1 else 0)
    runs = max(runs, 1) if on_gpu else 1
    total = 0.0
    for dtype in dtypes:
        window = max(float(params["min_window_s"]), int(params["iters"]) * gemm_s(n, dtype, device))
        warm = max(float(params["warmup_max_s"]), int(params["warmup"]) * gemm_s(n, dtype, device))
        total += runs * (warm + int(params["trials"]) * window + 0.2)
    return 1.0 + total


def memory(params: dict[str, Any], device: str, gpus: int) -> float:
    """STREAM's copy and triad over three arrays on a CPU; per GPU, in turn, the device copy and (with
    ``pcie``) the pinned copies both ways."""
    reps = int(params["iterations"]) + int(params["warmup"])
    if device == "cpu":
        return 0.5 + 5 * int(params["cpu_mib"]) * 2 ** 20 * reps / CPU_STREAM_BPS
    per_gpu = 2 * int(params["size_mib"]) * 2 ** 20 * reps / GPU_COPY_BPS
    if params["pcie"]:
        per_gpu += 2 * int(params["host_mib"]) * 2 ** 20 * (reps + 1) / PCIE_BPS
    return 1.0 + gpus * (per_gpu + 0.5)


P2P_BPS = 20e9
"""bytes/s of one GPU-to-GPU copy (low: a PCIe pair through the host bridge)."""


def p2p(params: dict[str, Any], device: str, gpus: int) -> float:
    """Per ordered pair of GPUs a timed copy loop and a latency loop, per unordered pair both directions at
    once (twice the bytes); per GPU (with ``host``) the pinned copies both ways; two NVML reads around it."""
    if device == "cpu":
        return 0.5
    reps = int(params["iterations"]) + int(params["warmup"])
    one = int(params["size_mib"]) * 2 ** 20 * reps / P2P_BPS
    pairs = gpus * (gpus - 1)
    total = pairs * (one + 0.1 + int(params["latency_iters"]) * 20e-6)
    if params["bidirectional"]:
        total += pairs / 2 * 2 * one
    if params["host"]:
        total += gpus * (2 * int(params["host_mib"]) * 2 ** 20 * (reps + 1) / PCIE_BPS + 0.5)
    return 1.0 + 0.5 * gpus + total


def memtest(params: dict[str, Any], device: str, gpus: int) -> float:
    """Every pattern of every pass over the tested memory, stopped at ``max_seconds`` (plus the pattern run
    in flight then)."""
    runs = max(1, len(params["patterns"]) * int(params["passes"]))
    if device == "cpu":
        one = int(params["cpu_mib"]) * 2 ** 20 / CPU_MEMTEST_BPS
    else:
        one = gpus * float(params["fraction"]) * GPU_MEMORY_BYTES / GPU_MEMTEST_BPS
    return 0.5 + min(runs * one, float(params["max_seconds"]) + one)


def mlp_steps(steps: int, batch: int, hidden: int, device: str) -> float:
    """Seconds of ``steps`` training steps of the small MLP."""
    return steps * (STEP_FIXED_S[device] + STEP_PER_UNIT_S[device] * batch * hidden ** 2)


def train(params: dict[str, Any], device: str, gpus: int) -> float:
    """``steps`` on each trained device in turn."""
    devices = max(gpus, 1) if device == "cuda" and params["all_gpus"] else 1
    return 0.5 + devices * mlp_steps(int(params["steps"]), int(params["batch"]), int(params["hidden"]), device)


def ddp(params: dict[str, Any], device: str, gpus: int) -> float:
    """``steps`` on every rank at once, each with its gradient all-reduce."""
    return 1.0 + mlp_steps(int(params["steps"]), int(params["batch"]), int(params["hidden"]), device)


def nbody(params: dict[str, Any], device: str, gpus: int) -> float:
    """The compile (once) and the steps of N^2 interactions on each device in turn."""
    kernel = "eager" if params["kernel"] == "eager" else "compiled"
    n = int(params["bodies"] if device == "cuda" else params["cpu_bodies"])
    rate = NBODY_FLOPS[(device, kernel)] / (2.0 if params["dtype"] == "fp64" else 1.0)
    steps = int(params["steps"]) + int(params["warmup"])
    devices = max(gpus, 1) if device == "cuda" else 1
    compile_s = NBODY_COMPILE_S[device] if kernel == "compiled" else 0.0
    return 1.0 + compile_s + devices * steps * 20.0 * n * n / rate


def stress(params: dict[str, Any], device: str, gpus: int) -> float:
    """The warm-up (``warmup_s``, and half the wait for a stable rate past it), then ``duration_s``, on every
    device at once, with the set-up and the fp64 reference around them."""
    warm = float(params.get("warmup_s", 0.0))
    wait = max(0.0, float(params.get("warmup_max_s", 0.0)) - warm) if float(params.get("stable_within", 0)) else 0.0
    return warm + wait / 2 + float(params["duration_s"]) + 5.0


def agreement(params: dict[str, Any], device: str, gpus: int) -> float:
    """The GEMM chain per dtype, on each device in turn (``runs`` times on a single device)."""
    on_gpu = device == "cuda"
    n = int(params["size"] if on_gpu else params["cpu_size"])
    devices = max(gpus, 1) if on_gpu else 1
    runs = int(params["runs"]) if devices == 1 else 1
    chains = sum(gemm_s(n, d, device) for d in params["dtypes"]) * int(params["chain"])
    return 2.0 + devices * runs * chains


def throughput(params: dict[str, Any], device: str, gpus: int) -> float:
    """``measure_s`` per model and device, each after building the model and its warm-up steps."""
    devices = max(gpus, 1) if device == "cuda" else 1
    return 2.0 + devices * len(params["models"]) * (float(params["measure_s"]) + 3.0)


def disk(params: dict[str, Any], device: str, gpus: int) -> float:
    """Four phases of ``runtime_s`` after laying the file out (at 200 MB/s)."""
    return 2.0 + 4 * float(params["runtime_s"]) + int(params["size_mib"]) * 2 ** 20 / 200e6


def collective_sweep(sizes: Sequence[int], rows_per_size: int, ops_per_row: int, device: str) -> float:
    """A sweep: ``rows_per_size`` rows (op, dtype, placement) at each of ``sizes`` bytes, ``ops_per_row``
    operations each."""
    one = sum(COLL_LATENCY_S[device] + size / COLL_BPS[device] for size in sizes)
    return 1.0 + rows_per_size * ops_per_row * one


def nccl_sizes(args: Sequence[str]) -> tuple[list[int], int] | None:
    """(sizes in bytes, operations per size) of an nccl-tests argument list (``-b``, ``-e``, ``-f``, ``-n``,
    ``-w``, ``-c`` and their defaults); None where they cannot be read."""
    given: dict[str, str] = {}
    for flag, value in itertools.pairwise(args):
        if flag in ("-b", "-e", "-f", "-n", "-w", "-c"):
            given[flag] = value
    try:
        low, high = (_bytes(given.get(f, d)) for f, d in (("-b", "32M"), ("-e", "32M")))
        factor, iters, warmup = (int(given.get(f, d)) for f, d in (("-f", "2"), ("-n", "20"), ("-w", "5")))
        checks = int(given.get("-c", "1"))
    except ValueError:
        return None
    if low < 1 or high < low or factor < 2:
        return None
    sizes: list[int] = []
    while low <= high and len(sizes) < 64:
        sizes.append(low)
        low *= factor
    return sizes, iters + warmup + checks


def _bytes(text: str) -> int:
    """``8``, ``64K``, ``8M``, ``1G`` in bytes, as nccl-tests reads them."""
    units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    t = text.strip().upper()
    if t and t[-1] in units:
        return int(t[:-1]) * units[t[-1]]
    return int(t)


def nccl_tests(params: dict[str, Any], device: str, gpus: int) -> float | None:
    """Each test's sweep (its binary's start counted); about nothing where it skips (on a CPU run)."""
    if device != "cuda":
        return 0.5
    sweep = nccl_sizes(list(params["args"]))
    if sweep is None:
        return None
    sizes, ops = sweep
    return sum(5.0 + collective_sweep(sizes, 1, ops, device) for _ in params["tests"])


RDMA_CONNECT_S = 3.0
"""Seconds of one NIC's loopback run that are not traffic (the server's start, the client's connection, CUDA's
start with ``--use_cuda``): :data:`gpuaccept.perftest.plan.CONNECT_S`."""


def rdma(params: dict[str, Any], device: str, gpus: int, nics: int | None) -> float:
    """Each NIC's loopback run (``-D`` seconds x its sizes + :data:`RDMA_CONNECT_S`, else its ``nic_timeout_s``
    where the arguments give no duration), ``parallel`` at once. ``nics``: the NICs with an ACTIVE port (0: it
    skips); None where this machine's sysfs has no RDMA class, so the figure is for the node planned: one NIC
    per GPU (a rail-optimised GPU node) on a GPU run, none on a CPU run."""
    from gpuaccept.perftest.plan import estimate_s

    count = (gpus if device == "cuda" else 0) if nics is None else nics
    if count <= 0:
        return 0.5
    one, _why = estimate_s(list(params["args"]), RDMA_CONNECT_S)
    per_nic = float(params["nic_timeout_s"]) if one is None else min(one, float(params["nic_timeout_s"]))
    waves = -(-count // max(1, int(params["parallel"])))
    return 1.0 + waves * per_nic


#: a reference training run's sustained model FLOP/s (reftrain_task.flops_per_token x tokens/s): a 2-core
#: CPU in fp32, and a GPU in bf16 with the written-out attention (well below a datacenter GPU's rate)
REFTRAIN_FLOPS = {"cpu": 5e9, "cuda": 100e12}


def reference_train(params: dict[str, Any], device: str, gpus: int) -> float:
    """The corpus (Python sampling, about 1 us per token), then ``steps`` on every GPU at once (``runs``
    times in turn on a single device), at :data:`REFTRAIN_FLOPS`."""
    from gpuaccept.checks.reftrain_task import ModelShape, flops_per_token

    pre = "" if device == "cuda" else "cpu_"
    shape = ModelShape(int(params["vocab"]), int(params[pre + "d_model"]), int(params[pre + "layers"]),
                       int(params["heads"]), int(params[pre + "seq"]))
    steps = int(params["steps" if device == "cuda" else "cpu_steps"])
    tokens = steps * int(params["batch" if device == "cuda" else "cpu_batch"]) * shape.seq
    runs = int(params["runs"]) if device == "cpu" or gpus <= 1 else 1
    return 2.0 + 1e-6 * tokens + runs * tokens * flops_per_token(shape) / REFTRAIN_FLOPS[device]
