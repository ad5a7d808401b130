"""The warm process after an import that started CUDA: it forks no more, the run falls back to fresh processes
and says so. Real processes; the poisoned state is faked by a test import in the warm process
(:mod:`tests.plugins.poison_cuda`), as on CPU ``torch.cuda`` starts nothing."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaccept.model import CheckResult, Status
from gpuaccept.node.config import Config
from gpuaccept.node.runner import Runner
from gpuaccept.node.suite import RunOptions, plan_suite
from gpuaccept.node.warm import WarmProcess
from tests.conftest import cuda_available
from tests.helpers import ROOT
from tests.plugins import poison_checks
from tests.plugins.poison_cuda import MODE_ENV

REG = {c.name: c for c in poison_checks.CHECKS}
SAYS = {"initialized": "torch.cuda.is_initialized()", "bad_fork": "bad-fork state"}


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("GPUACCEPT_ZYGOTE", raising=False)
    monkeypatch.delenv("GPUACCEPT_TEST_POISON_PLUGIN", raising=False)


def _runner(tmp_path: Path, checks: list[str]) -> Runner:
    plan = plan_suite(RunOptions(checks=checks), Config(), {n: REG[n] for n in checks}, "cpu")
    return Runner(plan, tmp_path, host="testhost", warm=True)


def _forked(result: CheckResult) -> bool:
    assert result.status is Status.PASS, result.reason
    return "gpuaccept.node.zygote" in result.details["parent"]


@pytest.mark.parametrize("mode", ["initialized", "bad_fork"])
def test_a_warm_import_that_starts_cuda_sends_the_rest_to_fresh_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], mode: str) -> None:
    monkeypatch.setenv(MODE_ENV, mode)
    runner = _runner(tmp_path, ["calm", "poisoner", "calm2"])
    calm, poisoner, calm2 = runner.run().checks
    assert _forked(calm) and "fresh_process" not in calm.details
    assert not _forked(poisoner), "the fork after the poisoning import was refused, the check ran fresh"
    assert not _forked(calm2)
    assert SAYS[mode] in poisoner.details["fresh_process"] and SAYS[mode] in calm2.details["fresh_process"]
    assert runner.warm is None and runner.warm_off is not None
    assert runner.warm_off.startswith("the warm process cannot fork safely") and SAYS[mode] in runner.warm_off
    assert "cannot fork safely" in capfd.readouterr().err
    saved = json.loads(runner.report_path.read_text())
    assert SAYS[mode] in saved["checks"][1]["details"]["fresh_process"]


def test_a_plugin_that_starts_cuda_at_import_means_no_fork_at_all(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin is imported with the check registry, before the warm process is ready: it says so then, and the
    first check already runs fresh."""
    monkeypatch.setenv(MODE_ENV, "bad_fork")
    monkeypatch.setenv("GPUACCEPT_TEST_POISON_PLUGIN", "1")
    monkeypatch.setenv("GPUACCEPT_PLUGINS", "tests.plugins.poison_checks")
    warm = WarmProcess()
    ready = warm.wait_ready(120)
    assert ready is not None and SAYS["bad_fork"] in ready["poisoned"]
    plan = plan_suite(RunOptions(checks=["calm", "calm2"]), Config(), {n: REG[n] for n in ("calm", "calm2")}, "cpu")
    calm, calm2 = Runner(plan, tmp_path, host="testhost", warm=warm).run().checks
    assert not _forked(calm) and not _forked(calm2)
    assert SAYS["bad_fork"] in calm.details["fresh_process"]


def test_without_a_poisoning_import_nothing_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODE_ENV, raising=False)
    runner = _runner(tmp_path, ["calm", "calm2"])
    ready_checks = runner.run().checks
    assert all(_forked(c) and "fresh_process" not in c.details for c in ready_checks)


def test_the_fork_probe_reads_flags_only() -> None:
    """forksafe is what the warm process calls about CUDA: it may read torch's two flags, nothing else of CUDA."""
    tree = ast.parse((ROOT / "src" / "gpuaccept" / "node" / "forksafe.py").read_text())
    attrs = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert {a for a in attrs if "cuda" in a} == {"torch.cuda", "torch.cuda.is_initialized",
                                                  "torch.cuda._is_in_bad_fork"}


def _probe_after(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", "import json, torch\nfrom gpuaccept.node.forksafe import "
                          f"fork_poison\n{code}\nprint(json.dumps(fork_poison()))"],
                         capture_output=True, text=True, timeout=300, check=True)
    return str(json.loads(run.stdout.strip().splitlines()[-1]))


def test_is_available_on_a_machine_without_cuda_poisons_nothing() -> None:
    if cuda_available():
        pytest.skip("this machine has CUDA: see the gpu test")
    assert _probe_after("torch.cuda.is_available()") == "None"


@pytest.mark.gpu
def test_gpu_is_available_and_a_cuda_tensor_both_poison_forks() -> None:
    assert cuda_available()
    assert _probe_after("pass") == "None"
    assert _probe_after("torch.cuda.is_available()") != "None"
    assert "is_initialized" in _probe_after("torch.zeros(1, device='cuda')")
