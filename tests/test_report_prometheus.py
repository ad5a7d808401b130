"""The Prometheus textfile (node_exporter format): parsed back with prometheus_client's own parser."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpuaccept.errors import InputError
from gpuaccept.model import Metric, Status
from gpuaccept.report.prometheus import render_prometheus, write_atomic
from gpuaccept.results.load import load_file
from tests.helpers import gpuaccept
from tests.report_data import HOSTILE_HOST, NODE_COLLECTIVES, NODE_CPU, cluster, hostile_cluster, node_cpu, write_json

_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? \S+$')


def _parse(text: str) -> dict[str, list[Sample]]:
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def _gpu(device: str | None) -> str:
    return "" if device is None else device.split(":")[1] if device.startswith("cuda:") else device


def test_textfile_holds_every_measured_value() -> None:
    rep = cluster()
    fams = _parse(render_prometheus(rep))
    assert all(name.startswith("gpuaccept_") for name in fams)
    values = {(s.labels["host"], s.labels["gpu"], s.labels["check"], s.labels["metric"], s.labels["size_bytes"]):
              s.value for s in fams["gpuaccept_metric"]}
    count = 0
    for entry in rep.nodes:
        assert entry.report is not None
        for c in entry.report.checks:
            for m in c.metrics:
                size = str(m.tags["size_bytes"]) if c.name == "collectives" else ""
                assert values[(entry.host, _gpu(m.device), c.name, m.name, size)] == m.value
                count += 1
    assert len(values) == count == len(fams["gpuaccept_metric"])
    thresholds = [s for s in fams["gpuaccept_metric_threshold"] if s.labels["metric"] == "gemm_bf16_tflops"]
    assert len(thresholds) == 32 and {s.labels["bound"] for s in thresholds} == {"min"}
    assert {s.value for s in thresholds} == {593.64}


def test_check_status_and_verdict_are_one_hot() -> None:
    rep = hostile_cluster()
    fams = _parse(render_prometheus(rep))
    by_check: dict[tuple[str, str], dict[str, float]] = {}
    for s in fams["gpuaccept_check_status"]:
        by_check.setdefault((s.labels["host"], s.labels["check"]), {})[s.labels["status"]] = s.value
    for entry in rep.nodes:
        for c in entry.report.checks if entry.report else []:
            states = by_check[(entry.host, c.name)]
            assert set(states) == {s.value for s in Status}
            assert states[c.status.value] == 1 and sum(states.values()) == 1
    verdicts = {(s.labels["host"], s.labels["verdict"]): s.value for s in fams["gpuaccept_node_verdict"]}
    assert verdicts[("gpu-node-03", "failure")] == 1 and verdicts[("gpu-node-01", "success")] == 1
    assert verdicts[(HOSTILE_HOST, "failure")] == 1  # the missing node, its name escaped and read back intact
    reported = {s.labels["host"]: s.value for s in fams["gpuaccept_node_reported"]}
    assert reported[HOSTILE_HOST] == 0 and reported["gpu-node-02"] == 1
    nodes = {s.labels["state"]: s.value for s in fams["gpuaccept_cluster_nodes"]}
    assert nodes == {"expected": 5, "reported": 4, "missing": 1, "failed": 2}
    assert {s.labels["verdict"]: s.value for s in fams["gpuaccept_cluster_verdict"]}["failure"] == 1


def test_series_are_unique_and_families_uniform() -> None:
    text = render_prometheus(hostile_cluster())
    fams = _parse(text)
    for name, samples in fams.items():
        keys = [tuple(sorted(s.labels.items())) for s in samples]
        assert len(keys) == len(set(keys)), f"duplicate series in {name}"
        assert len({tuple(sorted(s.labels)) for s in samples}) == 1, f"mixed label names in {name}"
    metric = fams["gpuaccept_metric"]
    # size_bytes tells the collective sweep apart and stays empty for one-size metrics (stable series)
    assert {s.labels["size_bytes"] for s in metric if s.labels["check"] == "memory"} == {""}
    sweep = {s.labels["size_bytes"] for s in metric if s.labels["metric"] == "allreduce_busbw_gbs"}
    assert len(sweep) == 24 and str(2**33) in sweep
    assert {s.labels["op"] for s in metric if s.labels["check"] == "collectives"} == {"allreduce", "allgather"}
    z = fams["gpuaccept_metric_outlier_zscore"]
    assert len(z) == len(cluster().analysis["outliers"]) == 25
    assert any(s.labels["host"] == "gpu-node-03" and s.labels["gpu"] == "5" and s.value < -5 for s in z)
    # node_exporter's textfile format: no timestamps, each family's lines together after its HELP and TYPE
    seen: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            seen.append(line.split()[2])
        elif not line.startswith("#"):
            assert _LINE.match(line), line
            assert line.split("{")[0].split(" ")[0] == seen[-1]
    assert len(seen) == len(set(seen))


def test_label_values_are_escaped() -> None:
    rep = node_cpu()
    rep.host = 'node "7"\\a'
    for c in rep.checks:
        c.host = None  # the node's name applies
    rep.checks[1].metrics.append(Metric("odd_gbs", 1.5, "GB/s", device="cuda:0",
                                        tags={"dtype": 'b"f\\1\n6', "9 weird-key": "x"}))
    rep.checks[1].metrics.append(Metric("nan_gbs", math.nan, "GB/s", device="cuda:0"))
    text = render_prometheus(rep)
    fams = _parse(text)
    odd = [s for s in fams["gpuaccept_metric"] if s.labels["metric"] == "odd_gbs"]
    assert len(odd) == 1
    assert odd[0].labels["host"] == 'node "7"\\a' and odd[0].labels["dtype"] == 'b"f\\1\n6'
    assert odd[0].value == 1.5
    assert not [s for s in fams["gpuaccept_metric"] if s.labels["metric"] == "nan_gbs"]  # NaN is left out
    assert "\n6" not in text  # the newline went out escaped


def test_cli_writes_the_textfile_atomically_into_a_directory(tmp_path: Path) -> None:
    textfile_dir = tmp_path / "textfile_collector"
    textfile_dir.mkdir()
    src = write_json(tmp_path / "report.json", node_cpu())
    proc = gpuaccept("report", str(src), "--format", "prom", "--output", str(textfile_dir))
    assert proc.returncode == 0, proc.stderr
    prom = textfile_dir / "gpuaccept.prom"
    first = prom.stat()
    assert first.st_mode & 0o777 == 0o644
    fams = _parse(prom.read_text())
    assert {s.labels["run_id"] for s in fams["gpuaccept_run_info"]} == {"20261122T020807Z-vm-fadd"}
    ts = fams["gpuaccept_run_timestamp_seconds"][0].value
    assert ts == 1795313287.0  # 2026-11-22T02:08:07Z
    proc = gpuaccept("report", str(src), "--format", "prom", "--output", str(textfile_dir))
    assert proc.returncode == 0
    assert prom.stat().st_ino != first.st_ino  # replaced by rename, never rewritten in place
    assert [p.name for p in textfile_dir.iterdir()] == ["gpuaccept.prom"]


def test_write_atomic_leaves_nothing_behind_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "gpuaccept.prom"
    target.mkdir()  # a directory in the way: the rename must fail
    with pytest.raises(InputError, match=re.escape(str(target))):
        write_atomic(target, "x 1\n")
    assert [p.name for p in tmp_path.iterdir()] == ["gpuaccept.prom"]


def test_stdout_textfile_of_the_real_node_run() -> None:
    proc = gpuaccept("report", str(NODE_CPU), "--format", "prom")
    assert proc.returncode == 0, proc.stderr
    fams = _parse(proc.stdout)
    metrics = {s.labels["metric"]: s for s in fams["gpuaccept_metric"]}
    assert set(metrics) == {"gpu_count", "cpu_count", "host_memory_gib", "gemm_fp32_tflops", "gemm_bf16_tflops",
                            "stream_copy_gbs", "stream_triad_gbs"}
    assert metrics["gemm_bf16_tflops"].labels["gpu"] == "cpu" and metrics["gemm_bf16_tflops"].labels["dtype"] == "bf16"
    assert "gpuaccept_cluster_nodes" not in fams


def test_real_collectives_run_series_are_told_apart_by_size_rank_and_inplace() -> None:
    fams = _parse(render_prometheus(load_file(NODE_COLLECTIVES)))
    metric = fams["gpuaccept_metric"]
    keys = [tuple(sorted(s.labels.items())) for s in metric]
    assert len(keys) == len(set(keys)) == 120
    names = set(metric[0].labels)
    assert {"size_bytes", "rank", "inplace"} <= names and "count" not in names  # count follows the size
    ag = [s for s in metric if s.labels["metric"] == "allgather_busbw_gbs"]
    assert {(s.labels["size_bytes"], s.labels["rank"], s.labels["inplace"]) for s in ag} == \
        {(size, rank, inplace) for size in ("4096", "65536") for rank in "01" for inplace in "01"}
