"""``compare`` with a noise floor: two runs of one machine that differ by run-to-run noise are "same"; a real
regression beyond the floor is "worse"; the floor comes from --noise-pct, the history, or the family default."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from gpuaccept.model import NodeReport
from gpuaccept.results.compare import compare_reports
from gpuaccept.results.history import open_store
from gpuaccept.results.noise import HISTORY_SIGMAS, NoisePolicy, family, history_values, judge
from gpuaccept.results.store import MetricPoint
from tests.helpers import gpuaccept, ok
from tests.report_data import cluster
from tests.store_reports import T0, node_report


def _rerun_of(a: NodeReport, seed: int, run_id: str) -> NodeReport:
    """``a`` measured again minutes later: rates within ±2 % (0.8 % sd), power within ±4 %, temperatures
    ±2 C, counts unchanged -- the run-to-run noise of an idle, healthy H100 node."""
    rng = random.Random(seed)
    b = copy.deepcopy(a)
    b.run_id = run_id
    for check in b.checks:
        for m in check.metrics:
            if m.unit == "C":
                m.value += rng.choice((-2.0, -1.0, 1.0, 2.0))
            elif m.unit == "W":
                m.value *= 1 + max(-0.04, min(0.04, rng.gauss(0, 0.02)))
            elif m.unit.endswith("/s"):
                m.value *= 1 + max(-0.02, min(0.02, rng.gauss(0, 0.008)))
    return b


def _h100_node() -> NodeReport:
    rep = cluster().nodes[0].report
    assert rep is not None
    return rep


def test_families() -> None:
    assert family("gemm_bf16_tflops", "TFLOP/s").name == "throughput"
    assert family("allreduce_busbw_gbs", "GB/s").rel == 0.03
    assert (family("temperature_c", "C").name, family("temperature_c", "C").abs) == ("temperature", 3.0)
    assert family("memtest_errors", "count").name == "counts"
    assert family("train_step_ms", "ms").name == "time"
    assert family("something", "widgets").name == "other"
    assert [judge(d, 1.0, True) for d in (-1.5, -1.0, 0.0, 1.0, 2.0, None)] == \
        ["worse", "same", "same", "same", "better", ""]
    assert [judge(d, 0.0, False) for d in (1.0, 0.0, -1.0)] == ["worse", "same", "better"]


@pytest.mark.parametrize("seed", range(5))
def test_two_runs_of_one_machine_that_differ_by_noise_are_the_same(seed: int) -> None:
    a = _h100_node()
    b = _rerun_of(a, seed, "again")
    cmp = compare_reports(a, b)
    assert cmp.counts() == {"worse": 0, "better": 0, "same": len(cmp.deltas), "n/a": 0}
    assert len(cmp.deltas) == sum(len(c.metrics) for c in a.checks)
    # Without a floor, the same pair is full of "worse" lines: the floor is what makes them "same".
    bare = compare_reports(a, b, noise=NoisePolicy(override_pct=0.0))
    assert bare.counts()["worse"] >= 30


def test_a_regression_beyond_the_floor_is_worse() -> None:
    a = _h100_node()
    b = _rerun_of(a, 1, "slow")
    gemm = next(m for c in b.checks for m in c.metrics if m.name == "gemm_bf16_tflops" and m.device == "cuda:3")
    gemm.value = next(m.value for c in a.checks for m in c.metrics
                      if m.name == "gemm_bf16_tflops" and m.device == "cuda:3") * 0.94
    hot = next(m for c in b.checks for m in c.metrics if m.name == "temperature_c" and m.device == "cuda:5")
    hot.value += 10
    cmp = compare_reports(a, b)
    worse = [(d.metric, d.device) for d in cmp.deltas if d.verdict == "worse"]
    assert worse == [("gemm_bf16_tflops", "cuda:3"), ("temperature_c", "cuda:5")]
    d = next(d for d in cmp.deltas if d.metric == "gemm_bf16_tflops" and d.device == "cuda:3")
    assert d.worse and d.noise == pytest.approx(0.03 * d.a) and d.noise_from == "default throughput"
    t = next(d for d in cmp.deltas if d.metric == "temperature_c" and d.device == "cuda:5")
    assert (t.noise, t.noise_from) == (3.0, "default temperature")
    # A wider floor given by option hides the 6 % drop.
    assert compare_reports(a, b, noise=NoisePolicy(override_pct=7)).counts()["worse"] == 1


def _point(run: str, value: float, host: str = "gpu01") -> MetricPoint:
    return MetricPoint(run_id=run, host=host, sku=None, started="", started_ts=0.0, check="compute",
                       name="gemm_bf16_tflops", device="cuda:0", value=value, unit="TFLOP/s", expected=None,
                       threshold_op=None, threshold_value=None, dtype="bf16", size_bytes=None,
                       tags={"dtype": "bf16"}, hw_kind=None, hw_id=None, hw_serial=None, rerun=False)


def test_history_floor_is_three_sigma_of_the_recent_runs() -> None:
    values = [600.0, 601.0, 599.0, 600.5, 599.5]
    hist = history_values([_point(f"r{i}", v) for i, v in enumerate(values)] + [_point("A", 500.0)],
                          exclude_runs={"A"})
    key = ("compute", "gemm_bf16_tflops", "cuda:0", '{"dtype":"bf16"}')
    floor, source = NoisePolicy(history=hist).floor(["gpu01"], key, "TFLOP/s", 600.0)
    import statistics
    assert floor == pytest.approx(HISTORY_SIGMAS * statistics.stdev(values)) and source == "history (5 runs)"
    # Too few runs of the host: the family default.
    assert NoisePolicy(history=hist).floor(["gpu02"], key, "TFLOP/s", 600.0) == (18.0, "default throughput")
    short = history_values([_point(f"r{i}", v) for i, v in enumerate(values[:3])])
    assert NoisePolicy(history=short).floor(["gpu01"], key, "TFLOP/s", 600.0)[1] == "default throughput"
    # The option wins over the history.
    assert NoisePolicy(override_pct=1, history=hist).floor(["gpu01"], key, "TFLOP/s", 600.0) == \
        (6.0, "--noise-pct 1")


def _write(path: Path, report: NodeReport) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict()))
    return str(path)


def test_compare_cli_noise_from_defaults_history_and_option(tmp_path: Path) -> None:
    a = _h100_node()
    fa, fb = _write(tmp_path / "a.json", a), _write(tmp_path / "b.json", _rerun_of(a, 3, "b"))
    text = ok(gpuaccept("compare", fa, fb))
    assert "0 worse in B, 0 better" in text and "same (within noise)" in text
    assert "defaults by family: counts exact; temperature 3 C; time 5% of A" in text
    assert "throughput 3% of A" in text
    bare = json.loads(ok(gpuaccept("compare", fa, fb, "--json", "--noise-pct", "0")))
    assert bare["counts"]["worse"] >= 30 and bare["noise"]["override_pct"] == 0.0

    # A steady history of gpu01 (0.1 % apart): a 2 % drop is inside the 3 % default but far outside its noise.
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with open_store(url) as store:
        for i, t in enumerate([600.0, 600.6, 599.4, 600.3, 599.7, 600.0]):
            store.add_node_report(node_report("gpu01", f"run{i}", T0 + 3600 * i, tflops=t))
        store.add_node_report(node_report("gpu01", "run6", T0 + 3600 * 6, tflops=588.0))
    data = json.loads(ok(gpuaccept("compare", "run5", "run6", "--db", url, "--json", "--metric", "gemm_bf16_tflops")))
    assert [(d["device"], d["verdict"], d["noise_from"]) for d in data["deltas"]] == [
        ("cuda:0", "worse", "history (5 runs)"), ("cuda:1", "worse", "history (5 runs)")]
    assert data["deltas"][0]["noise"] < 3.0
    # The same two runs as files, without --db: no history, the family default calls it the same.
    f5 = _write(tmp_path / "r5.json", node_report("gpu01", "run5", T0 + 3600 * 5, tflops=600.0))
    f6 = _write(tmp_path / "r6.json", node_report("gpu01", "run6", T0 + 3600 * 6, tflops=588.0))
    data = json.loads(ok(gpuaccept("compare", f5, f6, "--json", "--metric", "gemm_bf16_tflops",
                                   GPUACCEPT_DB="mysql://never-opened")))
    assert {d["verdict"] for d in data["deltas"]} == {"same"}
    text = ok(gpuaccept("compare", f5, f6, "--db", url, "--metric", "gemm_bf16_tflops"))
    assert "2 worse in B" in text and "2 from the history" in text
