"""``node-status label|daemonset|npd`` (issue 28: modes that are really separate commands), and the forms before
the actions, kept for one release with a deprecation line: the real CLI, old and new forms side by side."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuaccept.health.nodestatus_legacy import legacy_form
from tests.helpers import gpuaccept
from tests.report_data import write_json
from tests.store_reports import node_report

NOTE = "gpuaccept: warning: 'node-status' without an action is deprecated and goes in the next release; this is "


@pytest.mark.parametrize(("old", "new"), [
    (["node-status", "--report", "r.json", "--apply"], ["node-status", "label", "--report", "r.json", "--apply"]),
    (["node-status", "--profile", "quick", "--plan"], ["node-status", "label", "--profile", "quick", "--plan"]),
    (["node-status", "--daemonset", "--image", "i", "--profile", "quick"],
     ["node-status", "daemonset", "--image", "i", "--profile", "quick"]),
    (["node-status", "--profile", "quick", "--npd-config", "d", "--npd-interval", "1h", "--npd-timeout=5m"],
     ["node-status", "npd", "d", "--profile", "quick", "--invoke-interval", "1h", "--timeout=5m"]),
    (["node-status", "--npd-config=d", "--report", "r", "--npd-plugin-path", "/p.sh"],
     ["node-status", "npd", "d", "--report", "r", "--plugin-path", "/p.sh"]),
])
def test_old_forms_are_rewritten_with_one_deprecation_line(old: list[str], new: list[str]) -> None:
    said: list[str] = []
    assert legacy_form(old, said.append) == new
    assert len(said) == 1 and said[0].startswith(NOTE) and f"node-status {new[1]}" in said[0]


@pytest.mark.parametrize("argv", [
    ["node-status"], ["node-status", "--help"], ["node-status", "-h"], ["node-status", "label", "--apply"],
    ["node-status", "daemonset", "--image", "i"], ["node-status", "npd", "d"], ["run", "--daemonset"], [],
])
def test_new_forms_and_other_commands_are_left_alone(argv: list[str]) -> None:
    said: list[str] = []
    assert legacy_form(argv, said.append) == argv and said == []


def _report(tmp_path: Path) -> str:
    return str(write_json(tmp_path / "r.json", node_report("gpu-1", "r1", fail=True)))


def test_label_old_and_new_forms_print_the_same_verdict(tmp_path: Path) -> None:
    report = _report(tmp_path)
    new = gpuaccept("node-status", "label", "--report", report, "--node", "gpu-1", "--summary", "--taint")
    old = gpuaccept("node-status", "--report", report, "--node", "gpu-1", "--summary", "--taint")
    assert new.returncode == old.returncode == 1  # the report failed: exit 1, the change printed, nothing sent
    assert new.stdout == old.stdout and new.stdout.startswith("node gpu-1: fail: ")
    assert new.stderr == ""
    assert old.stderr == NOTE + "'gpuaccept node-status label ...'\n"


def test_daemonset_old_and_new_forms_print_the_same_manifests() -> None:
    args = ["--image", "reg.example.com/gpuaccept:1", "--profile", "quick", "--taint", "--interval", "15m"]
    new = gpuaccept("node-status", "daemonset", *args)
    old = gpuaccept("node-status", "--daemonset", *args)
    assert new.returncode == old.returncode == 0, old.stderr
    assert new.stdout == old.stdout and "node-status label --apply" in new.stdout
    assert "kind: DaemonSet" in new.stdout and old.stderr == NOTE + "'gpuaccept node-status daemonset ...'\n"


def test_npd_old_and_new_forms_write_the_same_files(tmp_path: Path) -> None:
    new = gpuaccept("node-status", "npd", str(tmp_path / "new"), "--report", "/var/lib/gpuaccept/latest",
                    "--invoke-interval", "1h", "--timeout", "20m")
    old = gpuaccept("node-status", "--npd-config", str(tmp_path / "old"), "--report", "/var/lib/gpuaccept/latest",
                    "--npd-interval", "1h", "--npd-timeout", "20m")
    assert new.returncode == old.returncode == 0, old.stderr
    assert old.stderr == NOTE + "'gpuaccept node-status npd DIR ...'\n"
    for name in ("gpuaccept-monitor.json", "gpuaccept-plugin.sh"):
        assert (tmp_path / "new" / name).read_text() == (tmp_path / "old" / name).read_text()
    cfg = json.loads((tmp_path / "new" / "gpuaccept-monitor.json").read_text())
    assert cfg["pluginConfig"]["invoke_interval"] == "1h" and cfg["pluginConfig"]["timeout"] == "20m"
    assert "node-status label --summary" in (tmp_path / "new" / "gpuaccept-plugin.sh").read_text()


def test_each_action_has_its_own_short_help() -> None:
    top = gpuaccept("node-status", "--help")
    assert top.returncode == 0
    lines = top.stdout.splitlines()
    assert len(lines) < 30, top.stdout  # was 110 lines for three modes in one
    for action in ("label", "daemonset", "npd"):
        assert any(line.split()[:1] == [action] for line in lines), action
    helps = {a: gpuaccept("node-status", a, "--help").stdout for a in ("label", "daemonset", "npd")}
    flags = {a: set(re.findall(r"^  (--[a-z-]+)", text, re.M)) for a, text in helps.items()}
    assert {"--apply", "--report", "--node", "--summary", "--taint", "--plan"} <= flags["label"]
    assert {"--image", "--interval", "--node-selector", "--taint", "--plan"} <= flags["daemonset"]
    assert {"--report", "--plugin-path", "--invoke-interval", "--timeout", "--plan"} <= flags["npd"]
    assert not flags["label"] & {"--image", "--interval", "--node-selector", "--invoke-interval", "--plugin-path"}
    assert not flags["daemonset"] & {"--apply", "--report", "--node", "--summary", "--invoke-interval"}
    assert not flags["npd"] & {"--apply", "--taint", "--image", "--node-selector", "--summary"}
    for action, text in helps.items():
        assert f"gpuaccept node-status {action} " in text.split("examples:")[1], action
