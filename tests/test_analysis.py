"""Outlier analysis: detection power and false positives on simulated fleets, scopes, directions, SKUs, CLI."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuaccept.model import CheckResult, ClusterReport, Metric, NodeEntry, NodeState, Status, Threshold
from gpuaccept.results.analysis import OutlierPolicy, analyze, with_analysis
from gpuaccept.results.samples import SkuResolver, direction
from tests.fleet_sim import METRICS, THROUGHPUT, fleet, node_report
from tests.helpers import ROOT, gpuaccept

OUTLIER_KEYS = {"host", "device", "check", "metric", "tags", "value", "median", "mad", "z", "direction", "scope"}


def _by(result: dict, **match: object) -> list[dict]:
    return [o for o in result["outliers"] if all(o.get(k) == v for k, v in match.items())]


# ---------------------------------------------------------------------------------------------- detection power


@pytest.mark.parametrize("seed", range(20))
def test_gpu_at_80_percent_of_its_siblings_is_flagged_on_every_metric(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    node, gpu = int(rng.integers(0, 32)), int(rng.integers(0, 8))
    result = analyze(fleet(seed, slow={(node, gpu): 0.8}))
    host, dev = f"node{node:03d}", f"cuda:{gpu}"
    for _, name, unit, *_ in METRICS:
        hits = _by(result, host=host, device=dev, metric=name, scope="node")
        assert len(hits) == 1, (name, result["outliers"])
        o = hits[0]
        assert o["direction"] == ("high" if unit == "ms" else "low")
        assert abs(o["z"]) >= 5
        assert o["z"] == pytest.approx(0.6745 * (o["value"] - o["median"]) / o["mad"], rel=1e-3)
        lo, hi = (0.12, 0.40) if unit == "ms" else (-0.28, -0.12)   # -20 % (+25 % step time), 1-2 % noise
        assert lo < o["deviation_fraction"] < hi
    # Nothing else in the fleet is flagged, and the slow GPU is not listed twice.
    assert {(o["host"], o["device"]) for o in result["outliers"]} == {(host, dev)}
    assert len(result["outliers"]) == len(METRICS)


def test_no_false_positives_over_20_healthy_fleets() -> None:
    flagged = []
    values = 0
    for seed in range(20):
        result = analyze(fleet(100 + seed))
        flagged += result["outliers"]
        values += result["samples"]
    assert values >= 20 * 32 * 8 * len(METRICS)
    assert flagged == []


def test_a_whole_slow_node_is_one_cluster_outlier_per_metric() -> None:
    result = analyze(fleet(5, slow_nodes={9: 0.85}))
    host = "node009"
    assert {o["host"] for o in result["outliers"]} == {host}
    for name in THROUGHPUT:
        (o,) = _by(result, host=host, metric=name)
        assert o["scope"] == "cluster" and o["device"] is None and o["gpus"] == 8 and o["direction"] == "low"
        assert o["deviation_fraction"] == pytest.approx(-0.15, abs=0.04)
    (step,) = _by(result, host=host, metric="train_step_ms")
    assert step["direction"] == "high" and step["z"] > 5


def test_gpus_of_a_half_bad_node_are_each_listed() -> None:
    # Four of eight GPUs slow: each is listed (against its siblings or the fleet), the healthy four are
    # not, and the node's median is itself an outlier among the nodes.
    slow = {(3, g): 0.8 for g in range(4)}
    result = analyze(fleet(6, slow=slow))
    for name in THROUGHPUT:
        hits = _by(result, host="node003", metric=name)
        assert {o["device"] for o in hits} == {f"cuda:{g}" for g in range(4)} | {None}, name
        (node_entry,) = [o for o in hits if o["device"] is None]
        assert node_entry["scope"] == "cluster" and node_entry["gpus"] == 8 and node_entry["direction"] == "low"
    assert {o["host"] for o in result["outliers"]} == {"node003"}


def test_single_gpu_nodes_are_compared_across_the_cluster() -> None:
    result = analyze(fleet(8, gpus=1, nodes=24, slow={(4, 0): 0.8}))
    hits = _by(result, host="node004", metric="gemm_bf16_tflops")
    assert len(hits) == 1 and hits[0]["scope"] == "cluster" and hits[0]["device"] == "cuda:0"
    assert {o["host"] for o in result["outliers"]} == {"node004"}


def test_two_gpus_cannot_tell_which_is_odd() -> None:
    result = analyze(fleet(9, gpus=2, nodes=2, slow={(0, 1): 0.5}))
    assert result["outliers"] == []


# ---------------------------------------------------------------------------------------------- directions


def test_only_the_bad_side_is_flagged() -> None:
    # 25 % faster GEMM (and shorter steps) is not an outlier; more memory errors are.
    rng = np.random.default_rng(3)
    rep = node_report("fast", rng, slow={2: 1.25},
                      extra=[CheckResult("memtest", Status.FAIL, "errors", metrics=[
                          Metric("memtest_errors", 12.0 if g == 5 else 0.0, "count", device=f"cuda:{g}")
                          for g in range(8)]),
                          CheckResult("health", Status.PASS, "", metrics=[
                              Metric("power_w", 700.0 if g == 1 else 90.0, "W", device=f"cuda:{g}")
                              for g in range(8)])])
    result = analyze(rep)
    assert [(o["metric"], o["device"], o["direction"]) for o in result["outliers"]] == [
        ("memtest_errors", "cuda:5", "high")]
    assert not any(k.endswith("/power_w") for k in result["stats"])  # never judged


@pytest.mark.parametrize(("name", "unit", "expected"), [
    ("gemm_bf16_tflops", "TFLOP/s", "low"), ("d2d_copy_gbs", "GB/s", "low"), ("nbody_gflops", "GFLOP/s", "low"),
    ("train_step_ms", "ms", "high"), ("ecc_volatile_uncorrectable", "count", "high"),
    ("memtest_errors", "count", "high"), ("nvlink_links_down", "count", "high"), ("temperature_c", "C", "high"),
    ("gpu_count", "count", "low"), ("pcie_link_width", "count", "low"), ("cpu_count", "count", "both"),
    ("power_w", "W", None), ("allreduce_busbw_gbs", "GB/s", "low"), ("samples_per_s", "samples/s", "low"),
])
def test_direction_table(name: str, unit: str, expected: str | None) -> None:
    assert direction(name, unit) == expected


def test_node_wide_metric_outlier_has_no_device() -> None:
    c = fleet(10, nodes=12)
    rep = c.nodes[7].report
    assert rep is not None
    rep.checks[0].metrics[0].value = 7.0   # gpu_count: one GPU fell off the bus
    result = analyze(c)
    (o,) = _by(result, metric="gpu_count")
    assert o["host"] == "node007" and o["device"] is None and o["scope"] == "cluster" and o["direction"] == "low"
    assert result["stats"]["h100_sxm/gpu_count"]["median"] == 8.0


# ---------------------------------------------------------------------------------------------- SKUs and input


def test_skus_are_analysed_separately() -> None:
    h100 = fleet(11, nodes=8)
    a100 = fleet(12, nodes=8, sku="a100_sxm4_80gb", prefix="a", slow={(2, 6): 0.8})
    result = analyze([h100, a100])
    stats = result["stats"]
    assert stats["h100_sxm/gemm_bf16_tflops"]["n"] == 64 and stats["a100_sxm4_80gb/gemm_bf16_tflops"]["n"] == 64
    assert stats["a100_sxm4_80gb/gemm_bf16_tflops"]["median"] == pytest.approx(0.4 * 710, rel=0.03)
    # A100s are 60 % slower than H100s, yet only the planted GPU is an outlier.
    assert {(o["host"], o["device"], o["sku"]) for o in result["outliers"]} == {("a002", "cuda:6", "a100_sxm4_80gb")}


def test_sku_resolution_rules() -> None:
    rng = np.random.default_rng(0)
    rep = node_report("n", rng, sku="nvidia_a800_80gb_pcie")
    rep.checks[0].details["nvml"]["gpus"] = [{"index": i, "name": "NVIDIA A800 80GB PCIe", "sku": None}
                                            for i in range(8)]
    stream = CheckResult("memory", Status.PASS, "", metrics=[Metric("stream_triad_gbs", 80.0, "GB/s", "cpu")])
    r = SkuResolver(rep)
    assert r.node_sku == "nvidia_a800_80gb_pcie"               # unknown model: a slug of its name
    assert r.for_device(stream, "cpu") == "cpu"
    recorded = CheckResult("compute", Status.PASS, "", details={"sku": {"cuda:0": "h100_sxm"}})
    assert r.for_device(recorded, "cuda:0") == "h100_sxm"       # what the check recorded wins
    memory = CheckResult("memory", Status.PASS, "", details={"devices": {"cuda:1": {"name": "NVIDIA H200"}}})
    assert r.for_device(memory, "cuda:1") == "h200_sxm"         # ... also by GPU name
    spec = Metric("gemm_fp8_tflops", 1.0, "TFLOP/s", "cuda:2", threshold=Threshold(">=", 1.0, source="sku:b200"))
    assert r.for_device(memory, "cuda:2", spec) == "b200"       # ... or by the source of its threshold
    assert r.for_device(rep.checks[1], "cuda:0") == "nvidia_a800_80gb_pcie"
    mixed = node_report("m", rng, gpus=2)
    mixed.checks[0].details["nvml"]["gpus"] = [{"index": 0, "name": "NVIDIA H100 80GB HBM3"},
                                              {"index": 1, "name": "NVIDIA A100-SXM4-80GB"}]
    r = SkuResolver(mixed)
    assert r.node_sku == "mixed"
    assert r.for_device(mixed.checks[1], "cuda:1") == "a100_sxm4_80gb"
    bare = node_report("b", rng)
    bare.checks = bare.checks[1:]                                # no env check, no recorded SKU
    assert SkuResolver(bare).for_device(bare.checks[0], "cuda:0") == "unknown"
    assert SkuResolver(bare).node_sku == "cpu"


def test_skipped_errored_and_nan_metrics_are_left_out() -> None:
    c = fleet(13, nodes=6)
    rep = c.nodes[0].report
    assert rep is not None
    rep.checks[1].metrics[0].value = math.nan
    rep.checks[2].status = Status.ERROR
    result = analyze(c)
    assert result["stats"]["h100_sxm/gemm_bf16_tflops"]["n"] == 6 * 8 - 1
    assert result["stats"]["h100_sxm/d2d_copy_gbs"]["n"] == 5 * 8


def test_missing_nodes_and_empty_input() -> None:
    c = fleet(14, nodes=4)
    c.nodes.append(NodeEntry("gone", NodeState.MISSING, None, reason="never reported"))
    assert analyze(c)["nodes"] == 4
    empty = analyze([])
    assert empty["outliers"] == [] and empty["stats"] == {} and empty["samples"] == 0


def test_sweep_sizes_get_their_own_stats_keys() -> None:
    c = fleet(15, nodes=4)
    for entry in c.nodes:
        assert entry.report is not None
        entry.report.checks.append(CheckResult("nccl", Status.PASS, "", metrics=[
            Metric("allreduce_busbw_gbs", 100.0 + size, "GB/s", tags={"size_bytes": size}) for size in (1024, 4096)]))
    stats = analyze(c)["stats"]
    assert stats["h100_sxm/allreduce_busbw_gbs[size_bytes=1024]"]["median"] == 1124.0
    assert stats["h100_sxm/allreduce_busbw_gbs[size_bytes=4096]"]["n"] == 4


# ---------------------------------------------------------------------------------------------- output shape


def test_output_structure_is_plain_json_and_stored_in_the_cluster_report() -> None:
    c = with_analysis(fleet(16, nodes=8, slow={(1, 1): 0.8}), OutlierPolicy(max_z=4.5))
    a = c.analysis
    assert set(a) >= {"outliers", "stats", "policy"} and a["policy"]["max_z"] == 4.5
    for o in a["outliers"]:
        assert OUTLIER_KEYS <= set(o)
        assert o["direction"] in ("low", "high") and o["scope"] in ("node", "cluster")
        assert isinstance(o["host"], str) and isinstance(o["tags"], dict)
        assert "stat" not in o["tags"]                 # how a number was taken is not part of the key
    for key, st in a["stats"].items():
        assert key == f"{st['sku']}/{st['metric']}" and {"median", "mad", "n"} <= set(st)
    back = ClusterReport.from_dict(json.loads(json.dumps(c.to_dict(), allow_nan=False)))
    assert back.analysis == a


def test_policy_is_validated() -> None:
    with pytest.raises(ValueError):
        OutlierPolicy(max_z=0)
    with pytest.raises(ValueError):
        OutlierPolicy(min_siblings=2)


def test_a_single_node_report_is_analysed_within_the_node() -> None:
    rep = node_report("solo", np.random.default_rng(17), slow={4: 0.8})
    result = analyze(rep)
    assert {(o["device"], o["scope"]) for o in result["outliers"]} == {("cuda:4", "node")}


# ---------------------------------------------------------------------------------------------- CLI and bench


def test_analyze_cli(tmp_path: Path) -> None:
    path = tmp_path / "cluster-report.json"
    path.write_text(json.dumps(fleet(18, nodes=8, slow={(6, 2): 0.8}).to_dict()))
    p = gpuaccept("analyze", str(path))
    assert p.returncode == 0, p.stderr
    assert "node006 cuda:2 compute/gemm_bf16_tflops" in p.stdout and "sibling median" in p.stdout
    p = gpuaccept("analyze", str(path), "--json", "--fail-on-outliers", "--output", str(tmp_path / "a.json"))
    assert p.returncode == 1
    data = json.loads(p.stdout)
    assert data == json.loads((tmp_path / "a.json").read_text())
    assert {o["host"] for o in data["outliers"]} == {"node006"}


def test_analyze_cli_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    for args in (("analyze", str(bad)), ("analyze", str(tmp_path / "missing.json")), ("analyze", str(tmp_path)),
                 ("analyze", str(bad), "--max-z", "-1")):
        p = gpuaccept(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_bench_runs_and_finds_what_was_planted(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_analysis
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert bench_analysis.main(["--nodes", "40", "--repeat", "1", "--no-json-roundtrip"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("BENCH_ANALYSIS "))
    out = json.loads(line.split(" ", 1)[1])
    assert out["planted_missed"] == [] and out["unexpected_hosts"] == [] and out["values"] == 40 * 8 * 50 + 40 * 3


def _with_rerun(c: ClusterReport, node: int, factor: float) -> ClusterReport:
    """``c`` with a deeper ``run --budget`` re-run of node ``node``'s compute check, its values times ``factor``."""
    out = copy.deepcopy(c)
    rep = out.nodes[node].report
    assert rep is not None
    first = next(x for x in rep.checks if x.name == "compute")
    rerun = copy.deepcopy(first)
    rerun.details = {"rerun": {"name": "compute", "level": "full", "why": "it warned"}}
    for m in rerun.metrics:
        m.value *= factor
    rep.checks.append(rerun)
    return out


def test_a_budget_rerun_is_not_a_sample() -> None:
    """The analysis judges each node's first pass: a re-run (another depth, a node already suspect) would
    count the node twice; here its values at half speed would flag the node on its own re-run."""
    c = fleet(16, nodes=6)
    plain = analyze(c)
    assert plain["outliers"] == []
    assert analyze(_with_rerun(c, 2, 0.5)) == plain


@pytest.mark.parametrize("top", [40, 3_000_000, 10**12])
def test_dense_labels_are_np_uniques_whether_counted_or_sorted(top: int) -> None:
    """Codes in a small range are counted, others sorted: the labels are np.unique's either way."""
    import numpy as np

    from gpuaccept.results.analysis import _dense

    codes = np.random.default_rng(top).integers(0, top, 200_000)
    uniq, inverse = _dense(codes)
    want_uniq, want_inverse = np.unique(codes, return_inverse=True)
    assert np.array_equal(uniq, want_uniq) and np.array_equal(inverse, want_inverse.reshape(-1))
    assert _dense(np.zeros(0, dtype=np.int64))[0].size == 0
