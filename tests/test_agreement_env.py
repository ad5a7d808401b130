"""``CUBLAS_WORKSPACE_CONFIG`` for the agreement check: set by the runner in the check process's environment (forked
or fresh), only deterministic values accepted on a GPU, torch's refusal turned into a clear ERROR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks import agreement
from gpuaccept.checks.agreement import CUBLAS_ENV, AgreementCheck, cublas_refusal, workspace_problem
from gpuaccept.checks.base import CheckContext
from gpuaccept.model import Status
from gpuaccept.node.config import Config
from gpuaccept.node.runner import Runner, child_env
from gpuaccept.node.suite import RunOptions, plan_suite
from tests.conftest import cuda_available
from tests.helpers import ROOT

TORCH_REFUSAL = (  # torch's message (aten/src/ATen/Context.cpp, alertCuBLASConfigNotDeterministic)
    "Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` or "
    "`at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic because it uses "
    "CuBLAS and you have CUDA >= 10.2. To enable deterministic behavior in this case, you must set an environment "
    "variable before running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 or "
    "CUBLAS_WORKSPACE_CONFIG=:16:8. For more information, go to "
    "https://docs.nvidia.com/cuda/cublas/index.html#results-reproducibility")
SMALL = {"cpu_size": 32, "chain": 2, "dtypes": ["fp32"]}


def test_only_deterministic_values_or_none_before_cuda_are_accepted() -> None:
    assert workspace_problem(":4096:8", True) is None and workspace_problem(":16:8", True) is None
    assert workspace_problem(None, False) is None  # CUDA has not started: the check sets it
    unset = workspace_problem(None, True)
    assert unset is not None and "unset and CUDA already started" in unset
    bad = workspace_problem(":0:0", False)
    assert bad is not None and "':0:0'" in bad and ":4096:8 or :16:8" in bad
    assert AgreementCheck.process_env({CUBLAS_ENV: ":16:8"}) == {CUBLAS_ENV: ":16:8"}
    assert AgreementCheck.process_env({CUBLAS_ENV: ":0:0"}) == {CUBLAS_ENV: ":4096:8"}
    assert AgreementCheck.process_env({}) == {CUBLAS_ENV: ":4096:8"}


def test_torchs_refusal_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(TORCH_REFUSAL)

    monkeypatch.setattr(agreement, "gemm_chain", refuse)
    monkeypatch.setenv(CUBLAS_ENV, ":0:0")
    out = AgreementCheck().run(CheckContext(device="cpu", params={**AgreementCheck.defaults("full"), **SMALL}))
    assert out.status is Status.ERROR and "\n" not in out.reason
    assert out.reason.startswith("torch refused a cuBLAS GEMM in deterministic mode: CUBLAS_WORKSPACE_CONFIG in "
                                 "this process is ':0:0'")
    assert cublas_refusal(RuntimeError("CUDA error: an illegal memory access")) is None


def test_another_runtime_error_is_not_disguised(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(agreement, "gemm_chain", boom)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        AgreementCheck().run(CheckContext(device="cpu", params={**AgreementCheck.defaults("full"), **SMALL}))


def _runner(tmp_path: Path, warm: bool) -> Runner:
    plan = plan_suite(RunOptions(checks=["agreement"]), Config(), {"agreement": AgreementCheck}, "cpu")
    plan.checks[0].params.update(SMALL)
    return Runner(plan, tmp_path, host="testhost", warm=warm)


@pytest.mark.parametrize("warm, given, used", [(True, ":0:0", ":4096:8"), (False, ":16:8", ":16:8"),
                                               (False, None, ":4096:8")])
def test_the_runner_sets_it_in_the_check_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool,
                                                 given: str | None, used: str) -> None:
    """Forked from the warm process (which started without it) or a fresh interpreter: the check's process has a
    deterministic value from its start, and the runner's own environment is left as it was."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    if given is None:
        monkeypatch.delenv(CUBLAS_ENV, raising=False)
    else:
        monkeypatch.setenv(CUBLAS_ENV, given)
    result, = _runner(tmp_path, warm).run().checks
    assert result.status is Status.PASS, result.reason
    assert result.details["cublas_workspace_config"] == used
    assert os.environ.get(CUBLAS_ENV) == given
    plan = _runner(tmp_path / "x", warm).plan
    assert child_env(plan.checks[0], {"A": "1"}) == {"A": "1", CUBLAS_ENV: ":4096:8"}


def _in_fresh_python(code: str, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.gpu
def test_gpu_a_non_deterministic_value_is_an_error_whether_or_not_torch_refuses_it() -> None:
    """On a GPU, in processes of their own: the check refuses ':0:0' with one line. torch's own guard is not
    always there (torch 2.11 with CUDA 13 on an H200 ran a deterministic-mode GEMM under ':0:0' without a
    word), so the check's refusal is what protects; where torch does refuse, cublas_refusal
    recognises its message, and nothing else goes wrong."""
    assert cuda_available()
    code = ("import json\nfrom gpuaccept.checks.agreement import AgreementCheck\nfrom gpuaccept.checks.base import "
            "CheckContext\nout = AgreementCheck().run(CheckContext(device='cuda', params={**AgreementCheck.defaults"
            "('full'), 'size': 256}))\nprint(json.dumps({'status': out.status.value, 'reason': out.reason}))")
    got = _in_fresh_python(code, {CUBLAS_ENV: ":0:0"})
    assert got["status"] == "error" and "':0:0'" in got["reason"], got
    code = ("import json, torch\nfrom gpuaccept.checks.agreement import cublas_refusal\n"
            "torch.use_deterministic_algorithms(True)\na = torch.ones(64, 64, device='cuda')\n"
            "try:\n    ok = bool(((a @ a) == 64).all())\n    r = e = None\nexcept RuntimeError as exc:\n"
            "    ok, r, e = False, cublas_refusal(exc), str(exc)[:300]\n"
            "print(json.dumps({'ran': ok, 'reason': r, 'error': e}))")
    got = _in_fresh_python(code, {CUBLAS_ENV: ":0:0"})
    if got["error"] is None:
        assert got["ran"] is True, got  # this torch does not guard; the GEMM's result is still right
    else:
        assert got["reason"] and got["reason"].startswith("torch refused a cuBLAS GEMM"), got


@pytest.mark.gpu
def test_gpu_the_runner_gives_the_check_a_deterministic_value(tmp_path: Path) -> None:
    assert cuda_available()
    env = {**os.environ, CUBLAS_ENV: ":0:0", "PYTHONPATH": str(ROOT)}
    config = tmp_path / "small.yaml"
    config.write_text("checks:\n  agreement: {params: {size: 512}}\n")
    r = subprocess.run([sys.executable, "-m", "gpuaccept", "run", "--checks", "agreement", "--device", "cuda",
                        "--report-dir", str(tmp_path / "reports"), "--config", str(config)], capture_output=True,
                       text=True, timeout=600, env=env)
    report = json.loads(next((tmp_path / "reports").glob("*/report.json")).read_text())
    result = next(c for c in report["checks"] if c["name"] == "agreement")
    assert result["status"] == "pass", (result["reason"], r.stderr[-2000:])
    assert result["details"]["cublas_workspace_config"] == ":4096:8"
