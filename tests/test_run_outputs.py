"""What a run leaves for a person: report.html beside report.json (``--no-html`` to skip), the report directory
in the last lines, a page that cannot be written as a warning only; ``gpuaccept report`` writes beside the
report unless ``-o`` says otherwise."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.helpers import gpuaccept, only_run_dir, validate_report
from tests.report_data import CLUSTER, NODE_CPU


def _run(tmp_path: Path, *args: str) -> tuple[int, list[str], str]:
    proc = gpuaccept("run", "--device", "cpu", "--no-history", "--report-dir", str(tmp_path / "r"), *args)
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


def test_a_run_writes_report_html_and_ends_with_its_directory(tmp_path: Path) -> None:
    rc, lines, err = _run(tmp_path, "--checks", "steady")
    assert rc == 0, err
    run_dir = only_run_dir(tmp_path / "r")
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert oct((run_dir / "report.html").stat().st_mode & 0o777) == "0o644"
    assert lines[-2] == f"[RESULT] report directory: {run_dir} (report.json, report.html)"
    assert lines[-1].startswith("[RESULT] SUCCESS")
    assert run_dir.is_absolute()


def test_no_html_writes_none_and_says_so(tmp_path: Path) -> None:
    rc, lines, err = _run(tmp_path, "--checks", "steady", "--no-html")
    assert rc == 0, err
    run_dir = only_run_dir(tmp_path / "r")
    assert not (run_dir / "report.html").exists()
    assert lines[-2] == f"[RESULT] report directory: {run_dir} (report.json)"


def test_a_planted_link_is_not_followed_and_costs_only_a_warning(tmp_path: Path) -> None:
    """A link at report.html (planted before the run, in a run directory named by --run-id) is refused: the
    target is untouched, report.json is complete, the verdict and exit code are the run's own (a FAIL here,
    with its next steps)."""
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    run_dir = tmp_path / "r" / "planted-1"
    run_dir.mkdir(parents=True)
    (run_dir / "report.html").symlink_to(victim)
    rc, lines, err = _run(tmp_path, "--checks", "steady,boom", "--run-id", "planted-1")
    assert rc == 1, err
    assert victim.read_text() == "keep me" and (run_dir / "report.html").is_symlink()
    warning = next(ln for ln in lines if ln.startswith("[RESULT] warning: "))
    assert f"{run_dir / 'report.html'} not written" in warning and "symbolic link" in warning
    assert lines[-2] == f"[RESULT] report directory: {run_dir} (report.json)"
    assert lines[-1] == "[RESULT] FAILURE: boom"
    data = validate_report(run_dir / "report.json")
    boom = next(c for c in data["checks"] if c["name"] == "boom")
    assert boom["next_steps"]["commands"] == ["gpuaccept run --checks boom --verbose"]  # its log: not in details
    assert (run_dir / "logs" / "boom.log").is_file()
    assert f"[RESULT]   next:   less {run_dir}/logs/boom.log" in lines  # the console knows the run directory


def _copy_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "reports" / "20250101T000000Z-vm-0001"
    run_dir.mkdir(parents=True)
    shutil.copy(NODE_CPU, run_dir / "report.json")
    return run_dir


def test_report_writes_html_beside_the_report_not_in_the_current_directory(tmp_path: Path) -> None:
    run_dir = _copy_run(tmp_path)
    for ref in (str(run_dir), str(run_dir / "report.json")):
        proc = gpuaccept("report", ref)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.strip() == f"gpuaccept: wrote {run_dir / 'report.html'}"
        (run_dir / "report.html").unlink()
    other = tmp_path / "elsewhere.json"
    shutil.copy(NODE_CPU, other)
    proc = gpuaccept("report", str(other))
    assert proc.returncode == 0 and (tmp_path / "elsewhere.html").is_file()
    out = tmp_path / "out.html"
    proc = gpuaccept("report", str(run_dir), "-o", str(out))
    assert proc.returncode == 0 and out.is_file() and not (run_dir / "report.html").exists()


def test_report_by_run_id_writes_into_its_run_directory(tmp_path: Path) -> None:
    run_dir = _copy_run(tmp_path)
    run_id = validate_report(run_dir / "report.json")["run_id"]
    (run_dir.parent / run_id).mkdir()
    shutil.copy(NODE_CPU, run_dir.parent / run_id / "report.json")
    proc = gpuaccept("report", run_id, "--report-dir", str(run_dir.parent), "--db",
                     f"sqlite:///{tmp_path / 'none.db'}")
    assert proc.returncode == 0, proc.stderr
    assert (run_dir.parent / run_id / "report.html").is_file()


def test_report_refuses_a_directory_others_may_write_to(tmp_path: Path) -> None:
    run_dir = _copy_run(tmp_path)
    os.chmod(run_dir, 0o777)
    proc = gpuaccept("report", str(run_dir))
    assert proc.returncode == 2 and not (run_dir / "report.html").exists()
    assert proc.stderr.count("\n") == 1 and "writable by others" in proc.stderr and "--output" in proc.stderr


def test_report_of_a_cluster_run_and_of_one_of_its_hosts(tmp_path: Path) -> None:
    run_dir = tmp_path / "launch-1"
    run_dir.mkdir()
    shutil.copy(CLUSTER, run_dir / "cluster-report.json")
    assert gpuaccept("report", str(run_dir)).returncode == 0
    assert "gpu-node-03" in (run_dir / "cluster-report.html").read_text()
    proc = gpuaccept("report", str(run_dir / "cluster-report.json"), "--host", "gpu-node-03")
    assert proc.returncode == 0, proc.stderr
    page = (run_dir / "cluster-report-gpu-node-03.html").read_text()
    assert "nvidia-smi -q -d PERFORMANCE,POWER,CLOCK -i 5" in page  # the failed compute check's next step
