"""Memory bandwidth: device-to-device copy and pinned host<->device copies on GPU, STREAM on CPU.

GPU metrics (device ``cuda:N``, GB/s = 1e9 bytes/s):

* ``d2d_copy_gbs``: ``dst.copy_(src)`` within one GPU, counting bytes read plus
  written (a copy of N bytes moves 2N), like ``nvbandwidth -t device_local_copy``.
* ``h2d_pinned_gbs`` / ``d2h_pinned_gbs``: pinned host memory to device and back,
  N bytes per copy, like ``nvbandwidth -t host_to_device_memcpy_ce`` /
  ``device_to_host_memcpy_ce`` or the CUDA sample ``bandwidthTest --memory=pinned``.

CPU metrics (device ``cpu``): ``stream_copy_gbs`` and ``stream_triad_gbs`` with the
STREAM counting convention (copy moves 2 arrays, triad 3 arrays, of 8-byte doubles),
best of N, like ``stream_c.exe`` (OpenMP build) on all threads torch uses.

Expectations come from the SKU data (``gpuaccept/data/skus.yaml``): ``d2d_copy_gbs``
expects ``memory_bandwidth_gbs`` and gets a pre-set FAIL bound of
``expected x pass_fraction("memory_d2d")``; the pinned copies expect the
theoretical PCIe bandwidth per direction with a WARN bound of
``expected x pass_fraction("pcie")``. Every copy is verified: a copy that does
not reproduce its source fails the check.

The pinned copies run with the measuring thread bound to the GPU's NUMA node
(sysfs under ``root``, :mod:`gpuaccept.hw.numa`) and the pinned buffers allocated
after binding, so they are local to the GPU, as ``numactl --cpunodebind=N
--membind=N bandwidthTest`` would be; the metrics' ``numa_node`` tag says which
node (-1: measured unbound, the details say why).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import (
    Check,
    CheckContext,
    Outcome,
    Param,
    RequiredMetric,
    per_device,
    torch_devices_or_skip,
)
from gpuaccept.hw.numa import NumaBinding, bound_to, current_affinity, plan_binding
from gpuaccept.model import Metric, Status, Threshold

MIB = 1 << 20

_STREAM_SCALAR = 3.0


@dataclass
class CopyResult:
    """One timed copy measurement.

    ``gbs`` in GB/s (1e9 bytes/s) over the timed loop; ``bytes_per_iter`` is
    the counted traffic of one copy; ``mismatches`` is the number of 4-byte
    words of the destination that differ from the source after the copies.
    """

    gbs: float
    seconds: float
    iterations: int
    bytes_per_iter: int
    mismatches: int
    iter_gbs: list[float] = field(default_factory=list)


@dataclass
class StreamResult:
    """STREAM copy and triad on one CPU, best of ``iterations`` timed runs.

    Rates in GB/s; ``copy_ok``/``triad_ok`` say the arrays hold the expected values.
    """

    copy_gbs: float
    triad_gbs: float
    copy_median_gbs: float
    triad_median_gbs: float
    array_bytes: int
    iterations: int
    threads: int
    copy_ok: bool
    triad_ok: bool


def _fill_pattern(t: Any, salt: int, block: int = 1 << 28) -> None:
    """Fill a 1-D int32 tensor with a cheap, non-repeating pattern: word i = (i * odd constant + salt) mod 2**32.

    Works in blocks so that int32 indices never overflow, whatever the size.
    """
    import torch

    mult = -1640531535  # odd, so the map i -> i * mult mod 2**32 is a bijection
    for start in range(0, t.numel(), block):
        part = t[start:start + block]
        torch.arange(part.numel(), dtype=torch.int32, device=t.device, out=part)
        offset = (start * mult + salt) & 0xFFFFFFFF
        part.mul_(mult).add_(offset - (1 << 32) if offset >= 1 << 31 else offset)  # int32 wraps


def count_mismatches(a: Any, b: Any) -> int:
    """Number of elements where tensors ``a`` and ``b`` (same shape) differ; 0 for identical tensors."""
    import torch

    if torch.equal(a, b):
        return 0
    return int((a != b).sum().item())


def measure_d2d(device: Any, nbytes: int, iterations: int, warmup: int = 2) -> CopyResult:
    """Device-to-device copy bandwidth of one GPU in GB/s, counting read + write (2N per copy of N bytes).

    Times ``iterations`` copies of ``nbytes`` between two buffers on ``device``
    with CUDA events on the device's current stream after ``warmup`` copies,
    then compares destination and source word by word. Equivalent:
    ``nvbandwidth -t device_local_copy``.
    """
    import torch

    n = max(1, nbytes // 4)
    with torch.cuda.device(device):
        src = torch.empty(n, dtype=torch.int32, device=device)
        dst = torch.zeros_like(src)
        _fill_pattern(src, 12345)
        stream = torch.cuda.current_stream(device)
        for _ in range(warmup):
            dst.copy_(src)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iterations + 1)]
        events[0].record(stream)
        for i in range(iterations):
            dst.copy_(src)
            events[i + 1].record(stream)
        events[-1].synchronize()
        per_ms = [events[i].elapsed_time(events[i + 1]) for i in range(iterations)]
        total_s = events[0].elapsed_time(events[-1]) / 1e3
        moved = 2 * n * 4
        mismatches = count_mismatches(dst, src)
        del src, dst
        torch.cuda.empty_cache()
    return CopyResult(gbs=moved * iterations / total_s / 1e9, seconds=total_s, iterations=iterations,
                      bytes_per_iter=moved, mismatches=mismatches,
                      iter_gbs=[moved / (ms / 1e3) / 1e9 for ms in per_ms if ms > 0])


def measure_pinned(device: Any, nbytes: int, iterations: int, warmup: int = 2) -> tuple[CopyResult, CopyResult]:
    """Pinned host-to-device and device-to-host bandwidth of one GPU in GB/s (N bytes per copy of N bytes).

    Uses page-locked host buffers and ``non_blocking`` copies timed with CUDA
    events. The data is checked end to end: host pattern -> device -> a second
    host buffer must reproduce the pattern. Equivalent: ``bandwidthTest --memory=pinned``.
    """
    import torch

    n = max(1, nbytes // 4)
    with torch.cuda.device(device):
        host_src = torch.empty(n, dtype=torch.int32, pin_memory=True)
        host_dst = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        _fill_pattern(host_src, 777)
        dev = torch.empty(n, dtype=torch.int32, device=device)
        stream = torch.cuda.current_stream(device)

        def timed(dst: Any, src: Any) -> tuple[float, list[float]]:
            for _ in range(warmup):
                dst.copy_(src, non_blocking=True)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(iterations + 1)]
            events[0].record(stream)
            for i in range(iterations):
                dst.copy_(src, non_blocking=True)
                events[i + 1].record(stream)
            events[-1].synchronize()
            per = [events[i].elapsed_time(events[i + 1]) for i in range(iterations)]
            return events[0].elapsed_time(events[-1]) / 1e3, per

        h2d_s, h2d_per = timed(dev, host_src)
        d2h_s, d2h_per = timed(host_dst, dev)
        stream.synchronize()
        mismatches = count_mismatches(host_dst, host_src)
        del dev
        torch.cuda.empty_cache()
    moved = n * 4

    def result(total_s: float, per_ms: list[float]) -> CopyResult:
        return CopyResult(gbs=moved * iterations / total_s / 1e9, seconds=total_s, iterations=iterations,
                          bytes_per_iter=moved, mismatches=mismatches,
                          iter_gbs=[moved / (ms / 1e3) / 1e9 for ms in per_ms if ms > 0])

    return result(h2d_s, h2d_per), result(d2h_s, d2h_per)


def torch_pci_bus_id(device: Any) -> str | None:
    """``dddd:bb:dd.0`` of a torch CUDA device (``nvidia-smi --query-gpu=pci.bus_id``); None when torch lacks it."""
    import torch

    props = torch.cuda.get_device_properties(device)
    try:
        domain, bus, dev = (int(getattr(props, k)) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    except (AttributeError, TypeError, ValueError):
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}.0"


def release_pinned_cache() -> None:
    """Free torch's cached pinned host blocks, so the next pinned buffer is a new allocation (placed where bound)."""
    import torch

    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


def measure_pinned_numa(device: Any, nbytes: int, iterations: int, warmup: int,
                        binding: NumaBinding) -> tuple[CopyResult, CopyResult, bool]:
    """:func:`measure_pinned` with the calling thread bound to ``binding``'s CPUs, restored afterwards.

    The pinned buffers are allocated inside the binding (torch's cached pinned
    blocks are released first and after), so first touch places them on the
    GPU's node. Returns (h2d, d2h, whether it was bound).
    """
    with bound_to(binding.cpus if binding.bound else None) as bound:
        release_pinned_cache()
        try:
            h2d, d2h = measure_pinned(device, nbytes, iterations, warmup)
        finally:
            release_pinned_cache()
    return h2d, d2h, bound


def pinned_tags(h2d: CopyResult, binding: NumaBinding, bound: bool) -> dict[str, str | int | float]:
    """Tags of the pinned-copy metrics: buffer size and the NUMA node measured on (-1: unbound)."""
    return {"size_bytes": h2d.bytes_per_iter, "numa_node": binding.node if bound and binding.node is not None else -1}


def verify_stream(a: Any, b: Any, c: Any, expect: str, block: int = 1 << 22) -> bool:
    """True when ``c`` equals ``a`` (``expect='copy'``) or ``b + 3*a`` (``'triad'``), compared blockwise."""
    import torch

    for i in range(0, a.numel(), block):
        sa, sb, sc = a[i:i + block], b[i:i + block], c[i:i + block]
        want = sa if expect == "copy" else torch.add(sb, sa, alpha=_STREAM_SCALAR)
        if not torch.equal(sc, want):
            return False
    return True


def measure_stream(array_bytes: int, iterations: int, warmup: int = 1, threads: int | None = None) -> StreamResult:
    """STREAM copy (``c = a``) and triad (``c = b + 3*a``) bandwidth of the host in GB/s, best of ``iterations``.

    Arrays are float64 of ``array_bytes`` each; copy counts 2 x 8 x n bytes and
    triad 3 x 8 x n bytes per run (the STREAM convention). ``threads`` (default
    ``torch.get_num_threads()``) work in parallel: the copy is a ``memcpy`` per
    thread slice (``Tensor.copy_``) and the triad is one multi-threaded ``torch.add``.
    After each timed phase ``c`` is checked exactly against ``a`` and ``b + 3*a``
    (small integers, so float64 arithmetic is exact).
    Equivalent: STREAM ``stream_c.exe`` built with OpenMP.
    """
    import torch

    nthreads = max(1, threads if threads is not None else torch.get_num_threads())
    n = max(1, array_bytes // 8)
    a = torch.arange(n, dtype=torch.float64).remainder_(1024.0)
    b = torch.arange(n, dtype=torch.float64).remainder_(7.0)
    c = torch.zeros(n, dtype=torch.float64)
    copy_t: list[float] = []
    triad_t: list[float] = []
    old_threads = torch.get_num_threads()
    torch.set_num_threads(nthreads)
    try:
        # Copy and triad run as separate phases, each with torch's own parallel
        # loops (``Tensor.copy_`` is a memcpy per thread slice for contiguous tensors).
        for it in range(warmup + iterations):
            t0 = time.perf_counter()
            c.copy_(a)
            if it >= warmup:
                copy_t.append(time.perf_counter() - t0)
        copy_ok = verify_stream(a, b, c, "copy")
        for it in range(warmup + iterations):
            t0 = time.perf_counter()
            torch.add(b, a, alpha=_STREAM_SCALAR, out=c)
            if it >= warmup:
                triad_t.append(time.perf_counter() - t0)
        triad_ok = verify_stream(a, b, c, "triad")
    finally:
        torch.set_num_threads(old_threads)
    copy_bytes, triad_bytes = 2 * 8 * n, 3 * 8 * n
    return StreamResult(
        copy_gbs=copy_bytes / min(copy_t) / 1e9,
        triad_gbs=triad_bytes / min(triad_t) / 1e9,
        copy_median_gbs=copy_bytes / statistics.median(copy_t) / 1e9,
        triad_median_gbs=triad_bytes / statistics.median(triad_t) / 1e9,
        array_bytes=n * 8,
        iterations=iterations,
        threads=nthreads,
        copy_ok=copy_ok,
        triad_ok=triad_ok,
    )


class MemoryCheck(Check):
    """Memory bandwidth per GPU (device copy, pinned PCIe copies) or of the host (STREAM)."""

    name = "memory"
    tag = "MEMORY"
    summary = "GPU memory copy and pinned host<->device bandwidth (STREAM copy/triad on CPU), data verified"
    key_metric = "*_copy_gbs"
    metrics = ("stream_copy_gbs", "stream_triad_gbs", "d2d_copy_gbs", "h2d_pinned_gbs", "d2h_pinned_gbs")
    params = (
        Param("size_mib", "int", 1024, "GPU device-to-device buffer size in MiB (two buffers are allocated)",
              minimum=1, maximum=1 << 20, gpu_memory_mib=True, gpu_buffers=2),
        Param("host_mib", "int", 256, "GPU pinned host buffer size in MiB for H2D/D2H (two pinned host buffers "
              "and one device buffer)", minimum=1, maximum=1 << 22, memory_mib=True, host_buffers=2,
              gpu_memory_mib=True),
        Param("cpu_mib", "int", 256, "CPU STREAM array size in MiB (three arrays)", minimum=1,
              maximum=1 << 22, memory_mib=True, host_buffers=3),
        Param("iterations", "int", 20, "timed copies (GPU) or timed STREAM runs (CPU, best is reported)",
              minimum=1, maximum=100_000),
        Param("warmup", "int", 2, "untimed copies before timing", minimum=0, maximum=10_000),
        Param("pcie", "bool", True, "measure pinned host<->device bandwidth on GPU"),
        Param("numa_bind", "bool", True, "bind H2D/D2H measurements (thread and pinned memory) to the GPU's NUMA node"),
        Param("root", "str", "/", "filesystem root under which sys/ is read for NUMA nodes (a recorded tree in tests)"),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"size_mib": 512, "host_mib": 128, "cpu_mib": 32, "iterations": 10},
        "standard": {"size_mib": 1024, "host_mib": 256, "cpu_mib": 256, "iterations": 20},
        "full": {"size_mib": 4096, "host_mib": 1024, "cpu_mib": 1024, "iterations": 50},
    }
    timeout_s: ClassVar[dict[str, float]] = {"quick": 60.0, "standard": 180.0, "full": 600.0}

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """STREAM copy and triad on CPU; on each GPU its device copy and, with ``pcie``, both pinned directions."""
        if devices == ["cpu"]:
            return per_device(devices, "stream_copy_gbs", "stream_triad_gbs")
        pcie = ("h2d_pinned_gbs", "d2h_pinned_gbs") if params.get("pcie") else ()
        return per_device(devices, "d2d_copy_gbs", *pcie)

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.memory(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        if ctx.device == "cpu":
            return self._run_cpu(ctx)
        return self._run_gpu(ctx, devices)

    def _run_cpu(self, ctx: CheckContext) -> Outcome:
        p = ctx.params
        r = measure_stream(int(p["cpu_mib"]) * MIB, int(p["iterations"]), warmup=max(1, int(p["warmup"])))
        tags: dict[str, str | int | float] = {"size_bytes": r.array_bytes, "threads": r.threads}
        metrics = [
            Metric("stream_copy_gbs", r.copy_gbs, "GB/s", device="cpu", tags=dict(tags), performance=True),
            Metric("stream_triad_gbs", r.triad_gbs, "GB/s", device="cpu", tags=dict(tags), performance=True),
        ]
        details = {"copy_median_gbs": round(r.copy_median_gbs, 3), "triad_median_gbs": round(r.triad_median_gbs, 3),
                   "iterations": r.iterations, "threads": r.threads}
        ctx.log(f"STREAM {r.array_bytes / MIB:.0f} MiB x3, {r.threads} threads: copy {r.copy_gbs:.1f} GB/s, "
                f"triad {r.triad_gbs:.1f} GB/s")
        bad = [name for name, ok in (("copy", r.copy_ok), ("triad", r.triad_ok)) if not ok]
        if bad:
            return Outcome.failed(f"STREAM {' and '.join(bad)} produced wrong values", metrics, **details)
        return Outcome.passed(f"STREAM copy {r.copy_gbs:.1f} GB/s, triad {r.triad_gbs:.1f} GB/s "
                              f"({r.threads} threads)", metrics, **details)

    def _run_gpu(self, ctx: CheckContext, devices: list[Any]) -> Outcome:
        import torch

        from gpuaccept.hw.sku import match_sku

        p = ctx.params
        iterations, warmup = int(p["iterations"]), int(p["warmup"])
        metrics: list[Metric] = []
        details: dict[str, Any] = {"devices": {}}
        broken: list[str] = []
        for dev in devices:
            label = f"cuda:{dev.index}"
            gpu_name = torch.cuda.get_device_name(dev)
            sku = match_sku(gpu_name)
            free, _total = torch.cuda.mem_get_info(dev)
            size = int(p["size_mib"]) * MIB
            if 2 * size > 0.8 * free:  # two buffers must fit with room to spare
                size = int(0.4 * free) // MIB * MIB
            d2d = measure_d2d(dev, size, iterations, warmup)
            tags: dict[str, str | int | float] = {"size_bytes": size}
            expected = sku.memory_bandwidth_gbs if sku is not None else None
            threshold = sku_threshold(sku, expected, "memory_d2d", Status.FAIL)
            metrics.append(Metric("d2d_copy_gbs", d2d.gbs, "GB/s", device=label, expected=expected,
                                  threshold=threshold, tags=tags, performance=True))
            dev_details: dict[str, Any] = {
                "name": gpu_name, "sku": sku.id if sku is not None else None,
                "d2d_median_gbs": round(statistics.median(d2d.iter_gbs), 1) if d2d.iter_gbs else None,
                "d2d_mismatched_words": d2d.mismatches,
            }
            ctx.log(f"{label} {gpu_name}: d2d copy {d2d.gbs:.0f} GB/s"
                    + (f" (expected {expected:.0f})" if expected else ""))
            if d2d.mismatches:
                broken.append(f"{label} device copy: {d2d.mismatches} words differ")
            if p["pcie"]:
                binding = (plan_binding(torch_pci_bus_id(dev), current_affinity(), str(p["root"]))
                           if p["numa_bind"] else NumaBinding(None, (), "numa_bind is off: measured unbound"))
                h2d, d2h, bound = measure_pinned_numa(dev, int(p["host_mib"]) * MIB, iterations, warmup, binding)
                # The host slot may legitimately run a lower PCIe generation than the GPU supports: warn only.
                pcie_exp = sku.pcie_bandwidth_gbs() if sku is not None else None
                pcie_thr = sku_threshold(sku, pcie_exp, "pcie", Status.WARN)
                ptags = pinned_tags(h2d, binding, bound)
                dev_details["numa"] = binding.reason
                if binding.bound and not bound:
                    dev_details["numa"] += ", but setting the affinity failed: measured unbound"
                metrics.append(Metric("h2d_pinned_gbs", h2d.gbs, "GB/s", device=label, expected=pcie_exp,
                                      threshold=pcie_thr, tags=dict(ptags), performance=True))
                metrics.append(Metric("d2h_pinned_gbs", d2h.gbs, "GB/s", device=label, expected=pcie_exp,
                                      threshold=pcie_thr, tags=dict(ptags), performance=True))
                dev_details["pinned_mismatched_words"] = h2d.mismatches
                ctx.log(f"{label}: h2d {h2d.gbs:.1f} GB/s, d2h {d2h.gbs:.1f} GB/s (pinned; {dev_details['numa']})")
                if h2d.mismatches:
                    broken.append(f"{label} host round trip: {h2d.mismatches} words differ")
            details["devices"][label] = dev_details
        if broken:
            return Outcome.failed("copied data is wrong: " + "; ".join(broken), metrics, **details)
        d2d_vals = [m.value for m in metrics if m.name == "d2d_copy_gbs"]
        return Outcome.passed(f"{len(devices)} GPU(s): device copy {min(d2d_vals):.0f}-{max(d2d_vals):.0f} GB/s, "
                              "data verified", metrics, **details)


def sku_threshold(sku: Any, expected: float | None, family: str, severity: Status) -> Threshold | None:
    """``expected x sku.pass_fraction(family)`` as a ``>=`` bound sourced ``sku:<id>``; None without SKU data
    (:func:`gpuaccept.checks.sku_expect.from_spec`'s bound)."""
    from gpuaccept.checks.sku_expect import from_spec

    found = from_spec(sku, expected, family, severity)
    return found.threshold if found is not None else None


CHECKS = (MemoryCheck,)
