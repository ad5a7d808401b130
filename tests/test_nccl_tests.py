"""nccl-tests: the parser on recorded outputs, the judgement, the run path with a fake binary, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.nccl_tests import NcclTestsCheck, gpu_args
from gpuaccept.cli import main
from gpuaccept.errors import InputError, UsageError
from gpuaccept.model import Status
from gpuaccept.nccltests.judge import canonical_test, find_binary, judge
from gpuaccept.nccltests.parse import Device, Footer, Measure, parse_any, parse_text, strip_env

DATA = Path(__file__).parent / "data" / "nccl-tests"


def load(name: str):  # type: ignore[no-untyped-def]
    return parse_any((DATA / name).read_text())


def test_current_format_two_hosts_exact() -> None:
    r = load("current_2hosts_h100.txt")
    assert len(r.devices) == 16 and r.hosts == ["ztan-mig-235z", "ztan-mig-gq73"]
    assert r.devices[8] == Device(8, 0, 6733, "ztan-mig-gq73", 0, "0000:04:00", "NVIDIA H100 80GB HBM3")
    assert len(r.rows) == 31 and r.rows[0].size_bytes == 8 and r.rows[0].count == 2
    last = r.rows[-1]
    assert (last.size_bytes, last.count, last.type, last.redop, last.root) == (8589934592, 2147483648, "float",
                                                                               "sum", -1)
    assert last.out_of_place == Measure(47535.0, 180.71, 338.82, 0.0)
    assert last.in_place == Measure(47743.0, 179.92, 337.35, 0.0)
    assert r.footer == Footer(0, True, 70.742, None)
    assert (r.check_column, r.time_column) == ("#wrong", "time")


@pytest.mark.parametrize("name", ["mpirun_tagged.txt", "srun_label.txt"])
def test_launcher_prefixes_parse_like_the_plain_log(name: str) -> None:
    plain = load("current_2hosts_h100.txt")
    assert load(name).to_dict() == plain.to_dict()


def test_na_in_wrong_column() -> None:
    r = load("alltoall_rtx5090_na.txt")
    row = r.rows[0]
    assert row.redop == "none" and row.out_of_place is not None and row.out_of_place.wrong == 0.0
    assert row.in_place == Measure(0.78, 43046.10, 0.0, None)
    assert r.devices[0].host == "GENOA-01" and r.devices[0].pci == "0x01"


def test_old_error_column_without_root_and_without_group() -> None:
    r = load("old_error_noroot_broadcast_v100.txt")
    assert r.check_column == "error" and r.devices[1] == Device(1, None, 9210, "v100-gpu-5", 0, "0x00",
                                                                "Tesla V100-PCIE-16GB")
    assert (r.rows[0].redop, r.rows[0].root) == (None, 0)
    assert r.rows[0].out_of_place == Measure(45.82, 0.0, 0.0, None)
    assert r.footer is None  # the recorded excerpt ends after the first row


def test_old_error_column_without_redop() -> None:
    r = load("old_error_noredop_v100.txt")
    assert r.check_column == "error" and len(r.rows) == 12
    assert (r.rows[-1].redop, r.rows[-1].root) == (None, None)
    assert r.rows[-1].in_place == Measure(3070.3, 21.86, 21.86, 0.0)
    assert r.footer == Footer(0, True, 6.6972, None)


def test_cputime_and_timestamp_columns() -> None:
    c = load("cputime_C1.txt")
    assert c.time_column == "cputime" and c.program == "all_reduce_perf"
    s = load("timestamps_S1.txt")
    assert [x.timestamp for x in s.rows] == ["2025-06-02 14:07:10", "2025-06-02 14:07:11", "2025-06-02 14:07:12"]
    assert s.rows[1].out_of_place == Measure(5431.0, 395.41, 691.97, 0.0)
    assert s.footer == Footer(0, True, 689.13, True)


def test_json_file_matches_and_env_is_stripped() -> None:
    text = (DATA / "all_reduce_J.json").read_text()
    r = parse_any(text)
    t = load("timestamps_S1.txt")
    assert [(x.size_bytes, x.out_of_place, x.in_place) for x in r.rows] == \
        [(x.size_bytes, x.out_of_place, x.in_place) for x in t.rows]
    assert r.devices == t.devices and r.program == "all_reduce_perf" and r.footer == Footer(0, True, 689.13, None)
    stripped = strip_env(json.loads(text))
    assert "env" not in stripped and "hf_not_a_real_token" not in json.dumps(stripped)
    assert "hf_not_a_real_token" not in json.dumps(r.to_dict())


@pytest.mark.parametrize("text, message", [
    ((DATA / "not_nccl_nccom.txt").read_text(), "not nccl-tests output"),
    ("", "not nccl-tests output"),
    ("#       size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n", "without a single"),
    ("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
     "  8  2 float sum -1 1.0 nan 0.00 0 1.0 0.0 0.0 0\n", "not a finite number"),
    ("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
     "  8  2 float sum -1 1.0 0.0 0.00 0 1.0 0.0\n", "fields where the header has 13"),
    ("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
     "  8  2 float sum -1 1.0 0.0 -3.0 0 1.0 0.0 0.0 0\n", "finite number >= 0"),
    ("#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
     "  8  2 float sum -1 1.0 0.0 0.0 0.5 1.0 0.0 0.0 0\n", "not a whole number"),
    ("#  size count type redop root time algbw busbw #wrong time algbw busbw\n", "unknown nccl-tests column header"),
    ("#  size count type redop root time algbw busbw #wrong cputime algbw busbw #wrong\n",
     "unknown nccl-tests column header"),
    ('{"version": 1, "results": [{"size": 8}]}', "has no 'root'"),
    ('{"version": 1, "results": [', "not valid JSON"),
    ('{"version": 2, "results": []}', "version 2"),
])
def test_bad_input_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_any(text)


def test_two_runs_in_one_log_are_refused() -> None:
    text = (DATA / "cputime_C1.txt").read_text()
    with pytest.raises(InputError, match="second"):
        parse_text(text + text)


def test_judge_pass_fail_and_exit_codes() -> None:
    r = load("current_2hosts_h100.txt")
    ok = judge(r, "all_reduce", min_busbw_gbs=300)
    assert ok.status is Status.PASS and "337.4 GB/s at 8 GiB" in ok.reason
    m = {x.name: x for x in ok.metrics}
    assert m["allreduce_busbw_large_gbs"].value == 337.35 and m["allreduce_wrong"].value == 0
    assert m["allreduce_busbw_large_gbs"].threshold is not None
    low = judge(r, "all_reduce", min_busbw_gbs=340)
    assert low.status is Status.FAIL and "below 340 GB/s" in low.reason
    # sizes >= 1 GiB: the lowest is 297.86 at 1 GiB
    floor = judge(r, "all_reduce", min_busbw_gbs=300, judge_min_bytes=1 << 30)
    assert floor.status is Status.FAIL and "at 1 GiB" in floor.reason
    assert judge(r, "all_reduce", returncode=7).status is Status.FAIL
    err = judge(r, "all_reduce", returncode=3)
    assert err.status is Status.ERROR and "exited 3" in err.reason
    assert judge(load("truncated.txt"), "all_reduce").status is Status.ERROR
    assert "not judged" in judge(r, "all_reduce").reason


def test_judge_wrong_and_failed_footer() -> None:
    j = judge(load("wrong_failed.txt"), "all_reduce", returncode=7)
    assert j.status is Status.FAIL
    assert "#wrong > 0 at 1 sizes (first 2 GiB float)" in j.reason and "Out of bounds values: 1 FAILED" in j.reason
    assert "Avg bus bandwidth 689.13 GB/s FAILED" in j.reason
    assert {x.name: x.value for x in j.metrics}["allreduce_wrong"] == 1024


def test_old_error_column_is_not_counted_as_wrong() -> None:
    j = judge(load("old_error_noredop_v100.txt"), "all_gather")
    assert j.status is Status.PASS and "allgather_wrong" not in {x.name for x in j.metrics}


def test_canonical_test_names() -> None:
    assert canonical_test("all_reduce_perf") == canonical_test("allreduce") == "all_reduce"
    with pytest.raises(UsageError, match="unknown nccl-tests binary"):
        canonical_test("all_reduc")


def fake_binary(tmp_path: Path, sample: str, rc: int = 0) -> Path:
    """An ``all_reduce_perf`` that records its argv and CUDA_VISIBLE_DEVICES and prints a recorded output."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "all_reduce_perf"
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/argv\n"
                   f"echo \"$CUDA_VISIBLE_DEVICES\" > {tmp_path}/cvd\n"
                   f"{shutil.which('cat')} {DATA / sample}\nexit {rc}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_find_binary_places(tmp_path: Path) -> None:
    bindir = fake_binary(tmp_path, "cputime_C1.txt")
    assert find_binary("all_reduce", {"PATH": "/nonexistent"}) is None
    assert find_binary("all_reduce", {"PATH": str(bindir)}) == str(bindir / "all_reduce_perf")
    assert find_binary("all_reduce", {"PATH": "", "NCCL_TESTS_DIR": str(bindir)}) == str(bindir / "all_reduce_perf")


def _ctx(params: dict, gpus: list[int] | None = None) -> CheckContext:
    return CheckContext(device="cuda", params=params, gpus=gpus, timeout_s=30)


def test_check_runs_the_binary_and_judges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = fake_binary(tmp_path, "cputime_C1.txt")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    params = {**NcclTestsCheck.defaults("standard"), "min_busbw_gbs": 600.0}
    out = NcclTestsCheck().run(_ctx(params, gpus=[2, 3]))
    assert out.status is Status.PASS, out.reason
    assert (tmp_path / "argv").read_text().split() == ["-b", "8M", "-e", "1G", "-f", "2", "-g", "2"]
    assert (tmp_path / "cvd").read_text().strip() == "2,3"
    assert out.details["all_reduce"]["returncode"] == 0 and len(out.details["all_reduce"]["rows"]) == 3
    assert {m.name for m in out.metrics} >= {"allreduce_busbw_large_gbs", "allreduce_wrong"}


def test_check_exit_7_and_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = fake_binary(tmp_path, "wrong_failed.txt", rc=7)
    monkeypatch.setenv("PATH", str(bindir))
    out = NcclTestsCheck().run(_ctx(NcclTestsCheck.defaults("quick"), gpus=[0]))
    assert out.status is Status.FAIL and "#wrong > 0" in out.reason


def test_check_non_nccl_output_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = fake_binary(tmp_path, "not_nccl_nccom.txt", rc=1)
    monkeypatch.setenv("PATH", str(bindir))
    out = NcclTestsCheck().run(_ctx(NcclTestsCheck.defaults("quick"), gpus=[0]))
    assert out.status is Status.ERROR and "not nccl-tests output" in out.reason and "exit 1" in out.reason


def test_check_skips_naming_the_places(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("NCCL_TESTS_DIR", "/nonexistent/nccl-tests")
    out = NcclTestsCheck().run(_ctx(NcclTestsCheck.defaults("quick")))
    assert out.status is Status.SKIP
    assert "$PATH" in out.reason and "/nonexistent/nccl-tests" in out.reason and "/workspace/nccl-tests/build" \
        in out.reason


def test_a_missing_nccl_tests_is_a_skip_on_a_gpu_node_even_when_a_gpu_is_required(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU is there; the tool is not. Not GA-GPU-007 "GPU required but none usable" with replace_part."""
    from gpuaccept.node.judge import judge

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("NCCL_TESTS_DIR", raising=False)
    out = NcclTestsCheck().run(_ctx(NcclTestsCheck.defaults("standard"), gpus=[0]))
    assert out.status is Status.SKIP and not out.needs_gpu and "NCCL_TESTS_DIR" in out.reason
    verdict = judge(out, require_gpu=True, device="cuda", check="nccl_tests")
    assert verdict.status is Status.SKIP and not verdict.reason.startswith("GPU required")


def test_gpu_args_keeps_an_explicit_g() -> None:
    args, env = gpu_args(["-g", "4"], [0, 1], {"CUDA_VISIBLE_DEVICES": "4,5,6"})
    assert args == ["-g", "4"] and env["CUDA_VISIBLE_DEVICES"] == "4,5"


def test_check_counts_only_the_visible_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job given 4 of a node's 8 GPUs runs nccl-tests with -g 4 (-g 8 is "Invalid number of GPUs")."""
    bindir = fake_binary(tmp_path, "cputime_C1.txt")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setattr("gpuaccept.hw.devices.nvidia_gpu_count", lambda: 8)  # NVML: the node's 8 GPUs
    NcclTestsCheck().run(_ctx(NcclTestsCheck.defaults("standard")))
    argv = (tmp_path / "argv").read_text().split()
    assert argv[argv.index("-g") + 1] == "4"
    assert (tmp_path / "cvd").read_text().strip() == "4,5,6,7"


@pytest.mark.parametrize(("cvd", "g", "nproc"), [(None, "8", 8), ("0,1", "2", 2), ("MIG-1a,MIG-3c,MIG-5e", "1", 1),
                                                 ("NoDevFiles", "1", 0), ("-1", "1", 0)])
def test_gpu_args_counts_as_default_nproc(cvd: str | None, g: str, nproc: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuaccept.distributed.local import default_nproc

    monkeypatch.setattr("gpuaccept.hw.devices.nvidia_gpu_count", lambda: 8)
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    args, _ = gpu_args(["-b", "8M"], None, env)
    assert args == ["-b", "8M", "-g", g]
    assert default_nproc("cuda", None, env) == nproc


def test_cli_parse_table_json_and_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["nccl-tests", "parse", str(DATA / "current_2hosts_h100.txt"), "--min-busbw", "300"]) == 0
    out = capsys.readouterr().out
    assert "8589934592" in out and out.strip().splitlines()[-1].startswith("PASS:")
    assert main(["nccl-tests", "parse", str(DATA / "all_reduce_J.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "pass" and len(doc["rows"]) == 3 and doc["rows"][0]["in_place"]["busbw_gbs"] == 673.33
    assert doc["devices"][0]["host"] == "node-a01" and doc["footer"]["out_of_bounds"] == 0
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO((DATA / "wrong_failed.txt").read_text()))
    assert main(["nccl-tests", "parse", "-"]) == 1


@pytest.mark.parametrize("argv, message", [
    (["nccl-tests", "parse", str(DATA / "not_nccl_nccom.txt")], "not nccl-tests output"),
    (["nccl-tests", "all_reduc"], "unknown nccl-tests binary"),
    (["nccl-tests", "parse", "x", "--min-busbw", "fast"], "not a number"),
    (["nccl-tests", "parse", "/nonexistent/log"], "cannot read"),
])
def test_cli_bad_input_exits_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        code = main(argv)
        raise SystemExit(code)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_runs_the_binary_with_extra_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bindir = fake_binary(tmp_path, "timestamps_S1.txt")
    monkeypatch.setenv("PATH", str(bindir))
    assert main(["nccl-tests", "all_reduce", "--min-busbw", "650", "--", "-b", "1G", "-e", "4G", "-g", "8",
                 "-S", "1"]) == 0
    assert (tmp_path / "argv").read_text().split() == ["-b", "1G", "-e", "4G", "-g", "8", "-S", "1"]
    assert "PASS:" in capsys.readouterr().out
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["nccl-tests", "all_reduce"]) == 2


def test_timeout_kills_the_wrapper_and_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A wrapper script (as a site's module-loading wrapper would be) whose child outlives it: ``--timeout`` ends
    the whole process group, so no orphan keeps the GPUs."""
    import time

    script = tmp_path / "bin" / "all_reduce_perf"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {tmp_path}/child.pid\nwait\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    started = time.monotonic()
    assert main(["nccl-tests", "all_reduce", "--timeout", "3"]) != 0
    assert time.monotonic() - started < 20
    assert "all_reduce_perf was killed at the timeout (3 s), its process group with it" in capsys.readouterr().err
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the wrapper's child outlived the timeout"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False
