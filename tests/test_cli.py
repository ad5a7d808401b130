"""End-to-end tests of the CLI: exit codes, report schema, non-TTY output, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli_env, gpuaccept, only_run_dir, validate_report


def test_passing_run_exits_0_with_prefixed_plain_lines_and_a_valid_report(tmp_path: Path) -> None:
    out_json = tmp_path / "copy.json"
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(tmp_path / "rep"),
                  "--json", str(out_json))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("[COMPUTE] steady: PASS") for line in lines)
    assert lines[-1].startswith("[RESULT] SUCCESS (CPU only: ")  # --device cpu: never read as a GPU acceptance
    assert "\x1b[" not in r.stdout  # no terminal escapes in logs
    run_dir = only_run_dir(tmp_path / "rep")
    report = validate_report(run_dir / "report.json")
    assert report["verdict"] == "success" and report["checks"][0]["metrics"][0]["value"] == 10.0
    assert json.loads(out_json.read_text()) == report
    assert (run_dir / "results.jsonl").read_text().count("\n") == 1


def test_failing_check_exits_1_and_names_it(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady,boom", "--report-dir", str(tmp_path))
    assert r.returncode == 1
    assert r.stdout.splitlines()[-1] == "[RESULT] FAILURE: boom"


def test_json_to_stdout_keeps_progress_on_stderr(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(tmp_path), "--json", "-")
    assert r.returncode == 0
    assert json.loads(r.stdout)["verdict"] == "success"
    assert "[RESULT] SUCCESS" in r.stderr


def test_require_gpu_on_a_cpu_node_fails(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--checks", "gpuonly", "--report-dir", str(tmp_path))
    assert r.returncode == 5 and "gpuonly: SKIP" in r.stdout  # skipped: nothing measured
    r = gpuaccept("run", "--device", "cpu", "--checks", "gpuonly", "--require-gpu", "--report-dir", str(tmp_path))
    assert r.returncode == 1 and "GPU required" in r.stdout


def test_plan_prints_json_and_runs_nothing(tmp_path: Path) -> None:
    r = gpuaccept("run", "--device", "cpu", "--profile", "quick", "--plan", "--report-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["profile"] == "quick" and plan["checks"] and not list(tmp_path.iterdir())


def _one_clean_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(("yaml_text", "words"), [
    ("profile: quick\nchecks:\n  steady:\n    params: {value: fast}\n", "checks.steady.params.value"),
    ("checks:\n  nosuch: {}\n", "checks.nosuch: unknown check"),
    ("thresholds: []\n", "thresholds: unknown key"),
    ("checks: [\n", "invalid YAML"),
    ("checks:\n  steady:\n    thresholds:\n      - {metric: steady_value, min: 1, eval: 'x>1'}\n", "eval"),
])
def test_malformed_config_exits_2_with_one_line(tmp_path: Path, yaml_text: str, words: str) -> None:
    cfg = tmp_path / "gpuaccept.yaml"
    cfg.write_text(yaml_text)
    line = _one_clean_error_line(gpuaccept("run", "--device", "cpu", "--config", str(cfg),
                                           "--report-dir", str(tmp_path / "r")))
    assert str(cfg) in line and words in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args", [
    ["run", "--profile", "turbo"],
    ["run", "--checks", "nosuch"],
    ["run", "--skip", "nosuch"],
    ["run", "--gpus", "0,a"],
    ["run", "--timeout-scale", "-1"],
    ["run", "--expect-gpus", "many"],
    ["run", "--bogus"],
    ["frobnicate"],
])
def test_bad_usage_exits_2_with_one_line(args: list[str], tmp_path: Path) -> None:
    line = _one_clean_error_line(gpuaccept(*args, "--report-dir", str(tmp_path)) if args[0] == "run"
                                 else gpuaccept(*args))
    assert line.startswith("gpuaccept: error:")


def test_config_thresholds_judge_the_run(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  steady:\n    thresholds:\n      - {metric: steady_value, min: 50, severity: warn}\n")
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--config", str(cfg), "--report-dir",
                  str(tmp_path / "r"))
    assert r.returncode == 0 and "steady: WARN" in r.stdout  # warnings do not fail the node
    metric = validate_report(only_run_dir(tmp_path / "r") / "report.json")["checks"][0]["metrics"][0]
    assert metric["threshold"] == {"op": ">=", "value": 50.0, "severity": "warn", "source": str(cfg)}


def test_checks_lists_parameters_and_thresholds() -> None:
    r = gpuaccept("checks", "--json")
    assert r.returncode == 0
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert {"env", "health", "fabric", "compute", "memory", "memtest", "train", "nbody"} <= set(rows)
    assert rows["steady"]["params"][0]["name"] == "value"
    assert rows["steady"]["thresholds"] == ["steady_value >= 5 (fail)"]
    text = gpuaccept("checks").stdout
    assert "compute [COMPUTE]" in text


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["checks"]])
def test_help_and_listing_do_not_import_torch(argv: list[str]) -> None:
    code = (f"import sys\nfrom gpuaccept.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint('clean')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("clean")


def test_quick_profile_on_cpu_runs_every_builtin_check_and_skips_gpu_only_ones(tmp_path: Path) -> None:
    r = gpuaccept("run", "--profile", "quick", "--device", "cpu", "--report-dir", str(tmp_path), timeout=300,
                  GPUACCEPT_PLUGINS="")
    assert r.returncode == 0, r.stdout + r.stderr
    report = validate_report(only_run_dir(tmp_path) / "report.json")
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert {"env", "health", "fabric", "compute", "memory", "memtest", "train", "nbody"} <= set(statuses)
    assert statuses["health"] == "skip" and "NVML" in next(c["reason"] for c in report["checks"]
                                                          if c["name"] == "health")
    assert statuses["fabric"] == "skip" or Path("/sys/class/infiniband").exists(), statuses  # no RDMA here
    assert all(s == "pass" for n, s in statuses.items() if n not in ("health", "fabric")), statuses
    by_name = {c["name"]: c for c in report["checks"]}
    assert any(m["name"] == "gemm_fp32_tflops" and m["value"] > 0 for m in by_name["compute"]["metrics"])
    assert report["device"] == "cpu" and report["verdict"] == "success"
    for tag in ("[ENV]", "[HEALTH]", "[COMPUTE]", "[MEMORY]", "[TRAIN]", "[RESULT]"):
        assert any(line.startswith(tag) for line in r.stdout.splitlines()), tag


def test_terminal_output_is_a_rich_table_with_the_result_line(tmp_path: Path) -> None:
    import os
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpuaccept", "run", "--device", "cpu", "--checks", "steady,boom",
                             "--report-dir", str(tmp_path)], stdout=follower, stderr=follower,
                            env=cli_env(COLUMNS="120", TERM="xterm"), cwd=ROOT)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO once the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 1
    text = b"".join(chunks).decode(errors="replace")
    assert "\x1b[" in text  # styled for a terminal
    assert "key metric" in text and "steady_value=10 GB/s" in text
    assert "[RESULT] FAILURE: boom" in text


def test_runs_are_stored_in_the_history_unless_told_not_to(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(tmp_path / "r"),
                  "--db", f"sqlite:///{db}")
    assert r.returncode == 0 and "stored run" in r.stderr
    run_id = only_run_dir(tmp_path / "r").name
    h = gpuaccept("history", "--db", f"sqlite:///{db}", "--json")
    assert [x["run_id"] for x in json.loads(h.stdout)] == [run_id]
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(tmp_path / "r2"),
                  "--db", f"sqlite:///{tmp_path / 'other.db'}", "--no-history")
    assert r.returncode == 0 and not (tmp_path / "other.db").exists()


def test_an_unwritable_history_costs_a_warning_not_the_report(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    foreign.write_bytes(b"this is not a database" * 100)
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(tmp_path / "r"),
                  "--db", f"sqlite:///{foreign}")
    assert r.returncode == 0
    assert "warning: not stored in the history" in r.stderr and "report is in" in r.stderr
    assert validate_report(only_run_dir(tmp_path / "r") / "report.json")["verdict"] == "success"
    assert foreign.read_bytes() == b"this is not a database" * 100


BASELINE = """schema: 1
source: {created: '2026-11-01T00:00:00Z', nodes: 40, runs: 40}
skus:
  cpu:
    metrics:
      - {metric: steady_value, value: 100.0, unit: GB/s, mad: 1.0, n: 40}
"""


def test_a_baseline_judges_the_run_and_a_bad_one_is_refused_before_anything_runs(tmp_path: Path) -> None:
    base = tmp_path / "baseline.yaml"
    base.write_text(BASELINE)
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(tmp_path / "r"),
                  "--baseline", str(base), "--no-history")
    assert r.returncode == 1, r.stdout + r.stderr  # 10 GB/s against a fleet at 100 GB/s
    check = validate_report(only_run_dir(tmp_path / "r") / "report.json")["checks"][0]
    metric = check["metrics"][0]
    assert check["status"] == "fail" and metric["expected"] == 100.0
    assert metric["threshold"]["source"].startswith("baseline")
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASELINE.replace("value: 100.0", "value: fast"))
    line = _one_clean_error_line(gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir",
                                           str(tmp_path / "r2"), "--baseline", str(bad)))
    assert str(bad) in line and "value" in line
    assert not (tmp_path / "r2").exists()


def test_an_unusable_report_directory_is_bad_input(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    r = gpuaccept("run", "--device", "cpu", "--checks", "steady", "--report-dir", str(not_a_dir), "--no-history")
    line = _one_clean_error_line(r)
    assert "cannot write the report directory" in line and str(not_a_dir) in line
