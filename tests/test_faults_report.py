"""Fault codes in every rendering: report.json (and its schema), the console lines, Markdown, JUnit (testcase
properties) and Prometheus (``gpuaccept_check_fault{code=...}``)."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from importlib import resources

import jsonschema

from gpuaccept.faults import with_fault
from gpuaccept.model import CheckResult, NodeReport, Status, Verdict
from gpuaccept.node.suite import PlannedCheck
from gpuaccept.report.console import PlainConsole, next_step_lines
from gpuaccept.report.junit import render_junit
from gpuaccept.report.markdown import render_markdown
from gpuaccept.report.prometheus import render_prometheus

XID79 = "cuda:2: XID 79 (GPU has fallen off the bus)"


def report() -> NodeReport:
    rep = NodeReport("r1", "gpu-node-7", "quick", "2026-11-28T10:00:00Z", "2026-11-28T10:01:00Z",
                     Verdict.FAILURE, device="cuda")
    rep.checks = [with_fault(CheckResult("env", Status.PASS, "ok")),
                  with_fault(CheckResult("health", Status.FAIL, XID79, duration_s=1.0)),
                  with_fault(CheckResult("disk_space", Status.FAIL, "/tmp: 1 GiB free < 10 GiB"))]
    return rep


def test_report_json_carries_the_fault_and_meets_the_schema() -> None:
    d = report().to_dict()
    schema = json.loads(resources.files("gpuaccept").joinpath("data", "report.schema.json").read_text())
    jsonschema.validate(d, schema)
    assert "fault" not in d["checks"][0]
    f = d["checks"][1]["fault"]
    assert f["code"] == "GA-XID-079" and f["action"] == "reboot_node" and f["devices"] == ["cuda:2"]
    assert f["ladder"] == ["reboot_node", "drain_for_service", "replace_part"] and f["origin"] == "node"
    assert d["checks"][2]["fault"]["code"] == "GA-DSK-001" and d["checks"][2]["fault"]["origin"] == "job"
    assert NodeReport.from_dict(d).checks[1].code == "GA-XID-079"


def test_console_line_and_next_steps_name_the_code() -> None:
    out = io.StringIO()
    rep = report()
    PlainConsole(out, {}).on_end(PlannedCheck("health", "", "HEALTH", {}, [], [], 10.0, None), rep.checks[1])
    assert out.getvalue().rstrip().endswith(f"- {XID79} [GA-XID-079, now: reboot_node]")
    lines = next_step_lines(rep, rep.checks[1])
    assert lines[0] == ("fault: GA-XID-079 GPU has fallen off the bus (critical, gpu, the node's fault): now "
                        "reboot_node; then drain_for_service, replace_part")
    assert next_step_lines(rep, rep.checks[0]) == []


def test_markdown_shows_the_code_before_the_reason() -> None:
    text = render_markdown(report())
    assert "`GA-XID-079` cuda:2: XID 79" in text and "`GA-DSK-001` /tmp" in text


def test_junit_testcase_properties_carry_the_code() -> None:
    root = ET.fromstring(render_junit(report()))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["health"].iter("property")}
    assert props == {"fault_code": "GA-XID-079", "fault_severity": "critical", "fault_origin": "node",
                     "fault_action": "reboot_node"}
    assert "FAULT: GA-XID-079" in (cases["health"].find("failure").text or "")  # type: ignore[union-attr]
    assert not list(cases["env"].iter("property"))


def test_prometheus_has_a_fault_series_with_the_code_label() -> None:
    text = render_prometheus(report())
    lines = [ln for ln in text.splitlines() if ln.startswith("gpuaccept_check_fault{")]
    assert lines == [
        'gpuaccept_check_fault{host="gpu-node-7",check="health",code="GA-XID-079",severity="critical",'
        'origin="node",action="reboot_node"} 1',
        'gpuaccept_check_fault{host="gpu-node-7",check="disk_space",code="GA-DSK-001",severity="major",'
        'origin="job",action="drain_for_service"} 1']
