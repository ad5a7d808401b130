"""The throughput check: real CPU training runs at reduced size, reported not judged without a baseline."""

from __future__ import annotations

from typing import Any

import pytest

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.throughput import ThroughputCheck, build_cnn, build_transformer
from gpuaccept.model import Status
from gpuaccept.node.judge import judge
from tests.conftest import cuda_available


def params(**over: Any) -> dict[str, Any]:
    return {**ThroughputCheck.defaults("full"), "measure_s": 0.5, "warmup_steps": 1, "min_steps": 2, **over}


def test_cpu_run_reports_both_models_unjudged() -> None:
    out = ThroughputCheck().run(CheckContext(device="cpu", params=params()))
    assert out.status is Status.PASS, out.reason
    m = {x.name: x for x in out.metrics}
    assert set(m) == {"throughput_cnn_samples_s", "throughput_transformer_samples_s"}
    assert all(x.unit == "samples/s" and x.value > 0 and x.device == "cpu" for x in m.values())
    assert all(x.threshold is None for x in m.values())  # a baseline judges them, nothing else
    assert m["throughput_cnn_samples_s"].tags["dtype"] == "fp32" and m["throughput_cnn_samples_s"].tags["batch"] == 32
    assert "not judged without a baseline" in out.reason and "reduced size" in out.reason
    assert judge(out, ThroughputCheck.thresholds).status is Status.PASS
    assert {r.metric for r in ThroughputCheck.required_metrics(params(), ["cpu"])} == set(m)


def test_one_model_and_cpu_fp16_falls_back_to_fp32() -> None:
    out = ThroughputCheck().run(CheckContext(device="cpu", params=params(models=["transformer"], dtype="fp16")))
    assert out.status is Status.PASS, out.reason
    assert [x.name for x in out.metrics] == ["throughput_transformer_samples_s"]
    assert out.metrics[0].tags["dtype"] == "fp32" and "fp16 autocast is not a meaningful CPU test" in out.reason
    assert ThroughputCheck.required_metrics(params(models=["transformer"]), ["cpu"])[0].metric == \
        "throughput_transformer_samples_s"


def test_models_have_the_shapes_asked_for() -> None:
    import torch

    cnn = build_cnn(8, 1)
    assert cnn(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    tf = build_transformer(64, 1, 12)
    assert tf(torch.randint(0, 1024, (3, 12))).shape == (3, 12, 1024)


def test_a_nonfinite_loss_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import math

    from gpuaccept.checks import throughput

    real = throughput.train_throughput

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        r = real(*args, **kwargs)
        r.loss = math.nan  # what a broken device or a diverging fp16 run gives
        return r

    monkeypatch.setattr(throughput, "train_throughput", poisoned)
    out = ThroughputCheck().run(CheckContext(device="cpu", params=params(models=["cnn"], measure_s=0.1)))
    assert out.status is Status.FAIL and out.reason == "loss is not finite: cpu cnn"


@pytest.mark.gpu
def test_gpu_throughput_uses_autocast() -> None:
    assert cuda_available()
    out = ThroughputCheck().run(CheckContext(device="cuda", params=params(measure_s=2.0)))
    assert out.status is Status.PASS, out.reason
    assert {x.tags["dtype"] for x in out.metrics} <= {"bf16", "fp16"}
