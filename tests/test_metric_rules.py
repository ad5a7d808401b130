"""A rule or filter naming a metric nothing produces is refused before anything runs, with a "did you mean"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaccept.checks import registry
from gpuaccept.checks.base import Check, CheckContext, Outcome, ThresholdRule
from gpuaccept.errors import ConfigError, UsageError
from gpuaccept.model import Metric, Status
from gpuaccept.node.config import parse_config
from gpuaccept.node.suite import RunOptions, SuitePlan, check_rule_metrics, plan_suite
from gpuaccept.results.compare import compare_reports
from gpuaccept.results.load import load_file
from tests.cli_inproc import run_main

REPORTS = Path(__file__).parent / "data" / "reports"


def plan(rules: dict[str, list[dict[str, object]]], checks: list[str] | None = None,
         reg: dict[str, type[Check]] | None = None) -> SuitePlan:
    reg = reg or registry()
    cfg = parse_config({"checks": {name: {"thresholds": r} for name, r in rules.items()}}, "c.yaml", reg)
    return plan_suite(RunOptions(profile="standard", checks=checks), cfg, reg, "cpu")


def test_a_misspelt_metric_is_refused_with_did_you_mean() -> None:
    with pytest.raises(ConfigError) as info:
        plan({"compute": [{"metric": "gemm_fp32_tflop", "min": 100000}]})
    assert str(info.value).startswith("c.yaml: checks.compute.thresholds[0].metric: check compute produces no "
                                      "metric 'gemm_fp32_tflop' (did you mean gemm_fp32_tflops")
    assert "\n" not in str(info.value)


def test_a_glob_that_matches_nothing_of_its_check_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"thresholds\[1\]\.metric: check compute produces no metric "
                                          r"'gemm_\*_tflop'"):
        plan({"compute": [{"metric": "gemm_*_tflops", "min": 1}, {"metric": "gemm_*_tflop", "min": 1}]})


def test_a_rule_on_another_checks_metric_names_that_check() -> None:
    with pytest.raises(ConfigError, match=r"'stress_tflops' is not a metric of check compute but of stress "
                                          r"\(not selected\); move the rule to checks.stress.thresholds"):
        plan({"compute": [{"metric": "stress_tflops", "min": 1}]}, checks=["compute"])


def test_good_rules_plan_and_unselected_ones_are_noted() -> None:
    p = plan({"compute": [{"metric": "gemm_*_tflops_concurrent", "min_fraction": 0.6}],
              "memory": [{"metric": "stream_triad_gbs", "min": 1}]}, checks=["memory"])
    assert [c.name for c in p.checks] == ["memory"]
    assert p.notes == ["c.yaml: checks.compute.thresholds[0].metric: check compute is not selected: its rule on "
                       "'gemm_*_tflops_concurrent' applies to nothing"]
    assert p.to_dict()["notes"] == p.notes


class Undeclared(Check):
    name = "undeclared"
    tag = "COMPUTE"
    summary = "a plugin check from before metrics were declared"

    def run(self, ctx: CheckContext) -> Outcome:
        return Outcome.passed("ok", [Metric("its_own", 1.0, "count")])


def test_a_check_that_declares_no_metrics_is_accepted_as_unverified() -> None:
    reg = {**registry(), "undeclared": Undeclared}
    p = plan({"undeclared": [{"metric": "anything_at_all", "min": 1}]}, checks=["undeclared", "env"], reg=reg)
    assert p.notes == ["c.yaml: checks.undeclared.thresholds[0].metric: check undeclared declares no metrics: "
                       "its rule on 'anything_at_all' is not verified"]
    # a baseline rule no declared check produces: unverified while such a check is selected, refused otherwise
    check_rule_metrics(p, reg, [("its_own", "b.yaml", "thresholds[0].metric")])
    assert "not verified (declare none: undeclared)" in p.notes[-1]
    with pytest.raises(ConfigError, match="no check produces a metric 'its_own'"):
        check_rule_metrics(plan({}, checks=["env"], reg=reg), reg, [("its_own", "b.yaml", "thresholds[0].metric")])


def test_baseline_rules_are_checked_against_every_check() -> None:
    p = plan({}, checks=["env"])
    check_rule_metrics(p, registry(), [("*", "b.yaml", "thresholds[0].metric"),
                                       ("gpu_count", "b.yaml", "thresholds[1].metric")])
    assert p.notes == []
    check_rule_metrics(p, registry(), [("gemm_*_tflops", "b.yaml", "thresholds[2].metric")])
    assert p.notes == ["b.yaml: thresholds[2].metric: 'gemm_*_tflops' names metrics of compute, not selected: the "
                       "rule applies to nothing in this run"]
    with pytest.raises(ConfigError) as info:
        check_rule_metrics(p, registry(), [("train_stepms", "b.yaml", "thresholds[3].metric")])
    assert str(info.value) == ("b.yaml: thresholds[3].metric: no check produces a metric 'train_stepms' "
                               "(did you mean train_step_ms or reftrain_tflops or ddp_step_ms?)")


BASELINE = """schema: 1
skus:
  h100_sxm:
    metrics:
      - {metric: gemm_bf16_tflops, dtype: bf16, value: 745.2, unit: TFLOP/s, mad: 6.1, n: 512}
"""


def test_run_refuses_bad_rules_with_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  compute:\n    thresholds:\n      - {metric: gemm_fp32_tflop, min: 100000}\n")
    line = run_main("run", "--plan", "--device", "cpu", "--config", str(cfg)).one_line_error()
    assert "checks.compute.thresholds[0].metric" in line and "did you mean gemm_fp32_tflops" in line
    base = tmp_path / "b.yaml"
    base.write_text(BASELINE + "thresholds:\n  - {metric: gemm_*_tflop, min_fraction: 0.9}\n")
    line = run_main("run", "--plan", "--device", "cpu", "--checks", "env", "--baseline", str(base)).one_line_error()
    assert f"{base}: thresholds[0].metric: no check produces a metric 'gemm_*_tflop'" in line
    rules = tmp_path / "r.yaml"
    rules.write_text("thresholds:\n  - {metric: memtest_error, max: 0}\n")
    line = run_main("run", "--plan", "--device", "cpu", "--checks", "env", "--baseline", str(base),
                    "--baseline-thresholds", str(rules)).one_line_error()
    assert f"{rules}: thresholds[0].metric: no check produces a metric 'memtest_error'" in line
    assert "did you mean memtest_errors" in line


def test_run_plan_lists_the_notes(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  compute:\n    thresholds:\n      - {metric: gemm_fp32_tflops, min: 1}\n")
    res = run_main("run", "--plan", "--device", "cpu", "--checks", "env", "--config", str(cfg))
    assert res.rc == 0, res.err
    assert json.loads(res.out)["notes"] == [f"{cfg}: checks.compute.thresholds[0].metric: check compute is not "
                                            "selected: its rule on 'gemm_fp32_tflops' applies to nothing"]


def test_checks_lists_declared_metrics() -> None:
    res = run_main("checks", "--json")
    rows = {r["name"]: r for r in json.loads(res.out)}
    assert "gemm_fp32_tflops" in rows["compute"]["metrics"] and "temperature_c" in rows["health"]["metrics"]
    assert "    metrics: gpu_count, cpu_count, host_memory_gib" in run_main("checks").out


def _report(name: str) -> object:
    return load_file(REPORTS / name)


@pytest.mark.parametrize(("check", "metric", "words"), [
    (None, "gemm_fp32_tflop", "--metric 'gemm_fp32_tflop': neither run has this metric (did you mean "
                              "gemm_fp32_tflops"),
    ("comput", None, "--check 'comput': neither run has this check (did you mean compute?)"),
    ("compute", "stream_copy_gbs", "--metric 'stream_copy_gbs' is not a metric of check compute in these runs "
                                   "but of memory"),
])
def test_compare_refuses_filters_that_match_nothing(check: str | None, metric: str | None, words: str) -> None:
    a = _report("node-cpu.json")
    with pytest.raises(UsageError) as info:
        compare_reports(a, a, check=check, metric=metric)  # type: ignore[arg-type]
    assert str(info.value).startswith(words), str(info.value)
    good = compare_reports(a, a, check="compute", metric="gemm_fp32_tflops")  # type: ignore[arg-type]
    assert {d.metric for d in good.deltas} == {"gemm_fp32_tflops"}


def test_compare_cli_is_one_line(tmp_path: Path) -> None:
    path = str(REPORTS / "node-cpu.json")
    line = run_main("compare", path, path, "--metric", "stream_triad_gb").one_line_error()
    assert "did you mean stream_triad_gbs" in line


def test_an_unjudged_rule_would_have_passed_before() -> None:
    """The bug this guards: a misspelt rule matched nothing, so the judge passed the check."""
    from gpuaccept.node.judge import judge

    out = Outcome.passed("ok", [Metric("gemm_fp32_tflops", 1.0, "TFLOP/s", "cpu")])
    assert judge(out, (), [ThresholdRule("gemm_fp32_tflop", min=100000)]).status is Status.PASS


def test_baseline_apply_and_create_refuse_a_rule_nothing_produces(tmp_path: Path) -> None:
    base = tmp_path / "b.yaml"
    base.write_text(BASELINE + "thresholds:\n  - {metric: stream_triad_gb, min_fraction: 0.9}\n")
    report = str(REPORTS / "node-cpu.json")
    line = run_main("baseline", "apply", report, "--baseline", str(base)).one_line_error()
    assert f"{base}: thresholds[0].metric: no check produces a metric 'stream_triad_gb'" in line
    assert "did you mean stream_triad_gbs" in line
    rules = tmp_path / "r.yaml"
    rules.write_text("thresholds:\n  - {metric: gemm_*_tflops, min_fraction: 0.9}\n  - {metric: '*', max_z: 5}\n")
    res = run_main("baseline", "apply", report, "--baseline", str(base), "--thresholds", str(rules))
    assert res.rc in (0, 1) and "no check produces" not in res.err, res.err
    rules.write_text("thresholds:\n  - {metric: trian_step_ms, max_fraction: 1.1}\n")
    line = run_main("baseline", "create", "--from", report, "--thresholds", str(rules)).one_line_error()
    assert "no check produces a metric 'trian_step_ms' (did you mean train_step_ms" in line


def test_the_run_header_prints_the_notes() -> None:
    import io

    from gpuaccept.report.console import PlainConsole

    p = plan({"compute": [{"metric": "gemm_fp32_tflops", "min": 1}]}, checks=["env"])
    out = io.StringIO()
    PlainConsole(out, {}).header(p, "/tmp/run")
    assert "[PLAN] note: c.yaml: checks.compute.thresholds[0].metric: check compute is not selected" in out.getvalue()
