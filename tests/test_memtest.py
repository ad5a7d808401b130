"""Tests of the memtest check and its pure pattern helpers: corrupted words must be found at the right offset."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.memtest import (
    MIB,
    PATTERNS,
    DeviceTest,
    MemtestCheck,
    allocate_chunks,
    expected_words,
    fill_pattern,
    verify_pattern,
)
from gpuaccept.model import Status
from gpuaccept.node.judge import judge
from tests.conftest import cuda_available


def _u32(t: torch.Tensor) -> list[int]:
    return [v & 0xFFFFFFFF for v in t.tolist()]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("n", [4096, 1000])  # a multiple of 32 (broadcast path) and not (generic path)
def test_fill_then_verify_is_clean_and_a_flipped_bit_is_found(pattern: str, n: int) -> None:
    buf = torch.empty(n, dtype=torch.int32)
    base, pass_index, seed = 96, 3, 11
    fill_pattern(buf, pattern, base, pass_index, seed)
    assert verify_pattern(buf, pattern, base, pass_index, seed).errors == 0
    good = int(buf[777]) & 0xFFFFFFFF
    buf[777] ^= 1 << 5
    res = verify_pattern(buf, pattern, base, pass_index, seed)
    assert res.errors == 1
    (bad,) = res.bad
    assert bad.offset == (base + 777) * 4
    assert bad.expected == good
    assert bad.actual == good ^ (1 << 5)
    assert bad.pattern == pattern
    assert bad.to_dict()["flipped_bits"] == "0x00000020"


def test_many_errors_are_all_counted_but_reports_are_capped_in_address_order() -> None:
    buf = torch.empty(1 << 16, dtype=torch.int32)
    fill_pattern(buf, "address")
    bad_idx = [5, 17, 4000, 9000, 20000, 65535]
    for i in bad_idx:
        buf[i] = -12345
    res = verify_pattern(buf, "address", max_report=4)
    assert res.errors == len(bad_idx)
    assert [b.offset for b in res.bad] == [i * 4 for i in bad_idx[:4]]
    assert all(b.actual == (-12345) & 0xFFFFFFFF for b in res.bad)


def test_a_stuck_bit_in_every_word_is_counted_per_word() -> None:
    buf = torch.empty(3200, dtype=torch.int32)
    fill_pattern(buf, "walking_zeros")
    buf |= 1  # bit 0 stuck at one everywhere: wrong only where walking_zeros clears bit 0
    res = verify_pattern(buf, "walking_zeros", max_report=3)
    assert res.errors == 3200 // 32
    assert [b.offset for b in res.bad] == [0, 32 * 4, 64 * 4]


def test_walking_ones_sets_one_bit_that_walks_with_address_and_pass() -> None:
    n, base = 64, 40
    seen: list[set[int]] = [set() for _ in range(n)]
    for pass_index in range(32):
        words = _u32(expected_words("walking_ones", n, base, pass_index, 0, "cpu"))
        for i, w in enumerate(words):
            assert w.bit_count() == 1
            bit = w.bit_length() - 1
            assert bit == (base + i + pass_index) % 32
            seen[i].add(bit)
    # Over 32 passes every word has had every bit position set alone.
    assert all(s == set(range(32)) for s in seen)
    zeros = _u32(expected_words("walking_zeros", n, base, 0, 0, "cpu"))
    ones = _u32(expected_words("walking_ones", n, base, 0, 0, "cpu"))
    assert [z ^ o for z, o in zip(zeros, ones, strict=True)] == [0xFFFFFFFF] * n


def test_fill_broadcast_path_matches_expected_words() -> None:
    buf = torch.empty(320, dtype=torch.int32)
    for pattern in ("walking_ones", "walking_zeros"):
        fill_pattern(buf, pattern, base_word=7, pass_index=2)
        assert torch.equal(buf, expected_words(pattern, 320, 7, 2, 0, "cpu"))


def test_address_pattern_holds_word_index_and_wraps_at_2_32() -> None:
    words = _u32(expected_words("address", 4, (1 << 32) - 2, 0, 0, "cpu"))
    assert words == [0xFFFFFFFE, 0xFFFFFFFF, 0, 1]
    assert _u32(expected_words("address", 3, 10, 0, 0, "cpu")) == [10, 11, 12]
    assert _u32(expected_words("address", 2, 10, 1, 0, "cpu")) == [0xFFFFFFFF ^ 10, 0xFFFFFFFF ^ 11]


def test_random_pattern_is_reproducible_from_its_seed_only() -> None:
    a = expected_words("random", 1000, 0, 0, 5, "cpu")
    assert torch.equal(a, expected_words("random", 1000, 0, 0, 5, "cpu"))
    assert not torch.equal(a, expected_words("random", 1000, 0, 0, 6, "cpu"))  # other seed
    assert not torch.equal(a, expected_words("random", 1000, 0, 1, 5, "cpu"))  # other pass
    assert not torch.equal(a, expected_words("random", 1000, 1000, 0, 5, "cpu"))  # other chunk
    assert len(set(a.tolist())) > 990  # not degenerate
    buf = a.clone()
    # Verifying against the wrong seed finds (nearly) every word wrong.
    assert verify_pattern(buf, "random", 0, 0, 6).errors > 990


def test_unknown_pattern_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown memtest pattern"):
        fill_pattern(torch.empty(10, dtype=torch.int32), "checkerboard")


def test_allocate_chunks_splits_the_target() -> None:
    chunks, note = allocate_chunks(torch.device("cpu"), 10 * MIB, 4 * MIB)
    assert note == ""
    assert [c.numel() * 4 for c in chunks] == [4 * MIB, 4 * MIB, 2 * MIB]
    assert all(c.dtype == torch.int32 for c in chunks)


def test_quick_cpu_run_is_clean() -> None:
    params = MemtestCheck.defaults("quick")
    out = MemtestCheck().run(CheckContext(device="cpu", params=params))
    assert out.status is Status.PASS, out.reason
    by_name = {m.name: m for m in out.metrics}
    assert set(by_name) == {"memtest_errors", "memtest_bytes_tested", "memtest_gbs"}
    assert by_name["memtest_errors"].value == 0
    assert by_name["memtest_bytes_tested"].value == params["cpu_mib"] * MIB
    assert by_name["memtest_bytes_tested"].unit == "bytes"
    assert by_name["memtest_gbs"].value > 0
    assert out.details["patterns_run"] == [f"{p}#0" for p in params["patterns"]]
    assert judge(out, MemtestCheck.thresholds).status is Status.PASS


class _FaultyMemtest(MemtestCheck):
    """Flips one bit of the second chunk after every fill, like a weak DRAM cell."""

    def after_fill(self, tests: list[DeviceTest], pattern: str, pass_index: int) -> None:
        tests[0].chunks[1][123] ^= 1 << 30


def test_injected_fault_is_reported_and_fails_the_default_threshold() -> None:
    params = {**MemtestCheck.defaults("quick"), "cpu_mib": 8, "chunk_mib": 2, "max_report": 2}
    out = _FaultyMemtest().run(CheckContext(device="cpu", params=params))
    errors = next(m for m in out.metrics if m.name == "memtest_errors")
    assert errors.value == len(params["patterns"])  # one bad word per pattern run
    bad = out.details["bad_words"]["cpu"]
    assert len(bad) == 2  # capped by max_report
    assert all(b["offset"] == 2 * MIB + 123 * 4 for b in bad)
    assert [b["pattern"] for b in bad] == params["patterns"][:2]
    assert "bad word" in out.reason
    verdict = judge(out, MemtestCheck.thresholds)
    assert verdict.status is Status.FAIL
    assert "memtest_errors" in verdict.reason


def test_time_budget_stops_between_patterns() -> None:
    params = {**MemtestCheck.defaults("quick"), "cpu_mib": 4, "chunk_mib": 1, "max_seconds": 0.0, "passes": 3}
    out = MemtestCheck().run(CheckContext(device="cpu", params=params))
    assert out.status is Status.PASS
    assert len(out.details["patterns_run"]) == 1  # the first run always completes
    assert "stopped early" in out.reason
    assert "1 of 9" in out.details["stopped"]
    tested = next(m for m in out.metrics if m.name == "memtest_bytes_tested")
    assert tested.value == 4 * MIB
    assert tested.tags["bytes_verified"] == 4 * MIB


def test_engine_timeout_bounds_the_budget() -> None:
    params = {**MemtestCheck.defaults("quick"), "cpu_mib": 4, "chunk_mib": 1, "max_seconds": 1000.0}
    out = MemtestCheck().run(CheckContext(device="cpu", params=params, timeout_s=0.0))
    assert len(out.details["patterns_run"]) == 1
    assert "stopped" in out.details


@pytest.mark.skipif(cuda_available(), reason="tests the no-CUDA path")
def test_cuda_requested_without_cuda_is_a_gpu_skip() -> None:
    out = MemtestCheck().run(CheckContext(device="cuda", params=MemtestCheck.defaults("quick")))
    assert out.status is Status.SKIP and out.needs_gpu


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", PATTERNS)
def test_helpers_find_a_fault_on_gpu(pattern: str) -> None:
    buf = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
    fill_pattern(buf, pattern, 32, 1, 3)
    assert verify_pattern(buf, pattern, 32, 1, 3).errors == 0
    buf[4242] ^= 1
    res = verify_pattern(buf, pattern, 32, 1, 3)
    assert res.errors == 1 and res.bad[0].offset == (32 + 4242) * 4


@pytest.mark.gpu
def test_quick_gpu_run_is_clean() -> None:
    params: dict[str, Any] = {**MemtestCheck.defaults("quick"), "fraction": 0.2}
    out = MemtestCheck().run(CheckContext(device="cuda", params=params, gpus=[0]))
    assert out.status is Status.PASS, out.reason
    errors = next(m for m in out.metrics if m.name == "memtest_errors")
    assert errors.value == 0 and errors.device == "cuda:0"
    free, _ = torch.cuda.mem_get_info(0)
    tested = next(m for m in out.metrics if m.name == "memtest_bytes_tested")
    assert tested.value > 0.05 * free
