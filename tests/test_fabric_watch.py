"""RDMA counters read around another check's traffic (checks/fabric_watch.py), and the nccl_tests check with it.

Counters change *during* the run: either the "after" read is pointed at a recorded later tree of the
same node (``ndr_4x`` -> ``ndr_4x_later``), or a copy of a tree is rewritten while the run is in
progress (by a fake ``all_reduce_perf`` on PATH for nccl_tests).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from gpuaccept.checks.base import CheckContext, Outcome
from gpuaccept.checks.collectives import CollectivesCheck
from gpuaccept.checks.fabric import FabricCheck
from gpuaccept.checks.fabric_watch import AFTER_ROOT_ENV, DELTA_RULES, FabricWatch
from gpuaccept.checks.nccl_tests import NcclTestsCheck
from gpuaccept.model import Status
from gpuaccept.node.judge import judge

SYSFS = Path(__file__).parent / "data" / "sysfs"
NCCL_DATA = Path(__file__).parent / "data" / "nccl-tests"


def planted(tmp_path: Path, name: str = "ndr_4x") -> Path:
    root = tmp_path / "sysroot"
    shutil.copytree(SYSFS / name, root, symlinks=True)
    return root


def counter(root: Path, dev: str, name: str) -> Path:
    return root / "sys/class/infiniband" / dev / "ports/1/counters" / name


def ticking(start: float = 100.0, step: float = 5.0):  # type: ignore[no-untyped-def]
    t = [start - step]

    def clock() -> float:
        t[0] += step
        return t[0]

    return clock


def passed() -> Outcome:
    return Outcome(Status.PASS, "all good")


def test_the_rules_are_the_fabric_checks_own() -> None:
    assert DELTA_RULES and all(r in FabricCheck.thresholds for r in DELTA_RULES)
    assert {r.metric for r in DELTA_RULES} == {r.metric for r in FabricCheck.thresholds
                                               if r.metric.endswith("_delta")}
    assert next(r for r in DELTA_RULES if r.metric == "rdma_link_downed_delta").severity is Status.FAIL
    assert all(r.severity is Status.WARN for r in DELTA_RULES if r.metric != "rdma_link_downed_delta")
    for check in (CollectivesCheck, NcclTestsCheck):
        assert set(DELTA_RULES) <= set(check.thresholds)
        assert check.defaults("standard")["fabric_root"] == "/"


def test_no_rdma_devices_records_nothing() -> None:
    assert FabricWatch.start(str(SYSFS / "no_rdma")) is None
    assert FabricWatch.start("/nonexistent/root") is None


def test_link_downed_under_load_fails_and_names_the_port() -> None:
    watch = FabricWatch.start(str(SYSFS / "ndr_4x"), clock=ticking())
    assert watch is not None
    out = watch.finish(passed(), env={AFTER_ROOT_ENV: str(SYSFS / "ndr_4x_later")})
    info = out.details["fabric_counters"]
    assert info["root"] == str(SYSFS / "ndr_4x") and info["interval_s"] == 5.0
    assert info["rising"] == {"mlx5_2:1": {"symbol_error": 4031, "link_downed": 2, "port_rcv_errors": 17}}
    assert set(info["ports"]) == {"mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"}
    assert info["ports"]["mlx5_1:1"]["symbol_error"] == 0  # old errors at boot did not rise
    assert "mlx5_2:1 (symbol_error +4031, link_downed +2, port_rcv_errors +17)" in out.reason
    j = judge(out, DELTA_RULES)
    assert j.status is Status.FAIL
    assert "rdma_link_downed_delta on mlx5_2:1 2 > 0 count" in j.reason
    m = next(m for m in j.metrics if m.name == "rdma_symbol_error_delta" and m.device == "mlx5_2:1")
    assert m.value == 4031 and m.tags == {"hca": "mlx5_2", "port": 1, "interval_s": 5.0}


def test_symbol_errors_under_load_warn_and_traffic_shows_the_carrier(tmp_path: Path) -> None:
    root = planted(tmp_path)
    watch = FabricWatch.start(str(root))
    assert watch is not None
    # the "run": mlx5_1 carries 4 MB each way and picks up symbol errors and receive errors
    for name, add in (("port_xmit_data", 1 << 20), ("port_rcv_data", 1 << 20)):
        path = counter(root, "mlx5_1", name)
        path.write_text(f"{int(path.read_text()) + add}\n")
    counter(root, "mlx5_1", "symbol_error").write_text("40\n")  # 12 at boot
    counter(root, "mlx5_1", "port_rcv_errors").write_text("3\n")
    out = watch.finish(passed(), env={})
    info = out.details["fabric_counters"]
    assert info["rising"] == {"mlx5_1:1": {"symbol_error": 28, "port_rcv_errors": 3}}
    assert info["traffic_bytes"]["mlx5_1:1"] == {"xmit": 4 << 20, "rcv": 4 << 20}
    assert info["traffic_bytes"]["mlx5_0:1"] == {"xmit": 0, "rcv": 0}
    j = judge(out, DELTA_RULES)
    assert j.status is Status.WARN
    assert "rdma_symbol_error_delta on mlx5_1:1 28 > 0 count" in j.reason
    assert "rdma_port_rcv_errors_delta on mlx5_1:1 3 > 0 count" in j.reason


def test_quiet_counters_pass_and_keep_the_reason(tmp_path: Path) -> None:
    root = planted(tmp_path)
    watch = FabricWatch.start(str(root))
    assert watch is not None
    j = judge(watch.finish(passed(), env={}), DELTA_RULES)
    assert (j.status, j.reason) == (Status.PASS, "all good")
    assert len([m for m in j.metrics if m.name.startswith("rdma_")]) == 4 * 8


def test_cleared_vanished_and_unreadable_counters_are_notes_not_crashes(tmp_path: Path) -> None:
    root = planted(tmp_path)
    watch = FabricWatch.start(str(root))
    assert watch is not None
    counter(root, "mlx5_0", "symbol_error").write_text("0\n")
    counter(root, "mlx5_1", "symbol_error").write_text("0\n")  # 12 -> 0: cleared
    counter(root, "mlx5_2", "port_rcv_errors").write_text("not a number\n")
    (root / "sys/class/infiniband/mlx5_3").unlink()  # the device went away (driver reset)
    out = watch.finish(passed(), env={})
    info = out.details["fabric_counters"]
    assert info["reset"] == {"mlx5_1:1": ["symbol_error"]}
    assert info["vanished"] == ["mlx5_3:1"]
    assert any("port_rcv_errors: counter is not a non-negative integer" in n for n in info["notes"])
    assert any("deltas are lower bounds: mlx5_1:1 symbol_error" in n for n in info["notes"])
    assert out.status is Status.WARN and "mlx5_3:1 vanished" in out.reason
    assert "port_rcv_errors" not in info["ports"]["mlx5_2:1"]


def test_unreadable_root_before_the_run_is_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuaccept.checks.fabric_watch as fw

    def broken(*_a: object, **_k: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fw, "read_snapshot", broken)
    watch = FabricWatch.start(str(tmp_path))
    assert watch is not None
    out = watch.finish(passed(), env={})
    assert out.status is Status.PASS and out.reason == "all good" and not out.metrics
    assert "could not be read before the run" in out.details["fabric_counters"]["notes"][0]


# ---- nccl_tests: a fake binary rewrites the planted counters while it "runs"


def fake_nccl_binary(tmp_path: Path, root: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "all_reduce_perf"
    c = root / "sys/class/infiniband/mlx5_0/ports/1/counters"
    exe.write_text(f"#!/bin/sh\necho 9 > {c}/symbol_error\necho 1 > {c}/link_error_recovery\n"
                   f"{shutil.which('cat')} {NCCL_DATA / 'cputime_C1.txt'}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_nccl_tests_ties_errors_during_the_run_to_the_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = planted(tmp_path)
    monkeypatch.setenv("PATH", f"{fake_nccl_binary(tmp_path, root)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(AFTER_ROOT_ENV, raising=False)
    params = {**NcclTestsCheck.defaults("standard"), "fabric_root": str(root)}
    out = NcclTestsCheck().run(CheckContext(device="cuda", params=params, gpus=[0, 1], timeout_s=30))
    assert out.status is Status.PASS, out.reason  # the check's own verdict; the rules judge the counters
    assert out.details["fabric_counters"]["rising"] == {"mlx5_0:1": {"symbol_error": 9, "link_error_recovery": 1}}
    assert "all_reduce" in out.details
    j = judge(out, NcclTestsCheck.thresholds)
    assert j.status is Status.WARN
    assert "rdma_symbol_error_delta on mlx5_0:1 9 > 0 count" in j.reason
    assert "rdma_link_error_recovery_delta on mlx5_0:1 1 > 0 count" in j.reason


def test_nccl_tests_without_rdma_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = planted(tmp_path, "no_rdma")
    monkeypatch.setenv("PATH", f"{fake_nccl_binary(tmp_path, root)}{os.pathsep}{os.environ['PATH']}")
    params = {**NcclTestsCheck.defaults("standard"), "fabric_root": str(root)}
    out = NcclTestsCheck().run(CheckContext(device="cuda", params=params, gpus=[0, 1], timeout_s=30))
    assert out.status is Status.PASS, out.reason
    assert "fabric_counters" not in out.details and not any(m.name.startswith("rdma_") for m in out.metrics)
