"""The cross-device agreement check: the vote, single-device repeat runs on CPU, injected one-ulp faults."""

from __future__ import annotations

from typing import Any

import pytest

from gpuaccept.checks.agreement import FAULT_ENV, AgreementCheck, gemm_chain, result_hash, vote
from gpuaccept.checks.base import CheckContext
from gpuaccept.model import Status
from gpuaccept.node.judge import judge
from tests.conftest import cuda_available


def params(**over: Any) -> dict[str, Any]:
    return {**AgreementCheck.defaults("full"), "cpu_size": 64, "chain": 4, **over}


def test_vote_names_the_odd_device() -> None:
    v = vote({"cuda:0": "a", "cuda:1": "a", "cuda:2": "b", "cuda:3": "a"})
    assert v.majority == "a" and v.odd == ["cuda:2"] and v.groups == {"a": ["cuda:0", "cuda:1", "cuda:3"],
                                                                      "b": ["cuda:2"]}
    assert vote({"x": "a", "y": "a"}) .odd == []
    tie = vote({"cuda:0": "a", "cuda:1": "b"})
    assert tie.majority is None and tie.odd == ["cuda:0", "cuda:1"]
    assert vote({"cuda:0": "a"}).majority == "a"
    assert vote({}).majority is None


def test_cpu_runs_agree_and_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAULT_ENV, raising=False)
    out = AgreementCheck().run(CheckContext(device="cpu", params=params()))
    assert out.status is Status.PASS, out.reason
    assert "one device (cpu): compared 2 runs" in out.reason
    assert {(m.name, m.tags["dtype"]) for m in out.metrics} == {
        (n, d) for n in ("agreement_match", "agreement_ref_error") for d in ("fp32", "bf16")}
    assert all(m.value == 1 for m in out.metrics if m.name == "agreement_match")
    hashes = out.details["hashes"]["fp32"]
    assert len(set(hashes.values())) == 1 and set(hashes) == {"cpu#0", "cpu#1"}
    assert judge(out, AgreementCheck.thresholds).status is Status.PASS


def test_a_one_ulp_fault_in_one_run_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "cpu#1")
    out = AgreementCheck().run(CheckContext(device="cpu", params=params(runs=3, dtypes=["fp32"])))
    assert out.status is Status.FAIL
    assert "run(s) 1 differ from the rest" in out.reason
    assert next(m for m in out.metrics if m.name == "agreement_match").value == 0
    assert "agreement_match on cpu 0 < 1" in judge(out, AgreementCheck.thresholds).reason


def test_hash_is_of_the_bytes() -> None:
    import torch

    a = torch.arange(6, dtype=torch.float32)
    b = a.clone()
    assert result_hash(a) == result_hash(b)
    b.view(torch.int32)[3] ^= 1  # one ulp, not a NaN
    assert result_hash(a) != result_hash(b) and bool(torch.isfinite(b).all())
    assert result_hash(a.to(torch.bfloat16)) == result_hash(a.to(torch.bfloat16))


def test_chain_is_deterministic_and_checked_against_fp64() -> None:
    import torch

    one = gemm_chain(torch.device("cpu"), "fp32", 32, 3, seed=5, ref_sample=16)
    assert one == gemm_chain(torch.device("cpu"), "fp32", 32, 3, seed=5, ref_sample=16)
    assert one.ref_error < 1e-5
    assert gemm_chain(torch.device("cpu"), "fp32", 32, 3, seed=5, ref_sample=16, corrupt=True).hash != one.hash


def _judged(hashes: dict[str, str], models: dict[str, str]) -> Any:
    errors = {d: 0.0 for d in models}
    return AgreementCheck._judge({"bf16": hashes}, {"bf16": errors}, models, False, 1, 4096, params())


def test_multi_gpu_vote_names_the_odd_gpu() -> None:
    models = {f"cuda:{i}": "NVIDIA H100 80GB HBM3" for i in range(8)}
    out = _judged({d: ("bad" if d == "cuda:5" else "good") for d in models}, models)
    assert out.status is Status.FAIL
    assert "bf16: cuda:5 differ(s) from the other NVIDIA H100 80GB HBM3 GPUs (7 of 8 agree on good)" in out.reason
    match = {m.device: m.value for m in out.metrics if m.name == "agreement_match"}
    assert match["cuda:5"] == 0 and sum(match.values()) == 7
    ok = _judged(dict.fromkeys(models, "good"), models)
    assert ok.status is Status.PASS and "8 GPUs agree bit for bit" in ok.reason


def test_two_gpus_that_differ_have_no_majority_and_models_vote_apart() -> None:
    models = {"cuda:0": "A100", "cuda:1": "A100"}
    out = _judged({"cuda:0": "x", "cuda:1": "y"}, models)
    assert out.status is Status.FAIL and "disagree with no majority" in out.reason
    mixed = {"cuda:0": "A100", "cuda:1": "A100", "cuda:2": "H100", "cuda:3": "H100"}
    out = _judged({"cuda:0": "a", "cuda:1": "a", "cuda:2": "h", "cuda:3": "h"}, mixed)
    assert out.status is Status.PASS and "within each model (A100, H100)" in out.reason


@pytest.mark.gpu
def test_gpus_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cuda_available()
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # CUDA may have started in this process already
    out = AgreementCheck().run(CheckContext(device="cuda", params=params(size=1024)))
    assert out.status is Status.PASS, out.reason


@pytest.mark.gpu
def test_gpu_fault_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "cuda:0")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    out = AgreementCheck().run(CheckContext(device="cuda", params=params(size=1024, runs=3)))
    assert out.status is Status.FAIL
