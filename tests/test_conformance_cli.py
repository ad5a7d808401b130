"""Fleet conformance end to end: capture on this node, run --conformance, bad manifests (exit 2, one line),
capture --from a report, and the fleet-majority view of ``analyze`` over reports built from the drift cases."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpuaccept.checks.conformance import evaluate_conformance
from gpuaccept.model import CheckResult, NodeReport, Verdict
from gpuaccept.results.conformance_fleet import configs_of_reports, drift_lines, fleet_drift
from tests.helpers import gpuaccept, only_run_dir
from tests.test_conformance import CASES, node


def test_capture_then_run_on_this_node_passes_and_a_drift_fails(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    r = gpuaccept("conformance", "capture", "-o", str(manifest))
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(manifest.read_text())
    assert data["conformance"] == 1 and "kernel" in data["items"]
    run = ("run", "--device", "cpu", "--checks", "conformance", "--no-history")
    r = gpuaccept(*run, "--conformance", str(manifest), "--report-dir", str(tmp_path / "a"))
    assert r.returncode == 0, r.stdout + r.stderr
    report = tmp_path / "a" / only_run_dir(tmp_path / "a").name / "report.json"
    check = next(c for c in json.loads(report.read_text())["checks"] if c["name"] == "conformance")
    assert check["status"] == "pass" and check["reason"].startswith("conforms to")
    # the same configuration taken from the report is the same manifest
    again = tmp_path / "again.yaml"
    r = gpuaccept("conformance", "capture", "--from", str(report), "-o", str(again))
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(again.read_text())["items"] == data["items"]
    data["items"]["kernel"] = "0.0.1-other"
    manifest.write_text(yaml.safe_dump(data))
    r = gpuaccept(*run, "--conformance", str(manifest), "--report-dir", str(tmp_path / "b"))
    assert r.returncode == 1
    assert "kernel: " in r.stdout and "manifest 0.0.1-other" in r.stdout


def test_bad_manifest_is_exit_2_with_one_line_before_anything_runs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("conformance: 1\nitems:\n  gpu.*.pcie_widht: 16\n")
    for args in (("conformance", "check", str(bad)),
                 ("run", "--device", "cpu", "--checks", "conformance", "--no-history", "--conformance", str(bad),
                  "--report-dir", str(tmp_path / "r"))):
        r = gpuaccept(*args)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert "items.gpu.*.pcie_widht: no such item (did you mean 'gpu.*.pcie_width'?)" in r.stderr
    assert not (tmp_path / "r").exists()
    bad.write_text("conformance: 1\nitems:\n  gpu_count: {min: 8, max: 4}\n")
    r = gpuaccept("conformance", "check", str(bad))
    assert r.returncode == 2 and "impossible range, min 8 > max 4" in r.stderr


def test_conformance_option_needs_the_check_selected(tmp_path: Path) -> None:
    ok = tmp_path / "ok.yaml"
    ok.write_text("conformance: 1\nitems:\n  gpu_count: 8\n")
    r = gpuaccept("run", "--device", "cpu", "--checks", "env", "--conformance", str(ok), "--no-history",
                  "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and "the conformance check is not in this selection" in r.stderr


def _report(host: str, tmp_path: Path, case: str | None) -> NodeReport:
    cfg = node(tmp_path / host, CASES["cases"][case] if case else None)
    out = evaluate_conformance(cfg, None)
    check = CheckResult("conformance", out.status, out.reason, details=out.details)
    return NodeReport("r1", host, "standard", "2026-11-28T08:00:00Z", verdict=Verdict.SUCCESS, checks=[check])


def test_fleet_majority_names_the_drifted_node_and_item(tmp_path: Path) -> None:
    reports = [_report(f"node{i:02d}", tmp_path, "nic_firmware" if i == 3 else None) for i in range(5)]
    drift = fleet_drift(configs_of_reports(reports))
    assert drift["groups"] == [{"model": "8x NVIDIA H100 80GB HBM3", "nodes": 5, "compared": True}]
    assert [(n["host"], [i["item"] for i in n["items"]]) for n in drift["odd"]] == [("node03", ["nic.mlx5_4.fw_ver"])]
    assert drift_lines(drift) == ["node03 (8x NVIDIA H100 80GB HBM3): nic.mlx5_4.fw_ver 28.41.1000, majority "
                                  "28.39.1002 (4 of 5)"]
    assert drift["split"] == []


def test_analyze_shows_the_drift_first(tmp_path: Path) -> None:
    cases = {"node00": None, "node01": None, "node02": "gpu_x8_slot", "node03": None}
    paths = []
    for host, case in cases.items():
        p = tmp_path / f"{host}.json"
        p.write_text(json.dumps(_report(host, tmp_path, case).to_dict()))
        paths.append(str(p))
    r = gpuaccept("analyze", *paths)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "conformance: 1 of 4 node(s) differ from the majority of their model"
    assert lines[1].startswith("  node02 (8x NVIDIA H100 80GB HBM3): gpu.3.pcie_width 8, majority 16 (3 of 4)")
    r = gpuaccept("analyze", "--json", *paths)
    assert json.loads(r.stdout)["conformance"]["odd"][0]["host"] == "node02"


def test_small_groups_and_splits_are_not_blamed(tmp_path: Path) -> None:
    two = [_report("a", tmp_path, None), _report("b", tmp_path, "other_driver")]
    drift = fleet_drift(configs_of_reports(two))
    assert drift["odd"] == [] and drift["groups"][0]["compared"] is False
    four = [_report(h, tmp_path / "four", c) for h, c in (("a", None), ("b", None), ("c", "bios"), ("d", "bios"))]
    drift = fleet_drift(configs_of_reports(four))
    assert drift["odd"] == [] and [s["item"] for s in drift["split"]] == ["bios_version"]


def test_a_bad_manifest_named_in_the_config_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("conformance: 1\nitems:\n  nic.*.fw_ver: {min: 28}\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"checks:\n  conformance:\n    params: {{manifest: {bad}}}\n")
    r = gpuaccept("run", "--device", "cpu", "--checks", "conformance", "--config", str(config), "--no-history",
                  "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "items.nic.*.fw_ver.min: a range needs a numeric item; nic.*.fw_ver is text" in r.stderr


def test_diff_names_the_items_and_parts_that_changed_since_the_last_pass(tmp_path: Path) -> None:
    case = {**CASES["cases"]["nic_firmware"], "nvml": {"gpus.3.uuid": "GPU-00000000-0000-0000-0000-00000000beef"}}
    paths = []
    for name, edits in (("before", None), ("after", case)):
        cfg = node(tmp_path / name, edits)
        out = evaluate_conformance(cfg, None)
        rep = NodeReport(name, "node07", "standard", f"2026-11-2{len(paths) + 7}T08:00:00Z", verdict=Verdict.SUCCESS,
                         checks=[CheckResult("conformance", out.status, out.reason, details=out.details)])
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(rep.to_dict()))
    r = gpuaccept("conformance", "diff", *map(str, paths))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith(": 1 item(s) changed, 1 part(s) replaced")
    assert lines[1] == "  nic.mlx5_4.fw_ver: 28.39.1002 -> 28.41.1000"
    assert lines[2].startswith("  part gpu.3.uuid: GPU-")
    assert lines[2].endswith(" -> GPU-00000000-0000-0000-0000-00000000beef")


def test_the_html_report_of_a_cluster_shows_the_drift_before_the_outliers(tmp_path: Path) -> None:
    from gpuaccept.model import ClusterReport, NodeEntry, NodeState
    from gpuaccept.report.html import render_html

    hosts = {"node00": None, "node01": "port_lower_rate", "node02": None}
    cluster = ClusterReport("c1", "slurm", "2026-11-28T08:00:00Z", expected_nodes=3, nodes=[
        NodeEntry(h, NodeState.REPORTED, _report(h, tmp_path, c)) for h, c in hosts.items()])
    page = render_html(cluster, generated="2026-11-28T09:00:00Z")
    assert page.index('id="conformance"') < page.index('id="outliers"')
    assert "1 of 3 node(s) differ from the majority of their model" in page
    assert "<td>node01</td><td>8x NVIDIA H100 80GB HBM3</td><td>nic.mlx5_2.port1.rate_gbps</td><td>200.0</td>" in page
