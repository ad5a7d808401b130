"""Time-based warm-up and window planning (pure, with fake clocks), and the sustained measurement on CPU."""

from __future__ import annotations

import itertools
import math
import time

import pytest

from gpuaccept.checks.compute import ComputeCheck, GemmWorkload, measure_gemm
from gpuaccept.checks.timing import (
    MAX_WINDOW_ITERS,
    SUSTAINED_WARMUP_S,
    SUSTAINED_WINDOW_S,
    burst_note,
    next_chunk,
    rates_agree,
    stable_chunk_s,
    warm_up,
    warm_up_done,
    window_iters,
)

torch = pytest.importorskip("torch")
CPU = torch.device("cpu")


@pytest.mark.parametrize(("per_call", "window", "min_iters", "want"), [
    (0.03, 0.5, 1, 19),           # bf16 N=8192 on an H100: ~30 ms per window of 20 became >= 0.5 s (+10%)
    (0.03, 0.5, 20, 20),          # never fewer than asked
    (1e-3, 1.0, 10, 1100),
    (0.25, 0.5, 1, 3),
    (0.3, 0.5, 1, 2),             # rounds up: the window lasts at least the minimum
    (1e-3, 0.0, 10, 10),          # no window length asked: iters as given
    (0.0, 0.5, 10, MAX_WINDOW_ITERS),  # a probe that measured nothing
    (math.nan, 0.5, 10, MAX_WINDOW_ITERS),
    (1e-12, 1.0, 1, MAX_WINDOW_ITERS),  # capped
])
def test_window_iters(per_call: float, window: float, min_iters: int, want: int) -> None:
    assert window_iters(per_call, window, min_iters) == want


def test_next_chunk_doubles_but_stops_at_the_remaining_time() -> None:
    assert next_chunk(0.0, 0, 5.0, 1) == 1
    assert next_chunk(0.01, 1, 5.0, 1) == 2
    assert next_chunk(0.01, 7, 5.0, 4) == 8
    assert next_chunk(4.9, 490, 5.0, 256) == 10  # 0.1 s left at 10 ms per call


class FakeClock:
    """A clock that a fake workload advances by ``per_call`` seconds per call."""

    def __init__(self, per_call: float) -> None:
        self.now, self.per_call, self.calls = 100.0, per_call, 0

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.calls += 1
        self.now += self.per_call


def test_warm_up_runs_for_the_asked_time_and_probes_the_rate() -> None:
    clock = FakeClock(0.03)
    w = warm_up(clock.step, CPU, seconds=5.0, min_calls=2, clock=clock)
    assert 5.0 <= w.seconds < 5.0 + 0.03 + 1e-9  # never overshoots by more than one call
    assert w.calls == clock.calls == math.ceil(5.0 / 0.03 - 1e-9)
    assert w.per_call_s == pytest.approx(0.03)
    assert window_iters(w.per_call_s, 0.5, 20) == 20 and window_iters(w.per_call_s, 1.0, 1) == 37


def test_warm_up_honours_the_minimum_calls_and_always_probes() -> None:
    clock = FakeClock(0.5)
    w = warm_up(clock.step, CPU, seconds=0.1, min_calls=5, clock=clock)
    assert w.calls == 5 and w.per_call_s == pytest.approx(0.5)
    clock = FakeClock(0.5)
    w = warm_up(clock.step, CPU, seconds=0.0, min_calls=0, clock=clock)
    assert w.calls == 1 and w.per_call_s == pytest.approx(0.5)


def test_warm_up_done_waits_for_time_calls_then_two_agreeing_chunks() -> None:
    rule = {"seconds": 0.2, "min_calls": 2, "max_seconds": 1.0, "stable_within": 0.1}
    assert stable_chunk_s(0.2) == pytest.approx(0.02) and stable_chunk_s(0.0) == pytest.approx(0.01)
    ok = [(0.05, 0.0105), (0.05, 0.01)]
    assert warm_up_done(0.1, 10, ok, **rule) == (False, False)                       # time not yet spent
    assert warm_up_done(0.3, 1, ok, **rule) == (False, False)                        # too few calls
    assert warm_up_done(0.3, 10, [(0.05, 0.5), (0.05, 0.01)], **rule) == (False, False)  # 50x apart
    assert warm_up_done(0.3, 10, ok, **rule) == (True, True)                         # within 10 %
    assert warm_up_done(0.3, 10, [(0.001, 0.01), (0.05, 0.01)], **rule) == (False, False)  # one too short
    assert warm_up_done(1.0, 99, [(0.05, 0.02), (0.05, 0.01)], **rule) == (True, False)  # cap, not settled
    assert warm_up_done(0.3, 10, [(0.05, 0.5)], **{**rule, "stable_within": 0.0}) == (True, True)  # rule off
    assert rates_agree(1.0, 1.1, 0.1) and not rates_agree(1.0, 1.2, 0.1) and not rates_agree(math.nan, 1.0, 0.1)


class RampClock(FakeClock):
    """Calls start 60x slower than they end and speed up over ~0.1 s (a cold thread pool, rising clocks)."""

    def step(self) -> None:
        self.calls += 1
        self.now += self.per_call * (1 + 59 * math.exp(-(self.now - 100.0) / 0.1))


def test_warm_up_continues_past_a_slow_start_until_the_rate_is_stable() -> None:
    # Time alone (0.2 s, the quick profile): the probe still reads the ramp, several times too slow.
    plain = RampClock(0.001)
    w = warm_up(plain.step, CPU, seconds=0.2, min_calls=2, clock=plain)
    assert w.per_call_s > 3 * 0.001
    # With the stability rule the warm-up runs on until two chunks agree within 10 %.
    clock = RampClock(0.001)
    w = warm_up(clock.step, CPU, seconds=0.2, min_calls=2, max_seconds=1.0, stable_within=0.1, clock=clock)
    assert w.settled and w.per_call_s == pytest.approx(0.001, rel=0.15) and 0.2 < w.seconds < 1.0
    # A rate that never settles stops at the cap and says so.
    jitter = itertools.cycle([0.001, 0.003])

    class Jitter(FakeClock):
        def step(self) -> None:
            self.calls += 1
            self.now += next(jitter)

    j = Jitter(0.0)
    w = warm_up(j.step, CPU, seconds=0.05, min_calls=1, max_seconds=0.3, stable_within=0.0001, clock=j)
    assert not w.settled and 0.3 <= w.seconds < 0.3 + 0.05


def test_burst_note_and_profiles() -> None:
    assert burst_note(SUSTAINED_WARMUP_S, SUSTAINED_WINDOW_S) is None
    assert "burst" in (burst_note(0.2, 0.02) or "")
    assert burst_note(10.0, 0.03) is not None  # long warm-up, 30 ms windows: still a burst
    for profile in ("standard", "full"):
        p = ComputeCheck.defaults(profile)
        assert p["warmup_s"] >= SUSTAINED_WARMUP_S and p["min_window_s"] >= SUSTAINED_WINDOW_S, profile
        assert burst_note(p["warmup_s"], p["min_window_s"]) is None
    quick = ComputeCheck.defaults("quick")
    assert burst_note(quick["warmup_s"], quick["min_window_s"]) is not None


def test_standard_timeout_covers_eight_gpus() -> None:
    p = ComputeCheck.defaults("standard")
    dtypes = len(p["dtypes"])
    per_run = p["warmup_s"] + p["trials"] * p["min_window_s"]
    planned = (8 + 1) * dtypes * per_run  # 8 GPUs alone, then all at once
    assert planned * 1.5 < ComputeCheck.timeout_s["standard"]
    f = ComputeCheck.defaults("full")
    assert (8 + 1) * len(f["dtypes"]) * (f["warmup_s"] + f["trials"] * f["min_window_s"]) * 1.5 \
        < ComputeCheck.timeout_s["full"]


def test_sustained_measurement_sees_a_device_that_throttles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device at 1 ms per GEMM for its first 0.25 s of load, then 4 ms (throttled)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 32 x 32 GEMM costs microseconds; the sleeps are the device
    real_step = GemmWorkload.step
    start: list[float] = []

    def throttling_step(self: GemmWorkload) -> None:
        real_step(self)
        now = time.perf_counter()
        start[:] = start or [now]
        time.sleep(0.001 if now - start[0] < 0.25 else 0.004)

    monkeypatch.setattr(GemmWorkload, "step", throttling_step)
    try:
        burst = measure_gemm(CPU, "fp32", 32, warmup=5, iters=20, trials=3, buffers=2)  # the old defaults
        start.clear()
        sustained = measure_gemm(CPU, "fp32", 32, warmup=5, iters=20, trials=3, buffers=2, warmup_s=0.5,
                                 min_window_s=0.15)
    finally:
        torch.set_num_threads(threads)
    assert burst.ok and sustained.ok
    assert sustained.warmup_s >= 0.5 and median(sustained.window_s) >= 0.15
    assert min(sustained.window_s) >= 0.15 * 0.9  # the window length comes from a probe: jitter is allowed
    assert sustained.iters >= 20
    # the burst reads the boost rate; the sustained measurement the throttled one
    assert median(burst.window_s) / burst.iters < 0.0025 < median(sustained.window_s) / sustained.iters


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def test_measure_gemm_without_time_asked_keeps_counts() -> None:
    calls = itertools.count()
    real_step = GemmWorkload.step

    def counting_step(self: GemmWorkload) -> None:
        next(calls)
        real_step(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GemmWorkload, "step", counting_step)
        res = measure_gemm(CPU, "fp32", 32, warmup=3, iters=4, trials=2, buffers=1)
    assert res.iters == 4 and len(res.window_s) == 2
    assert next(calls) == 3 + 2 * 4
