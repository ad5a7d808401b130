"""Host memory sizes in a configuration against this machine's memory, before anything runs.

The comparison (:func:`gpuaccept.node.suite.check_host_fit`) is pure and is fed the
machine's memory directly; ``gpuaccept run`` reads it with
:func:`gpuaccept.checks.base.host_memory_mib`, which the CLI tests replace so
that the limits do not depend on the machine the tests run on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks import registry
from gpuaccept.errors import ConfigError
from gpuaccept.node.config import parse_config
from gpuaccept.node.suite import RunOptions, check_host_fit, plan_suite
from tests.cli_inproc import run_main


def fits(params: dict[str, dict[str, Any]], host_mib: int | None, device: str = "cpu") -> None:
    """check_host_fit for a config setting ``params`` ({check: {param: value}}), every check of it planned."""
    reg = registry()
    cfg = parse_config({"checks": {name: {"params": p} for name, p in params.items()}}, "site.yaml", reg)
    plan = plan_suite(RunOptions(checks=list(params)), cfg, reg, device)
    check_host_fit(plan, cfg, reg, host_mib)


def too_big(params: dict[str, dict[str, Any]], host_mib: int, device: str = "cpu") -> str:
    with pytest.raises(ConfigError) as info:
        fits(params, host_mib, device)
    assert "\n" not in str(info.value)
    return str(info.value)


# ---------------------------------------------------------------- the pure comparison

def test_memtest_cpu_mib_fits_up_to_the_host_memory() -> None:
    fits({"memtest": {"cpu_mib": 1000}}, 1000)
    assert too_big({"memtest": {"cpu_mib": 1001}}, 1000) == (
        "site.yaml: checks.memtest.params.cpu_mib: cpu_mib 1001 needs 1001 MiB of host memory "
        "(a buffer of 1001 MiB), more than this machine's memory (1000 MiB)")


def test_host_sizes_count_on_gpu_runs_too() -> None:
    assert "cpu_mib 1001" in too_big({"memtest": {"cpu_mib": 1001}}, 1000, device="cuda")


def test_unknown_host_memory_checks_nothing() -> None:
    fits({"memtest": {"cpu_mib": 1 << 24}}, None)


def test_only_sizes_the_configuration_sets_are_checked() -> None:
    fits({"memtest": {"passes": 2}}, 1)  # the built-in 256 MiB is not the configuration's
    assert "checks.memtest.params.cpu_mib" in too_big({"memtest": {"cpu_mib": 2}}, 1)


def test_memory_counts_its_two_pinned_buffers_and_three_stream_arrays() -> None:
    fits({"memory": {"host_mib": 500}}, 1000)  # pinned source and destination: 1000 MiB of 1000
    assert too_big({"memory": {"host_mib": 501}}, 1000) == (
        "site.yaml: checks.memory.params.host_mib: host_mib 501 needs 1002 MiB of host memory "
        "(2 buffers of 501 MiB), more than this machine's memory (1000 MiB)")
    fits({"memory": {"cpu_mib": 333}}, 1000)  # STREAM's a, b and c: 999 MiB
    assert "cpu_mib 334 needs 1002 MiB of host memory (3 buffers of 334 MiB)" in too_big(
        {"memory": {"cpu_mib": 334}}, 1000)


def test_compute_counts_the_cpu_gemm_operands_of_the_widest_cpu_dtype() -> None:
    # 4 A/B pairs and C of 8192 x 8192: 9 matrices of 256 MiB in fp32 (the default dtypes' widest on CPU)
    fits({"compute": {"cpu_size": 8192}}, 2304)
    assert too_big({"compute": {"cpu_size": 8192}}, 2303) == (
        "site.yaml: checks.compute.params.cpu_size: cpu_size 8192 needs 2304 MiB of host memory "
        "(4 A/B pairs and C of 8192 x 8192 fp32), more than this machine's memory (2303 MiB)")
    assert "needs 4608 MiB" in too_big({"compute": {"cpu_size": 8192, "dtypes": ["fp64", "fp8"]}}, 4607)
    fits({"compute": {"cpu_size": 8192, "dtypes": ["bf16", "fp8"]}}, 1152)  # fp8 does not run on CPU
    fits({"compute": {"cpu_size": 8192, "dtypes": ["fp8", "tf32"]}}, 1)  # nothing runs on CPU: no need
    # buffers alone: 64 pairs of the default 384 x 384 fp32 (0.5625 MiB each matrix), both named when both set
    assert "buffers 64 needs 73 MiB" in too_big({"compute": {"buffers": 64}}, 72)
    assert "cpu_size 1024, buffers 2 need 20 MiB" in too_big({"compute": {"cpu_size": 1024, "buffers": 2}}, 19)


def test_nbody_counts_the_fp64_seeds_of_its_bodies() -> None:
    # seeded in fp64 on the host on any device: 11 values, 88 bytes per body
    fits({"nbody": {"cpu_bodies": 1 << 20}}, 88)
    assert too_big({"nbody": {"cpu_bodies": 1 << 20}}, 87) == (
        "site.yaml: checks.nbody.params.cpu_bodies: cpu_bodies 1048576 needs 88 MiB of host memory "
        "(1048576 bodies seeded in fp64, 88 bytes each), more than this machine's memory (87 MiB)")
    assert "checks.nbody.params.bodies: bodies 4194304 needs 352 MiB" in too_big(
        {"nbody": {"bodies": 1 << 22}}, 351, device="cuda")


def test_every_declared_host_size_is_an_int_in_mib_with_buffers() -> None:
    declared = {(name, p.name, p.host_buffers) for name, cls in registry().items() for p in cls.params
                if p.memory_mib}
    assert declared == {("memory", "host_mib", 2), ("memory", "cpu_mib", 3), ("memtest", "cpu_mib", 1),
                        ("p2p", "host_mib", 2)}
    assert all(registry()[n].param(p).kind == "int" for n, p, _ in declared)  # type: ignore[union-attr]


# ---------------------------------------------------------------- gpuaccept run

def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return str(path)


def test_run_refuses_a_size_larger_than_the_host_before_anything_runs(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuaccept.checks.base.host_memory_mib", lambda: 4000)
    cfg = _config(tmp_path, "checks: {memtest: {params: {cpu_mib: 4001}}}\n")
    for plan in (["--plan"], ["--report-dir", str(tmp_path / "reports"), "--no-history"]):
        line = run_main("run", *plan, "--device", "cpu", "--checks", "memtest", "--config", cfg).one_line_error()
        assert line == (f"gpuaccept: error: {cfg}: checks.memtest.params.cpu_mib: cpu_mib 4001 needs 4001 MiB of "
                        "host memory (a buffer of 4001 MiB), more than this machine's memory (4000 MiB)")
    assert not (tmp_path / "reports").exists()
    ok = run_main("run", "--plan", "--device", "cpu", "--checks", "memtest", "--config",
                  _config(tmp_path, "checks: {memtest: {params: {cpu_mib: 4000}}}\n"))
    assert ok.rc == 0, ok.err
