"""Clocks, temperature, power and throttle reasons of GPUs, sampled by a background thread during a load.

The equivalent command is::

    nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active \\
               --format=csv -lms 1000

:class:`NvmlSampler` opens the GPUs a run tests (torch ordinals, mapped to NVML
by UUID through ``CUDA_VISIBLE_DEVICES``) and reads each every ``interval_s``
until stopped. A reading NVML refuses is ``None`` in that sample, never an
exception; a missing NVML raises :class:`~gpuaccept.hw.nvml.NvmlUnavailable`
from :meth:`NvmlSampler.start`. :func:`summarize` turns one GPU's samples into
plain numbers (pure, so tests feed it recorded or made-up samples).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpuaccept.hw.gpumap import map_visible_devices, select_ordinals
from gpuaccept.hw.nvml import NvmlUnavailable, inventory

THROTTLE_MASK: Final = 0x8 | 0x20 | 0x40 | 0x80
"""Clock event reasons that count as throttling: HW slowdown, SW thermal, HW thermal, HW power brake.
SW power cap (0x4) is left out: a GPU under a sustained GEMM runs at its power limit by design."""

THROTTLE_NAMES: Final[dict[int, str]] = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                                         0x80: "hw_power_brake"}


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU: seconds since the sampler started, SM clock (MHz), temperature (C),
    power draw (W) and the clock event reason bitmask; None where NVML would not say."""

    t_s: float
    sm_clock_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    reasons: int | None


@dataclass
class Summary:
    """What one GPU's samples show (None: no sample had that reading)."""

    samples: int
    sm_clock_mhz_min: int | None = None
    sm_clock_mhz_median: float | None = None
    sm_clock_mhz_max: int | None = None
    temperature_c_max: int | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    throttle_fraction: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def throttle_names(mask: int) -> list[str]:
    """Names of the throttling bits (:data:`THROTTLE_MASK`) set in ``mask``."""
    return [name for bit, name in THROTTLE_NAMES.items() if mask & bit]


def summarize(samples: Sequence[Sample], mask: int = THROTTLE_MASK) -> Summary:
    """Min/median/max SM clock, hottest temperature, mean and peak power, and the fraction of the samples
    with a reason bit of ``mask`` set (the samples that report reasons only). Pure."""
    out = Summary(samples=len(samples))
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    temps = [s.temperature_c for s in samples if s.temperature_c is not None]
    power = [s.power_w for s in samples if s.power_w is not None]
    reasons = [s.reasons for s in samples if s.reasons is not None]
    if clocks:
        out.sm_clock_mhz_min, out.sm_clock_mhz_max = min(clocks), max(clocks)
        out.sm_clock_mhz_median = float(statistics.median(clocks))
    if temps:
        out.temperature_c_max = max(temps)
    if power:
        out.power_w_mean, out.power_w_max = round(statistics.fmean(power), 2), max(power)
    if reasons:
        hit = [r for r in reasons if r & mask]
        out.throttle_fraction = len(hit) / len(reasons)
        seen = 0
        for r in hit:
            seen |= r
        out.throttle_reasons = throttle_names(seen & mask)
    return out


def _read(nvml: Any, handle: Any, fn_name: str, *args: Any) -> Any:
    fn = getattr(nvml, fn_name, None)
    if fn is None:
        return None
    try:
        return fn(handle, *args)
    except nvml.NVMLError:
        return None


def read_sample(nvml: Any, handle: Any, t_s: float) -> Sample:
    """One :class:`Sample` of the GPU behind ``handle`` (``nvml`` is the pynvml module or a stand-in)."""
    clock = _read(nvml, handle, "nvmlDeviceGetClockInfo", getattr(nvml, "NVML_CLOCK_SM", 1))
    temp = _read(nvml, handle, "nvmlDeviceGetTemperature", getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    power = _read(nvml, handle, "nvmlDeviceGetPowerUsage")
    reasons = _read(nvml, handle, "nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = _read(nvml, handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
    return Sample(round(t_s, 3), int(clock) if clock is not None else None,
                  int(temp) if temp is not None else None,
                  round(power / 1000.0, 2) if power is not None else None,  # NVML reports mW
                  int(reasons) if reasons is not None else None)


class NvmlSampler:
    """Samples the GPUs at torch ``ordinals`` every ``interval_s`` in a daemon thread, between
    :meth:`start` and :meth:`stop`; ``samples`` maps ``cuda:<ordinal>`` to its list of :class:`Sample`."""

    def __init__(self, ordinals: list[int] | None, visible: str | None, interval_s: float = 1.0,
                 nvml: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.ordinals, self.visible, self.interval_s = ordinals, visible, interval_s
        self._nvml = nvml
        self._clock = clock
        self._handles: dict[str, Any] = {}
        self._initialized = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.samples: dict[str, list[Sample]] = {}

    def start(self) -> None:
        """Initialise NVML, open the GPUs and start sampling (NvmlUnavailable when NVML cannot load)."""
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailable(f"NVML not available: nvidia-ml-py is not installed ({exc})") from exc
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML not available: {exc}") from exc
        self._initialized = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            inv = inventory(nvml, count, with_mig="mig-" in (self.visible or "").lower())
            for gpu in select_ordinals(map_visible_devices(self.visible, inv), self.ordinals):
                handle = (nvml.nvmlDeviceGetHandleByUUID(gpu.uuid) if gpu.uuid
                          else nvml.nvmlDeviceGetHandleByIndex(gpu.index))
                self._handles[gpu.device] = handle
                self.samples[gpu.device] = []
        except nvml.NVMLError as exc:
            self.stop()
            raise NvmlUnavailable(f"NVML cannot open the GPUs: {exc}") from exc
        start = self._clock()

        def loop() -> None:
            while True:
                now = self._clock() - start
                for label, handle in self._handles.items():
                    sample = read_sample(nvml, handle, now)
                    with self._lock:
                        self.samples[label].append(sample)
                if self._stop.wait(self.interval_s):
                    return

        self._thread = threading.Thread(target=loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, list[Sample]]:
        """Stop sampling, shut NVML down, and return the samples per GPU label."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self.interval_s + 5)
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
        with self._lock:
            return {k: list(v) for k, v in self.samples.items()}
