"""reference_train's model TFLOP/s against the compute check's GEMM rate on the same device
(:mod:`gpuaccept.trainspeed`): report.json's derived ``train_vs_gemm``, the console summary, Markdown and HTML.
The CPU report is a real run (tests/data/reports/README.md); the GPU reports are built from it."""

from __future__ import annotations

import copy
import io
import json
import math
from pathlib import Path

import jsonschema
import pytest

from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Verdict
from gpuaccept.report.console import PlainConsole
from gpuaccept.report.html import render_html
from gpuaccept.report.markdown import render_markdown
from gpuaccept.results.load import load_file
from gpuaccept.trainspeed import TrainVsGemm, train_vs_gemm

REPORTS = Path(__file__).parent / "data" / "reports"
SCHEMA = Path(__file__).resolve().parent.parent / "src" / "gpuaccept" / "data" / "report.schema.json"


def cpu_report() -> NodeReport:
    report = load_file(REPORTS / "reference_train_cpu_gemm.json")
    assert isinstance(report, NodeReport)
    return report


def value(check: CheckResult, name: str, device: str) -> float:
    return next(m.value for m in check.metrics if m.name == name and m.device == device)


def test_cpu_run_compares_fp32_training_with_the_fp32_gemm_not_bf16():
    report = cpu_report()
    compute, train = report.checks
    (row,) = train_vs_gemm(train, report.checks)
    assert (row.device, row.gemm_metric) == ("cpu", "gemm_fp32_tflops")  # the CPU trains in fp32
    assert row.gemm_tflops == value(compute, "gemm_fp32_tflops", "cpu") != value(compute, "gemm_bf16_tflops", "cpu")
    assert row.ratio == pytest.approx(value(train, "reftrain_tflops", "cpu") / row.gemm_tflops)


def test_report_json_carries_the_derived_ratio_and_validates():
    report = cpu_report()
    data = json.loads(json.dumps(report.to_dict()))
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    assert "train_vs_gemm" not in data["checks"][0]
    (row,) = data["checks"][1]["train_vs_gemm"]
    assert row["gemm_metric"] == "gemm_fp32_tflops"
    assert row["ratio"] == pytest.approx(row["model_tflops"] / row["gemm_tflops"], rel=1e-4)
    again = NodeReport.from_dict(data)  # read back: the derived field is recomputed, not stored twice
    assert again.to_dict()["checks"][1]["train_vs_gemm"] == [row]


def test_old_report_without_compute_reads_and_has_no_ratio():
    old = load_file(REPORTS / "reference_train_cpu_fault.json")
    assert isinstance(old, NodeReport)
    assert all("train_vs_gemm" not in c for c in old.to_dict()["checks"])
    assert "against the GEMM rate" not in render_markdown(old)
    assert 'class="trainspeed"' not in render_html(old)


def gpu_report(n: int, concurrent: bool = True) -> NodeReport:
    """``n`` GPUs: model 400 + 10 i TFLOP/s in bf16; GEMM bf16 700 alone, 650 concurrent; fp32 60."""
    base = cpu_report()
    train = copy.deepcopy(base.checks[1])
    train.details["dtype"] = "bf16"
    train.metrics = [Metric("reftrain_tflops", 400.0 + 10 * i, "TFLOP/s", f"cuda:{i}", expected=989.0,
                            tags={"dtype": "bf16"}, performance=True) for i in range(n)]
    gemm = []
    for i in range(n):
        gemm += [Metric("gemm_bf16_tflops", 700.0, "TFLOP/s", f"cuda:{i}", expected=989.0, performance=True),
                 Metric("gemm_fp32_tflops", 60.0, "TFLOP/s", f"cuda:{i}", expected=67.0, performance=True)]
        if concurrent and n > 1:
            gemm.append(Metric("gemm_bf16_tflops_concurrent", 650.0, "TFLOP/s", f"cuda:{i}", expected=989.0,
                               performance=True))
    compute = CheckResult("compute", Status.PASS, "ok", metrics=gemm, host=train.host)
    return NodeReport("r-gpu", "gpu-node", "full", base.started, base.finished, Verdict.SUCCESS, [compute, train],
                      device="cuda")


def test_several_gpus_trained_at_once_compare_with_the_concurrent_gemm():
    report = gpu_report(4)
    rows = train_vs_gemm(report.checks[1], report.checks)
    assert [r.device for r in rows] == [f"cuda:{i}" for i in range(4)]
    assert {r.gemm_metric for r in rows} == {"gemm_bf16_tflops_concurrent"}
    assert [round(r.ratio, 4) for r in rows] == [round((400 + 10 * i) / 650, 4) for i in range(4)]


def test_falls_back_to_the_other_mode_and_one_gpu_uses_the_gemm_alone():
    assert {r.gemm_metric for r in train_vs_gemm(gpu_report(2, concurrent=False).checks[1],
                                                 gpu_report(2, concurrent=False).checks)} == {"gemm_bf16_tflops"}
    one = gpu_report(1)
    (row,) = train_vs_gemm(one.checks[1], one.checks)
    assert (row.gemm_metric, row.ratio) == ("gemm_bf16_tflops", 400 / 700)


def test_unpairable_devices_are_left_out_not_guessed():
    report = gpu_report(2)
    report.checks[0].metrics = [m for m in report.checks[0].metrics if m.device != "cuda:1"]
    report.checks[0].metrics.append(Metric("gemm_bf16_tflops", math.nan, "TFLOP/s", "cuda:1"))
    assert [r.device for r in train_vs_gemm(report.checks[1], report.checks)] == ["cuda:0"]
    report.checks[0].details["rerun"] = {"level": "full"}  # a --budget re-run is not the first pass
    assert train_vs_gemm(report.checks[1], report.checks) == []
    other_rank, other_host = gpu_report(2), gpu_report(2)
    other_rank.checks[0].rank = 1
    other_host.checks[0].host = "another-node"
    assert train_vs_gemm(other_rank.checks[1], other_rank.checks) == []
    assert train_vs_gemm(other_host.checks[1], other_host.checks) == []


def test_text_names_rate_ratio_and_gemm():
    row = TrainVsGemm("cuda:0", 412.0, 672.0, "gemm_bf16_tflops")
    assert row.text() == "cuda:0: 412 model TFLOP/s = 0.61 of its GEMM rate (672 TFLOP/s, gemm_bf16_tflops)"
    assert TrainVsGemm("cpu", 0.00548, 0.0021, "gemm_fp32_tflops").text().startswith(
        "cpu: 5.48 model GFLOP/s = 2.61 of its GEMM rate (2.1 GFLOP/s")


def test_console_summary_prints_each_device_under_reference_train_marked_not_judged():
    out = io.StringIO()
    PlainConsole(out, {}).summary(gpu_report(2), {})
    lines = out.getvalue().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("[RESULT] reference_train"))
    assert lines[at + 1] == ("[RESULT]   cuda:0: 400 model TFLOP/s = 0.62 of its GEMM rate (650 TFLOP/s, "
                             "gemm_bf16_tflops_concurrent); not judged")
    assert lines[at + 2].startswith("[RESULT]   cuda:1: 410 model TFLOP/s = 0.63")
    # the state column lines up below a name longer than the others (reference_train, 15 characters)
    rows = [line for line in lines if line.startswith("[RESULT] ") and not line.startswith("[RESULT]  ")
            and line.split()[1] in ("compute", "reference_train")]
    assert len(rows) == 2 and len({line.index(line.split()[2], len("[RESULT] ") + 1) for line in rows}) == 1, rows


def test_markdown_and_html_show_the_ratio_per_device():
    report = gpu_report(2)
    md = render_markdown(report)
    assert "### Reference training against the GEMM rate" in md and "measured, not judged" in md
    assert "| cuda:1 | 410 TFLOP/s | 650 TFLOP/s | `gemm_bf16_tflops_concurrent` | 0.63 |" in md
    html = render_html(report)
    assert html.count('<tr data-device="cuda:') == 2 and ">0.62</td>" in html and "not judged" in html
    cpu_html = render_html(cpu_report())
    assert '<tr data-device="cpu">' in cpu_html and "gemm_fp32_tflops</code>" in cpu_html


def test_markdown_of_a_fleet_keeps_the_lowest_ratios():
    from gpuaccept.report.markdown import TRAIN_ROWS

    report = gpu_report(TRAIN_ROWS + 8, concurrent=False)
    md = render_markdown(report)
    assert f"The {TRAIN_ROWS} lowest ratios of {TRAIN_ROWS + 8} devices." in md
    assert "| cuda:0 | 400 TFLOP/s |" in md and f"| cuda:{TRAIN_ROWS + 7} |" not in md
