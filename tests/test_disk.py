"""The disk check: fio JSON parsing on recorded reports, real runs with fio and the Python fallback, bad paths."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.disk import DiskCheck
from gpuaccept.checks.disk_io import (
    PHASES,
    figures_from_fio,
    fio_command,
    parse_fio_json,
    python_fallback,
    scratch_problem,
)
from gpuaccept.errors import ConfigError, InputError
from gpuaccept.model import Status
from gpuaccept.node.judge import judge
from tests.helpers import gpuaccept
from tests.sshd import need_binary

FIO = Path(__file__).resolve().parent / "data" / "fio"
METRICS = {"disk_seq_write_mbs", "disk_seq_read_mbs", "disk_rand_write_iops", "disk_rand_read_iops", "disk_free_gib"}


def params(tmp_path: Path, **over: Any) -> dict[str, Any]:
    return {**DiskCheck.defaults("full"), "path": str(tmp_path), "size_mib": 16, "runtime_s": 1.0,
            "min_free_gib": 0.0, **over}


@pytest.mark.parametrize("name, direct", [("direct.json", True), ("buffered.json", False)])
def test_recorded_fio_reports_parse(name: str, direct: bool) -> None:
    text = (FIO / name).read_text()
    jobs = parse_fio_json(text)
    assert [j.name for j in jobs] == list(PHASES) and all(j.error == 0 for j in jobs)
    raw = {j["jobname"]: j for j in json.loads(text)["jobs"]}
    fig = figures_from_fio(jobs, direct, 32 if direct else 1)
    assert fig.engine == "fio" and fig.direct is direct
    assert fig.seq_write_mbs == raw["seq_write"]["write"]["bw_bytes"] / 1e6 > 0
    assert fig.seq_read_mbs == raw["seq_read"]["read"]["bw_bytes"] / 1e6 > 0
    assert fig.rand_write_iops == raw["rand_write"]["write"]["iops"] > 0
    assert fig.rand_read_iops == raw["rand_read"]["read"]["iops"] > 0


def test_recorded_fio_error_is_reported() -> None:
    jobs = parse_fio_json((FIO / "error.json").read_text())
    assert jobs[0].error == 13
    with pytest.raises(InputError, match=r"fio job\(s\) failed: seq_write \(error 13\)"):
        figures_from_fio(jobs, False, 1)


def test_fio_output_with_leading_warnings_and_junk() -> None:
    text = "fio: warning: something odd\n" + (FIO / "direct.json").read_text()
    assert len(parse_fio_json(text)) == 4
    for bad, match in (("", "no JSON report"), ("fio: file:filesetup.c: error\n", "no JSON report"),
                       ("{\n  \"jobs\": [", "malformed"), ("{\"jobs\": []}", "no 'jobs'"),
                       ('{"jobs": [{"jobname": "x", "read": {"bw_bytes": -1, "iops": 0}}]}', "non-negative")):
        with pytest.raises(InputError, match=match):
            parse_fio_json(bad)
    with pytest.raises(InputError, match="lacks job"):
        figures_from_fio(parse_fio_json((FIO / "direct.json").read_text())[:2], True, 32)


def test_fio_command_matches_the_recording() -> None:
    argv = fio_command("fio", "/scratch", 256, 5, True, 32)
    assert argv[:2] == ["fio", "--output-format=json"] and "--direct=1" in argv and "--iodepth=32" in argv
    assert [a for a in argv if a.startswith("--name=")] == [f"--name={p}" for p in PHASES]
    buffered = fio_command("fio", "/scratch", 256, 5, False, 32)
    assert "--ioengine=libaio" not in buffered and buffered.count("--end_fsync=1") == 2


def test_fio_run_for_real(tmp_path: Path) -> None:
    need_binary("fio", "the disk check measures with fio; apt-get install fio")
    out = DiskCheck().run(CheckContext(device="cpu", params=params(tmp_path, engine="fio")))
    assert out.status is Status.PASS, out.reason
    assert {m.name for m in out.metrics} == METRICS
    assert all(m.value > 0 for m in out.metrics)
    assert {m.tags["engine"] for m in out.metrics if m.name != "disk_free_gib"} == {"fio"}
    assert os.listdir(tmp_path) == []  # its work directory is gone


@pytest.mark.parametrize("direct", [True, False])
def test_python_fallback_for_real(tmp_path: Path, direct: bool) -> None:
    out = DiskCheck().run(CheckContext(device="cpu", params=params(tmp_path, engine="python", direct=direct)))
    assert out.status is Status.PASS, out.reason
    assert {m.name for m in out.metrics} == METRICS
    m = {x.name: x for x in out.metrics}
    assert m["disk_seq_write_mbs"].unit == "MB/s" and m["disk_rand_read_iops"].unit == "IO/s"
    assert m["disk_seq_read_mbs"].tags["engine"] == "python" and m["disk_seq_read_mbs"].tags["iodepth"] == 1
    if not direct:
        assert "O_DIRECT off: buffered I/O with fsync" in out.reason and m["disk_seq_read_mbs"].tags["direct"] == 0
    assert os.listdir(tmp_path) == []


def test_python_fallback_says_when_the_file_was_not_filled(tmp_path: Path) -> None:
    fig = python_fallback(str(tmp_path), 1 << 16, 1.0, direct=False)  # 64 GiB cannot be written in a second
    assert any("sequential write reached" in n for n in fig.notes)
    assert not (tmp_path / "gpuaccept-fio.dat").exists()


def test_too_little_free_space_fails(tmp_path: Path) -> None:
    out = DiskCheck().run(CheckContext(device="cpu", params=params(tmp_path, min_free_gib=1e8)))
    assert out.status is Status.FAIL and "GiB free, too little" in out.reason
    assert judge(out).status is Status.FAIL
    assert out.metrics[0].name == "disk_free_gib" and out.metrics[0].threshold is not None


def test_scratch_problems(tmp_path: Path) -> None:
    assert scratch_problem(str(tmp_path)) is None
    assert scratch_problem(str(tmp_path / "nope")) == f"scratch path {tmp_path / 'nope'} does not exist"
    (tmp_path / "f").write_text("")
    assert scratch_problem(str(tmp_path / "f")) == f"scratch path {tmp_path / 'f'} is not a directory"
    assert scratch_problem("/proc/1") == "scratch path /proc/1 is not writable"
    with pytest.raises(ConfigError, match=r"c.yaml: checks.disk.params.path: scratch path /nope does not exist"):
        DiskCheck.preflight({"path": "/nope"}, "c.yaml", "checks.disk.params")


@pytest.mark.parametrize("path, why", [("/nonexistent/scratch", "does not exist"), ("/proc/1", "is not writable"),
                                       ("/etc/hostname", "is not a directory")])
def test_bad_scratch_path_is_exit_2_before_anything_runs(tmp_path: Path, path: str, why: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"checks:\n  disk:\n    params: {{path: {path}}}\n")
    r = gpuaccept("run", "--profile", "burnin", "--device", "cpu", "--config", str(cfg),
                  "--report-dir", str(tmp_path / "reports"))
    assert r.returncode == 2
    assert r.stderr.strip() == f"gpuaccept: error: {cfg}: checks.disk.params.path: scratch path {path} {why}"
    assert not (tmp_path / "reports").exists()  # refused before the run started


# ------------------------------------------------------------------ --disk-path


def test_disk_path_flag_sets_the_scratch_directory_over_the_config(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  disk:\n    params: {path: /nonexistent, size_mib: 16, runtime_s: 1.0, "
                   "engine: python, min_free_gib: 0.0}\n")
    r = gpuaccept("run", "--checks", "disk", "--device", "cpu", "--config", str(cfg), "--disk-path", str(scratch),
                  "--report-dir", str(tmp_path / "reports"), "--no-history", "--json", "-")
    assert r.returncode == 0, r.stderr
    check = json.loads(r.stdout)["checks"][0]
    assert check["name"] == "disk" and check["status"] == "pass"
    assert {m["tags"]["path"] for m in check["metrics"]} == {str(scratch)}  # measured there, not in /nonexistent
    assert list(scratch.iterdir()) == []  # its work directory was removed


def test_disk_path_flag_is_in_the_plan(tmp_path: Path) -> None:
    r = gpuaccept("run", "--profile", "full", "--device", "cpu", "--disk-path", str(tmp_path), "--plan")
    assert r.returncode == 0, r.stderr
    disk = [c for c in json.loads(r.stdout)["checks"] if c["name"] == "disk"]
    assert disk[0]["params"]["path"] == str(tmp_path)


@pytest.mark.parametrize("path, why", [("/nonexistent/scratch", "does not exist"), ("/proc/1", "is not writable"),
                                       ("/etc/hostname", "is not a directory")])
def test_bad_disk_path_flag_is_exit_2_before_anything_runs(tmp_path: Path, path: str, why: str) -> None:
    r = gpuaccept("run", "--profile", "burnin", "--device", "cpu", "--disk-path", path,
                  "--report-dir", str(tmp_path / "reports"))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.strip() == f"gpuaccept: error: --disk-path: scratch path {path} {why}"
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("args, words", [
    (["--profile", "quick"], "--disk-path {tmp}: the disk check is not in this selection"),
    (["--checks", "env"], "--disk-path {tmp}: the disk check is not in this selection"),
    (["--profile", "full", "--skip", "disk"], "--disk-path {tmp}: the disk check is not in this selection"),
])
def test_disk_path_without_the_disk_check_is_refused(tmp_path: Path, args: list[str], words: str) -> None:
    r = gpuaccept("run", "--device", "cpu", *args, "--disk-path", str(tmp_path), "--report-dir",
                  str(tmp_path / "reports"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert words.format(tmp=tmp_path) in r.stderr
    assert not (tmp_path / "reports").exists()


def test_empty_disk_path_is_refused() -> None:
    r = gpuaccept("run", "--checks", "disk", "--device", "cpu", "--disk-path", "", "--plan")
    assert r.returncode == 2 and r.stderr.strip() == (
        "gpuaccept: error: --disk-path needs a directory (leave the flag out for the system temp directory)")


def test_launch_passes_disk_path_to_each_node_as_given(tmp_path: Path) -> None:
    """The path is on the nodes: the launch side forwards it unchecked (a node refuses a bad one itself)."""
    r = gpuaccept("launch", "local", "--nodes", "1", "--checks", "disk", "--device", "cpu", "--disk-path",
                  "/scratch/on/the/node", "--python", "python3", "--results-dir", "/r", "--run-id", "s",
                  "--per-node-only", "--dry-run", "--show-env")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("env "))
    assert line.endswith("run --checks disk --device cpu --disk-path /scratch/on/the/node --no-history "
                         "--report-dir /r/s")
    spec = tmp_path / "job.yaml"
    spec.write_text("nodes: 1\nsuite: {checks: [disk], device: cpu, disk_path: /scratch/from/spec}\n")
    r = gpuaccept("launch", "local", "--spec", str(spec), "--python", "python3", "--results-dir", "/r", "--run-id",
                  "s", "--per-node-only", "--dry-run", "--show-env")
    assert r.returncode == 0, r.stderr
    assert "--disk-path /scratch/from/spec" in next(x for x in r.stdout.splitlines() if x.startswith("env "))
    refused = gpuaccept("launch", "local", "--checks", "env", "--disk-path", "/x", "--results-dir", "/r", "--dry-run")
    assert refused.returncode == 2 and "the disk check is not in this selection" in refused.stderr
    command = gpuaccept("launch", "local", "--disk-path", "/x", "--results-dir", "/r", "--dry-run", "--", "hostname")
    assert command.returncode == 2 and "--disk-path is a suite option" in command.stderr
