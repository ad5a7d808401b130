"""Device memory test: fill most of the free memory with patterns and verify every word.

Like ``cuda_memtest`` / ``memtest86``: the allocation (a fraction of the free
device memory, or a small fixed size on CPU) is split into chunks; each
pattern is written to every chunk and then read back and compared word by
word. Patterns, over 32-bit words:

* ``walking_ones``: word *i* holds ``1 << ((i + pass) % 32)``; over 32 passes every
  bit position of every word is set alone.
* ``walking_zeros``: the complement of ``walking_ones``.
* ``random``: seeded pseudo-random words, regenerated from the seed to verify.
* ``address``: word *i* holds its own word index (mod 2**32), complemented on odd passes.

Metrics per device: ``memtest_errors`` (count of words that read back wrong,
summed over pattern runs; default threshold ``max 0``), ``memtest_bytes_tested``
(bytes of the allocation verified by at least one pattern) and ``memtest_gbs``
(verification throughput, bytes compared / compare time, GB/s = 1e9 bytes/s).

The fill and verify helpers are pure functions of a given tensor, so a test can
corrupt one element and check that it is reported at the right offset.
"""

from __future__ import annotations

import functools
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
    ThresholdRule,
    per_device,
    torch_devices_or_skip,
)
from gpuaccept.model import Metric

MIB = 1 << 20
WORD = 4  # bytes per tested word (int32)
PATTERNS = ("walking_ones", "walking_zeros", "random", "address")
_RANDOM_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant to derive per-chunk seeds


@dataclass(frozen=True)
class BadWord:
    """A word that did not read back as written. ``offset`` is in bytes from the start of the allocation."""

    offset: int
    expected: int
    actual: int
    pattern: str

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "expected": f"0x{self.expected:08x}", "actual": f"0x{self.actual:08x}",
                "flipped_bits": f"0x{self.expected ^ self.actual:08x}", "pattern": self.pattern}


@dataclass
class VerifyResult:
    """Mismatch count of one verified buffer and the first ``max_report`` bad words."""

    errors: int
    bad: list[BadWord] = field(default_factory=list)


def _signed32(x: int) -> int:
    """``x`` mod 2**32 as a signed 32-bit integer."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def _walking_period(device: Any, first_bit: int, invert: bool) -> Any:
    """The 32-word period of the walking pattern starting at bit ``first_bit`` (int32 tensor on ``device``).

    Cached per device, so that building it does not synchronize the device on every chunk.
    """
    import torch

    return _walking_period_cached(str(torch.device(device)), first_bit % 32, invert)


@functools.lru_cache(maxsize=512)
def _walking_period_cached(device: str, first_bit: int, invert: bool) -> Any:
    import torch

    words = [_signed32(1 << ((first_bit + k) % 32)) for k in range(32)]
    if invert:
        words = [_signed32(~w) for w in words]
    return torch.tensor(words, dtype=torch.int32, device=device)


def chunk_seed(seed: int, pass_index: int, base_word: int) -> int:
    """Deterministic generator seed for the random pattern of one chunk in one pass."""
    return (seed * 1_000_003 + pass_index * 7919 + base_word * _RANDOM_MIX) % (1 << 63)


def expected_words(pattern: str, n: int, base_word: int, pass_index: int, seed: int, device: Any) -> Any:
    """The int32 words ``pattern`` puts at word indices ``base_word .. base_word + n - 1`` of the allocation."""
    import torch

    if pattern in ("walking_ones", "walking_zeros"):
        period = _walking_period(device, (base_word + pass_index) % 32, pattern == "walking_zeros")
        return period.repeat((n + 31) // 32)[:n]
    if pattern == "random":
        gen = torch.Generator(device=device)
        gen.manual_seed(chunk_seed(seed, pass_index, base_word))
        return torch.randint(-(1 << 31), 1 << 31, (n,), dtype=torch.int32, device=device, generator=gen)
    if pattern == "address":
        words = torch.arange(n, dtype=torch.int32, device=device)
        words.add_(_signed32(base_word))  # int32 arithmetic wraps modulo 2**32
        return words.bitwise_not_() if pass_index % 2 else words
    raise ValueError(f"unknown memtest pattern {pattern!r}; known: {', '.join(PATTERNS)}")


def fill_pattern(buf: Any, pattern: str, base_word: int = 0, pass_index: int = 0, seed: int = 0) -> None:
    """Write ``pattern`` into the 1-D int32 tensor ``buf``, whose first word is word ``base_word`` of the allocation.

    Walking patterns are written by broadcasting their 32-word period; the
    others through one temporary of ``buf``'s size.
    """
    n = buf.numel()
    if pattern in ("walking_ones", "walking_zeros") and n % 32 == 0:
        period = _walking_period(buf.device, (base_word + pass_index) % 32, pattern == "walking_zeros")
        buf.view(-1, 32).copy_(period)
        return
    buf.copy_(expected_words(pattern, n, base_word, pass_index, seed, buf.device))


def verify_pattern(buf: Any, pattern: str, base_word: int = 0, pass_index: int = 0, seed: int = 0,
                   max_report: int = 10) -> VerifyResult:
    """Compare ``buf`` with what :func:`fill_pattern` wrote; count mismatching words and report the first ones.

    Returns the number of 32-bit words that differ and up to ``max_report``
    :class:`BadWord` entries in address order (byte offsets from the start of
    the allocation, i.e. ``(base_word + index) * 4``).
    """
    errors = int(_mismatch_count(buf, pattern, base_word, pass_index, seed).item())
    if errors == 0:
        return VerifyResult(0)
    expected = expected_words(pattern, buf.numel(), base_word, pass_index, seed, buf.device)
    return VerifyResult(errors, _first_bad(buf, expected, pattern, base_word, max_report))


def _first_bad(buf: Any, expected: Any, pattern: str, base_word: int, max_report: int,
               block: int = 1 << 20) -> list[BadWord]:
    """The first ``max_report`` mismatching words, scanning ``block`` words at a time to bound memory."""
    import torch

    bad: list[BadWord] = []
    for start in range(0, buf.numel(), block):
        if len(bad) >= max_report:
            break
        got, want = buf[start:start + block], expected[start:start + block]
        idx = torch.nonzero(got != want).flatten()[: max_report - len(bad)]
        if idx.numel() == 0:
            continue
        for i, a, e in zip(idx.tolist(), got[idx].tolist(), want[idx].tolist(), strict=True):
            bad.append(BadWord(offset=(base_word + start + i) * WORD, expected=e & 0xFFFFFFFF,
                               actual=a & 0xFFFFFFFF, pattern=pattern))
    return bad


@dataclass
class DeviceTest:
    """The buffers and running totals of one device under test."""

    label: str
    device: Any
    chunks: list[Any]
    errors: int = 0
    bytes_verified: int = 0
    verify_s: float = 0.0
    bad: list[BadWord] = field(default_factory=list)
    alloc_note: str = ""
    allocated: int = 0

    def __post_init__(self) -> None:
        self.allocated = sum(c.numel() for c in self.chunks) * WORD


def allocate_chunks(device: Any, target_bytes: int, chunk_bytes: int) -> tuple[list[Any], str]:
    """Allocate up to ``target_bytes`` as int32 chunks of ``chunk_bytes``; stop early on out-of-memory.

    Returns the chunks and a note (empty unless allocation stopped early).
    """
    import torch

    chunk_words = max(32, chunk_bytes // WORD // 32 * 32)
    chunks: list[Any] = []
    left = target_bytes // WORD // 32 * 32
    while left > 0:
        words = min(chunk_words, left)
        try:
            chunks.append(torch.empty(words, dtype=torch.int32, device=device))
        except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
            if "out of memory" not in str(exc).lower() and not isinstance(exc, torch.cuda.OutOfMemoryError):
                raise
            return chunks, f"allocation stopped at {sum(c.numel() for c in chunks) * WORD / MIB:.0f} MiB " \
                           "(out of memory)"
        left -= words
    return chunks, ""


class _Timer:
    """Elapsed verification time per device: CUDA events on GPU, wall clock on CPU."""

    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = device.type == "cuda"
        if self.cuda:
            stream = torch.cuda.current_stream(device)
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record(stream)
            self.stream = stream
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.end.record(self.stream)
        else:
            self.t1 = time.perf_counter()

    def seconds(self) -> float:
        if self.cuda:
            self.end.synchronize()
            return float(self.start.elapsed_time(self.end)) / 1e3
        return self.t1 - self.t0


class MemtestCheck(Check):
    """Pattern test of device memory: write, read back, count wrong words."""

    name = "memtest"
    tag = "MEMORY"
    summary = "Fill free GPU memory with walking-bit, random and address patterns and verify every word"
    key_metric = "memtest_errors"
    metrics = ("memtest_errors", "memtest_bytes_tested", "memtest_gbs")
    params = (
        Param("fraction", "float", 0.9, "GPU: fraction of the free device memory to test", minimum=0.0,
              maximum=1.0),
        Param("cpu_mib", "int", 64, "CPU: MiB of host memory to test (a fixed small size)", minimum=1,
              maximum=1 << 24, memory_mib=True),
        Param("chunk_mib", "int", 256, "allocation chunk size in MiB (bounds temporary memory; a GPU keeps four "
              "chunks free besides the tested ones)", minimum=1, maximum=1 << 20, gpu_memory_mib=True, gpu_buffers=5),
        Param("patterns", "list", ["walking_ones", "random", "address"], "patterns to run, in order",
              choices=PATTERNS),
        Param("passes", "int", 1, "passes over all patterns; each pass shifts the walking bit, reseeds random "
              "and complements address on odd passes", minimum=1, maximum=1000),
        Param("seed", "int", 1, "seed of the random pattern", minimum=0, maximum=(1 << 32) - 1),
        Param("max_seconds", "float", 60.0, "time budget; stops between patterns when spent", minimum=0.0,
              maximum=7 * 24 * 3600.0),
        Param("max_report", "int", 10, "bad words reported in details per device", minimum=0, maximum=10_000),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"cpu_mib": 64, "chunk_mib": 64, "passes": 1, "max_seconds": 10.0},
        "standard": {"cpu_mib": 256, "chunk_mib": 256, "passes": 4, "max_seconds": 120.0,
                     "patterns": ["walking_ones", "walking_zeros", "random", "address"]},
        "full": {"cpu_mib": 1024, "chunk_mib": 256, "passes": 32, "max_seconds": 1200.0,
                 "patterns": ["walking_ones", "walking_zeros", "random", "address"]},
    }
    thresholds = (ThresholdRule("memtest_errors", max=0),)
    timeout_s: ClassVar[dict[str, float]] = {"quick": 60.0, "standard": 300.0, "full": 1800.0}

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """Errors, bytes tested and verify rate on every device asked for (each is reported even when
        its allocation came up short)."""
        return per_device(devices, "memtest_errors", "memtest_bytes_tested", "memtest_gbs")

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.memtest(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        import torch

        p = ctx.params
        t_start = time.monotonic()
        # Leave a margin before the engine's kill so that partial results are reported.
        budget = min(float(p["max_seconds"]), 0.7 * ctx.timeout_s)
        chunk_bytes = int(p["chunk_mib"]) * MIB
        tests: list[DeviceTest] = []
        for dev in devices:
            if dev.type == "cuda":
                free, _total = torch.cuda.mem_get_info(dev)
                # Keep room for the verification temporaries (a few chunks) outside the tested area.
                target = min(int(float(p["fraction"]) * free), free - 4 * chunk_bytes - 256 * MIB)
            else:
                target = int(p["cpu_mib"]) * MIB
            chunks, note = allocate_chunks(dev, max(0, target), chunk_bytes)
            label = "cpu" if dev.type == "cpu" else f"cuda:{dev.index}"
            tests.append(DeviceTest(label, dev, chunks, alloc_note=note))
            ctx.log(f"{label}: testing {sum(c.numel() for c in chunks) * WORD / MIB:.0f} MiB in {len(chunks)} "
                    f"chunks{'; ' + note if note else ''}")
        if not any(t.chunks for t in tests):
            return Outcome.failed("could not allocate any memory to test",
                                  devices={t.label: t.alloc_note for t in tests})

        stopped = ""
        done: list[str] = []
        total_steps = int(p["passes"]) * len(p["patterns"])
        for pass_index in range(int(p["passes"])):
            for pattern in p["patterns"]:
                if done and time.monotonic() - t_start > budget:
                    stopped = f"time budget of {budget:.0f} s spent after {len(done)} of {total_steps} pattern runs"
                    break
                self._run_pattern(tests, pattern, pass_index, int(p["seed"]), int(p["max_report"]))
                done.append(f"{pattern}#{pass_index}")
                ctx.log(f"pass {pass_index} {pattern}: errors so far "
                        + ", ".join(f"{t.label}={t.errors}" for t in tests))
            if stopped:
                break

        metrics: list[Metric] = []
        for t in tests:
            gbs = t.bytes_verified / t.verify_s / 1e9 if t.verify_s > 0 else 0.0
            covered = t.allocated if t.bytes_verified else 0
            metrics += [
                Metric("memtest_errors", float(t.errors), "count", device=t.label),
                Metric("memtest_bytes_tested", float(covered), "bytes", device=t.label,
                       tags={"bytes_verified": t.bytes_verified}),
                Metric("memtest_gbs", gbs, "GB/s", device=t.label, tags={"bytes_verified": t.bytes_verified}),
            ]
        details: dict[str, Any] = {
            "patterns_run": done,
            "bad_words": {t.label: [b.to_dict() for b in t.bad] for t in tests if t.bad},
            "allocated_bytes": {t.label: t.allocated for t in tests},
        }
        notes = [f"{t.label}: {t.alloc_note}" for t in tests if t.alloc_note]
        if notes:
            details["allocation_notes"] = notes
        if stopped:
            details["stopped"] = stopped
        for t in tests:
            t.chunks.clear()
        if any(d.type == "cuda" for d in devices):
            torch.cuda.empty_cache()

        total_err = sum(t.errors for t in tests)
        tested = sum(t.allocated for t in tests if t.bytes_verified)
        reason = (f"{total_err} bad word(s)" if total_err else "no errors") + \
            f" in {_size(tested)} x {len(done)} pattern run(s)"
        if stopped:
            reason += f"; stopped early: {stopped}"
        return Outcome.passed(reason, metrics, **details)

    def after_fill(self, tests: list[DeviceTest], pattern: str, pass_index: int) -> None:
        """Hook between writing a pattern and reading it back; does nothing (tests inject faults here)."""

    def _run_pattern(self, tests: list[DeviceTest], pattern: str, pass_index: int, seed: int,
                     max_report: int) -> None:
        """Fill every chunk of every device, then verify them all (GPUs work concurrently: launches are async)."""
        import torch

        for t in tests:
            base = 0
            for chunk in t.chunks:
                fill_pattern(chunk, pattern, base, pass_index, seed)
                base += chunk.numel()
        self.after_fill(tests, pattern, pass_index)
        timers = {}
        counts: dict[str, list[Any]] = {}
        for t in tests:
            timers[t.label] = _Timer(t.device)
            base, counts[t.label] = 0, []
            for chunk in t.chunks:
                counts[t.label].append(_mismatch_count(chunk, pattern, base, pass_index, seed))
                base += chunk.numel()
            timers[t.label].stop()
        for t in tests:
            t.verify_s += timers[t.label].seconds()
            per_chunk = torch.stack(counts[t.label]).tolist() if counts[t.label] else []
            base = 0
            for chunk, n_bad in zip(t.chunks, per_chunk, strict=True):
                if n_bad:
                    t.errors += int(n_bad)
                    room = max_report - len(t.bad)
                    if room > 0:
                        t.bad += verify_pattern(chunk, pattern, base, pass_index, seed, max_report=room).bad
                base += chunk.numel()
            t.bytes_verified += t.allocated


def _mismatch_count(buf: Any, pattern: str, base_word: int, pass_index: int, seed: int) -> Any:
    """Number of words of ``buf`` that differ from the pattern, as a 0-d int64 tensor (no host sync)."""
    import torch

    n = buf.numel()
    if pattern in ("walking_ones", "walking_zeros") and n % 32 == 0:
        period = _walking_period(buf.device, (base_word + pass_index) % 32, pattern == "walking_zeros")
        return torch.count_nonzero(buf.view(-1, 32) != period)
    return torch.count_nonzero(buf != expected_words(pattern, n, base_word, pass_index, seed, buf.device))


def _size(nbytes: int) -> str:
    """Human-readable size in MiB or GiB."""
    return f"{nbytes / (1 << 30):.2f} GiB" if nbytes >= 1 << 30 else f"{nbytes / MIB:.0f} MiB"


CHECKS = (MemtestCheck,)
