from __future__ import annotations

from pathlib import Path

import pytest

from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, ThresholdRule
from gpuaccept.errors import ConfigError, UsageError
from gpuaccept.model import Status
from gpuaccept.node.config import Config, load_config, parse_config
from gpuaccept.node.suite import RunOptions, plan_suite


class Alpha(Check):
    name = "alpha"
    tag = "COMPUTE"
    summary = "test"
    params = (Param("size", "int", 64, "n", minimum=1), Param("dtypes", "list", ["fp32"], "d",
                                                               choices=("fp32", "bf16")))
    profile_params = {"quick": {"size": 8}}
    thresholds = (ThresholdRule("alpha_*", min=1.0),)
    timeout_s = {"quick": 10.0, "standard": 100.0, "full": 1000.0}

    def run(self, ctx: CheckContext) -> Outcome:
        return Outcome(Status.PASS)


class Beta(Alpha):
    name = "beta"
    profiles = ("full",)


REG: dict[str, type[Check]] = {"alpha": Alpha, "beta": Beta}


def _err(data: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.yaml", REG)
    return info.value


def test_valid_config_is_parsed_with_types() -> None:
    cfg = parse_config({"profile": "quick", "gpus": "0,1", "checks": {"alpha": {
        "params": {"size": 4, "dtypes": "fp32,bf16"}, "timeout_s": 5,
        "thresholds": [{"metric": "alpha_x", "min_fraction": 0.5, "severity": "warn"}]}}}, "cfg.yaml", REG)
    assert cfg.gpus == [0, 1]
    s = cfg.checks["alpha"]
    assert s.params == {"size": 4, "dtypes": ["fp32", "bf16"]} and s.timeout_s == 5.0
    assert s.thresholds[0].severity is Status.WARN and s.thresholds[0].min_fraction == 0.5


@pytest.mark.parametrize(("data", "key", "words"), [
    ({"profil": "quick"}, "profil", "unknown key"),
    ({"profile": "fast"}, "profile", "not one of"),
    ({"checks": {"gamma": {}}}, "checks.gamma", "unknown check"),
    ({"checks": {"alpha": {"params": {"sise": 3}}}}, "checks.alpha.params.sise", "unknown parameter"),
    ({"checks": {"alpha": {"params": {"size": "big"}}}}, "checks.alpha.params.size", "expected int"),
    ({"checks": {"alpha": {"params": {"size": True}}}}, "checks.alpha.params.size", "expected int"),
    ({"checks": {"alpha": {"params": {"size": 0}}}}, "checks.alpha.params.size", "minimum"),
    ({"checks": {"alpha": {"params": {"dtypes": ["fp64"]}}}}, "checks.alpha.params.dtypes[0]", "not one of"),
    ({"checks": {"alpha": {"thresholds": [{"metric": "a", "min": 1, "max": 2}]}}},
     "checks.alpha.thresholds[0]", "exactly one"),
    ({"checks": {"alpha": {"thresholds": [{"metric": "a", "min": "1"}]}}},
     "checks.alpha.thresholds[0].min", "expected a number"),
    ({"checks": {"alpha": {"thresholds": [{"metric": "a", "min": 1, "eval": "x"}]}}},
     "checks.alpha.thresholds[0].eval", "unknown key"),
    ({"checks": {"alpha": {"thresholds": [{"metric": "a", "min": 1, "severity": "error"}]}}},
     "checks.alpha.thresholds[0].severity", "'fail' or 'warn'"),
    ({"checks": {"alpha": {"timeout_s": -1}}}, "checks.alpha.timeout_s", "> 0"),
    ({"gpus": "0,x"}, "gpus", "not a GPU index"),
    ({"gpus": [0, 0]}, "gpus", "twice"),
    ({"timeout_scale": 0}, "timeout_scale", "> 0"),
    (["a"], "", "mapping"),
])
def test_bad_config_names_file_key_and_reason(data: object, key: str, words: str) -> None:
    err = _err(data)
    assert err.source == "cfg.yaml" and err.key == key and words in err.reason
    assert str(err).startswith("cfg.yaml")


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("profile: quick\nchecks: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(p, REG)
    assert str(p) in str(info.value) and "invalid YAML" in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml", REG)


def test_plan_selects_by_profile_and_flags() -> None:
    cfg = Config()
    plan = plan_suite(RunOptions(profile="quick"), cfg, REG, "cpu")
    assert [c.name for c in plan.checks] == ["alpha"]
    assert plan.checks[0].params == {"size": 8, "dtypes": ["fp32"]} and plan.checks[0].timeout_s == 10.0
    full = plan_suite(RunOptions(profile="full", timeout_scale=2.0), cfg, REG, "cpu")
    assert [c.name for c in full.checks] == ["alpha", "beta"] and full.checks[0].timeout_s == 2000.0
    only = plan_suite(RunOptions(profile="quick", checks=["beta"]), cfg, REG, "cpu")
    assert [c.name for c in only.checks] == ["beta"]
    with pytest.raises(UsageError, match="unknown check 'zeta'"):
        plan_suite(RunOptions(checks=["zeta"]), cfg, REG, "cpu")
    with pytest.raises(UsageError, match="no check selected"):
        plan_suite(RunOptions(profile="quick", skip=["alpha"]), cfg, REG, "cpu")


def test_config_overrides_reach_the_plan() -> None:
    cfg = parse_config({"checks": {"alpha": {"params": {"size": 3}, "timeout_s": 7,
                                             "thresholds": [{"metric": "alpha_y", "max": 2}]},
                                   "beta": {"enabled": True}}}, "c.yaml", REG)
    plan = plan_suite(RunOptions(profile="quick"), cfg, REG, "cpu")
    alpha = plan.checks[0]
    assert alpha.params["size"] == 3 and alpha.timeout_s == 7.0
    assert [r.metric for r in alpha.overrides] == ["alpha_y"] and alpha.defaults == [Alpha.thresholds[0]]
    assert [c.name for c in plan.checks] == ["alpha", "beta"]
