"""reference_train's curves in a fleet baseline: learned from reports (the majority per configuration and
stack), written and read back, and a later run's departing device named with its step."""

from __future__ import annotations

import copy

import pytest

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.reference_train import FAULT_ENV, ReferenceTrainCheck
from gpuaccept.errors import ConfigError
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold, Verdict
from gpuaccept.results.baseline import parse_baseline
from gpuaccept.results.baseline_judge import apply_baseline
from gpuaccept.results.baseline_learn import learn_baseline

H100 = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "550.54.15", "cuda": "12.4", "torch": "2.4.0", "cublas": "12.4.5.8"}
GOOD = [f"{i:016x}" for i in range(10)]


def result(curves: dict[str, list[str]], stack: dict[str, str] = H100, config: str = "abc123") -> CheckResult:
    metrics = [Metric("reftrain_match", 1.0, "bool", d, threshold=Threshold(">=", 1.0, Status.FAIL, "default"))
               for d in curves]
    details = {"config_key": config, "stack": {d: dict(stack) for d in curves},
               "devices": {d: {d: {"digests": list(c), "loss": []}} for d, c in curves.items()}}
    return CheckResult("reference_train", Status.PASS, "curves agree", metrics=metrics, details=details)


def report(host: str, *checks: CheckResult) -> NodeReport:
    return NodeReport("r-" + host, host, "full", "2026-11-28T10:00:00Z", "2026-11-28T10:10:00Z", Verdict.SUCCESS,
                      list(checks), device="cuda")


def test_learn_keeps_the_majority_curve_per_config_and_stack_and_round_trips():
    odd = GOOD[:4] + ["f" * 16] * 6
    other_torch = {**H100, "torch": "2.5.0"}
    reports = [report("n1", result({"cuda:0": GOOD, "cuda:1": GOOD})),
               report("n2", result({"cuda:0": GOOD, "cuda:1": odd})),
               report("n3", result({"cuda:0": GOOD, "cuda:1": odd}, stack=other_torch))]
    base = learn_baseline(iter(reports))  # a stream: read once, both metrics and curves
    by_torch = {dict(c.stack)["torch"]: c for c in base.curves}
    assert set(by_torch) == {"2.4.0"}  # 2.5.0: one good, one odd, no majority: no curve
    entry = by_torch["2.4.0"]
    assert entry.digests == tuple(GOOD) and entry.devices == 3 and entry.nodes == 2 and entry.config == "abc123"
    again = parse_baseline(__import__("yaml").safe_load(base.to_yaml()), "fleet.yaml")
    assert again.curves == base.curves


def test_a_later_run_departing_from_the_fleet_curve_fails_naming_device_and_step():
    base = learn_baseline([report(f"n{i}", result({"cuda:0": GOOD, "cuda:1": GOOD})) for i in range(3)])
    later = report("n9", result({"cuda:0": GOOD, "cuda:1": GOOD[:6] + ["e" * 16] * 4}))
    judged = apply_baseline(later, base)
    check = judged.checks[0]
    assert check.status is Status.FAIL and judged.verdict is Verdict.FAILURE
    fleet = {m.device: (m.value, m.tags.get("departs_at_step")) for m in check.metrics
             if m.name == "reftrain_fleet_match"}
    assert fleet == {"cuda:0": (1.0, None), "cuda:1": (0.0, 6)}
    assert check.details["baseline_curves"]["departed"] == ["cuda:1 departs from the fleet's curve (6 devices) "
                                                            "at step 6"]
    assert "reftrain_fleet_match on cuda:1" in check.reason and "curves, departs at step 6" in check.reason
    # judged twice (run --baseline, then baseline apply): one figure per device, not two
    twice = apply_baseline(judged, base).checks[0]
    assert sum(m.name == "reftrain_fleet_match" for m in twice.metrics) == 2
    # another stack (or configuration) has no fleet curve: nothing compared
    other = apply_baseline(report("n9", result({"cuda:0": GOOD[:2]}, stack={**H100, "driver": "560.1"})), base)
    assert not any(m.name == "reftrain_fleet_match" for m in other.checks[0].metrics)
    assert other.checks[0].status is Status.PASS


@pytest.mark.parametrize(("raw", "key"), [
    ({"config": "a", "stack": H100, "digests": []}, "curves[0].digests"),
    ({"config": "", "stack": H100, "digests": ["a"]}, "curves[0].config"),
    ({"config": "a", "stack": {"gpu": "x", "colour": "red"}, "digests": ["a"]}, "curves[0].stack"),
    ({"config": "a", "stack": H100, "digests": ["a"], "devices": -1}, "curves[0].devices"),
    ({"config": "a", "stack": H100, "digests": ["a"], "extra": 1}, "curves[0].extra"),
])
def test_bad_curve_entries_are_config_errors_naming_the_key(raw, key):
    with pytest.raises(ConfigError) as exc:
        parse_baseline({"schema": 1, "skus": {}, "curves": [raw]}, "fleet.yaml")
    assert key in str(exc.value)


def test_real_cpu_runs_learned_then_a_faulty_run_is_named(monkeypatch):
    small = {"cpu_d_model": 32, "cpu_layers": 1, "cpu_seq": 16, "cpu_batch": 4, "cpu_steps": 8, "heads": 4,
             "runs": 1, "progress": 1.0}
    params = {**ReferenceTrainCheck.defaults("full"), **small}

    def real_run() -> CheckResult:
        out = ReferenceTrainCheck().run(CheckContext(device="cpu", params=params, profile="full"))
        return CheckResult("reference_train", out.status, out.reason, metrics=out.metrics, details=out.details)

    first = real_run()
    assert first.status is Status.PASS, first.reason
    assert set(first.details["stack"]["cpu"]) == {"gpu", "driver", "cuda", "torch", "cublas"}
    base = learn_baseline([report(h, copy.deepcopy(first)) for h in ("a", "b")])
    assert len(base.curves) == 1 and len(base.curves[0].digests) == 8
    monkeypatch.setenv(FAULT_ENV, "cpu@3")
    judged = apply_baseline(report("c", real_run()), base).checks[0]
    assert judged.status is Status.FAIL
    assert judged.details["baseline_curves"]["departed"] == ["cpu departs from the fleet's curve (2 devices) at step 3"]
