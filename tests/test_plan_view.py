"""``run --plan`` for a person and for scripts; the profiles' expected durations and the DCGM/nccl-tests/gpu-burn
counterparts kept as data."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaccept.argtypes import fmt_s
from gpuaccept.checks import BUILTIN_MODULES, _checks_of
from gpuaccept.cliargs import PROFILES as CLI_PROFILES
from gpuaccept.equivalents import CHECKS, EXPECTED_GPUS, PROFILES, profile_help
from gpuaccept.node.budget import RUN_OVERHEAD_S, candidates, estimates_of
from gpuaccept.node.config import Config
from gpuaccept.node.suite import RunOptions, plan_suite
from gpuaccept.report.plan_view import plan_lines
from tests.helpers import ROOT, cli_env, gpuaccept

BUILTIN = {cls.name: cls for m in BUILTIN_MODULES for cls in _checks_of(m)}


def test_every_builtin_check_has_a_counterpart_entry() -> None:
    assert set(CHECKS) == set(BUILTIN)
    for name, eq in CHECKS.items():
        assert eq.tool, f"{name}: says nothing it replaces"


@pytest.mark.parametrize("profile", CLI_PROFILES)
def test_profile_expected_seconds_are_the_built_in_estimates_for_8_gpus(profile: str) -> None:
    reg = {**BUILTIN}
    plan = plan_suite(RunOptions(profile=profile), Config(), reg, "cuda")  # type: ignore[arg-type]
    estimates = estimates_of(candidates(plan, Config(), reg, EXPECTED_GPUS))  # type: ignore[arg-type]
    assert set(estimates) == {c.name for c in plan.checks}  # every built-in check of it has an estimate
    assert PROFILES[profile].expected_s == round(sum(estimates.values()) + RUN_OVERHEAD_S)
    assert PROFILES[profile].dcgm_level == {"quick": "r1", "standard": "r2", "full": "r3", "burnin": "r4"}[profile]


def test_profile_help_names_duration_and_level() -> None:
    assert profile_help("quick") == "quick: about 3 min on an 8-GPU node (like DCGM r1)"
    proc = gpuaccept("run", "--help")
    assert proc.returncode == 0
    assert "standard: about 15 min on an 8-GPU node (like DCGM r2)" in " ".join(proc.stdout.split())


def _plan_json(*args: str) -> dict[str, object]:
    proc = gpuaccept("run", "--plan", "--profile", "quick", "--device", "cpu", "--no-history", *args)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, object] = json.loads(proc.stdout)
    return data


def test_piped_plan_is_json_as_before_with_expected_seconds_added() -> None:
    data = _plan_json()
    assert {"profile", "device", "checks", "nproc"} <= set(data)  # what scripts parsed before
    checks = data["checks"]
    assert isinstance(checks, list) and all({"name", "params", "timeout_s", "thresholds"} <= set(c) for c in checks)
    expected = [c["expected_s"] for c in checks]
    assert all(isinstance(x, float) and x > 0 for x in expected)
    assert data["expected_total_s"] == pytest.approx(RUN_OVERHEAD_S + sum(expected), abs=0.1)
    assert data["profile_expected"] == {"expected_s": PROFILES["quick"].expected_s, "gpus": 8,
                                        "dcgm": "like DCGM r1: " + PROFILES["quick"].dcgm_note}


def test_plan_json_to_a_file_and_a_table_on_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    main, sub = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "gpuaccept", "run", "--plan", "--profile", "quick", "--device",
                           "cpu", "--no-history", "--json", str(out)], stdin=sub, stdout=sub,
                          stderr=subprocess.PIPE, env=cli_env(COLUMNS="200"), cwd=ROOT, timeout=120)
    os.close(sub)
    text = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        text += chunk
    os.close(main)
    assert proc.returncode == 0, proc.stderr
    lines = text.decode().replace("\r\n", "\n").splitlines()
    data = json.loads(out.read_text())
    assert lines[0] == f"profile quick on cpu, {len(data['checks'])} checks (CPU only: no GPU is tested)"
    assert lines[1].split() == ["check", "depth", "/", "parameters", "expected", "timeout"]
    assert [ln.split()[0] for ln in lines[2:2 + len(data["checks"])]] == [c["name"] for c in data["checks"]]
    most = fmt_s(sum(c["timeout_s"] for c in data["checks"]))
    assert any(ln.startswith("expected: about ") and f"at most {most} " in ln for ln in lines), (most, lines)


def test_plan_lines_mark_checks_without_an_estimate() -> None:
    plan = {"profile": "standard", "device": "cuda", "expected_total_s": 20.0,
            "checks": [{"name": "env", "params": {"pci_root": "/"}, "timeout_s": 60.0, "expected_s": 10.2},
                       {"name": "mine", "params": {}, "timeout_s": 300.0, "expected_s": None}]}
    lines = plan_lines(plan)
    assert lines[0] == "profile standard on cuda, 2 checks"
    assert lines[2].split() == ["env", "pci_root=/", "~11s", "1m"]
    assert lines[3].split() == ["mine", "-", "unknown", "5m"]
    assert lines[4] == "expected: about 20s here, the run's start included (1 without an estimate: mine); " \
                       "at most 6m (every check to its timeout)"


def test_checks_lists_each_builtin_checks_counterpart() -> None:
    proc = gpuaccept("checks", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    for name, eq in CHECKS.items():
        assert rows[name]["replaces"] == {"dcgm": eq.dcgm, "tool": eq.tool, "note": eq.note}
    assert rows["steady"]["replaces"] is None  # a plugin's check: nothing claimed for it
    text = gpuaccept("checks").stdout
    assert "    replaces: gpu-burn -d DURATION; DCGM diag plugin: targeted_stress; targeted_power" in text
