"""The ``health`` check: ECC, memory repair, PCIe link, clock throttling, thermals, power, NVLink, XIDs.

All readings come from one NVML snapshot (:mod:`gpuaccept.hw.nvml`, the
``nvidia-smi -q`` data) and are judged by the pure function
:func:`evaluate_health`, so recorded snapshots can be replayed in tests.
Fields NVML reports as unsupported are listed in ``details`` and never fail.

GPU selection: ``--gpus`` are torch CUDA ordinals. NVML ignores
``CUDA_VISIBLE_DEVICES``, so the visible devices are mapped to NVML GPUs by
UUID (:mod:`gpuaccept.hw.gpumap`) and opened with
``nvmlDeviceGetHandleByUUID``; without ``--gpus`` only the visible GPUs are
judged. Metrics are labelled ``cuda:<torch ordinal>`` and tagged with the
GPU's UUID and PCI bus id.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import PROFILES, Check, CheckContext, Outcome, Param, ThresholdRule
from gpuaccept.errors import GpuacceptError, InputError
from gpuaccept.hw.gpumap import normalize_pci_bus_id
from gpuaccept.hw.nvml import FATAL_NVML_ERRORS, UNSUPPORTED, GpuSnapshot, NvmlSnapshot, NvmlUnavailable
from gpuaccept.hw.xid import XID_SEVERITY, XidEvent, xid_meaning
from gpuaccept.model import Metric, Status, Threshold, worst

# nvmlClocksEventReason* bits (``nvidia-smi -q -d PERFORMANCE``).
EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
    0x200: "board_limit",
    0x400: "reliability",
}
GPU_IDLE = 0x1
HW_SLOWDOWN = 0x8
FAIL_REASONS: dict[int, str] = {0x40: "HW thermal slowdown", 0x80: "HW power brake"}
"""Fail when set in any sample. HW slowdown (0x8) fails only when set in more than half of the samples:
NVML documents that it "may be also reported during PState or clock change"."""
WARN_REASONS: dict[int, str] = {0x20: "SW thermal slowdown"}
NO_PERMISSION = "Insufficient Permissions"

LIMITS: dict[str, tuple[float, Status]] = {
    "memory_temperature_c": (85.0, Status.WARN),  # HBM3 max operating temperature is 95 C on H100
    "nvlink_crc_flit_errors": (100.0, Status.WARN),
    "nvlink_replay_errors": (100.0, Status.WARN),
    "nvlink_recovery_errors": (0.0, Status.FAIL),
    "xid_fail_count": (0.0, Status.FAIL),
    "xid_warn_count": (0.0, Status.WARN),
}
"""Default upper bounds (metric -> max, severity): the check's judgement and its ThresholdRules both use these.

NVLink counts are summed over the GPU's active links since driver load; XID
counts are those of :data:`gpuaccept.hw.xid.XID_SEVERITY` (NVML events and kernel log)."""

SOURCE = "nvml"
"""Threshold source of bounds taken from the GPU's own NVML limits (max link, slowdown temperature, power limit)."""

MAX_REASON_GPUS = 4


@dataclass(frozen=True)
class Problem:
    """One finding on one GPU."""

    device: str
    status: Status
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"device": self.device, "status": self.status.value, "message": self.message}


def event_reason_names(mask: int) -> list[str]:
    """Names of the clock event (throttle) bits set in ``mask``; unknown bits as hex."""
    names = [name for bit, name in EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(EVENT_REASONS)
    if unknown:
        names.append(hex(unknown))
    return names


@lru_cache(maxsize=32)
def _sku_expectations(name: str) -> dict[str, float]:
    """PCIe gen/width and max power from ``skus.yaml`` for a GPU ``name`` (empty when unknown or unreadable)."""
    try:
        from gpuaccept.hw.sku import match_sku

        sku = match_sku(name)
    except (ImportError, OSError, GpuacceptError):  # SKU data only refines; perf checks report a bad file
        return {}
    if sku is None:
        return {}
    return {"pcie_gen": float(sku.pcie_gen), "pcie_width": float(sku.pcie_width), "max_power_w": sku.max_power_w}


def _num(value: object) -> float | None:
    """A reading as float, or None when "unsupported"."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(name: str, value: int, device: str, threshold: Threshold | None = None) -> Metric:
    return Metric(name, float(value), "count", device=device, threshold=threshold)


class _GpuJudge:
    """Collects the problems and metrics of one GPU."""

    def __init__(self, g: GpuSnapshot, params: dict[str, Any]) -> None:
        self.g = g
        self.params = params
        self.device = g.device
        self.problems: list[Problem] = []
        self.metrics: list[Metric] = []
        self.notes: list[str] = []

    def add(self, status: Status, message: str) -> None:
        self.problems.append(Problem(self.device, status, message))

    def limit(self, name: str, value: float, unit: str, message: str) -> None:
        """A metric bounded by :data:`LIMITS`, and ``message`` as a problem when it is over."""
        bound, sev = LIMITS[name]
        self.metrics.append(Metric(name, value, unit, device=self.device, threshold=Threshold("<=", bound, sev)))
        if value > bound:
            self.add(sev, message)

    def judge(self) -> None:
        self.nvml_errors()
        if "handle" in self.g.errors:
            return
        self.ecc()
        self.memory_repair()
        self.pcie()
        self.clocks()
        self.thermal_power()
        if self.params.get("nvlink", True):
            self.nvlink()
        self.memory_temperature()
        self.xids()

    def nvml_errors(self) -> None:
        """A GPU NVML cannot open fails ("GPU is lost", "Unknown Error", ...); no permission is a SKIP."""
        handle = self.g.errors.get("handle")
        if handle == NO_PERMISSION:
            self.add(Status.SKIP, "NVML: Insufficient Permissions to open the GPU (run as a user with access "
                                  "to /dev/nvidia*, e.g. in the video group, or in a container given the GPU)")
            return
        if handle is not None and handle not in FATAL_NVML_ERRORS:
            self.add(Status.FAIL, f"NVML cannot open the GPU: {handle}")
            return
        for msg in self.g.errors.values():
            if msg in FATAL_NVML_ERRORS:
                self.add(Status.FAIL, f"NVML: {msg}")
                return
        if "Corrupted infoROM" in self.g.errors.values():
            self.add(Status.WARN, "NVML: corrupted infoROM")

    def ecc(self) -> None:
        g, dev = self.g, self.device
        if isinstance(g.ecc_volatile_uncorrectable, int):
            self.metrics.append(_count("ecc_volatile_uncorrectable", g.ecc_volatile_uncorrectable, dev))
            if g.ecc_volatile_uncorrectable > 0:
                self.add(Status.FAIL, f"{g.ecc_volatile_uncorrectable} volatile uncorrectable ECC error(s)")
        if isinstance(g.ecc_volatile_correctable, int):
            self.metrics.append(_count("ecc_volatile_correctable", g.ecc_volatile_correctable, dev))
        if isinstance(g.ecc_aggregate_uncorrectable, int):
            self.metrics.append(_count("ecc_aggregate_uncorrectable", g.ecc_aggregate_uncorrectable, dev))
            if g.ecc_aggregate_uncorrectable > 0:
                self.add(Status.WARN, f"{g.ecc_aggregate_uncorrectable} lifetime uncorrectable ECC error(s)")
        if isinstance(g.ecc_aggregate_correctable, int):
            self.metrics.append(_count("ecc_aggregate_correctable", g.ecc_aggregate_correctable, dev))
        if g.ecc_mode_current is False and self.params.get("require_ecc", True):
            self.add(Status.WARN, "ECC disabled")
        if isinstance(g.ecc_mode_current, bool) and isinstance(g.ecc_mode_pending, bool) \
                and g.ecc_mode_pending != g.ecc_mode_current:
            self.add(Status.WARN, f"ECC mode change to {'on' if g.ecc_mode_pending else 'off'} pending (reset needed)")

    def memory_repair(self) -> None:
        g, dev = self.g, self.device
        if isinstance(g.retired_pages_pending, bool):
            self.metrics.append(_count("retired_pages_pending", int(g.retired_pages_pending), dev))
            if g.retired_pages_pending:
                self.add(Status.WARN, "page retirement pending (reset the GPU)")
        for name in ("retired_pages_sbe", "retired_pages_dbe", "remapped_rows_correctable",
                     "remapped_rows_uncorrectable"):
            value = getattr(g, name)
            if isinstance(value, int):
                self.metrics.append(_count(name, value, dev))
        if isinstance(g.remapped_rows_pending, bool):
            self.metrics.append(_count("remapped_rows_pending", int(g.remapped_rows_pending), dev))
            if g.remapped_rows_pending:
                self.add(Status.WARN, "row remap pending (reset the GPU)")
        if isinstance(g.remapped_rows_failure, bool):
            self.metrics.append(_count("remapped_rows_failure", int(g.remapped_rows_failure), dev))
            if g.remapped_rows_failure:
                self.add(Status.FAIL, "row remapping failed (no spare rows: RMA candidate)")

    def pcie(self) -> None:
        """Current PCIe link against the best the GPU and slot allow (``nvidia-smi -q -d PCI``).

        Width below max is a FAIL: GPUs keep their lane count at idle, so a
        narrow link is a bad riser, slot or retimer and halves host bandwidth.
        Generation below max is only a WARN (FAIL with ``pcie_strict``), and is
        ignored while NVML flags the GPU idle: the driver lowers the link speed
        of idle GPUs to save power and raises it under load. The H2D/D2H
        bandwidth checks measure the link under load.
        """
        g, dev = self.g, self.device
        strict = bool(self.params.get("pcie_strict", False))
        idle = isinstance(g.clocks_event_reasons, int) and bool(g.clocks_event_reasons & GPU_IDLE)
        sku = _sku_expectations(g.name) if g.name != UNSUPPORTED else {}
        gen, gen_max, width, width_max = g.pcie_link_gen, g.pcie_link_gen_max, g.pcie_link_width, g.pcie_link_width_max
        if isinstance(width, int):
            thr = Threshold(">=", float(width_max), Status.FAIL, SOURCE) if isinstance(width_max, int) else None
            self.metrics.append(Metric("pcie_link_width", float(width), "count", device=dev,
                                       expected=float(width_max) if isinstance(width_max, int) else None,
                                       threshold=thr))
            if isinstance(width_max, int) and width < width_max:
                self.add(Status.FAIL, f"PCIe x{width} < x{width_max} max")
        if isinstance(gen, int):
            downgraded = isinstance(gen_max, int) and gen < gen_max
            excused = downgraded and idle and not strict
            sev = Status.FAIL if strict else Status.WARN
            thr = Threshold(">=", float(gen_max), sev, SOURCE) if isinstance(gen_max, int) and not excused else None
            self.metrics.append(Metric("pcie_link_gen", float(gen), "count", device=dev,
                                       expected=float(gen_max) if isinstance(gen_max, int) else None, threshold=thr))
            if excused:
                self.notes.append(f"PCIe gen{gen} < gen{gen_max} max while idle (power saving; not judged)")
            elif downgraded:
                self.add(sev, f"PCIe gen{gen} < gen{gen_max} max")
        gpu_gen = g.pcie_link_gen_gpu_max if isinstance(g.pcie_link_gen_gpu_max, int) else sku.get("pcie_gen")
        if isinstance(gen_max, int) and gpu_gen is not None and gen_max < gpu_gen:
            self.add(Status.WARN, f"PCIe slot limits the link to gen{gen_max} (GPU supports gen{int(gpu_gen)})")
        sku_width = sku.get("pcie_width")
        if isinstance(width_max, int) and sku_width is not None and width_max < sku_width:
            self.add(Status.WARN, f"PCIe slot limits the link to x{width_max} (GPU supports x{int(sku_width)})")

    def clocks(self) -> None:
        """Clock event reasons (``nvidia-smi --query-gpu=clocks_event_reasons.active``).

        HW slowdown, HW thermal slowdown and HW power brake fail; SW thermal
        slowdown warns; idle, application clocks, SW power cap and sync boost are normal.
        """
        g = self.g
        samples = g.clocks_event_reasons_samples if isinstance(g.clocks_event_reasons_samples, list) else (
            [g.clocks_event_reasons] if isinstance(g.clocks_event_reasons, int) else [])
        if not samples:
            return
        mask = 0
        for m in samples:
            mask |= m
        slow = sum(1 for m in samples if m & HW_SLOWDOWN)
        hard = [name for bit, name in FAIL_REASONS.items() if mask & bit]
        if 2 * slow > len(samples):
            hard.insert(0, "HW slowdown" + (f" ({slow}/{len(samples)} samples)" if len(samples) > 1 else ""))
        elif slow:
            self.notes.append(f"HW slowdown in {slow}/{len(samples)} samples (transient, e.g. a clock change)")
        if hard:
            self.add(Status.FAIL, ", ".join(hard))
        soft = [name for bit, name in WARN_REASONS.items() if mask & bit]
        if soft:
            self.add(Status.WARN, ", ".join(soft))

    def thermal_power(self) -> None:
        """``nvidia-smi --query-gpu=temperature.gpu,power.draw,enforced.power.limit``, C and W."""
        g, dev = self.g, self.device
        margin = float(self.params.get("temp_margin_c", 5.0))
        if isinstance(g.temperature_c, int):
            slow = g.temperature_slowdown_c if isinstance(g.temperature_slowdown_c, int) else None
            thr = Threshold("<=", float(slow - margin), Status.WARN, SOURCE) if slow is not None else None
            self.metrics.append(Metric("temperature_c", float(g.temperature_c), "C", device=dev, threshold=thr))
            if slow is not None and g.temperature_c > slow - margin:
                self.add(Status.WARN, f"{g.temperature_c} C within {margin:g} C of slowdown {slow} C")
        draw, limit = _num(g.power_draw_w), _num(g.power_limit_w)
        if draw is not None:
            thr = Threshold("<=", limit, Status.WARN, SOURCE) if limit is not None else None
            self.metrics.append(Metric("power_w", draw, "W", device=dev, threshold=thr))
            if limit is not None and draw > limit:
                self.add(Status.WARN, f"power {draw:.0f} W > limit {limit:.0f} W")
        if limit is not None:
            sku_power = (_sku_expectations(g.name) if g.name != UNSUPPORTED else {}).get("max_power_w")
            self.metrics.append(Metric("power_limit_w", limit, "W", device=dev, expected=sku_power))
            if sku_power is not None and limit < 0.95 * sku_power:
                self.notes.append(f"power limit {limit:.0f} W below the {sku_power:.0f} W spec")

    def nvlink(self) -> None:
        """NVLink link states (``nvidia-smi nvlink --status``): a link down while others are up fails."""
        links = self.g.nvlink_active
        if not isinstance(links, list) or not links:
            return
        active = sum(links)
        self.metrics.append(_count("nvlink_links_active", active, self.device))
        if active == 0:
            self.notes.append(f"no active NVLink link of {len(links)} (NVLink unused)")
            return
        down = [i for i, up in enumerate(links) if not up]
        self.metrics.append(_count("nvlink_links_down", len(down), self.device))
        if down:
            self.add(Status.FAIL, f"NVLink {len(down)}/{len(links)} link(s) down ({','.join(map(str, down))})")
        for name, what in (("nvlink_crc_flit_errors", "NVLink CRC flit errors"),
                           ("nvlink_replay_errors", "NVLink replay errors"),
                           ("nvlink_recovery_errors", "NVLink recovery errors")):
            counts = getattr(self.g, name)
            if isinstance(counts, dict) and counts:
                total = sum(counts.values())
                bad = ", ".join(f"link {k}: {v}" for k, v in counts.items() if v)
                self.limit(name, float(total), "count", f"{what} {total} > {LIMITS[name][0]:g} ({bad})")

    def memory_temperature(self) -> None:
        """HBM temperature (``nvidia-smi --query-gpu=temperature.memory``); not judged where unsupported."""
        if isinstance(self.g.memory_temperature_c, int):
            t = self.g.memory_temperature_c
            self.limit("memory_temperature_c", float(t), "C",
                       f"memory temperature {t} C > {LIMITS['memory_temperature_c'][0]:g} C")

    def xids(self) -> None:
        """XIDs from NVML events and the kernel log, named; those in XID_SEVERITY warn or fail."""
        seen: Counter[int] = Counter()
        for source in (self.g.xid_events, self.g.xid_kernel_log):
            if isinstance(source, list):
                seen.update(source)
        if not isinstance(self.g.xid_events, list) and not isinstance(self.g.xid_kernel_log, list):
            return
        for sev, name in ((Status.FAIL, "xid_fail_count"), (Status.WARN, "xid_warn_count")):
            hits = {x: n for x, n in sorted(seen.items()) if XID_SEVERITY.get(x) == sev}
            what = "XID " + ", ".join(f"{x}{f' x{n}' if n > 1 else ''} ({xid_meaning(x)})" for x, n in hits.items())
            self.limit(name, float(sum(hits.values())), "count", what)
        other = [x for x in sorted(seen) if x not in XID_SEVERITY]
        if other:
            self.notes.append("XID " + ", ".join(f"{x} ({xid_meaning(x)})" for x in other) + " (not judged)")


def _reason(problems: list[Problem]) -> str:
    """The worst problems grouped by GPU: ``cuda:3: PCIe x8 < x16 max; cuda:5: HW slowdown``."""
    ordered = sorted(problems, key=lambda p: -p.status.severity)
    by_device: dict[str, list[str]] = {}
    for p in ordered:
        by_device.setdefault(p.device, []).append(p.message)
    parts = [f"{dev}: {', '.join(msgs)}" for dev, msgs in list(by_device.items())[:MAX_REASON_GPUS]]
    more = len(by_device) - MAX_REASON_GPUS
    return "; ".join(parts) + (f"; +{more} more GPU(s)" if more > 0 else "")


def attach_kernel_xids(snapshot: NvmlSnapshot, events: list[XidEvent] | None, why: str = "") -> None:
    """Put the kernel log's XIDs on the GPUs of ``snapshot``, matched by PCI bus id. Pure.

    ``events`` None: the log could not be read; each readable GPU then records
    ``why`` under ``errors["xid_kernel_log"]`` and its kernel XIDs stay unsupported.
    XIDs of GPUs outside this run are ignored.
    """
    for g in snapshot.gpus:
        if "handle" in g.errors:
            continue
        if events is None:
            g.xid_kernel_log = UNSUPPORTED
            g.errors["xid_kernel_log"] = why or "kernel log not readable"
            continue
        try:
            pci = normalize_pci_bus_id(str(g.pci_bus_id))
        except InputError:
            g.xid_kernel_log = UNSUPPORTED
            g.errors["xid_kernel_log"] = f"no PCI bus id to match the kernel log ({g.pci_bus_id})"
            continue
        g.xid_kernel_log = [e.xid for e in events if normalize_pci_bus_id(e.pci_bus_id) == pci]
        g.errors.pop("xid_kernel_log", None)


def evaluate_health(snapshot: NvmlSnapshot, params: dict[str, Any]) -> Outcome:
    """Judge an NVML snapshot. Pure: no NVML calls, so recorded snapshots replay exactly.

    FAIL: volatile uncorrectable ECC, row-remap failure, PCIe width below max,
    HW thermal slowdown / HW power brake in any sample, HW slowdown in more
    than half of the samples, an NVLink link down while others are up, a GPU
    NVML cannot open (lost, needs a restart, "Unknown Error", ...), an XID that
    needs attention, NVLink counters and memory temperature over :data:`LIMITS`.
    WARN: lifetime uncorrectable ECC, pending page retirement or row remap, PCIe
    generation below max (not while idle), SW thermal slowdown, temperature
    within ``temp_margin_c`` of slowdown, power draw over the limit, ECC
    disabled, the WARN rows of LIMITS. SKIP: no GPU (needs a GPU), or a GPU
    NVML may not open (Insufficient Permissions) when nothing else is wrong.
    """
    if not snapshot.gpus:
        return Outcome.skip("NVML sees no GPU", needs_gpu=True, driver_version=snapshot.driver_version)
    problems: list[Problem] = []
    metrics: list[Metric] = []
    unsupported: dict[str, dict[str, str]] = {}
    gpus: list[dict[str, Any]] = []
    notes: dict[str, list[str]] = {}
    for g in snapshot.gpus:
        judge = _GpuJudge(g, params)
        judge.judge()
        for m in judge.metrics:
            m.tags.update({k: v for k, v in (("uuid", g.uuid), ("pci_bus_id", g.pci_bus_id)) if v != UNSUPPORTED})
        problems += judge.problems
        metrics += judge.metrics
        if judge.notes:
            notes[g.device] = judge.notes
        missing = {f: g.errors.get(f, "not reported") for f in g.unsupported_fields()}
        if "handle" in g.errors:
            missing["handle"] = g.errors["handle"]
        if missing:
            unsupported[g.device] = missing
        mask = g.clocks_event_reasons
        gpus.append({
            "device": g.device, "nvml_index": g.index, "name": g.name, "uuid": g.uuid, "serial": g.serial,
            "pci_bus_id": g.pci_bus_id,
            "clocks_event_reasons": event_reason_names(mask) if isinstance(mask, int) else UNSUPPORTED,
            "pcie": (f"gen{g.pcie_link_gen} x{g.pcie_link_width} "
                     f"(max gen{g.pcie_link_gen_max} x{g.pcie_link_width_max})"),
            "nvlink_active": (f"{sum(g.nvlink_active)}/{len(g.nvlink_active)}"
                              if isinstance(g.nvlink_active, list) else UNSUPPORTED),
        })
    details: dict[str, Any] = {
        "driver_version": snapshot.driver_version,
        "cuda_driver_version": snapshot.cuda_driver_version,
        "gpu_count": snapshot.gpu_count,
        "gpus": gpus,
        "problems": [p.to_dict() for p in problems],
        "unsupported": unsupported,
    }
    if snapshot.cuda_visible_devices is not None:
        details["cuda_visible_devices"] = snapshot.cuda_visible_devices
    if notes:
        details["notes"] = notes
    judged = [p for p in problems if p.status != Status.SKIP]
    skipped = sorted({p.device for p in problems if p.status == Status.SKIP})
    if judged:
        status = worst(*(p.status for p in judged))
        return Outcome(status, _reason(judged + [p for p in problems if p.status == Status.SKIP]), metrics, details)
    if skipped:  # a GPU not read is never a pass
        return Outcome(Status.SKIP, _reason(problems), metrics, details)
    reason = (f"{len(snapshot.gpus)} GPU(s) healthy "
              f"(driver {snapshot.driver_version}, CUDA {snapshot.cuda_driver_version})")
    return Outcome(Status.PASS, reason + unsupported_note(unsupported), metrics, details)


def unsupported_note(unsupported: dict[str, dict[str, str]], listed: int = 4) -> str:
    """``; N NVML field(s) unsupported: a, b, c, d and K more (details.unsupported)``, the fields named (each once
    however many GPUs lack it), or "" when NVML gave every field."""
    count = sum(len(v) for v in unsupported.values())
    if not count:
        return ""
    names = list(dict.fromkeys(f for fields in unsupported.values() for f in fields))
    more = f" and {len(names) - listed} more" if len(names) > listed else ""
    return f"; {count} NVML field(s) unsupported: {', '.join(names[:listed])}{more} (details.unsupported)"


class HealthCheck(Check):
    """NVML health snapshot of each GPU (``nvidia-smi -q``); instant, no load applied."""

    name = "health"
    tag = "HEALTH"
    summary = "ECC, row remapping, PCIe link, throttle reasons, temperature, power and NVLink from NVML"
    params: ClassVar[tuple[Param, ...]] = (
        Param("pcie_strict", "bool", False,
              "fail (not warn) when a PCIe link runs below its max generation, even while idle"),
        Param("temp_margin_c", "float", 5.0, "warn when a GPU is within this many C of its slowdown temperature",
              minimum=0.0, maximum=100.0),
        Param("require_ecc", "bool", True, "warn when a GPU supports ECC but has it disabled"),
        Param("nvlink", "bool", True, "check NVLink link states"),
        Param("sample_s", "float", 1.0, "seconds to sample clock event reasons (HW slowdown must persist)",
              minimum=0.0, maximum=3600.0),
        Param("sample_interval_s", "float", 0.1, "seconds between clock event reason samples", minimum=0.01,
              maximum=60.0),
        Param("kernel_log", "bool", True, "read XIDs from the kernel log (/dev/kmsg or dmesg) where permitted"),
    )
    # A snapshot costs the same in every profile.
    profiles: ClassVar[tuple[str, ...]] = PROFILES  # burnin too: the inventory and health around a long load
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {p: {} for p in PROFILES}
    thresholds: ClassVar[tuple[ThresholdRule, ...]] = (
        ThresholdRule("ecc_volatile_uncorrectable", max=0.0),
        ThresholdRule("ecc_aggregate_uncorrectable", max=0.0, severity=Status.WARN),
        ThresholdRule("remapped_rows_pending", max=0.0, severity=Status.WARN),
        ThresholdRule("remapped_rows_failure", max=0.0),
        ThresholdRule("retired_pages_pending", max=0.0, severity=Status.WARN),
        ThresholdRule("nvlink_links_down", max=0.0),
        *(ThresholdRule(name, max=bound, severity=sev) for name, (bound, sev) in LIMITS.items()),
    )
    # nvmlInit can take seconds per GPU when persistence mode is off.
    timeout_s: ClassVar[dict[str, float]] = {"quick": 60.0, "standard": 60.0, "full": 120.0, "burnin": 120.0}
    key_metric = "temperature_c"
    metrics = ("ecc_volatile_uncorrectable", "ecc_volatile_correctable", "ecc_aggregate_uncorrectable",
               "ecc_aggregate_correctable", "retired_pages_pending", "retired_pages_sbe", "retired_pages_dbe",
               "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
               "remapped_rows_failure", "pcie_link_width", "pcie_link_gen", "temperature_c", "power_w",
               "power_limit_w", "nvlink_links_active", "nvlink_links_down", *LIMITS)
    imports_beside = True  # one NVML snapshot and GPU-side clock event reasons: no CPU or GPU work timed

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.health(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        from gpuaccept.hw.nvml import read_visible_snapshot
        from gpuaccept.hw.xid import parse_kernel_xids, read_kernel_log

        try:
            snapshot = read_visible_snapshot(os.environ.get("CUDA_VISIBLE_DEVICES"), ctx.gpus,
                                             sample_s=float(ctx.params.get("sample_s", 1.0)),
                                             interval_s=float(ctx.params.get("sample_interval_s", 0.1)))
        except NvmlUnavailable as exc:
            return Outcome.skip(str(exc), needs_gpu=True)
        except InputError as exc:
            return Outcome.failed(str(exc))
        if ctx.params.get("kernel_log", True):
            text, where = read_kernel_log()
            attach_kernel_xids(snapshot, parse_kernel_xids(text) if text is not None else None, where)
        outcome = evaluate_health(snapshot, ctx.params)
        if ctx.verbose:
            outcome.details["snapshot"] = snapshot.to_dict()
        return outcome


CHECKS = (HealthCheck,)
