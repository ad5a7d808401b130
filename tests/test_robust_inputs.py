"""Hostile environments are bad input (exit 2, one line), never an internal error: a plugin that raises, has a
SyntaxError or calls sys.exit when imported; a host name that cannot name a report directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, gpuaccept
from tests.launch_support import one_error_line

PLUGINS = {
    "plug_raises": ("raise ValueError('no licence server')\n", "'plug_raises': ValueError: no licence server"),
    "plug_syntax": ("def broken(:\n    pass\n", "'plug_syntax': SyntaxError: "),
    "plug_exits": ("import sys\nsys.exit(3)\n", "'plug_exits': it called sys.exit(3) when imported"),
}


@pytest.mark.parametrize("name", sorted(PLUGINS))
@pytest.mark.parametrize("command", [["run", "--checks", "steady"], ["healthcheck", "--skip", "env,compute"]])
def test_a_broken_plugin_is_one_line_and_exit_2(tmp_path: Path, name: str, command: list[str]) -> None:
    text, words = PLUGINS[name]
    (tmp_path / f"{name}.py").write_text(text)
    r = gpuaccept(*command, "--device", "cpu", "--report-dir", str(tmp_path / "rep"),
                  PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}", GPUACCEPT_PLUGINS=f"tests.plugins.fake_checks,{name}")
    line = one_error_line(r)
    assert f"cannot import check module {words}" in line and "internal error" not in line, line
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("command", [["run", "--checks", "steady"], ["healthcheck", "--skip", "env,compute"]])
def test_a_host_name_that_cannot_name_a_directory_is_exit_2(tmp_path: Path, command: list[str]) -> None:
    r = gpuaccept(*command, "--device", "cpu", "--report-dir", str(tmp_path / "rep"), GPUACCEPT_HOSTNAME="a" * 300)
    line = one_error_line(r)
    assert "cannot name a report directory" in line and "set GPUACCEPT_HOSTNAME" in line, line
    assert len(line) < 300


@pytest.mark.parametrize(("host", "safe"), [("../../etc", "etc"), ("gpu 01", "gpu-01")])
@pytest.mark.parametrize("command", [["run", "--checks", "steady"], ["healthcheck", "--skip", "env,compute"]])
def test_a_host_name_from_the_environment_is_made_safe_and_stays_in_the_report_directory(
        tmp_path: Path, host: str, safe: str, command: list[str]) -> None:
    """A host name from the environment is made safe (as it would be read back), never a path out of the report
    directory (``argtypes.host_part``)."""
    rep = tmp_path / "rep"
    r = gpuaccept(*command, "--device", "cpu", "--report-dir", str(rep), GPUACCEPT_HOSTNAME=host)
    assert r.returncode != 2 and "Traceback" not in r.stderr, r.stderr
    reports = list(rep.glob("*/report.json"))
    assert reports and {json.loads(p.read_text())["host"] for p in reports} == {safe}, reports
    assert all(p.resolve().is_relative_to(rep.resolve()) for p in tmp_path.rglob("*") if p != rep), \
        sorted(tmp_path.rglob("*"))
