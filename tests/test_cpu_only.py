"""A run that used no GPU says "CPU only" wherever its verdict is shown; GPUs on the bus that cannot be used fail it.

The runs are real (``gpuaccept run`` in a subprocess), pointed at recorded sysfs trees with the env check's
``pci_root``; the renderers read the NodeReport and ClusterReport they write.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
from prometheus_client.parser import text_string_to_metric_families

from gpuaccept.health.nodepatch import verdict_from_report
from gpuaccept.launch.gather import summary_lines
from gpuaccept.model import ClusterReport, NodeEntry, NodeReport, NodeState, Verdict
from gpuaccept.report.console import result_line
from gpuaccept.report.html import render_html
from gpuaccept.report.junit import render_junit
from gpuaccept.report.markdown import render_markdown
from gpuaccept.report.prometheus import render_prometheus
from tests.helpers import SCHEMA, gpuaccept, only_run_dir, validate_report

SYSFS = Path(__file__).parent / "data" / "sysfs"


def run_on(tree: str, tmp_path: Path) -> tuple[int, list[str], dict]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"checks:\n  env:\n    params: {{pci_root: '{SYSFS / tree}'}}\n")
    r = gpuaccept("run", "--profile", "quick", "--checks", "env,steady", "--config", str(cfg),
                  "--report-dir", str(tmp_path / "rep"), timeout=180)
    return r.returncode, r.stdout.splitlines(), validate_report(only_run_dir(tmp_path / "rep") / "report.json")


def test_no_gpu_on_the_bus_is_a_cpu_only_success(tmp_path: Path) -> None:
    rc, lines, report = run_on("no_gpu", tmp_path)
    assert rc == 0, lines
    assert lines[-1] == "[RESULT] SUCCESS (CPU only: this node has no GPU)"
    assert any(line.startswith("[ENV] env: PASS") and "CPU only: this node has no GPU" in line for line in lines)
    assert report["verdict"] == "success" and report["cpu_only"] == "this node has no GPU"


def test_gpus_on_the_bus_without_nvml_fail(tmp_path: Path) -> None:
    """This machine has no NVML and a CPU torch: a node whose 8 GPUs are on the bus but unusable."""
    rc, lines, report = run_on("gpu_8x", tmp_path)
    assert rc == 1, lines
    assert lines[-1] == "[RESULT] FAILURE: env"
    env_line = next(line for line in lines if line.startswith("[ENV] env: FAIL"))
    assert "8 NVIDIA GPUs on the PCI bus but NVML is not available" in env_line
    assert report["cpu_only"] == "the node's 8 NVIDIA GPUs cannot be used (see env)"


def node(cpu_only: str | None, host: str = "n1", verdict: Verdict = Verdict.SUCCESS) -> NodeReport:
    return NodeReport("r1", host, "quick", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", verdict, device="cpu",
                      cpu_only=cpu_only)


def test_every_renderer_says_cpu_only() -> None:
    rep = node("this node has no GPU")
    doc = rep.to_dict()
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert NodeReport.from_dict(doc).cpu_only == "this node has no GPU"
    assert result_line(rep) == "[RESULT] SUCCESS (CPU only: this node has no GPU)"
    assert render_markdown(rep).splitlines()[0] == "## ✅ gpuaccept: **SUCCESS** (CPU only: this node has no GPU)"
    html = render_html(rep)
    assert 'data-cpu-only="1"' in html and '<div id="cpu-only" class="cpu-only">CPU only: this node has no GPU' in html
    props = {p.get("name"): p.get("value") for p in ET.fromstring(render_junit(rep)).iter("property")}
    assert props["cpu_only"] == "this node has no GPU" and props["verdict"] == "success"
    samples = {f.name: f.samples for f in text_string_to_metric_families(render_prometheus(rep))}
    assert [(s.labels["host"], s.value) for s in samples["gpuaccept_node_cpu_only"]] == [("n1", 1.0)]
    assert verdict_from_report(rep, "n1", "now").reason.startswith("CPU only: this node has no GPU; ")
    gpu_run = node(None)
    assert "cpu_only" not in gpu_run.to_dict() and result_line(gpu_run) == "[RESULT] SUCCESS"
    assert "data-cpu-only=" not in render_html(gpu_run) and "CPU only" not in render_markdown(gpu_run)
    samples = {f.name: f.samples for f in text_string_to_metric_families(render_prometheus(gpu_run))}
    assert [s.value for s in samples["gpuaccept_node_cpu_only"]] == [0.0]


def test_the_cluster_verdict_names_the_cpu_only_nodes() -> None:
    cluster = ClusterReport("c1", "slurm", "2026-01-01T00:00:00Z", expected_nodes=2, nodes=[
        NodeEntry("n1", NodeState.REPORTED, node("this node has no GPU", "n1")),
        NodeEntry("n2", NodeState.REPORTED, node(None, "n2"))])
    lines = summary_lines(cluster)
    assert lines[-1] == "[RESULT] SUCCESS (CPU only on 1 of 2 node(s): n1)"
    assert "[NODE] n1: SUCCESS (CPU only: this node has no GPU) - 0 check(s)" in lines
    assert "CPU only on 1 of 2 node(s): n1" in render_markdown(cluster).splitlines()[0]
    assert 'data-cpu-only="1"' in render_html(cluster)
