"""Baselines: strict loading, learning from simulated fleets, declarative thresholds, judging, CLI."""

from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from gpuaccept.checks.base import Outcome, ThresholdRule
from gpuaccept.errors import ConfigError
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold, Verdict
from gpuaccept.node.judge import judge
from gpuaccept.results.baseline import (
    DEFAULT_RULES,
    Baseline,
    BaselineEntry,
    BaselineRule,
    load_baseline,
    load_rules,
    parse_baseline,
    parse_rule,
)
from gpuaccept.results.baseline_judge import apply_baseline, overlay_baseline
from gpuaccept.results.baseline_learn import learn_baseline
from tests.fleet_sim import METRICS, fleet, node_report
from tests.helpers import gpuaccept

EXAMPLE = textwrap.dedent("""\
    schema: 1
    source: {created: "2025-01-31T12:00:00Z", nodes: 64, runs: 120, tool: gpuaccept 0.1.0}
    skus:
      h100_sxm:
        metrics:
          - {metric: gemm_bf16_tflops, dtype: bf16, value: 700.0, unit: TFLOP/s, mad: 6.0, n: 512}
          - {metric: gemm_bf16_tflops, value: 650.0, unit: TFLOP/s, mad: 6.0, n: 512}
          - {metric: train_step_ms, value: 41.0, unit: ms, mad: 0.4, n: 512}
          - {metric: allreduce_busbw_gbs, size_bytes: 1048576, value: 100.0, unit: GB/s, mad: 2.0, n: 64}
          - {metric: allreduce_busbw_gbs, size_bytes: 1073741824, value: 360.0, unit: GB/s, mad: 3.0, n: 64}
      cpu:
        metrics:
          - {metric: stream_triad_gbs, value: 200.0, unit: GB/s, mad: 5.0, n: 30}
    thresholds:
      - {metric: "*", max_z: 5}
      - {metric: "gemm_*_tflops", min_fraction: 0.95}
      - {metric: "train_step_ms", sku: "h100_*", max_fraction: 1.1, severity: warn}
    """)


def _write(tmp_path: Path, text: str, name: str = "baseline.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _metric(name: str, value: float, unit: str, device: str | None = "cuda:0", **tags: str | int | float) -> Metric:
    return Metric(name, value, unit, device=device, tags=dict(tags))


# ---------------------------------------------------------------------------------------------- file model


def test_example_loads_and_looks_up_most_specific_entry(tmp_path: Path) -> None:
    b = load_baseline(_write(tmp_path, EXAMPLE))
    assert len(b) == 6 and set(b.skus) == {"h100_sxm", "cpu"} and b.nodes == 64 and b.runs == 120
    assert b.lookup("h100_sxm", _metric("gemm_bf16_tflops", 1, "TFLOP/s", dtype="bf16")).value == 700.0
    assert b.lookup("h100_sxm", _metric("gemm_bf16_tflops", 1, "TFLOP/s")).value == 650.0      # no dtype tag
    big = _metric("allreduce_busbw_gbs", 1, "GB/s", None, size_bytes=1 << 30)
    assert b.lookup("h100_sxm", big).value == 360.0
    assert b.lookup("h100_sxm", _metric("allreduce_busbw_gbs", 1, "GB/s", None, size_bytes=4096)) is None
    assert b.lookup("h100_sxm", _metric("gemm_bf16_tflops", 1, "GFLOP/s")) is None              # unit differs
    assert b.lookup("a100_sxm4_80gb", _metric("gemm_bf16_tflops", 1, "TFLOP/s")) is None
    assert [r.bound_key for r in b.rules()] == ["max_z", "min_fraction", "max_fraction"]
    assert b.rules([]) == () and Baseline(skus={}).rules() == DEFAULT_RULES


def test_yaml_round_trip(tmp_path: Path) -> None:
    b = load_baseline(_write(tmp_path, EXAMPLE))
    again = load_baseline(_write(tmp_path, b.to_yaml(), "again.yaml"))
    assert again.to_dict() == b.to_dict()


_BAD = [
    ("[1, 2]", "", "expected a mapping"),
    ("skus: {}", "schema", "required key is missing"),
    ("schema: 2\nskus: {}", "schema", "newer than this gpuaccept reads"),
    ("schema: 1\nskus: {}\nextra: 1", "extra", "unknown key"),
    ("schema: 1\nskus: []", "skus", "expected a mapping"),
    ("schema: 1\nskus: {h100_sxm: {metrics: {}}}", "skus.h100_sxm.metrics", "expected a list"),
    ("schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, unit: u, mad: 1, n: 3}]}}",
     "skus.h100_sxm.metrics[0].value", "required key is missing"),
    ("schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, value: fast, unit: u, mad: 1, n: 3}]}}",
     "skus.h100_sxm.metrics[0].value", "expected a finite number"),
    ("schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, value: .nan, unit: u, mad: 1, n: 3}]}}",
     "skus.h100_sxm.metrics[0].value", "expected a finite number"),
    ("schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, value: 1, unit: u, mad: -1, n: 3}]}}",
     "skus.h100_sxm.metrics[0].mad", "must be >= 0"),
    ("schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, value: 1, unit: u, mad: 1, n: 0}]}}",
     "skus.h100_sxm.metrics[0].n", "must be >= 1"),
    ("schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, value: 1, unit: u, mad: 1, n: 3, colour: red}]}}",
     "skus.h100_sxm.metrics[0].colour", "unknown key"),
    ("schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, value: 1, unit: u, mad: 1, n: 3},"
     " {metric: m, value: 2, unit: u, mad: 1, n: 3}]}}", "skus.h100_sxm.metrics[1]", "duplicate of metrics[0]"),
    ("schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, value: 1, unit: u, mad: 1, n: 3, size_bytes: 1.5}]}}",
     "skus.h100_sxm.metrics[0].size_bytes", "expected an integer"),
    ("schema: 1\nskus: {1: {metrics: []}}", "skus.1", "non-empty string"),
    ("schema: 1\nskus: {}\nthresholds: [{metric: m, min: 1, max_z: 3}]", "thresholds[0]", "exactly one of"),
    ("schema: 1\nskus: {}\nthresholds: [{metric: m}]", "thresholds[0]", "exactly one of"),
    ("schema: 1\nskus: {}\nthresholds: [{metric: m, max_z: -3}]", "thresholds[0].max_z", "must be > 0"),
    ("schema: 1\nskus: {}\nthresholds: [{metric: m, min_fraction: 0.9, severity: page}]",
     "thresholds[0].severity", "must be 'fail' or 'warn'"),
    ("schema: 1\nskus: {}\nthresholds: [{metric: m, max_z: 3, code: 'import os'}]", "thresholds[0].code",
     "unknown key"),
    ("schema: 1\nskus: {}\nthresholds: {metric: m}", "thresholds", "expected a list"),
]


@pytest.mark.parametrize(("text", "key", "reason"), _BAD)
def test_malformed_baselines_name_file_key_and_reason(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_baseline(path)
    assert info.value.source == str(path) and info.value.key == key and reason in info.value.reason


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_baseline(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_baseline(_write(tmp_path, "skus: [unclosed"))
    with pytest.raises(ConfigError, match="thresholds: required key is missing"):
        load_rules(_write(tmp_path, "schema: 1\nskus: {}\n"))


def test_malformed_baseline_on_the_cli_is_exit_2_with_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "schema: 1\nskus: {h100_sxm: {metrics: [{metric: m, value: 1, unit: u, mad: x, n: 3}]}}")
    p = gpuaccept("baseline", "show", str(path))
    assert p.returncode == 2
    assert p.stderr.strip() == (f"gpuaccept: error: {path}: skus.h100_sxm.metrics[0].mad: "
                                "expected a finite number, got 'x'")
    report = tmp_path / "report.json"
    report.write_text(json.dumps(node_report("n", np.random.default_rng(0)).to_dict()))
    p = gpuaccept("baseline", "apply", str(report), "--baseline", str(path))
    assert p.returncode == 2 and "skus.h100_sxm.metrics[0].mad" in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------- rules


def _entry(value: float = 700.0, mad: float = 7.0, unit: str = "TFLOP/s") -> BaselineEntry:
    return BaselineEntry("m", value, unit, mad, 100)


def test_rule_bounds() -> None:
    thr = _metric("gemm_bf16_tflops", 600.0, "TFLOP/s")
    step = _metric("train_step_ms", 45.0, "ms")
    e, es = _entry(), _entry(41.0, 0.41, "ms")
    assert parse_rule({"metric": "*", "min": 500}, "f", "k").bound(thr, None) == (">=", 500.0)
    assert parse_rule({"metric": "*", "max": 50}, "f", "k").bound(step, None) == ("<=", 50.0)
    assert parse_rule({"metric": "*", "min_fraction": 0.9}, "f", "k").bound(thr, e) == (">=", pytest.approx(630.0))
    assert parse_rule({"metric": "*", "min_fraction": 0.9}, "f", "k").bound(thr, None) is None
    assert parse_rule({"metric": "*", "max_fraction": 1.1}, "f", "k").bound(step, es) == ("<=", pytest.approx(45.1))
    # max_z: below the centre for throughput, above for step time; MAD 7 -> 5 * 7 / 0.6745 = 51.9.
    z = parse_rule({"metric": "*", "max_z": 5}, "f", "k")
    assert z.bound(thr, e) == (">=", pytest.approx(700 - 5 * 7 / 0.6745))
    assert z.bound(step, es) == ("<=", pytest.approx(41 + 5 * 0.41 / 0.6745))
    # A MAD below the 1 % floor is floored: 0.0 -> 7.0 for a centre of 700.
    assert z.bound(thr, _entry(mad=0.0)) == (">=", pytest.approx(700 - 5 * 7 / 0.6745))
    # Unknown direction: the side the value is on.
    assert z.bound(_metric("cpu_count", 100.0, "count"), _entry(128.0, 0.0, "count"))[0] == ">="
    assert z.bound(_metric("cpu_count", 200.0, "count"), _entry(128.0, 0.0, "count"))[0] == "<="


def test_rule_in_code_needs_exactly_one_bound() -> None:
    with pytest.raises(ValueError):
        BaselineRule(metric="*")
    with pytest.raises(ValueError):
        BaselineRule(metric="*", min=1.0, max_z=3.0)
    assert BaselineRule(metric="*", max_z=5).bound_value == 5.0


def test_rule_matching_by_metric_and_sku_glob() -> None:
    r = BaselineRule(metric="gemm_*", sku="h100_*", min_fraction=0.9)
    m = _metric("gemm_bf16_tflops", 1, "TFLOP/s")
    assert r.matches(m, "h100_sxm") and not r.matches(m, "a100_sxm4_80gb")
    assert not r.matches(_metric("d2d_copy_gbs", 1, "GB/s"), "h100_sxm")
    assert r.describe() == "gemm_* on h100_*: min_fraction 0.9 (fail)"


# ---------------------------------------------------------------------------------------------- learning


def test_learning_finds_the_centre_despite_bad_nodes() -> None:
    slow = {(n, g): 0.6 for n in (2, 9) for g in range(8)} | {(20, 3): 0.8}
    c = fleet(21, nodes=40, slow=slow)
    b = learn_baseline([c], created="2025-02-01T00:00:00Z", origin=["c.json"])
    assert b.nodes == 40 and b.runs == 40 and b.created == "2025-02-01T00:00:00Z" and b.origin == ("c.json",)
    assert set(b.skus) == {"h100_sxm"}
    for _, name, unit, value, tags, cv in METRICS:
        probe = Metric(name, 0.0, unit, "cuda:0", tags=dict(tags))
        e = b.lookup("h100_sxm", probe)
        assert e is not None, name
        assert e.value == pytest.approx(value, rel=0.01), name          # 18 of 320 GPUs slow: not in the centre
        assert e.dropped >= 16 and e.n == 320 - e.dropped and e.nodes == 40 and e.runs == 40
        assert e.mad / e.value == pytest.approx(0.6745 * (cv ** 2 + 0.01 ** 2) ** 0.5, rel=0.35)
        assert e.dtype == tags.get("dtype") and e.size_bytes is None       # one size per run: no size key
    gpu_count = b.lookup("h100_sxm", Metric("gpu_count", 8.0, "count"))
    assert gpu_count is not None and gpu_count.value == 8.0 and gpu_count.mad == 0.0


def test_learning_keys_sweeps_by_size_and_cpu_metrics_by_cpu() -> None:
    c = fleet(22, nodes=5)
    for i, entry in enumerate(c.nodes):
        assert entry.report is not None
        entry.report.checks.append(CheckResult("nccl", Status.PASS, "", metrics=[
            Metric("allreduce_busbw_gbs", 10.0 * k + i * 0.01, "GB/s", tags={"size_bytes": 1 << (10 + k)})
            for k in range(4)]))
        entry.report.checks.append(CheckResult("memory", Status.PASS, "", metrics=[
            Metric("stream_triad_gbs", 200.0 + i, "GB/s", device="cpu", tags={"size_bytes": 1 << 28})]))
        entry.report.checks.append(CheckResult("health", Status.PASS, "", metrics=[
            Metric("power_w", 300.0, "W", device="cuda:0")]))
        entry.report.checks.append(CheckResult("broken", Status.ERROR, "", metrics=[
            Metric("broken_gbs", 1.0, "GB/s", device="cuda:0")]))
    b = learn_baseline([c])
    sweep = [e for e in b.skus["h100_sxm"] if e.metric == "allreduce_busbw_gbs"]
    assert [e.size_bytes for e in sweep] == [1024, 2048, 4096, 8192]
    assert sweep[3].value == pytest.approx(30.02) and sweep[3].n == 5
    (stream,) = b.skus["cpu"]
    assert stream.metric == "stream_triad_gbs" and stream.value == 202.0 and stream.size_bytes is None
    names = {e.metric for entries in b.skus.values() for e in entries}
    assert "power_w" not in names and "broken_gbs" not in names


def test_learning_counts_nodes_and_runs_and_honours_min_samples() -> None:
    rng = np.random.default_rng(23)
    reports = [node_report(f"h{i % 3}", rng, gpus=1, run_id=f"r{i}") for i in range(6)]
    b = learn_baseline(reports, min_samples=3)
    assert b.nodes == 3 and b.runs == 6
    assert all(e.n == 6 and e.nodes == 3 and e.runs == 6 for e in b.skus["h100_sxm"])
    assert len(learn_baseline(reports[:2], min_samples=3)) == 0
    assert len(learn_baseline([])) == 0


# ---------------------------------------------------------------------------------------------- judging


def _baseline_for(c_seed: int = 31) -> Baseline:
    return learn_baseline([fleet(c_seed, nodes=24)])


def test_apply_sets_expected_and_fails_a_slow_gpu_without_touching_the_input() -> None:
    b = _baseline_for()
    rep = node_report("suspect", np.random.default_rng(32), slow={3: 0.85})
    before = copy.deepcopy(rep.to_dict())
    judged = apply_baseline(rep, b)
    assert rep.to_dict() == before                                   # pure
    compute = next(c for c in judged.checks if c.name == "compute")
    assert compute.status is Status.FAIL and judged.verdict is Verdict.FAILURE
    assert compute.reason.startswith("gemm_bf16_tflops on cuda:3 ")
    assert "(baseline:" in compute.reason and compute.reason.endswith("(measured)")
    m = next(m for m in compute.metrics if m.name == "gemm_bf16_tflops" and m.device == "cuda:0")
    entry = b.lookup("h100_sxm", m)
    assert entry is not None and m.expected == entry.value
    assert m.threshold is not None and m.threshold.op == ">=" and m.threshold.source.endswith(":max_z=5")
    assert compute.details["baseline"]["matched"] == 16 and len(compute.details["baseline"]["violations"]) == 2
    # A healthy node passes.
    healthy = apply_baseline(node_report("ok", np.random.default_rng(33)), b)
    assert healthy.verdict is Verdict.SUCCESS and not healthy.failed_checks()


def test_warn_rules_and_file_rules() -> None:
    b = _baseline_for()
    rep = node_report("suspect", np.random.default_rng(34), slow={1: 0.85})
    judged = apply_baseline(rep, b, [BaselineRule(metric="*", min_fraction=0.9, severity=Status.WARN)])
    compute = next(c for c in judged.checks if c.name == "compute")
    assert compute.status is Status.WARN and judged.verdict is Verdict.SUCCESS
    # A later rule overrides an earlier one for the metrics it matches.
    b.thresholds = (BaselineRule(metric="*", max_z=5), BaselineRule(metric="gemm_*", min_fraction=0.5))
    judged = apply_baseline(rep, b)
    statuses = {c.name: c.status for c in judged.checks}
    assert statuses["compute"] is Status.PASS and statuses["memory"] is Status.FAIL


def test_after_the_fact_a_baseline_cannot_excuse_a_runtime_failure() -> None:
    b = _baseline_for()
    rep = node_report("spec", np.random.default_rng(35))
    compute = next(c for c in rep.checks if c.name == "compute")
    m = compute.metrics[0]
    m.threshold = Threshold(">=", 1000.0, Status.FAIL, "sku:h100_sxm")
    compute.status, compute.reason = Status.FAIL, "gemm below spec"
    rep.verdict = Verdict.FAILURE
    judged = apply_baseline(rep, b)
    jc = next(c for c in judged.checks if c.name == "compute")
    assert jc.status is Status.FAIL and judged.verdict is Verdict.FAILURE
    assert jc.metrics[0].threshold == m.threshold                     # the bound that decided stays
    assert "sku:h100_sxm" in jc.details["baseline"]["not_excused"][0]


def test_skipped_checks_and_unmatched_metrics_are_left_alone() -> None:
    b = _baseline_for()
    rep = node_report("n", np.random.default_rng(36), sku="a100_sxm4_80gb")   # no A100 entries
    rep.checks.append(CheckResult("train2", Status.SKIP, "no GPU", metrics=[]))
    judged = apply_baseline(rep, b)
    assert [c.to_dict() for c in judged.checks] == [c.to_dict() for c in rep.checks]


def test_overlay_before_judging_replaces_the_spec_bound_at_run_time() -> None:
    """How ``gpuaccept run --baseline`` judges: overlay on the outcome's metrics, then judge() as usual."""
    b = _baseline_for()
    env_only = node_report("n", np.random.default_rng(37))
    env_only.checks = env_only.checks[:1]
    slow_but_normal = [Metric("gemm_bf16_tflops", 690.0, "TFLOP/s", f"cuda:{g}", tags={"dtype": "bf16"},
                              threshold=Threshold(">=", 989.4 * 0.75, Status.FAIL, "sku:h100_sxm"))
                       for g in range(8)]
    outcome = Outcome(Status.PASS, "measured", slow_but_normal)
    check = CheckResult("compute", outcome.status, outcome.reason, metrics=outcome.metrics)
    changed = overlay_baseline(check, env_only, b)
    assert len(changed) == 8
    j = judge(outcome, defaults=(), overrides=())
    assert j.status is Status.PASS                                   # the fleet, not the spec, decides
    assert outcome.metrics[0].threshold is not None and outcome.metrics[0].threshold.source.startswith("baseline:")
    # A user's config rule still wins over the baseline, with min_fraction now of the baseline value.
    j = judge(outcome, overrides=[ThresholdRule("gemm_*", min_fraction=0.999)])
    assert j.status is Status.FAIL and "gemm_bf16_tflops" in j.reason


# ---------------------------------------------------------------------------------------------- CLI


def _reports_dir(tmp_path: Path) -> Path:
    d = tmp_path / "reports"
    c = fleet(41, nodes=12, slow={(5, 2): 0.8})
    (d / "cluster").mkdir(parents=True)
    (d / "cluster" / "cluster-report.json").write_text(json.dumps(c.to_dict()))
    for entry in c.nodes[:4]:                          # the same node reports again, as launch leaves them
        assert entry.report is not None
        (d / entry.report.run_id).mkdir()
        (d / entry.report.run_id / "report.json").write_text(json.dumps(entry.report.to_dict()))
    rng = np.random.default_rng(42)
    for i in range(3):
        rep = node_report(f"extra{i}", rng)
        (d / rep.run_id).mkdir()
        (d / rep.run_id / "report.json").write_text(json.dumps(rep.to_dict()))
    (d / "notes.json").write_text('{"not": "a report"}')
    return d


def test_cli_create_show_apply(tmp_path: Path) -> None:
    d = _reports_dir(tmp_path)
    out = tmp_path / "fleet.yaml"
    p = gpuaccept("baseline", "create", "--from", str(d), "--output", str(out), "--note", "after RMA batch 7")
    assert p.returncode == 0, p.stderr
    assert "from 15 node(s), 15 run(s)" in p.stderr                # duplicates counted once
    b = load_baseline(out)
    assert b.nodes == 15 and b.note == "after RMA batch 7" and b.origin == (str(d),)
    assert yaml.safe_load(out.read_text())["schema"] == 1

    p = gpuaccept("baseline", "show", str(out))
    assert p.returncode == 0 and "gemm_bf16_tflops" in p.stdout and "thresholds (default): *: max_z 5" in p.stdout
    p = gpuaccept("baseline", "show", str(out), "--json", "--sku", "h100_sxm")
    assert json.loads(p.stdout)["skus"]["h100_sxm"]["metrics"][0]["n"] > 0

    slow = d / "node005" / "report.json"
    slow.parent.mkdir()
    c = json.loads((d / "cluster" / "cluster-report.json").read_text())
    slow.write_text(json.dumps(c["nodes"][5]["report"]))
    p = gpuaccept("baseline", "apply", str(slow), "--baseline", str(out), "--output", str(tmp_path / "j.json"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "node005 compute: FAIL" in p.stdout and "cuda:2" in p.stdout
    judged = json.loads((tmp_path / "j.json").read_text())
    assert judged["verdict"] == "failure"
    p = gpuaccept("baseline", "apply", str(d / "cluster" / "cluster-report.json"), "--baseline", str(out))
    assert p.returncode == 1 and "node005 compute: FAIL" in p.stdout and "node004 compute: PASS" in p.stdout
    ok = d / "run-extra0" / "report.json"
    p = gpuaccept("baseline", "apply", str(ok), "--baseline", str(out))
    assert p.returncode == 0, p.stdout


def test_cli_create_with_embedded_thresholds_to_stdout(tmp_path: Path) -> None:
    d = _reports_dir(tmp_path)
    rules = _write(tmp_path, "thresholds:\n  - {metric: 'gemm_*', min_fraction: 0.9}\n", "rules.yaml")
    p = gpuaccept("baseline", "create", "--from", str(d / "cluster"), "--thresholds", str(rules), "--min-samples", "5")
    assert p.returncode == 0, p.stderr
    data = yaml.safe_load(p.stdout)
    assert data["thresholds"] == [{"metric": "gemm_*", "min_fraction": 0.9}]
    assert parse_baseline(data, "<stdout>").thresholds[0].min_fraction == 0.9


@pytest.mark.parametrize("args", [
    ("baseline", "create"),
    ("baseline", "create", "--from", "/nonexistent/dir"),
    ("baseline", "create", "--from", "EMPTY"),
    ("baseline", "create", "--from", "BADJSON"),
    ("baseline", "create", "--from", "EMPTY", "--host", "x"),
    ("baseline", "create", "--from", "EMPTY", "--trim-z", "0"),
    ("baseline",),
])
def test_cli_create_bad_input_is_exit_2_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad" / "report.json"
    bad.parent.mkdir()
    bad.write_text('{"run_id": "x", "host": "h", "checks": [{"name": 1}]}')
    args = tuple(str(tmp_path / "empty") if a == "EMPTY" else str(bad.parent) if a == "BADJSON" else a
                 for a in args)
    p = gpuaccept(*args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_cli_create_from_the_history_store(tmp_path: Path) -> None:
    from gpuaccept.results.history import record

    db = f"sqlite:///{tmp_path / 'history.db'}"
    rng = np.random.default_rng(51)
    for i in range(5):
        rep: NodeReport = node_report(f"h{i}", rng, run_id=f"run-{i}")
        record(rep, db)
    p = gpuaccept("baseline", "create", "--history", "--db", db, "--output", str(tmp_path / "b.yaml"))
    assert p.returncode == 0, p.stderr
    b = load_baseline(tmp_path / "b.yaml")
    assert b.nodes == 5 and b.runs == 5 and b.origin == ("history",)
    assert b.lookup("h100_sxm", Metric("gpu_count", 8.0, "count")) is not None
    p = gpuaccept("baseline", "create", "--history", "--db", db, "--host", "nobody")
    assert p.returncode == 2 and "no node runs in the history match" in p.stderr


def test_overlay_finds_the_sku_in_the_judged_checks_own_details() -> None:
    """Without an env check (``--skip env``), the check's own record of its GPUs decides the SKU."""
    b = _baseline_for()
    bare = NodeReport("r", "n", "standard", "2025-01-01T00:00:00Z")
    m = Metric("d2d_copy_gbs", 100.0, "GB/s", "cuda:0", tags={"size_bytes": 1 << 30})
    check = CheckResult("memory", Status.PASS, "", metrics=[m],
                        details={"devices": {"cuda:0": {"name": "NVIDIA H100 80GB HBM3", "sku": "h100_sxm"}}})
    (changed,) = overlay_baseline(check, bare, b)
    assert changed.entry is not None and m.expected == changed.entry.value
    assert m.threshold is not None and not m.threshold.met_by(m.value)
    unknown = CheckResult("memory", Status.PASS, "", metrics=[Metric("d2d_copy_gbs", 1.0, "GB/s", "cuda:0")])
    assert overlay_baseline(unknown, bare, b) == []


# ---------------------------------------------------------------------------------------------- bounds shown


def _wide_spread_report() -> tuple[NodeReport, Baseline]:
    """The reported case: value 24.77 GB/s, baseline 26.33 GB/s with a MAD so wide that max_z=5 reaches -12.86."""
    mad = (26.33 + 12.86) * 0.6745 / 5
    b = Baseline(skus={"cpu": (BaselineEntry("stream_copy_gbs", 26.33, "GB/s", mad, 40),)}, path="/x/fleet.yaml")
    m = Metric("stream_copy_gbs", 24.77, "GB/s", device="cpu")
    check = CheckResult("memory", Status.PASS, "measured", metrics=[m])
    rep = NodeReport("r1", "n1", "quick", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", Verdict.SUCCESS, [check])
    return rep, b


def test_a_max_z_bound_below_zero_is_clamped_and_the_baseline_is_called_a_baseline() -> None:
    from gpuaccept.report.console import describe_key, metric_line
    from gpuaccept.report.html import render_html
    from gpuaccept.report.markdown import render_markdown

    rep, b = _wide_spread_report()
    judged = apply_baseline(rep, b)
    m = judged.checks[0].metrics[0]
    assert m.threshold is not None and m.threshold.value == 0.0 and m.threshold.clamped
    assert m.expected == 26.33 and m.expected_source == "baseline:fleet.yaml"
    assert Metric.from_dict(m.to_dict()) == m                       # the source and the clamp survive JSON
    value, expect = describe_key(judged.checks[0], None)
    assert value.startswith("stream_copy_gbs=24.")
    assert expect == ">= 0 GB/s (clamped: baseline spread too wide to bound) (baseline 26.3 GB/s)"
    assert "-12" not in expect and "spec" not in expect
    line = metric_line(m)
    assert "baseline 26.3 GB/s" in line and "spec" not in line and "-12" not in line
    md_text = render_markdown(judged)
    assert "baseline 26.3 GB/s" in md_text and "-12" not in md_text
    html_text = render_html(judged)
    assert "<th>baseline</th>" in html_text and "clamped" in html_text


def test_junit_names_the_baseline_of_a_failed_metric() -> None:
    from gpuaccept.report.junit import render_junit

    rep, b = _wide_spread_report()
    judged = apply_baseline(rep, b, [BaselineRule(metric="*", min_fraction=0.99)])
    text = render_junit(judged)
    assert "baseline 26.33 GB/s" in text and "spec" not in text
    # the reason and the metric line show the missed bound alike, in one unit
    assert "24.77 &lt; 26.0667 GB/s (baseline:" in text and "&gt;= 26.0667 GB/s" in text


def test_bounds_stay_inside_the_metric_domain() -> None:
    from gpuaccept.results.samples import clamp_to_domain, domain

    assert domain("stream_copy_gbs", "GB/s") == (0.0, float("inf"))
    assert domain("mfu", "fraction") == (0.0, 1.0)
    assert domain("train_loss_last", "") == (float("-inf"), float("inf"))
    assert clamp_to_domain(">=", -12.86, "stream_copy_gbs", "GB/s") == (0.0, True)
    assert clamp_to_domain(">=", 20.0, "stream_copy_gbs", "GB/s") == (20.0, False)
    assert clamp_to_domain("<=", 1.3, "mfu", "fraction") == (1.0, True)
    # A bound inside the domain is left alone and not marked.
    rep, _ = _wide_spread_report()
    b = Baseline(skus={"cpu": (BaselineEntry("stream_copy_gbs", 26.33, "GB/s", 0.2, 40),)})
    m = apply_baseline(rep, b).checks[0].metrics[0]
    assert m.threshold is not None and m.threshold.value > 0 and not m.threshold.clamped


def test_learning_leaves_budget_reruns_out() -> None:
    """Each run counts once, with its first pass: a re-run (``details.rerun``) of a suspect node, measured at
    another depth, would add a second, lower value of that node to its group."""
    rng = np.random.default_rng(29)
    reports = [node_report(f"h{i}", rng, gpus=1, run_id=f"r{i}") for i in range(4)]
    plain = learn_baseline(reports, min_samples=3, created="2026-11-24T00:00:00Z")
    rerun = copy.deepcopy(reports[0].checks[1])
    rerun.details = {"rerun": {"name": rerun.name, "level": "full", "why": "it warned"}}
    for m in rerun.metrics:
        m.value *= 0.5
    reports[0].checks.append(rerun)
    learned = learn_baseline(reports, min_samples=3, created="2026-11-24T00:00:00Z")
    assert learned.skus == plain.skus and learned.runs == 4
    assert all(e.n == 4 for e in learned.skus["h100_sxm"])
