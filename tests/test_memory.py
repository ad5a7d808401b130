"""Tests of the memory bandwidth check: STREAM on CPU, device and pinned copies on GPU."""

from __future__ import annotations

import pytest
import torch

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.memory import (
    MIB,
    MemoryCheck,
    count_mismatches,
    measure_d2d,
    measure_pinned,
    measure_stream,
    sku_threshold,
    verify_stream,
)
from gpuaccept.hw.sku import load_skus
from gpuaccept.model import Status
from tests.conftest import cuda_available


def test_quick_cpu_reports_stream_copy_and_triad() -> None:
    params = MemoryCheck.defaults("quick")
    out = MemoryCheck().run(CheckContext(device="cpu", params=params))
    assert out.status is Status.PASS, out.reason
    by_name = {m.name: m for m in out.metrics}
    assert set(by_name) == {"stream_copy_gbs", "stream_triad_gbs"}
    for m in by_name.values():
        assert m.unit == "GB/s"
        assert m.device == "cpu"
        # Any real machine moves between 0.1 GB/s and 10 TB/s.
        assert 0.1 < m.value < 10_000, m
        assert m.tags["size_bytes"] == params["cpu_mib"] * MIB
        assert m.tags["threads"] == torch.get_num_threads()
    assert "copy" in out.reason and "triad" in out.reason


def test_measure_stream_counts_bytes_by_stream_convention() -> None:
    r = measure_stream(4 * MIB, iterations=3)
    assert r.copy_ok and r.triad_ok
    assert r.array_bytes == 4 * MIB
    assert r.iterations == 3
    # Best of N is never below the median.
    assert r.copy_gbs >= r.copy_median_gbs > 0
    assert r.triad_gbs >= r.triad_median_gbs > 0


def test_verify_stream_detects_a_wrong_element() -> None:
    n = 10_000
    a = torch.arange(n, dtype=torch.float64).remainder_(1024.0)
    b = torch.arange(n, dtype=torch.float64).remainder_(7.0)
    c = a.clone()
    assert verify_stream(a, b, c, "copy", block=1000)
    c[9_999] += 1
    assert not verify_stream(a, b, c, "copy", block=1000)
    c = b + 3 * a
    assert verify_stream(a, b, c, "triad", block=1000)
    assert not verify_stream(a, b, c, "copy", block=1000)
    c[4321] = 0.5
    assert not verify_stream(a, b, c, "triad", block=1000)


def test_count_mismatches() -> None:
    a = torch.arange(1000, dtype=torch.int32)
    b = a.clone()
    assert count_mismatches(a, b) == 0
    b[3] = -1
    b[999] = 7
    assert count_mismatches(a, b) == 2


def test_sku_threshold_uses_pass_fraction_and_names_the_sku() -> None:
    sku = load_skus()["h100_sxm"]
    thr = sku_threshold(sku, sku.memory_bandwidth_gbs, "memory_d2d", Status.FAIL)
    assert thr is not None
    assert thr.op == ">="
    assert thr.value == pytest.approx(sku.memory_bandwidth_gbs * sku.pass_fraction("memory_d2d"), abs=5e-4)
    assert thr.source == "sku:h100_sxm"
    assert thr.severity is Status.FAIL
    pcie = sku_threshold(sku, sku.pcie_bandwidth_gbs(), "pcie", Status.WARN)
    assert pcie is not None and pcie.severity is Status.WARN
    assert pcie.value == pytest.approx(sku.pcie_bandwidth_gbs() * sku.pass_fraction("pcie"), abs=5e-4)
    assert sku_threshold(None, 100.0, "memory_d2d", Status.FAIL) is None
    assert sku_threshold(sku, None, "memory_d2d", Status.FAIL) is None
    assert sku_threshold(sku, 100.0, "no_such_family", Status.FAIL) is None


@pytest.mark.skipif(cuda_available(), reason="tests the no-CUDA path")
def test_cuda_requested_without_cuda_is_a_gpu_skip() -> None:
    out = MemoryCheck().run(CheckContext(device="cuda", params=MemoryCheck.defaults("quick")))
    assert out.status is Status.SKIP
    assert out.needs_gpu
    assert "CUDA" in out.reason


@pytest.mark.gpu
def test_measure_d2d_on_gpu_verifies_data() -> None:
    dev = torch.device("cuda", 0)
    r = measure_d2d(dev, 64 * MIB, iterations=5)
    assert r.mismatches == 0
    assert r.bytes_per_iter == 2 * 64 * MIB
    assert 10 < r.gbs < 20_000
    assert len(r.iter_gbs) == 5


@pytest.mark.gpu
def test_measure_pinned_on_gpu() -> None:
    h2d, d2h = measure_pinned(torch.device("cuda", 0), 32 * MIB, iterations=5)
    assert h2d.mismatches == 0 and d2h.mismatches == 0
    assert h2d.bytes_per_iter == 32 * MIB
    assert 0.5 < h2d.gbs < 1000 and 0.5 < d2h.gbs < 1000


@pytest.mark.gpu
def test_quick_gpu_reports_per_device_metrics() -> None:
    out = MemoryCheck().run(CheckContext(device="cuda", params=MemoryCheck.defaults("quick")))
    assert out.status is Status.PASS, out.reason
    count = torch.cuda.device_count()
    for name in ("d2d_copy_gbs", "h2d_pinned_gbs", "d2h_pinned_gbs"):
        devices = sorted(m.device or "" for m in out.metrics if m.name == name)
        assert devices == sorted(f"cuda:{i}" for i in range(count)), name
    for m in out.metrics:
        if m.name == "d2d_copy_gbs" and m.expected is not None:
            assert m.threshold is not None and m.threshold.source.startswith("sku:")


def test_fill_pattern_is_a_bijection_across_blocks() -> None:
    from gpuaccept.checks.memory import _fill_pattern

    whole = torch.empty(10_000, dtype=torch.int32)
    _fill_pattern(whole, 5)
    blocked = torch.empty(10_000, dtype=torch.int32)
    _fill_pattern(blocked, 5, block=999)  # block boundaries must not change the pattern
    assert torch.equal(whole, blocked)
    assert len(set(whole.tolist())) == 10_000
    assert int(whole[3]) & 0xFFFFFFFF == (3 * -1640531535 + 5) & 0xFFFFFFFF
