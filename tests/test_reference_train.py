"""The reference_train check on this CPU: the loss falls under the task's bound, runs are bit-identical across
runs and processes, and an injected one-bit gradient fault is named by device and step."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.reference_train import FAULT_ENV, ReferenceTrainCheck, parse_faults
from gpuaccept.model import Status

SMALL = {"cpu_d_model": 64, "cpu_layers": 2, "cpu_seq": 32, "cpu_batch": 8, "cpu_steps": 30, "cpu_lr": 1e-2,
         "vocab": 32, "heads": 4}


def run_check(**params: Any):
    p = {**ReferenceTrainCheck.defaults("full"), **SMALL, **params}
    return ReferenceTrainCheck().run(CheckContext(device="cpu", params=p, profile="full"))


def by_name(outcome, name):
    return [m for m in outcome.metrics if m.name == name]


def test_cpu_run_passes_with_the_task_bound_and_repeatable_runs():
    out = run_check()
    assert out.status is Status.PASS, out.reason
    task = out.details["task"]
    assert task["floor_nats"] < task["bound_nats"] < task["start_nats"]
    (final,) = by_name(out, "reftrain_loss_final")
    assert final.value <= task["bound_nats"] and final.threshold and final.threshold.value == pytest.approx(
        task["bound_nats"], abs=1e-6)
    assert [m.value for m in by_name(out, "reftrain_match")] == [1.0]
    runs = out.details["devices"]["cpu"]
    assert set(runs) == {"cpu#0", "cpu#1"} and runs["cpu#0"]["digests"] == runs["cpu#1"]["digests"]
    assert len(runs["cpu#0"]["digests"]) == 30
    assert by_name(out, "reftrain_tflops")[0].value > 0 and by_name(out, "reftrain_tokens_per_s")[0].value > 0
    assert not by_name(out, "reftrain_mfu")  # no SKU peak for a CPU
    assert "2 runs on cpu bit-identical" in out.reason


def test_injected_gradient_bit_flip_is_named_by_run_and_step(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "cpu#1@7")
    out = run_check(runs=3)
    assert out.status is Status.FAIL
    assert "cpu#1 departs from the other runs' curve at step 7" in out.reason
    runs = out.details["devices"]["cpu"]
    assert runs["cpu#1"]["digests"][:7] == runs["cpu#0"]["digests"][:7]
    assert [m.value for m in by_name(out, "reftrain_match")] == [0.0]


def test_a_bound_the_run_cannot_meet_fails_naming_the_figures():
    out = run_check(progress=0.0, cpu_steps=4)
    assert out.status is Status.FAIL
    assert "cpu: final loss" in out.reason and "above the bound" in out.reason


def test_parse_faults():
    assert parse_faults({FAULT_ENV: "cuda:1@5, cpu#1@3,bad,x@y"}) == {"cuda:1": 5, "cpu#1": 3}
    assert parse_faults({}) == {}


def test_heads_that_do_not_divide_the_width_is_an_error():
    out = run_check(heads=3)
    assert out.status is Status.ERROR and "heads=3" in out.reason


CHILD = """
import json, sys
from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.reference_train import ReferenceTrainCheck
p = {**ReferenceTrainCheck.defaults("full"), **json.loads(sys.argv[1])}
out = ReferenceTrainCheck().run(CheckContext(device="cpu", params=p, profile="full"))
print(json.dumps(out.details["devices"]["cpu"]["cpu"]["digests"]))
"""


def test_bit_for_bit_across_processes():
    params = json.dumps({**SMALL, "cpu_steps": 12, "runs": 1})
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, params], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]  # two processes at once: each imports torch
    seen = [json.loads(proc.communicate(timeout=120)[0]) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert len(seen[0]) == 12 and seen[0] == seen[1]


def test_judge_names_the_departing_gpu_and_sets_sku_expectations():
    from gpuaccept.checks.reference_train import judge, shape_of
    from gpuaccept.checks.reftrain_model import RunResult
    from gpuaccept.checks.reftrain_task import make_task

    p = {**ReferenceTrainCheck.defaults("full"), "d_model": 64, "layers": 2, "seq": 32, "heads": 4}
    task, shape = make_task(64, 1, 4, 31), shape_of(p, True)
    good = [f"{i:016x}" for i in range(20)]
    losses = [4.0 - 0.1 * i for i in range(20)]

    def run(digests):
        return RunResult(losses=list(losses), digests=digests, step_s=[0.5] + [0.01] * 19, tokens_per_step=256)

    bad = good[:13] + ["f" * 16] * 7
    results = {f"cuda:{i}": run(bad if i == 2 else good) for i in range(4)}
    models = {f"cuda:{i}": "NVIDIA H100 80GB HBM3" for i in range(4)}
    out = judge(results, models, task, shape, p, single=False, on_gpu=True)
    assert out.status is Status.FAIL
    assert "cuda:2 departs from the other NVIDIA H100 80GB HBM3s' curve at step 13" in out.reason
    match = {m.device: m.value for m in by_name(out, "reftrain_match")}
    assert match == {"cuda:0": 1.0, "cuda:1": 1.0, "cuda:2": 0.0, "cuda:3": 1.0}
    tf = by_name(out, "reftrain_tflops")[0]
    assert tf.value == pytest.approx(256 / 0.01 * (6 * shape.matmul_params + 12 * 2 * 32 * 64) / 1e12)
    assert tf.expected and tf.expected > 500  # the H100's dense bf16 peak from the SKU table
    (mfu,) = [m for m in by_name(out, "reftrain_mfu") if m.device == "cuda:0"]
    assert mfu.value == pytest.approx(tf.value / tf.expected)
    # the same four curves agreeing pass
    ok = judge({d: run(good) for d in models}, models, task, shape, p, single=False, on_gpu=True)
    assert ok.status is Status.PASS and "4 GPUs' per-step loss and gradient bits identical" in ok.reason


GPU_SMALL = {"d_model": 256, "layers": 2, "seq": 128, "batch": 4, "steps": 40, "lr": 3e-3, "heads": 4}


@pytest.mark.gpu
def test_gpu_run_is_bit_identical_and_reports_tflops_and_mfu(monkeypatch):
    from tests.conftest import cuda_available

    assert cuda_available()
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    p = {**ReferenceTrainCheck.defaults("full"), **GPU_SMALL}
    out = ReferenceTrainCheck().run(CheckContext(device="cuda", params=p, profile="full"))
    assert out.status is Status.PASS, out.reason
    assert out.details["dtype"] == "bf16" and all(m.value == 1.0 for m in by_name(out, "reftrain_match"))
    assert all(m.value > 0 for m in by_name(out, "reftrain_tflops"))
    assert set(out.details["stack"]["cuda:0"]) == {"gpu", "driver", "cuda", "torch", "cublas"}


@pytest.mark.gpu
def test_gpu_fault_is_named_by_device_and_step(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "cuda:0#1@9,cuda:1@9")  # one GPU: its second run; several: cuda:1
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    p = {**ReferenceTrainCheck.defaults("full"), **GPU_SMALL, "runs": 3}
    out = ReferenceTrainCheck().run(CheckContext(device="cuda", params=p, profile="full"))
    assert out.status is Status.FAIL
    assert re.search(r"cuda:(0#1|1) departs from the other .*curve at step 9", out.reason), out.reason


def test_several_devices_train_at_once_and_the_odd_one_is_named(monkeypatch):
    """The several-GPU path (one thread per device) on three CPU device labels: they vote, the faulty one loses."""
    import torch

    from gpuaccept.checks.reftrain_task import make_task

    monkeypatch.setenv(FAULT_ENV, "cpu:1@4")
    p = {**ReferenceTrainCheck.defaults("full"), **SMALL, "cpu_steps": 10, "progress": 1.0}
    ctx = CheckContext(device="cpu", params=p, profile="full")
    devices = [torch.device("cpu"), torch.device("cpu", 0), torch.device("cpu", 1)]
    from gpuaccept.checks.reference_train import shape_of

    out = ReferenceTrainCheck()._train_all(ctx, devices, make_task(32, 1, 4, p["seed"]), shape_of(p, False))
    assert out.status is Status.FAIL
    assert out.reason == "cpu:1 departs from the other cpus' curve at step 4"
    assert {m.device: m.value for m in by_name(out, "reftrain_match")} == {"cpu": 1.0, "cpu:0": 1.0, "cpu:1": 0.0}


def test_sizes_per_profile_and_device():
    """The issue's sizes: a few million parameters on the CPU and hundreds of millions on a GPU in ``full``;
    ``standard`` keeps a short form."""
    from gpuaccept.checks.reference_train import shape_of

    full, standard = ReferenceTrainCheck.defaults("full"), ReferenceTrainCheck.defaults("standard")
    assert 2e6 <= shape_of(full, on_gpu=False).params <= 1e7
    assert 3e8 <= shape_of(full, on_gpu=True).params <= 1.5e9
    assert shape_of(standard, on_gpu=False).params < 0.2e6
    assert shape_of(ReferenceTrainCheck.defaults("burnin"), on_gpu=False) == shape_of(full, on_gpu=False)
