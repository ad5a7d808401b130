"""Device-agnostic timing: time-based warm-up, window planning from a timed probe, timed windows.

Used by the compute (GEMM) and nbody checks. A sustained measurement warms the
device for several seconds (so clocks leave boost and reach what power and
heat allow) and times windows long enough (>= 0.5 s) that a throttling device
cannot hide in a burst. torch is imported inside functions only.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Below these a measurement is a burst: boost clocks, not what the device sustains.
SUSTAINED_WARMUP_S = 3.0
SUSTAINED_WINDOW_S = 0.5
MAX_WINDOW_ITERS = 1_000_000
WINDOW_MARGIN = 1.1  # the probe can read a little slow (launch latency, jitter): aim 10% past the minimum


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on ``device`` (no-op on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def finite_or_none(x: float) -> float | None:
    """``x``, or None for NaN/inf (JSON has neither), for ``details``."""
    return x if math.isfinite(x) else None


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN for none)."""
    return statistics.median(values) if values else math.nan


def window_iters(per_call_s: float, min_window_s: float, min_iters: int, max_iters: int = MAX_WINDOW_ITERS) -> int:
    """Calls per timed window so that it lasts at least ``min_window_s`` seconds at ``per_call_s`` per call.

    Aims :data:`WINDOW_MARGIN` past the minimum, since the probe is an estimate.
    Never fewer than ``min_iters`` nor more than ``max_iters``; a probe that
    measured nothing (``per_call_s <= 0``) gets ``max_iters`` when a window
    length is asked for.
    """
    if min_window_s <= 0:
        return max(1, min_iters)
    if per_call_s <= 0 or not math.isfinite(per_call_s):
        return max(1, min_iters, max_iters)
    want = math.ceil(WINDOW_MARGIN * min_window_s / per_call_s)
    return max(1, min_iters, min(want, max_iters))


def next_chunk(done_s: float, calls: int, target_s: float, last_chunk: int) -> int:
    """Calls in the next warm-up chunk: doubling, but not past the remaining time at the rate so far."""
    if calls <= 0 or done_s <= 0:
        return max(1, last_chunk)
    remaining = max(0.0, target_s - done_s)
    per_call = done_s / calls
    return max(1, min(2 * last_chunk, math.ceil(remaining / per_call)))


STABLE_CHUNK_S = 0.01
STABLE_CHUNK_FRACTION = 0.1
"""Chunks compared for a stable rate last at least ``max(STABLE_CHUNK_S, STABLE_CHUNK_FRACTION * seconds)``
(a single call is noise, and two short chunks agree even on a slow ramp)."""


def stable_chunk_s(seconds: float) -> float:
    """The shortest warm-up chunk whose rate counts towards stability, for a warm-up of ``seconds``."""
    return max(STABLE_CHUNK_S, STABLE_CHUNK_FRACTION * seconds)


def rates_agree(a: float, b: float, within: float) -> bool:
    """Whether per-call times ``a`` and ``b`` differ by at most ``within`` of the larger one."""
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 0 or b <= 0:
        return False
    return abs(a - b) <= within * max(a, b)


def warm_up_done(elapsed_s: float, calls: int, chunks: Sequence[tuple[float, float]], *, seconds: float,
                 min_calls: int, max_seconds: float, stable_within: float) -> tuple[bool, bool]:
    """(stop now, rate settled) after a warm-up chunk: the stopping rule of :func:`warm_up` (pure).

    ``chunks`` are ``(seconds, seconds per call)`` of each chunk so far, oldest
    first. Never stop before ``seconds`` of wall time and ``min_calls`` calls.
    Then, with ``stable_within`` > 0, not before the last two chunks both last
    at least :func:`stable_chunk_s` and their per-call times agree within that
    fraction (:func:`rates_agree`), unless ``max_seconds`` have passed (stop,
    not settled).
    """
    if elapsed_s < seconds or calls < min_calls:
        return False, False
    if stable_within <= 0:
        return True, True
    shortest = stable_chunk_s(seconds)
    settled = (len(chunks) >= 2 and min(chunks[-2][0], chunks[-1][0]) >= shortest
               and rates_agree(chunks[-2][1], chunks[-1][1], stable_within))
    return settled or elapsed_s >= max_seconds, settled


@dataclass
class WarmUp:
    """What a warm-up did: calls, wall seconds, seconds per call of its last chunk (the probe), and
    whether its rate settled (False: it stopped at its time limit with the last two chunks still apart)."""

    calls: int
    seconds: float
    per_call_s: float
    settled: bool = True


def warm_up(fn: Callable[[], object], device: torch.device, *, seconds: float, min_calls: int,
            max_seconds: float | None = None, stable_within: float = 0.0,
            clock: Callable[[], float] = time.perf_counter) -> WarmUp:
    """Call ``fn`` untimed until ``seconds`` of wall time and ``min_calls`` calls have passed and, with
    ``stable_within`` > 0, the rate is stable; never past ``max_seconds`` for the stability (default
    ``seconds``: no extension) -- :func:`warm_up_done` is the rule.

    Calls go in synchronized chunks (1, 2, 4, ... capped by the time left;
    while waiting for a stable rate, chunks of :func:`stable_chunk_s` at the
    rate of the previous one); the last one, at the end of the warm-up and
    so at the settled clocks, is the timed probe of the per-call time that
    :func:`window_iters` turns into a window length. Always makes at least one
    call, which is the probe when nothing more is asked for.
    """
    limit = seconds if max_seconds is None else max(seconds, max_seconds)
    start = clock()
    calls, chunk = 0, 1
    chunks: list[tuple[float, float]] = []
    while True:
        t0 = clock()
        for _ in range(chunk):
            fn()
        synchronize(device)
        t1 = clock()
        calls += chunk
        chunks.append((t1 - t0, (t1 - t0) / chunk))
        probe = chunks[-1][1]
        stop, settled = warm_up_done(t1 - start, calls, chunks, seconds=seconds, min_calls=min_calls,
                                     max_seconds=limit, stable_within=stable_within)
        if stop:
            return WarmUp(calls, t1 - start, probe, settled)
        if t1 - start < seconds:
            chunk = next_chunk(t1 - start, calls, seconds, chunk)
        elif calls < min_calls:
            chunk = max(1, min_calls - calls)
        elif probe > 0:  # waiting for a stable rate: chunks of at least stable_chunk_s, within the limit
            chunk = max(1, min(math.ceil(stable_chunk_s(seconds) / probe), math.ceil((limit - (t1 - start)) / probe)))


def time_windows(fn: Callable[[], object], device: torch.device, *, warmup: int, windows: int, iters: int,
                 before_window: Callable[[], None] | None = None) -> list[float]:
    """Seconds taken by each of ``windows`` windows of ``iters`` back-to-back ``fn()`` calls.

    ``warmup`` untimed calls come first. On CUDA each window is bracketed by
    events on the current stream (so launch overhead overlapping the GPU is not
    counted); on CPU by ``time.perf_counter``. ``before_window`` runs before each
    window, outside the timing (a barrier for concurrent runs).
    """
    import torch

    if windows < 1 or iters < 1:
        raise ValueError("windows and iters must be >= 1")
    cuda = device.type == "cuda"
    # events record on the current stream of the current device: make that ``device``
    with torch.cuda.device(device) if cuda else contextlib.nullcontext():
        for _ in range(warmup):
            fn()
        synchronize(device)
        times: list[float] = []
        for _ in range(windows):
            if before_window is not None:
                before_window()
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                times.append(time.perf_counter() - t0)
    return times


def burst_note(warmup_s: float, min_window_s: float) -> str | None:
    """Why a measurement with this warm-up and window length shows burst, not sustained, throughput (None if not)."""
    if warmup_s >= SUSTAINED_WARMUP_S and min_window_s >= SUSTAINED_WINDOW_S:
        return None
    return (f"burst throughput ({warmup_s:g} s warm-up, windows >= {min_window_s:g} s; sustained needs "
            f">= {SUSTAINED_WARMUP_S:g} s and >= {SUSTAINED_WINDOW_S:g} s, as the standard and full profiles do)")
