"""Tests of the train check: the loss must fall, divergence and non-finite losses fail."""

from __future__ import annotations

import math

import pytest
import torch

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.train import TrainCheck, loss_drop, train_mlp
from gpuaccept.model import Status
from gpuaccept.node.judge import judge
from tests.conftest import cuda_available


def test_loss_drop_math() -> None:
    assert loss_drop([4.0, 4.0, 3.0, 2.0, 2.0], 2) == pytest.approx(0.5)
    assert loss_drop([1.0, 2.0], 1) == pytest.approx(-1.0)
    assert loss_drop([1.0, 1.0, 1.0], 3) == pytest.approx(0.0)
    assert math.isnan(loss_drop([1.0, math.nan, 0.5], 1))  # any non-finite loss poisons the result
    assert math.isnan(loss_drop([1.0, math.inf, 0.5, 0.5], 2))
    assert math.isnan(loss_drop([0.0, 0.0], 1))
    with pytest.raises(ValueError):
        loss_drop([1.0], 2)


def test_quick_cpu_run_learns() -> None:
    params = TrainCheck.defaults("quick")
    out = TrainCheck().run(CheckContext(device="cpu", params=params))
    assert out.status is Status.PASS, out.reason
    m = {x.name: x for x in out.metrics}
    assert set(m) == {"train_loss_first", "train_loss_last", "train_loss_drop", "train_step_ms"}
    assert all(x.device == "cpu" for x in out.metrics)
    assert m["train_loss_last"].value < m["train_loss_first"].value
    assert m["train_loss_drop"].value == pytest.approx(1 - m["train_loss_last"].value / m["train_loss_first"].value)
    assert m["train_loss_drop"].value >= params["min_loss_drop"]
    assert m["train_loss_drop"].unit == "fraction"
    thr = m["train_loss_drop"].threshold
    assert thr is not None and thr.op == ">=" and thr.value == params["min_loss_drop"]
    assert m["train_step_ms"].unit == "ms" and m["train_step_ms"].value > 0
    assert m["train_step_ms"].tags["threads"] == params["cpu_threads"]
    assert judge(out, TrainCheck.thresholds).status is Status.PASS


def test_cpu_threads_are_set_for_training_and_restored() -> None:
    before = torch.get_num_threads()
    params = {**TrainCheck.defaults("quick"), "steps": 20, "window": 5, "cpu_threads": 0}
    out = TrainCheck().run(CheckContext(device="cpu", params=params))
    step = next(x for x in out.metrics if x.name == "train_step_ms")
    assert step.tags["threads"] == before  # 0 keeps torch's default
    params["cpu_threads"] = 1
    TrainCheck().run(CheckContext(device="cpu", params=params))
    assert torch.get_num_threads() == before


def test_training_is_deterministic_for_a_seed() -> None:
    a = train_mlp("cpu", steps=12, batch=32, hidden=32, window=3, seed=7)
    b = train_mlp("cpu", steps=12, batch=32, hidden=32, window=3, seed=7)
    c = train_mlp("cpu", steps=12, batch=32, hidden=32, window=3, seed=8)
    assert a.losses == b.losses
    assert a.losses != c.losses
    assert len(a.losses) == 12 and len(a.step_ms) == 12


def test_no_learning_fails_the_threshold() -> None:
    params = {**TrainCheck.defaults("quick"), "lr": 0.0}
    out = TrainCheck().run(CheckContext(device="cpu", params=params))
    drop = next(x for x in out.metrics if x.name == "train_loss_drop")
    assert abs(drop.value) < 0.1  # fresh batches of the same distribution: no trend
    verdict = judge(out, TrainCheck.thresholds)
    assert verdict.status is Status.FAIL
    assert "train_loss_drop" in verdict.reason


def test_divergence_fails_even_if_the_loss_comes_down_from_its_peak() -> None:
    params = {**TrainCheck.defaults("quick"), "lr": 1000.0}
    out = TrainCheck().run(CheckContext(device="cpu", params=params))
    assert out.status is Status.FAIL
    assert "not finite" in out.reason or "above its untrained value" in out.reason


def test_non_finite_loss_fails() -> None:
    params = {**TrainCheck.defaults("quick"), "lr": math.inf}
    out = TrainCheck().run(CheckContext(device="cpu", params=params))
    assert out.status is Status.FAIL
    assert "not finite" in out.reason


def test_window_too_large_for_steps_is_an_error() -> None:
    params = {**TrainCheck.defaults("quick"), "steps": 10, "window": 6}
    out = TrainCheck().run(CheckContext(device="cpu", params=params))
    assert out.status is Status.ERROR
    assert "window" in out.reason


def test_bf16_autocast_still_learns() -> None:
    params = {**TrainCheck.defaults("quick"), "bf16": True}
    out = TrainCheck().run(CheckContext(device="cpu", params=params))
    assert out.status is Status.PASS, out.reason
    drop = next(x for x in out.metrics if x.name == "train_loss_drop")
    assert drop.tags["dtype"] == "bf16"
    assert drop.value >= 0.3


@pytest.mark.skipif(cuda_available(), reason="tests the no-CUDA path")
def test_cuda_requested_without_cuda_is_a_gpu_skip() -> None:
    out = TrainCheck().run(CheckContext(device="cuda", params=TrainCheck.defaults("quick")))
    assert out.status is Status.SKIP and out.needs_gpu


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_quick_gpu_run_learns_on_every_gpu(bf16: bool) -> None:
    params = {**TrainCheck.defaults("quick"), "bf16": bf16}
    out = TrainCheck().run(CheckContext(device="cuda", params=params))
    assert out.status is Status.PASS, out.reason
    drops = [x for x in out.metrics if x.name == "train_loss_drop"]
    assert sorted(x.device or "" for x in drops) == sorted(f"cuda:{i}" for i in range(torch.cuda.device_count()))
    assert all(x.value >= params["min_loss_drop"] for x in drops)
