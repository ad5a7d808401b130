"""``gpuaccept report``: loading (files, run dirs, the history store), Markdown, JUnit XML and JSON output."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuaccept.errors import InputError
from gpuaccept.model import ClusterReport, NodeReport, Status
from gpuaccept.report.junit import render_junit
from gpuaccept.report.markdown import render_markdown
from gpuaccept.results.load import load_report
from tests.helpers import gpuaccept
from tests.report_data import (
    CLUSTER,
    HOSTILE_HOST,
    NODE_CPU,
    big_cluster,
    cluster,
    hostile_cluster,
    node_cpu,
    write_json,
)

# ---- loading ----------------------------------------------------------------------------------------------


def test_load_node_and_cluster_files_and_run_dirs(tmp_path: Path) -> None:
    assert isinstance(load_report(str(NODE_CPU)), NodeReport)
    assert isinstance(load_report(str(CLUSTER)), ClusterReport)
    run_dir = tmp_path / "20261120T031500Z-slurm-4812"
    run_dir.mkdir()
    shutil.copy(CLUSTER, run_dir / "cluster-report.json")
    shutil.copy(NODE_CPU, run_dir / "report.json")
    assert isinstance(load_report(str(run_dir)), ClusterReport)  # the cluster report wins in a run dir
    # a run id found as <report-dir>/<run-id> when the history has no such run
    rep = load_report(run_dir.name, db=f"sqlite:///{tmp_path / 'none.db'}", report_dir=str(tmp_path))
    assert isinstance(rep, ClusterReport) and rep.run_id == run_dir.name
    node3 = load_report(str(CLUSTER), host="gpu-node-03")
    assert isinstance(node3, NodeReport) and node3.host == "gpu-node-03"


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON (line 1, column 2"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"run_id": "x"}', "not a valid gpuaccept report at (top level): 'schema_version' is a required property"),
    ('{"kind": "cluster", "nodes": 3}', "not a valid gpuaccept cluster report"),
])
def test_malformed_files_name_the_file_and_the_problem(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(InputError) as err:
        load_report(str(bad))
    assert str(err.value).startswith(f"{bad}: ") and message in str(err.value)


def test_a_bad_metric_inside_a_cluster_names_the_node(tmp_path: Path) -> None:
    data = json.loads(CLUSTER.read_text())
    data["nodes"][1]["report"]["checks"][2]["metrics"][0]["value"] = "fast"
    bad = tmp_path / "cluster.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_report(str(bad))
    text = str(err.value)
    assert "nodes[1] (gpu-node-02)" in text and "checks/2/metrics/0/value" in text


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "report.json"
    bad.write_text('{"schema_version": 1}')
    for args in ([str(bad)], [str(tmp_path / "nope.json")], ["no-such-run", "--db", f"sqlite:///{tmp_path}/h.db",
                                                                 "--report-dir", str(tmp_path)],
                 [str(NODE_CPU), "--format", "md", "--output", str(tmp_path / "missing-dir" / "x.md")],
                 [str(CLUSTER), "--host", "gpu-node-77"]):
        proc = gpuaccept("report", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuaccept: error: "), proc.stderr
        assert "Traceback" not in proc.stderr


def test_run_id_from_the_history_store(tmp_path: Path) -> None:
    """A run id (or a unique prefix) is looked up in a real SQLite history store."""
    from gpuaccept.results.history import open_store

    url = f"sqlite:///{tmp_path / 'history.db'}"
    store = open_store(url)
    try:
        store.add_cluster_report(cluster())
        store.add_node_report(node_cpu())
    finally:
        store.close()
    proc = gpuaccept("report", "20261120T0315", "--db", url, "--format", "json", "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["kind"] == "cluster" and len(data["nodes"]) == 4
    assert data == cluster().to_dict()
    proc = gpuaccept("report", "20261120T031500Z-slurm-4812", "--host", "gpu-node-03", "--db", url,
                     "--format", "md")
    assert proc.returncode == 0, proc.stderr
    assert "host `gpu-node-03`" in proc.stdout and "**FAIL**" in proc.stdout


def test_json_format_round_trips_and_exit_code_flag(tmp_path: Path) -> None:
    proc = gpuaccept("report", str(CLUSTER), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(CLUSTER.read_text())
    assert gpuaccept("report", str(CLUSTER), "--format", "json", "--exit-code").returncode == 1
    assert gpuaccept("report", str(NODE_CPU), "--format", "json", "--exit-code").returncode == 0
    out = gpuaccept("report", str(CLUSTER), "--format", "md", "--output", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "gpuaccept-20261120T031500Z-slurm-4812.md").read_text().startswith("## ")


# ---- Markdown ---------------------------------------------------------------------------------------------


def _tables(text: str) -> list[list[str]]:
    tables: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def _cells(row: str) -> int:
    """Columns of a table row, not counting escaped pipes."""
    return row.replace("\\|", "").count("|") - 1


def test_markdown_cluster_failures_first_and_tables_intact() -> None:
    text = render_markdown(hostile_cluster())
    assert text.startswith("## ❌ gpuaccept: **FAILURE**")
    assert "4/5 nodes reported" in text
    order = [text.index(h) for h in ("### Failures and warnings", "### Outliers", "### Nodes",
                                     "#### gpu-node-03: failure")]
    assert order == sorted(order)
    failures = _tables(text)[0]
    assert "**MISSING**" in failures[2] and "**FAIL**" in failures[3] and "WARN" in failures[4]
    for table in _tables(text):
        widths = {_cells(r) for r in table}
        assert len(widths) == 1, table  # a pipe in a reason did not add a column
    assert "<script>" not in text and "&lt;script&gt;" in text
    outside_code = re.sub(r"`[^`]*`", "", text)  # a code span shows markup literally; elsewhere it is escaped
    assert "<img" not in outside_code and "&lt;img src=x" in outside_code
    assert "\\| &lt;script&gt;" in text  # the reason's pipe is escaped
    # failing nodes' tables before successful ones
    assert text.index("#### gpu-node-03") < text.index("#### gpu-node-01")
    assert f"#### {HOSTILE_HOST[:11]}" in text


def test_markdown_node_report() -> None:
    text = render_markdown(node_cpu())
    assert text.startswith("## ✅ gpuaccept: **SUCCESS**")
    assert "No check failed, errored or warned." in text
    (table,) = _tables(text)
    assert [r.split("|")[1].strip() for r in table[2:]] == ["`env`", "`compute`", "`memory`"]


# ---- JUnit ------------------------------------------------------------------------------------------------


def _check_junit_structure(root: ET.Element) -> None:
    """The structure CI tools read (the common subset of the Jenkins/Ant JUnit schema)."""
    assert root.tag == "testsuites"
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for suite in root:
        assert suite.tag == "testsuite"
        for key in ("name", "tests", "failures", "errors", "skipped", "time", "timestamp"):
            assert key in suite.attrib, key
        cases = suite.findall("testcase")
        assert int(suite.get("tests", "")) == len(cases)
        assert int(suite.get("failures", "")) == sum(1 for c in cases if c.find("failure") is not None)
        assert int(suite.get("errors", "")) == sum(1 for c in cases if c.find("error") is not None)
        assert int(suite.get("skipped", "")) == sum(1 for c in cases if c.find("skipped") is not None)
        for case in cases:
            assert case.get("classname") and case.get("name")
            float(case.get("time", ""))
            outcomes = [e.tag for e in case if e.tag in ("failure", "error", "skipped")]
            assert len(outcomes) <= 1
        for key in totals:
            totals[key] += int(suite.get(key, ""))
    for key, value in totals.items():
        assert int(root.get(key, "")) == value


def test_junit_one_testcase_per_check_per_node() -> None:
    rep = hostile_cluster()
    node3 = rep.nodes[2].report
    assert node3 is not None
    node3.checks[0].reason = "driver says \x1b[31mFAILED\x1b[0m\x00 on bus \x07 00:1b"
    node3.checks[0].status = Status.ERROR
    text = render_junit(rep)
    root = ET.fromstring(text.encode())
    _check_junit_structure(root)
    suites = {s.get("name"): s for s in root}
    assert list(suites) == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04", HOSTILE_HOST]
    cases = {(c.get("classname"), c.get("name")): c for s in root for c in s.findall("testcase")}
    expected = {(n.host, c.name) for n in rep.nodes if n.report for c in n.report.checks}
    assert expected <= set(cases) and len(cases) == len(expected) + 1
    compute = cases[("gpu-node-03", "compute")]
    failure = compute.find("failure")
    assert failure is not None and failure.get("message", "").startswith('rate "low" | <script>')
    assert "FAIL: gemm_bf16_tflops on cuda:5 = 548.2 TFLOP/s (threshold >= 593.64 TFLOP/s, sku:h100_sxm)" \
        in (failure.text or "")
    assert compute.get("time") == "41.700"
    err = cases[("gpu-node-03", "env")].find("error")
    assert err is not None and err.get("message") == "driver says FAILED\ufffd on bus \ufffd 00:1b"
    assert cases[("gpu-node-01", "memtest")].find("skipped") is not None
    warn_out = cases[("gpu-node-02", "collectives")].find("system-out")
    assert warn_out is not None and (warn_out.text or "").startswith("WARN: allreduce busbw")
    outlier_out = cases[("gpu-node-01", "compute")].find("system-out")
    assert outlier_out is not None and "OUTLIER: gemm_bf16_tflops on cuda:2" in (outlier_out.text or "")
    missing = cases[(HOSTILE_HOST, "report")].find("error")
    assert missing is not None and "node did not report" in missing.get("message", "")
    assert root.get("tests") == str(len(cases)) and root.get("failures") == "1" and root.get("errors") == "2"


def test_junit_from_the_cli_of_a_real_node_run(tmp_path: Path) -> None:
    out = tmp_path / "junit.xml"
    proc = gpuaccept("report", str(NODE_CPU), "--format", "junit", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(out).getroot()
    _check_junit_structure(root)
    (suite,) = list(root)
    assert [c.get("name") for c in suite.findall("testcase")] == ["env", "compute", "memory"]
    assert {c.get("classname") for c in suite.findall("testcase")} == {"vm"}
    assert root.get("failures") == "0" and root.get("tests") == "3"


def test_written_files_replace_atomically(tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    for _ in range(2):
        proc = gpuaccept("report", str(write_json(tmp_path / "in.json", node_cpu())), "--format", "md",
                         "--output", str(out))
        assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json", "r.md"]  # no temporary files left
    assert out.stat().st_mode & 0o777 == 0o644


def test_markdown_of_a_large_cluster_keeps_only_the_failing_node_tables() -> None:
    text = render_markdown(big_cluster(20))
    assert re.findall(r"^#### (\S+)", text, re.M) == ["gpu-node-03:"]
    assert "Tables of the 19 successful nodes are left out" in text
    nodes_table = _tables(text)[2]
    assert len(nodes_table) == 2 + 20 and "`gpu-node-03` | failure" in nodes_table[2]


def test_markdown_shows_the_declared_key_metric_of_an_unjudged_check() -> None:
    """On a CPU node compute has no spec bound; its row still names the check's key metric (the weakest dtype)."""
    report = load_report(Path(__file__).parent / "data" / "reports" / "node-cpu.json")
    assert isinstance(report, NodeReport)
    compute = next(c for c in report.checks if c.name == "compute")
    assert all(m.threshold is None and m.expected is None for m in compute.metrics)
    lowest = min((m for m in compute.metrics if m.name.startswith("gemm_")), key=lambda m: m.value)
    row = next(line for line in render_markdown(report).splitlines() if line.startswith("| `compute`"))
    assert f"`{lowest.name}`" in row


def test_markdown_outliers_and_html_heatmap_show_readable_units() -> None:
    """An outlier of a metric stored in TFLOP/s but worth GFLOP/s is shown in GFLOP/s, with 1-3 digits."""
    from gpuaccept.report.html import render_html

    report = cluster()
    report.analysis["outliers"] = [{"host": "gpu-node-01", "device": "cuda:0", "check": "compute",
                                    "metric": "gemm_fp32_tflops", "tags": {}, "value": 0.00126, "median": 0.175,
                                    "mad": 0.001, "z": -9.5, "direction": "low", "scope": "gpu",
                                    "unit": "TFLOP/s"}]
    text = render_markdown(report)
    row = next(line for line in text.splitlines() if "gemm_fp32_tflops" in line and "-9.5" in line)
    assert "1.26 GFLOP/s" in row and "175.0 GFLOP/s" in row, row
    html = render_html(report)
    heads = re.findall(r'<th class="col"[^>]*>(.*?)</th>', html)
    assert heads and all('<span class="muted">' in h for h in heads), heads
