"""What a run's verdict and files can be trusted for: a full disk, a reused run id, a run that measured
nothing, a check that leaves out a declared metric, options that cannot apply. Real CLI processes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli_env, gpuaccept, only_run_dir, validate_report


def _lines_ok(path: Path) -> list[dict[str, object]]:
    """Every line of a results.jsonl parses (none cut in half)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- a full disk ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def small_disk(where: Path, kib: int = 256) -> Iterator[Path]:
    """A real tmpfs of ``kib`` KiB mounted at ``where`` (needs root; under CI it must work)."""
    where.mkdir()
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: the full-disk tests need root to mount a small tmpfs")
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: cannot mount a tmpfs: {r.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("leave_kib,pad_kib", [(0, 0), (16, 10)], ids=["outcome-not-written", "report-not-written"])
def test_a_full_report_disk_is_a_write_failure_not_a_failure_of_the_node(
        tmp_path: Path, leave_kib: int, pad_kib: int) -> None:
    cfg = tmp_path / "fill.yaml"
    cfg.write_text(f"checks:\n  filler:\n    params: {{leave_kib: {leave_kib}, pad_kib: {pad_kib}}}\n")
    with small_disk(tmp_path / "disk") as disk:
        reports = disk / "reports"
        r = gpuaccept("run", "--device", "cpu", "--checks", "steady,filler,declared", "--config", str(cfg),
                      "--report-dir", str(reports), GPUACCEPT_TEST_FILL=str(disk))
        assert r.returncode == 4, (r.stdout, r.stderr)
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr
        assert "could not be written" in r.stderr and "not a failure of this node" in r.stderr
        run_dir = only_run_dir(reports)
        assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")], "no .tmp file may be left behind"
        lines = _lines_ok(run_dir / "results.jsonl")
        assert lines[0]["name"] == "steady" and lines[0]["status"] == "pass"
        assert all(line["status"] != "error" for line in lines), "the disk must not be blamed on a check"
        report = validate_report(run_dir / "report.json")
        assert [c["name"] for c in report["checks"]][:1] == ["steady"]
        assert all(c["status"] != "error" for c in report["checks"])
        assert "declared: running" not in r.stdout, "the suite stops at the write failure"


# ---- run ids --------------------------------------------------------------------------------------------
def test_a_run_id_that_already_has_results_is_refused(tmp_path: Path) -> None:
    first = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(tmp_path),
                      "--run-id", "same")
    assert first.returncode == 0, first.stderr
    before = (tmp_path / "same" / "results.jsonl").read_text()
    again = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(tmp_path),
                      "--run-id", "same")
    assert again.returncode == 2, (again.stdout, again.stderr)
    assert "run id same already has results" in again.stderr and "Traceback" not in again.stderr
    assert (tmp_path / "same" / "results.jsonl").read_text() == before


# ---- a run that measured nothing ---------------------------------------------------------------------------
def test_a_run_in_which_every_check_skipped_is_not_a_success(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--checks", "skipper,gpuonly", "--report-dir", str(tmp_path))
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert r.stdout.splitlines()[-1].startswith("[RESULT] NOTHING MEASURED")
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    assert report["verdict"] == "nothing_measured"


def test_env_alone_passing_measured_nothing(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--checks", "env,skipper", "--report-dir", str(tmp_path))
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "env: PASS" in r.stdout or "env: WARN" in r.stdout
    assert validate_report(only_run_dir(tmp_path) / "report.json")["verdict"] == "nothing_measured"
    inventory = gpuaccept("run", "--device", "cpu", "--checks", "env", "--report-dir", str(tmp_path / "inv"))
    assert inventory.returncode == 0, inventory.stdout  # asked for the inventory alone: judged on it


def test_one_measuring_check_makes_it_a_success_again(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--checks", "skipper,steady", "--report-dir", str(tmp_path))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.splitlines()[-1].startswith("[RESULT] SUCCESS (CPU only: ")


# ---- declared metrics -------------------------------------------------------------------------------------
def test_a_pass_that_lacks_a_declared_metric_is_an_error_naming_it(tmp_path: Path) -> None:
    cfg = tmp_path / "drop.yaml"
    cfg.write_text("checks:\n  declared:\n    params: {drop: 4096}\n")
    good = gpuaccept("run", "--device", "cpu", "--checks", "declared", "--report-dir", str(tmp_path / "a"))
    assert good.returncode == 0, (good.stdout, good.stderr)
    bad = gpuaccept("run", "--device", "cpu", "--checks", "declared", "--config", str(cfg),
                    "--report-dir", str(tmp_path / "b"))
    assert bad.returncode == 1, (bad.stdout, bad.stderr)
    check = validate_report(only_run_dir(tmp_path / "b") / "report.json")["checks"][0]
    assert check["status"] == "error"
    assert "missing metrics: declared_gbs on cpu (size_bytes=4096)" in check["reason"]
    assert check["details"]["missing_metrics"] == ["declared_gbs on cpu (size_bytes=4096)"]


def test_compute_and_memory_declare_a_figure_per_device() -> None:
    from gpuaccept.checks.base import Outcome, enforce_required
    from gpuaccept.checks.compute import ComputeCheck
    from gpuaccept.checks.memory import MemoryCheck
    from gpuaccept.model import Metric, Status

    devices = ["cuda:0", "cuda:1"]
    gemm = [Metric("gemm_bf16_tflops", 900.0, "TFLOP/s", d) for d in devices]
    req = ComputeCheck.required_metrics(ComputeCheck.defaults("standard"), devices)
    assert all(r.found_in(gemm) for r in req)
    assert [r.describe() for r in req if not r.found_in(gemm[:1])] == ["gemm_*_tflops* on cuda:1"]
    mem = MemoryCheck.required_metrics(MemoryCheck.defaults("standard"), devices)
    assert {r.describe() for r in mem} >= {"d2d_copy_gbs on cuda:1", "h2d_pinned_gbs on cuda:0"}
    cpu = MemoryCheck.required_metrics(MemoryCheck.defaults("standard"), ["cpu"])
    only_copy = [Metric("stream_copy_gbs", 10.0, "GB/s", "cpu")]
    assert [r.describe() for r in cpu if not r.found_in(only_copy)] == ["stream_triad_gbs on cpu"]

    from gpuaccept.checks.base import CheckContext

    ctx = CheckContext(device="cpu", params=MemoryCheck.defaults("standard"))
    out = enforce_required(MemoryCheck, ctx, Outcome.passed("ok", only_copy))
    assert out.status is Status.ERROR and "stream_triad_gbs on cpu" in out.reason


def test_memtest_nbody_and_train_declare_their_figures_per_device() -> None:
    from gpuaccept.checks.base import CheckContext, Outcome, enforce_required
    from gpuaccept.checks.memtest import MemtestCheck
    from gpuaccept.checks.nbody import NBodyCheck
    from gpuaccept.checks.train import TrainCheck
    from gpuaccept.model import Metric, Status

    devices = ["cuda:0", "cuda:1"]
    nbody = NBodyCheck.required_metrics(NBodyCheck.defaults("standard"), devices)
    one = [Metric("nbody_gflops", 5000.0, "GFLOP/s", "cuda:0")]
    assert [r.describe() for r in nbody if not r.found_in(one)] == ["nbody_gflops on cuda:1"]
    # The per-device figure dropped from a CPU pass: an ERROR naming it.
    for cls, kept in ((MemtestCheck, [Metric("memtest_errors", 0.0, "count", "cpu"),
                                      Metric("memtest_bytes_tested", 1.0, "bytes", "cpu")]),
                      (NBodyCheck, [])):
        ctx = CheckContext(device="cpu", params=cls.defaults("quick"))
        out = enforce_required(cls, ctx, Outcome.passed("ok", kept))
        assert out.status is Status.ERROR, cls
    out = enforce_required(MemtestCheck, CheckContext(device="cpu", params=MemtestCheck.defaults("quick")),
                           Outcome.passed("ok", [Metric("memtest_errors", 0.0, "count", "cpu")]))
    assert out.details["missing_metrics"] == ["memtest_bytes_tested on cpu", "memtest_gbs on cpu"]
    params = {**TrainCheck.defaults("standard"), "all_gpus": False}
    assert {r.device for r in TrainCheck.required_metrics(params, devices)} == {"cuda:0"}
    assert {r.device for r in TrainCheck.required_metrics(TrainCheck.defaults("standard"), devices)} == set(devices)


def test_collectives_require_every_planned_row_on_each_rank() -> None:
    from gpuaccept.checks.collectives import Row, planned_rows, rows_to_outcome
    from gpuaccept.distributed.group import RankContext
    from gpuaccept.model import Status

    rc = RankContext(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0, num_nodes=1,
                     hosts=("h0", "h1"), store_host="127.0.0.1", store_port=1, prefix="p/", timeout_s=5.0)
    planned = planned_rows(["allreduce", "broadcast"], ["float32"], ["out", "in"], [4096, 65536], 2)
    assert ("allreduce", "float32", True, 65536) in planned and len(planned) == 4  # both are in-place only in torch
    rows = [Row(op, dt, inp, size, size // 4, 10.0, 1.0, 1.0, 0) for op, dt, inp, size in planned]
    assert rows_to_outcome(rows, rc, planned=planned).status is Status.PASS
    dropped = [r for r in rows if not (r.op == "broadcast" and r.size_bytes == 4096)]
    out = rows_to_outcome(dropped, rc, planned=planned)
    assert out.status is Status.ERROR
    assert "broadcast_busbw_gbs on cpu (dtype=float32, inplace=1, size_bytes=4096)" in out.reason


def test_ddp_requires_the_step_time_on_every_rank_and_the_loss_on_rank_0() -> None:
    from gpuaccept.checks.ddp import DdpTrainCheck
    from gpuaccept.distributed.group import RankContext

    def rc(rank: int) -> RankContext:
        return RankContext(rank=rank, world_size=2, local_rank=rank, local_world_size=2, node_rank=0, num_nodes=1,
                           hosts=("h0", "h1"), store_host="127.0.0.1", store_port=1, prefix="p/", timeout_s=5.0,
                           device_index=rank)

    params = DdpTrainCheck.defaults("standard")
    assert [r.describe() for r in DdpTrainCheck.rank_required_metrics(params, rc(1))] == ["ddp_step_ms on cuda:1"]
    assert "ddp_loss_drop" in {r.metric for r in DdpTrainCheck.rank_required_metrics(params, rc(0))}


def test_nccl_tests_and_fabric_declare_their_figures() -> None:
    from gpuaccept.checks.base import CheckContext, Outcome, enforce_required
    from gpuaccept.checks.fabric import FabricCheck
    from gpuaccept.checks.nccl_tests import NcclTestsCheck
    from gpuaccept.model import Metric, Status

    params = {**NcclTestsCheck.defaults("standard"), "tests": ["all_reduce", "alltoall"]}
    ctx = CheckContext(device="cpu", params=params)
    got = [Metric("allreduce_busbw_large_gbs", 100.0, "GB/s")]
    out = enforce_required(NcclTestsCheck, ctx, Outcome.passed("ok", got))
    assert out.status is Status.ERROR and out.details["missing_metrics"] == ["alltoall_busbw_large_gbs"]
    fab = enforce_required(FabricCheck, CheckContext(device="cpu", params=FabricCheck.defaults("standard")),
                           Outcome.passed("ok", []))
    assert fab.status is Status.ERROR and "rdma_ports_active" in fab.reason


# ---- options that cannot apply ------------------------------------------------------------------------------
def test_gpus_on_a_cpu_run_is_reported(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--gpus", "0,1", "--checks", "steady", "--report-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "warning: --gpus/gpus 0,1 did not apply" in r.stdout


def test_expect_gpus_without_the_env_check_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("expect_gpus: 8\n")
    r = gpuaccept("run", "--device", "cpu", "--config", str(cfg), "--checks", "steady",
                  "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "expect_gpus 8" in r.stderr and "env" in r.stderr
    r = gpuaccept("run", "--device", "cpu", "--expect-gpus", "8", "--checks", "env,steady",
                  "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 1 and "expected 8 GPUs, found 0" in r.stdout


# ---- the verdict is the last line ---------------------------------------------------------------------------
def test_the_verdict_is_the_last_line_of_merged_output(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gpuaccept", "run", "--device", "cpu", "--checks", "steady",
                        "--report-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=cli_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    assert any(line.startswith("[RESULT] stored run") for line in lines), lines
    assert lines[-1].startswith("[RESULT] SUCCESS (CPU only: ")
