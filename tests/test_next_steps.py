"""FAIL next steps: every row of the table fires on the failure it names, with the real values filled in, and is
shown in report.json (schema-valid), the console, Markdown and HTML."""

from __future__ import annotations

import fnmatch
import io
import json

import jsonschema
import pytest

from gpuaccept.checks import BUILTIN_MODULES, _checks_of
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold, Verdict
from gpuaccept.nextsteps import RULES, Rule, fill, next_steps
from gpuaccept.report.console import PlainConsole, RichConsole
from gpuaccept.report.html import render_html
from gpuaccept.report.markdown import render_markdown
from tests.helpers import SCHEMA

BUILTIN = {cls.name: cls for m in BUILTIN_MODULES for cls in _checks_of(m)}
ENV = CheckResult("env", Status.PASS, "8 GPUs", details={"nvml": {"gpus": [
    {"index": 5, "device": "cuda:2", "uuid": "GPU-5"}, {"index": 0, "device": "cuda:0", "uuid": "GPU-0"}]}})


def _metric_for(rule: Rule) -> str:
    """A metric the check declares that the rule's glob names (a glob that names none fails here)."""
    declared = BUILTIN[rule.check].metrics or ()
    glob = rule.kind.split("|")[0].split(":", 1)[1]
    names = [d for d in declared if "*" not in d and fnmatch.fnmatchcase(d, glob)]
    assert names, f"{rule.check} {rule.kind}: names no metric the check declares ({declared})"
    return names[0]


def _failing(rule: Rule) -> CheckResult:
    """A result of ``rule.check`` that fails the way ``rule.kind`` says, on CUDA device 2 (NVML index 5)."""
    name = rule.check if rule.check != "*" else "ddp_train"  # its own rule names one metric, not the first
    kind = rule.kind.split("|")[0].split(":", 1)  # of several kinds, the first
    if kind[0] == "metric":
        bad = Metric(_metric_for(rule), 7.0, "count", device="cuda:2", threshold=Threshold("<=", 0.0))
        return CheckResult(name, Status.FAIL, "missed", metrics=[bad])
    if kind[0] == "reason":  # the GPU named as the health check's reasons name it
        return CheckResult(name, Status.FAIL, f"cuda:2: problem: {kind[1].upper()} missing")
    if kind[0] == "timeout":
        return CheckResult(name, Status.ERROR, "timed out", details={"timeout": True, "log": "/r/logs/x.log"})
    if kind[0] == "error":
        return CheckResult(name, Status.ERROR, "raised", details={"log": "/r/logs/x.log"})
    others = [r for r in RULES if r.check == name and r.kind != "any"]
    concrete = [d for d in BUILTIN[name].metrics or () if "*" not in d and not any(  # a miss no other rule names
        fnmatch.fnmatchcase(d, k.split(":", 1)[1]) for r in others for k in r.kind.split("|") if k[:7] == "metric:")
    ][:1]
    bad = [Metric(n, 7.0, "count", device="cuda:2", threshold=Threshold("<=", 0.0)) for n in concrete]
    return CheckResult(name, Status.FAIL, "failed", metrics=bad, details={"log": "/r/logs/x.log"})


def _report(*checks: CheckResult, host: str = "gpu07") -> NodeReport:
    return NodeReport("20260101T000000Z-gpu07-abcd", host, "full", "2026-01-01T00:00:00Z", verdict=Verdict.FAILURE,
                      checks=[ENV, *checks])


@pytest.mark.parametrize("rule", RULES, ids=[f"{r.check}-{r.kind}" for r in RULES])
def test_every_rule_fires_on_its_failure_with_values_filled(rule: Rule) -> None:
    assert rule.check == "*" or rule.check in BUILTIN, f"{rule.check}: no such built-in check"
    result = _failing(rule)
    steps = next_steps(result, _report(result))
    assert steps is not None
    values = {"host": "gpu07", "gpu": "5", "ordinal": "2", "check": result.name, "nodes": "gpu07,OTHER_NODES",
              "log": "/r/logs/x.log", "run_id": "20260101T000000Z-gpu07-abcd"}
    for cause in rule.causes:
        assert fill(cause, values) in steps["causes"]
    for command in rule.commands:
        assert fill(command, values) in steps["commands"]
    assert not any("{" in s or "[" in s for s in steps["causes"] + steps["commands"])


def test_a_memory_failure_names_the_gpu_by_its_nvidia_smi_index() -> None:
    bad = Metric("ecc_volatile_uncorrectable", 3, "count", device="cuda:2", threshold=Threshold("<=", 0.0))
    steps = next_steps(CheckResult("health", Status.FAIL, "ECC", metrics=[bad]), _report())
    assert steps is not None
    assert steps["commands"][:2] == ["nvidia-smi -q -d ECC -i 5", "nvidia-smi -q -d ROW_REMAPPER -i 5"]


def test_without_a_device_the_optional_part_is_dropped_and_a_missing_value_drops_the_command() -> None:
    steps = next_steps(CheckResult("memtest", Status.FAIL, "bad", metrics=[
        Metric("memtest_errors", 4, "count", threshold=Threshold("<=", 0.0))]))
    assert steps is not None
    assert "nvidia-smi -q -d ECC" in steps["commands"]
    assert "gpuaccept run --checks memtest --profile full" in steps["commands"]
    error = next_steps(CheckResult("compute", Status.ERROR, "raised"))  # no log known: no 'less' command
    assert error is not None and not any(c.startswith("less") for c in error["commands"])


def test_a_timeout_gets_both_the_checks_own_and_the_timeout_steps() -> None:
    r = CheckResult("collectives", Status.ERROR, "timed out", details={"timeout": True, "log": "/r/c.log"})
    steps = next_steps(r, _report(r), hosts=["gpu07", "gpu08", "gpu09"])
    assert steps is not None
    assert "gpuaccept isolate --nodes gpu07,gpu08,gpu09 --per-rail" in steps["commands"]
    assert "less /r/c.log" in steps["commands"] and "gpuaccept run --checks collectives --timeout-scale 2" in \
        steps["commands"]


def test_pass_warn_and_skip_get_none_and_a_warn_bound_is_no_cause() -> None:
    warm = Metric("temperature_c", 90, "C", device="cuda:0", threshold=Threshold("<=", 85.0, Status.WARN))
    for status in (Status.PASS, Status.WARN, Status.SKIP):
        assert next_steps(CheckResult("health", status, "x", metrics=[warm])) is None
    # a FAIL whose only missed bound is a WARN one falls back to the check's generic steps
    steps = next_steps(CheckResult("health", Status.FAIL, "x", metrics=[warm], details={"log": "/l"}))
    assert steps is not None and steps["commands"] == ["nvidia-smi -q -d ECC,PERFORMANCE", "dmesg -T | grep -i xid",
                                                       "less /l", "gpuaccept run --checks health --verbose"]


def test_report_json_carries_next_steps_per_failed_check_and_validates() -> None:
    bad = CheckResult("memtest", Status.FAIL, "2 bad words", metrics=[
        Metric("memtest_errors", 2, "count", device="cuda:2", threshold=Threshold("<=", 0.0))])
    ok = CheckResult("train", Status.PASS, "fine")
    data = json.loads(json.dumps(_report(bad, ok).to_dict()))
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    by_name = {c["name"]: c for c in data["checks"]}
    assert "next_steps" not in by_name["train"] and "next_steps" not in by_name["env"]
    assert "nvidia-smi -q -d ECC -i 5" in by_name["memtest"]["next_steps"]["commands"]
    assert NodeReport.from_dict(data).to_dict() == data  # derived: read back and written again unchanged


def test_console_markdown_and_html_show_the_steps_under_the_failure() -> None:
    bad = CheckResult("memtest", Status.FAIL, "2 bad words", metrics=[
        Metric("memtest_errors", 2, "count", device="cuda:2", threshold=Threshold("<=", 0.0))])
    report = _report(bad)
    out = io.StringIO()
    PlainConsole(out, {}).summary(report, {}, "report directory: /r (report.json)")
    lines = out.getvalue().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("[RESULT] memtest"))
    assert lines[at + 1].startswith("[RESULT]   likely: GPU memory returned wrong data on GPU 5")
    assert "[RESULT]   next:   nvidia-smi -q -d ECC -i 5" in lines
    assert lines[-2:] == ["[RESULT] report directory: /r (report.json)", "[RESULT] FAILURE: memtest"]
    md = render_markdown(report)
    assert "### Next steps" in md and "- run: `nvidia-smi -q -d ECC -i 5`" in md
    html = render_html(report)
    assert '<div class="next-steps" data-check="memtest">' in html and "<code>nvidia-smi -q -d ECC -i 5</code>" in html


def test_the_terminal_table_is_followed_by_the_steps_the_directory_and_the_verdict() -> None:
    bad = CheckResult("memtest", Status.FAIL, "2 bad words", metrics=[
        Metric("memtest_errors", 2, "count", device="cuda:2", threshold=Threshold("<=", 0.0))])
    out = io.StringIO()
    console = RichConsole(out, {})
    console.run_dir = "/r/run-1"
    console.summary(_report(bad), {}, "report directory: /r/run-1 (report.json, report.html)")
    tail = [ln.strip() for ln in out.getvalue().splitlines()]
    at = tail.index("memtest next steps:")
    assert tail[at + 1].startswith("likely: GPU memory returned wrong data on GPU 5")
    assert "next:   nvidia-smi -q -d ECC -i 5" in tail[at:]
    assert tail[-2:] == ["report directory: /r/run-1 (report.json, report.html)", "[RESULT] FAILURE: memtest"]


@pytest.mark.parametrize(("reason", "cause", "command"), [
    ("cuda:2: 2 volatile uncorrectable ECC error(s)", "uncorrectable ECC errors",
     "nvidia-smi -q -d ECC -i 5"),
    ("cuda:2: XID 79 x2 (GPU has fallen off the bus)", "Xid errors", "dmesg -T | grep -i -e xid -e nvrm"),
    ("cuda:2: HW thermal slowdown, HW power brake", "HW thermal slowdown",
     "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i 5"),
    ("cuda:0: HW slowdown (9/10 samples)", "clocks held down", "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i 0"),
    ("cuda:2: page retirement pending (reset the GPU)", "retired memory pages",
     "nvidia-smi -q -d PAGE_RETIREMENT -i 5"),
    ("cuda:2: row remapping failed (no spare rows: RMA candidate)", "RMA candidate",
     "nvidia-smi -q -d ROW_REMAPPER -i 5"),
    ("cuda:2: NVML: GPU is lost", "fell off the bus", "lspci -d 10de:"),
    ("cuda:2: PCIe x8 < x16 max", "PCIe link", "nvidia-smi -q -d PCI -i 5"),
    ("cuda:2: NVLink 2/18 link(s) down (3,7)", "NVLink", "nvidia-smi nvlink --status -i 5"),
    ("cuda:2: something no rule names", "Xid errors, hardware throttling", "nvidia-smi -q -d ECC,PERFORMANCE -i 5"),
    ("GPU required (--require-gpu): NVML not available: NVML Shared Library Not Found", "no NVIDIA driver loaded",
     "lsmod | grep nvidia"),
])
def test_a_health_failure_says_the_causes_and_commands_of_its_kind(reason: str, cause: str, command: str) -> None:
    """The health check's reasons (as it writes them, often with no metric over a bound): concrete causes and
    commands for the GPU the reason names, never the bare fallback "see the reason above"."""
    steps = next_steps(CheckResult("health", Status.FAIL, reason), _report())
    assert steps is not None
    assert any(cause in c for c in steps["causes"]), steps
    assert command in steps["commands"], steps
    assert "see the reason above" not in steps["causes"]
