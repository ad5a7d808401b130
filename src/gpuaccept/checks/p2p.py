"""GPU-to-GPU copy bandwidth and latency for every pair of GPUs of a node, and host<->device per GPU.

Metrics (GB/s = 1e9 bytes/s; bytes counted as :mod:`gpuaccept.checks.p2p_plan` says, nvbandwidth's way):

* ``p2p_unidir_gbs`` (device ``cuda:i``, tag ``peer`` ``cuda:j``): ``dst.copy_(src)`` of ``size_mib`` from
  GPU i to GPU j, N bytes per copy. torch runs a cross-device copy on the source GPU's stream with a
  peer-to-peer ``cudaMemcpyAsync`` where peer access is possible (``details.peer_access``), so it is the
  copy-engine write of ``nvbandwidth -t device_to_device_memcpy_write_ce`` (the ``_read_ce`` variant
  measures the same links pulled by the peer) and ``p2pBandwidthLatencyTest``'s unidirectional matrix.
* ``p2p_bidir_gbs`` (i < j): copies i -> j and j -> i at once on separate streams, both directions'
  bytes counted (``p2pBandwidthLatencyTest``'s bidirectional matrix).
* ``p2p_latency_us``: mean time of one 4-byte copy i -> j over ``latency_iters`` copies, torch's
  cross-device stream barrier included (``p2pBandwidthLatencyTest``'s latency matrix is a little lower).
  Measured, not judged.
* ``p2p_h2d_gbs`` / ``p2p_d2h_gbs`` per GPU: pinned host memory bound to the GPU's NUMA node (the memory
  check's helpers, :func:`gpuaccept.checks.memory.measure_pinned_numa`), ``nvbandwidth -t
  host_to_device_memcpy_ce`` / ``device_to_host_memcpy_ce``.

Every copy is verified (the destination is compared with the pattern written at the source). Expectations
(:func:`gpuaccept.checks.p2p_plan.pair_expectation`): NVLink pairs against the SKU's ``p2p_gbs`` or the
NVLink ceiling of :mod:`gpuaccept.hw.fabric_expect` (FAIL below the bound), PCIe pairs against the PCIe rate
(WARN); host<->device against the SKU's ``h2d_gbs`` (FAIL) or the PCIe rate (WARN). The NVLink error
counters are read before and after (:mod:`gpuaccept.checks.nvlink_watch`): a link whose errors rise fails.
One GPU: host<->device only (the pair matrix needs two). CPU: SKIP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, RequiredMetric, torch_devices_or_skip
from gpuaccept.checks.nvlink_watch import DELTA_METRICS, NvlinkWatch, visible_reader
from gpuaccept.checks.p2p_plan import (
    METRICS,
    Expect,
    Pair,
    copy_bytes,
    format_matrix,
    host_expectation,
    links_of,
    matrix_details,
    ordered_pairs,
    pair_expectation,
    pair_metrics,
    rate_gbs,
    summary,
    unordered_pairs,
)
from gpuaccept.model import Metric

MIB = 1 << 20


@dataclass
class PairRun:
    """One timed loop between two GPUs: seconds, bytes moved (:func:`copy_bytes`), words that differ after."""

    seconds: float
    nbytes: int
    mismatches: int


def _pattern(t: Any, salt: int) -> None:
    from gpuaccept.checks.memory import _fill_pattern

    _fill_pattern(t, salt)


def _wrong(dst: Any, salt: int) -> int:
    """Words of ``dst`` that differ from the pattern ``salt`` (rebuilt on dst's GPU: nothing copied back)."""
    import torch

    from gpuaccept.checks.memory import count_mismatches

    ref = torch.empty_like(dst)
    _pattern(ref, salt)
    wrong = count_mismatches(dst, ref)
    del ref
    return wrong


def measure_unidir(src_dev: Any, dst_dev: Any, nbytes: int, iterations: int, warmup: int) -> PairRun:
    """``iterations`` copies of ``nbytes`` from ``src_dev`` to ``dst_dev``, timed with events on the source's
    stream (where torch runs the copy), after ``warmup`` copies."""
    import torch

    n = max(1, nbytes // 4)
    src = torch.empty(n, dtype=torch.int32, device=src_dev)
    dst = torch.zeros(n, dtype=torch.int32, device=dst_dev)
    _pattern(src, 101)
    torch.cuda.synchronize(src_dev)
    torch.cuda.synchronize(dst_dev)
    stream = torch.cuda.current_stream(src_dev)
    for _ in range(warmup):
        dst.copy_(src, non_blocking=True)
    with torch.cuda.device(src_dev):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(iterations):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
    end.synchronize()
    torch.cuda.synchronize(dst_dev)
    seconds = start.elapsed_time(end) / 1e3
    wrong = _wrong(dst, 101)
    del src, dst
    return PairRun(seconds, copy_bytes(n * 4, iterations), wrong)


def measure_bidir(a: Any, b: Any, nbytes: int, iterations: int, warmup: int) -> PairRun:
    """Copies a -> b and b -> a at once, each direction on its own streams (torch makes a cross-device copy
    wait for the peer's current stream, so each direction gets a fresh stream on both GPUs); timed from an
    event on ``a`` to an event on ``a`` recorded after both directions ended."""
    import torch

    n = max(1, nbytes // 4)
    src_a = torch.empty(n, dtype=torch.int32, device=a)
    src_b = torch.empty(n, dtype=torch.int32, device=b)
    dst_b = torch.zeros(n, dtype=torch.int32, device=b)
    dst_a = torch.zeros(n, dtype=torch.int32, device=a)
    _pattern(src_a, 202)
    _pattern(src_b, 303)
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
    fwd = (torch.cuda.Stream(a), torch.cuda.Stream(b))   # a -> b: runs on a's stream, waits on b's
    back = (torch.cuda.Stream(b), torch.cuda.Stream(a))  # b -> a: runs on b's stream, waits on a's

    def one(streams: tuple[Any, Any], dst: Any, src: Any) -> None:
        with torch.cuda.stream(streams[0]), torch.cuda.stream(streams[1]):
            dst.copy_(src, non_blocking=True)

    for _ in range(warmup):
        one(fwd, dst_b, src_a)
        one(back, dst_a, src_b)
    with torch.cuda.device(a):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(fwd[0])
    back[0].wait_event(start)
    for _ in range(iterations):
        one(fwd, dst_b, src_a)
        one(back, dst_a, src_b)
    done_b = torch.cuda.Event()
    done_b.record(back[0])
    fwd[0].wait_event(done_b)
    end.record(fwd[0])
    end.synchronize()
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
    seconds = start.elapsed_time(end) / 1e3
    wrong = _wrong(dst_b, 202) + _wrong(dst_a, 303)
    del src_a, src_b, dst_a, dst_b
    return PairRun(seconds, copy_bytes(n * 4, iterations, bidirectional=True), wrong)


def measure_latency(src_dev: Any, dst_dev: Any, iterations: int) -> float:
    """Mean microseconds of one 4-byte copy from ``src_dev`` to ``dst_dev`` over ``iterations`` copies."""
    import torch

    src = torch.ones(1, dtype=torch.int32, device=src_dev)
    dst = torch.zeros(1, dtype=torch.int32, device=dst_dev)
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(src_dev)
    torch.cuda.synchronize(dst_dev)
    stream = torch.cuda.current_stream(src_dev)
    with torch.cuda.device(src_dev):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(iterations):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
    end.synchronize()
    return float(start.elapsed_time(end)) * 1e3 / iterations


class P2PCheck(Check):
    """Copy bandwidth and latency between every pair of GPUs, and pinned host<->device per GPU."""

    name = "p2p"
    tag = "P2P"
    summary = "GPU-to-GPU copy bandwidth (one way, both ways) and latency per pair, host<->device per GPU"
    key_metric = "p2p_unidir_gbs"
    metrics = (*METRICS, *DELTA_METRICS)
    params = (
        Param("size_mib", "int", 256, "copy buffer size in MiB (two buffers per GPU of a bidirectional pair)",
              minimum=1, maximum=1 << 16, gpu_memory_mib=True, gpu_buffers=2),
        Param("iterations", "int", 10, "timed copies per pair and direction", minimum=1, maximum=100_000),
        Param("warmup", "int", 2, "untimed copies before timing", minimum=0, maximum=10_000),
        Param("latency_iters", "int", 100, "timed 4-byte copies per pair for the latency", minimum=1,
              maximum=1_000_000),
        Param("bidirectional", "bool", True, "measure both directions at once for every pair"),
        Param("host", "bool", True, "measure pinned host<->device bandwidth per GPU"),
        Param("host_mib", "int", 256, "pinned host buffer size in MiB for host<->device (two host buffers)",
              minimum=1, maximum=1 << 22, memory_mib=True, host_buffers=2),
        Param("numa_bind", "bool", True, "bind host<->device copies (thread and pinned memory) to the GPU's "
              "NUMA node"),
        Param("nvlink_counters", "bool", True, "read the NVLink error counters before and after; a rise fails"),
        Param("root", "str", "/", "filesystem root under which sys/ is read for NUMA nodes (a recorded tree in tests)"),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"size_mib": 64, "iterations": 5, "host_mib": 64},
        "standard": {"size_mib": 256, "iterations": 10, "host_mib": 256},
        "full": {"size_mib": 1024, "iterations": 20, "host_mib": 1024},
    }
    profiles: ClassVar[tuple[str, ...]] = ("standard", "full")
    timeout_s: ClassVar[dict[str, float]] = {"quick": 120.0, "standard": 300.0, "full": 900.0}

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """Each GPU's copies to each other GPU (and both ways, with ``bidirectional``); host<->device with
        ``host``. Nothing on CPU (it skips)."""
        if devices == ["cpu"] or not devices:
            return []
        out = [RequiredMetric(m, d) for d in devices if params.get("host") for m in ("p2p_h2d_gbs", "p2p_d2h_gbs")]
        for i, j in ordered_pairs(len(devices)):
            out.append(RequiredMetric("p2p_unidir_gbs", devices[i], (("peer", devices[j]),)))
        if params.get("bidirectional"):
            out += [RequiredMetric("p2p_bidir_gbs", devices[i], (("peer", devices[j]),))
                    for i, j in unordered_pairs(len(devices))]
        return out

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.p2p(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        if ctx.device == "cpu":
            return Outcome.skip("p2p copies between GPUs: a CPU-only run has no GPU to copy between",
                                needs_gpu=True)
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        watch = NvlinkWatch.start(visible_reader(ctx.gpus)) if ctx.params["nvlink_counters"] else None
        outcome = self._measure(ctx, devices, watch)
        return watch.finish(outcome) if watch is not None else outcome

    def _expectations(self, devices: list[Any], watch: NvlinkWatch | None) -> tuple[Any, dict[Pair, Expect | None],
                                                                                     list[Any], str]:
        import torch

        from gpuaccept.hw.p2p import nvlink_matrix
        from gpuaccept.hw.sku import match_sku

        sku = match_sku(torch.cuda.get_device_name(devices[0]))
        snap = watch.before if watch is not None else None
        if snap is None:
            try:
                snap = visible_reader([d.index for d in devices])()
            except Exception:  # NVML unavailable: expectations from the SKU alone
                snap = None
        links, uuids = links_of([d.index for d in devices], snap)
        nvl = nvlink_matrix(uuids) if uuids else None
        cc = torch.cuda.get_device_capability(devices[0])
        expect = {(i, j): pair_expectation(sku, [links[i], links[j]] if links else None,
                                           nvl[i][j] if nvl else None, (int(cc[0]), int(cc[1])))
                  for i, j in ordered_pairs(len(devices))}
        where = "NVML links and P2P matrix" if nvl else "NVML links" if links else "the SKU table (NVML not read)"
        return sku, expect, links or [], where

    def _measure(self, ctx: CheckContext, devices: list[Any], watch: NvlinkWatch | None) -> Outcome:
        import torch

        from gpuaccept.checks.memory import measure_pinned_numa, pinned_tags, torch_pci_bus_id
        from gpuaccept.hw.numa import NumaBinding, current_affinity, plan_binding

        p = ctx.params
        labels = [f"cuda:{d.index}" for d in devices]
        iters, warm, size = int(p["iterations"]), int(p["warmup"]), int(p["size_mib"]) * MIB
        sku, expect, links, where = self._expectations(devices, watch)
        details: dict[str, Any] = {"sku": sku.id if sku else None, "expectation_from": where, "size_bytes": size}
        metrics: list[Metric] = []
        broken: list[str] = []
        if p["host"]:
            for k, dev in enumerate(devices):
                binding = (plan_binding(torch_pci_bus_id(dev), current_affinity(), str(p["root"]))
                           if p["numa_bind"] else NumaBinding(None, (), "numa_bind is off: measured unbound"))
                h2d, d2h, bound = measure_pinned_numa(dev, int(p["host_mib"]) * MIB, iters, warm, binding)
                e = host_expectation(sku, links[k] if k < len(links) else None)
                tags = pinned_tags(h2d, binding, bound)
                judged: dict[str, Any] = {"expected": e.gbs, "threshold": e.threshold()} if e else {}
                metrics.append(Metric("p2p_h2d_gbs", round(h2d.gbs, 3), "GB/s", device=labels[k], tags=dict(tags),
                                      performance=True, **judged))
                metrics.append(Metric("p2p_d2h_gbs", round(d2h.gbs, 3), "GB/s", device=labels[k], tags=dict(tags),
                                      performance=True, **judged))
                if h2d.mismatches:
                    broken.append(f"{labels[k]} host round trip: {h2d.mismatches} words differ")
                ctx.log(f"{labels[k]}: h2d {h2d.gbs:.1f} GB/s, d2h {d2h.gbs:.1f} GB/s ({binding.reason})")
        if len(devices) < 2:
            details["p2p_matrix"] = {"devices": labels, "skipped": "one GPU: the pair matrix needs two"}
            text = "one GPU: host<->device only, the pair matrix needs two" if p["host"] else \
                "one GPU and host=false: nothing to measure (the pair matrix needs two GPUs)"
            if not p["host"]:
                return Outcome.skip(text, **details)
            return self._verdict(broken, text, metrics, details)
        details["peer_access"] = {f"{labels[i]}->{labels[j]}": bool(torch.cuda.can_device_access_peer(devices[i],
                                                                                                        devices[j]))
                                  for i, j in ordered_pairs(len(devices))}
        unidir: dict[Pair, float] = {}
        bidir: dict[Pair, float] = {}
        latency: dict[Pair, float] = {}
        for i, j in ordered_pairs(len(devices)):
            one = measure_unidir(devices[i], devices[j], size, iters, warm)
            unidir[(i, j)] = rate_gbs(one.nbytes, one.seconds)
            latency[(i, j)] = measure_latency(devices[i], devices[j], int(p["latency_iters"]))
            if one.mismatches:
                broken.append(f"{labels[i]} -> {labels[j]}: {one.mismatches} words differ")
        if p["bidirectional"]:
            for i, j in unordered_pairs(len(devices)):
                both = measure_bidir(devices[i], devices[j], size, iters, warm)
                bidir[(i, j)] = rate_gbs(both.nbytes, both.seconds)
                if both.mismatches:
                    broken.append(f"{labels[i]} <-> {labels[j]}: {both.mismatches} words differ")
        metrics += pair_metrics(labels, unidir, bidir, latency, expect, {"size_bytes": size})
        details["p2p_matrix"] = matrix_details(labels, unidir, bidir, latency, expect)
        ctx.log(format_matrix(labels, details["p2p_matrix"]["unidir_gbs"],
                              "memcpy GPU(rows) -> GPU(columns) bandwidth (GB/s)"))
        return self._verdict(broken, summary(labels, unidir, expect, bidir), metrics, details)

    @staticmethod
    def _verdict(broken: list[str], text: str, metrics: list[Metric], details: dict[str, Any]) -> Outcome:
        if broken:
            return Outcome.failed("copied data is wrong: " + "; ".join(broken[:4]), metrics, **details)
        return Outcome.passed(text, metrics, **details)


CHECKS = (P2PCheck,)
