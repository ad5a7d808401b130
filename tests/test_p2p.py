"""The p2p check: pair planning, byte accounting, expectations, judging and the matrix view on CPU;
the copies themselves on GPUs (``gpu``-marked)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuaccept.checks import registry
from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.p2p import P2PCheck
from gpuaccept.checks.p2p_plan import (
    Expect,
    Pair,
    below,
    copy_bytes,
    format_matrix,
    host_expectation,
    links_of,
    matrix,
    matrix_details,
    ordered_pairs,
    pair_expectation,
    pair_metrics,
    rate_gbs,
    slowest,
    summary,
    unordered_pairs,
)
from gpuaccept.hw.fabric_expect import GpuLinks
from gpuaccept.hw.sku import load_skus
from gpuaccept.model import CheckResult, Status
from gpuaccept.node.judge import judge
from gpuaccept.report.html_matrix import p2p_matrix_html

SKUS = load_skus()
H100 = SKUS["h100_sxm"]
FULL = GpuLinks(18, 5, 16)
LABELS = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def quad(slow: Pair = (2, 3), slow_gbs: float = 150.0) -> dict[Pair, float]:
    """One-way rates of 4 H100s through NVSwitch: about 380 GB/s, one slow direction."""
    values = {p: 380.0 + p[0] - p[1] for p in ordered_pairs(4)}
    values[slow] = slow_gbs
    return values


def test_links_follow_the_torch_ordinals_of_a_visible_snapshot() -> None:
    import json
    from pathlib import Path

    from gpuaccept.hw.nvml import snapshot_from_dict

    # CUDA_VISIBLE_DEVICES=4,5,6,7: NVML GPUs 4-7 are cuda:0-3
    snap = snapshot_from_dict(json.loads((Path(__file__).parent / "data" / "nvml" / "visible_upper_half.json")
                                         .read_text()))
    links, uuids = links_of([3, 1], snap)
    assert links == [GpuLinks(18, 5, 16), GpuLinks(18, 5, 16)]
    assert uuids == [next(str(g.uuid) for g in snap.gpus if g.ordinal == o) for o in (3, 1)]
    assert uuids[0] != uuids[1]
    assert links_of([0, 9], snap) == (None, [])  # cuda:9 is not in the snapshot
    assert links_of([0], None) == (None, [])


def test_pairs_cover_every_direction_once() -> None:
    assert ordered_pairs(2) == [(0, 1), (1, 0)]
    assert len(ordered_pairs(8)) == 56 and len(set(ordered_pairs(8))) == 56
    assert unordered_pairs(3) == [(0, 1), (0, 2), (1, 2)]
    assert len(unordered_pairs(8)) == 28
    assert ordered_pairs(1) == [] and unordered_pairs(1) == []


def test_bytes_count_once_per_copy_and_both_ways_when_bidirectional() -> None:
    assert copy_bytes(256 << 20, 10) == 10 * 268435456
    assert copy_bytes(256 << 20, 10, bidirectional=True) == 20 * 268435456
    assert rate_gbs(copy_bytes(1 << 30, 10), 0.05) == pytest.approx(214.748, abs=1e-3)
    assert rate_gbs(100, 0.0) == 0.0


def test_nvlink_pair_expectation_follows_the_links() -> None:
    e = pair_expectation(H100, [FULL, FULL], None, (9, 0))
    assert e is not None and (e.gbs, e.fraction, e.severity, e.path) == (450.0, 0.6, Status.FAIL, "nvlink")
    assert "NVLink4 18 links" in e.source and e.source.startswith("sku:h100_sxm")
    fewer = pair_expectation(H100, [FULL, GpuLinks(16, 5, 16)], None, (9, 0))
    assert fewer is not None and fewer.gbs == 400.0  # 16 links x 25 GB/s on the weaker GPU
    unknown = pair_expectation(H100, None, None, (9, 0))
    assert unknown is not None and unknown.gbs == 450.0 and "NVML link count unknown" in unknown.source


def test_a_sku_reference_figure_wins_over_the_links() -> None:
    ref = dataclasses.replace(H100, p2p_gbs=390.0)
    e = pair_expectation(ref, [FULL, FULL], True, (9, 0))
    assert e == Expect(390.0, 0.85, Status.FAIL, "sku:h100_sxm", "nvlink")
    assert e.threshold().value == pytest.approx(331.5) and e.threshold(2.0).value == pytest.approx(663.0)


def test_pcie_pairs_warn_and_bridged_cards_use_nvlink_only_where_nvml_says() -> None:
    pcie = SKUS["h100_pcie"]
    e = pair_expectation(pcie, [GpuLinks(0, 5, 16), GpuLinks(0, 5, 16)], False, (9, 0))
    assert e is not None and (e.path, e.severity, e.gbs) == ("pcie", Status.WARN, 63.015)
    bridged = pair_expectation(pcie, [GpuLinks(12, 5, 16), GpuLinks(12, 5, 16)], True, (9, 0))
    assert bridged is not None and bridged.path == "nvlink" and bridged.gbs == 300.0  # min(12 x 25, 600 / 2)
    l40s = pair_expectation(SKUS["l40s"], None, None, (8, 9))
    assert l40s is not None and l40s.path == "pcie" and l40s.gbs == pytest.approx(31.508, abs=1e-3)
    assert pair_expectation(None, [FULL, FULL], True) is None


def test_host_expectation_uses_the_reference_figure_then_the_link() -> None:
    e = host_expectation(H100)
    assert e is not None and (e.gbs, e.fraction, e.severity) == (52.0, 0.92, Status.FAIL)
    assert e.threshold().value == pytest.approx(47.84)  # Azure holds H2D to 48 GB/s
    l40s = host_expectation(SKUS["l40s"], GpuLinks(None, 4, 8))
    assert l40s is not None and l40s.severity is Status.WARN and l40s.gbs == pytest.approx(15.754, abs=1e-3)
    assert host_expectation(None) is None


def test_metrics_name_each_pair_and_carry_its_bound() -> None:
    exp = {p: pair_expectation(H100, [FULL, FULL], None, (9, 0)) for p in ordered_pairs(4)}
    uni = quad()
    bi = {p: 2 * uni[p] for p in unordered_pairs(4)}
    lat = {p: 2.5 for p in ordered_pairs(4)}
    ms = pair_metrics(LABELS, uni, bi, lat, exp, {"size_bytes": 1 << 28})
    assert [m.name for m in ms].count("p2p_unidir_gbs") == 12
    assert [m.name for m in ms].count("p2p_bidir_gbs") == 6
    one = next(m for m in ms if m.name == "p2p_unidir_gbs" and m.device == "cuda:2" and m.tags["peer"] == "cuda:3")
    assert one.value == 150.0 and one.threshold is not None and one.threshold.value == 270.0
    both = next(m for m in ms if m.name == "p2p_bidir_gbs" and m.device == "cuda:0")
    assert both.expected == 900.0 and both.threshold is not None and both.threshold.value == 540.0
    lat0 = next(m for m in ms if m.name == "p2p_latency_us")
    assert lat0.threshold is None and not lat0.performance  # measured, not judged


def test_the_engine_fails_the_slow_pair_and_names_it() -> None:
    exp = {p: pair_expectation(H100, [FULL, FULL], None, (9, 0)) for p in ordered_pairs(4)}
    from gpuaccept.checks.base import Outcome

    out = Outcome.passed(summary(LABELS, quad(), exp), pair_metrics(LABELS, quad(), {}, {}, exp))
    j = judge(out, device="cuda", check="p2p")
    assert j.status is Status.FAIL
    assert "p2p_unidir_gbs" in j.reason and "cuda:2" in j.reason
    assert "slowest cuda:2 -> cuda:3 150.0 GB/s (held to >= 270" in j.reason
    assert j.reason.endswith("under their bound (GB/s): cuda:2 -> cuda:3 150.0 < 270)")
    two = {**quad(), (1, 0): 200.0}
    bi = {p: 2 * min(two[p], two[(p[1], p[0])]) for p in unordered_pairs(4)}
    text = summary(LABELS, two, exp, bi, most=3)
    assert text.endswith("under their bound (GB/s): cuda:2 -> cuda:3 150.0 < 270, cuda:1 -> cuda:0 200.0 < 270, "
                         "cuda:2 <-> cuda:3 300.0 < 540 and 1 more")
    healthy = Outcome.passed("ok", pair_metrics(LABELS, quad(slow_gbs=379.0), {}, {}, exp))
    assert judge(healthy, device="cuda", check="p2p").status is Status.PASS


def test_slowest_and_below() -> None:
    exp = {p: pair_expectation(H100, [FULL, FULL], None, (9, 0)) for p in ordered_pairs(4)}
    assert slowest(quad()) == ((2, 3), 150.0)
    assert slowest({}) is None
    low = below(quad(), exp)
    assert [(p, v) for p, v, _ in low] == [((2, 3), 150.0)]
    assert below(quad(slow_gbs=300.0), exp) == []


def test_matrix_view_and_text() -> None:
    m = matrix(3, {(0, 1): 380.04, (1, 0): 379.96, (2, 0): 12.0})
    assert m == [[None, 380.0, None], [380.0, None, None], [12.0, None, None]]
    text = format_matrix(["cuda:0", "cuda:1", "cuda:2"], m, "memcpy GPU(rows) -> GPU(columns) bandwidth (GB/s)")
    lines = text.splitlines()
    assert lines[0].startswith("memcpy") and lines[1].split() == ["0", "1", "2"]
    assert lines[2].split() == ["0", "N/A", "380.0", "N/A"]


def test_matrix_details_and_html() -> None:
    exp = {p: pair_expectation(H100, [FULL, FULL], None, (9, 0)) for p in ordered_pairs(4)}
    uni = quad()
    d = matrix_details(LABELS, uni, {p: 2 * uni[p] for p in unordered_pairs(4)}, {p: 2.0 for p in uni}, exp)
    assert d["slowest"] == {"src": "cuda:2", "dst": "cuda:3", "gbs": 150.0}
    assert d["unidir_gbs"][2][3] == 150.0 and d["unidir_gbs"][0][0] is None
    assert d["bidir_gbs"][1][0] is None and d["bidir_gbs"][0][1] == 758.0  # 2 x (0 -> 1) = 2 x 379
    assert d["min_unidir_gbs"][0][1] == 270.0
    page = p2p_matrix_html(CheckResult("p2p", Status.FAIL, "slow", details={"p2p_matrix": d}))
    assert page.count('<table class="p2p-matrix">') == 3
    assert "Slowest pair: <b>cuda:2 &rarr; cuda:3</b> 150.0 GB/s" in page
    # the slow pair is under its bound one way (150 < 270) and both ways (300 < 540)
    assert page.count("st-fail") == 2 and 'title="below 270">150' in page and 'title="below 540">300' in page
    one = {"p2p_matrix": {"devices": ["cuda:0"], "skipped": "one GPU: the pair matrix needs two"}}
    assert "the pair matrix needs two" in p2p_matrix_html(CheckResult("p2p", Status.PASS, "", details=one))
    assert p2p_matrix_html(CheckResult("memory", Status.PASS, "", details={"devices": {}})) == ""


def test_node_page_draws_the_matrix_in_the_p2p_section() -> None:
    from gpuaccept.checks.base import Outcome
    from gpuaccept.report.html import render_html
    from tests.store_reports import node_report

    exp = {p: pair_expectation(H100, [FULL, FULL], None, (9, 0)) for p in ordered_pairs(4)}
    uni = quad()
    out = Outcome.passed(summary(LABELS, uni, exp), pair_metrics(LABELS, uni, {}, {}, exp),
                         p2p_matrix=matrix_details(LABELS, uni, {}, {}, exp))
    j = judge(out, device="cuda", check="p2p")
    rep = node_report("gpu-node-1", "run-1", gpus=4)
    rep.checks.append(CheckResult("p2p", j.status, j.reason, 12.0, j.metrics, out.details))
    page = render_html(rep)
    section = page[page.index('id="check-p2p"'):]
    assert section.index('<table class="p2p-matrix">') < section.index("</section>")
    assert "Slowest pair: <b>cuda:2 &rarr; cuda:3</b>" in section
    assert 'title="below 270">150' in section


def test_registered_in_standard_and_full_after_memory() -> None:
    names = list(registry())
    assert names.index("p2p") == names.index("memory") + 1
    assert P2PCheck.profiles == ("standard", "full")


def test_cpu_run_is_a_skip_with_a_reason() -> None:
    out = P2PCheck().run(CheckContext(device="cpu", params=P2PCheck.defaults("standard")))
    assert out.status is Status.SKIP and out.needs_gpu
    assert "CPU-only run" in out.reason


def test_required_metrics_every_pair_and_host() -> None:
    req = P2PCheck.required_metrics(P2PCheck.defaults("standard"), ["cuda:0", "cuda:1", "cuda:2"])
    said = [r.describe() for r in req]
    assert said.count("p2p_h2d_gbs on cuda:1") == 1
    assert "p2p_unidir_gbs on cuda:2 (peer=cuda:0)" in said
    assert sum(s.startswith("p2p_unidir_gbs") for s in said) == 6
    assert sum(s.startswith("p2p_bidir_gbs") for s in said) == 3
    assert P2PCheck.required_metrics(P2PCheck.defaults("standard"), ["cpu"]) == []


def test_estimate_grows_with_pairs() -> None:
    p = P2PCheck.defaults("standard")
    two, eight = P2PCheck.estimate_s(p, "cuda", 2), P2PCheck.estimate_s(p, "cuda", 8)
    assert 1 < two < eight < P2PCheck.timeout_for("standard", p)


# ------------------------------------------------------------------ on GPUs


def _gpu_params(**over: Any) -> dict[str, Any]:
    return {**P2PCheck.defaults("standard"), "size_mib": 64, "iterations": 3, "host_mib": 32, **over}


@pytest.mark.gpu
def test_gpu_run_measures_every_pair_or_host_only() -> None:
    import torch

    n = torch.cuda.device_count()
    out = P2PCheck().run(CheckContext(device="cuda", params=_gpu_params()))
    assert out.status in (Status.PASS, Status.FAIL), out.reason
    h2d = [m for m in out.metrics if m.name == "p2p_h2d_gbs"]
    assert len(h2d) == n and all(m.value > 1 for m in h2d)
    uni = [m for m in out.metrics if m.name == "p2p_unidir_gbs"]
    assert len(uni) == n * (n - 1)
    if n == 1:
        assert "one GPU" in out.reason and out.details["p2p_matrix"]["skipped"]
    else:
        assert all(m.value > 1 for m in uni) and out.details["p2p_matrix"]["slowest"]
    assert "nvlink_counters" in out.details


@pytest.mark.gpu
def test_gpu_copies_are_verified_and_timed() -> None:
    import torch

    from gpuaccept.checks.p2p import measure_bidir, measure_latency, measure_unidir

    # with one GPU the "pair" is the GPU with itself: the timing and the verification still run
    a, b = torch.device("cuda:0"), torch.device("cuda:1" if torch.cuda.device_count() > 1 else "cuda:0")
    r = measure_unidir(a, b, 32 << 20, 3, 1)
    assert r.mismatches == 0 and r.nbytes == 3 * (32 << 20) and r.seconds > 0
    both = measure_bidir(a, b, 32 << 20, 3, 1)
    assert both.mismatches == 0 and both.nbytes == 6 * (32 << 20)
    assert 0 < measure_latency(a, b, 50) < 1000
