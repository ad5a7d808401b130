"""Declared metric names: each check's declaration matches what it really produces, so it cannot drift.

Three witnesses: the metric names written in the check modules' source (an AST walk), the metrics of
recorded outcomes (reports, NVML snapshots, sysfs trees, nccl-tests logs under tests/data), and the
metrics the checks produce when run on this CPU with small parameters.
"""

from __future__ import annotations

import ast
import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks import BUILTIN_MODULES, registry
from gpuaccept.checks.base import Check, CheckContext
from gpuaccept.checks.metricnames import NOT_PERFORMANCE, globs_overlap, performance_expected, produces
from gpuaccept.model import Metric

DATA = Path(__file__).parent / "data"
SRC = Path(__file__).resolve().parent.parent / "src" / "gpuaccept"
BUILTIN = {n: c for n, c in registry().items() if c.__module__ in BUILTIN_MODULES}


def declared_match(cls: type[Check], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in cls.metrics or ())


@pytest.mark.parametrize(("a", "b", "overlap"), [
    ("gemm_fp32_tflops", "gemm_fp32_tflops", True),
    ("gemm_fp32_tflop", "gemm_fp32_tflops", False),
    ("gemm_*_tflops", "gemm_bf16_tflops", True),
    ("gemm_*_tflops", "gemm_bf16_tflops_concurrent", False),
    ("gemm_*_tflops*", "gemm_bf16_tflops_concurrent", True),
    ("*_busbw_gbs", "allreduce_busbw_large_gbs", False),
    ("*_gbs", "*_busbw_*", True),  # both globs: allx_busbw_y_gbs
    ("a*b", "*c", False),
    ("gemm_?p32_tflops", "gemm_fp32_tflops", True),
    ("gemm_[bf]*", "gemm_tf32_tflops", False),
    ("gemm_[!t]f32*", "gemm_tf32_tflops", False),
    ("gemm_[!t]f32*", "gemm_*", True),
    ("*", "anything", True),
    ("", "x", False),
])
def test_glob_overlap(a: str, b: str, overlap: bool) -> None:
    assert globs_overlap(a, b) is overlap
    assert globs_overlap(b, a) is overlap


def test_every_builtin_check_declares_its_metrics() -> None:
    assert set(BUILTIN) >= {"env", "health", "compute", "memory", "collectives", "nccl_tests", "fabric"}
    for name, cls in BUILTIN.items():
        assert cls.metrics, f"{name} declares no metrics"
        assert len(set(cls.metrics)) == len(cls.metrics), f"{name} declares a name twice"
        if cls.key_metric:
            assert produces(cls, cls.key_metric), (name, cls.key_metric)
        for rule in cls.thresholds:  # a built-in rule on a name the check does not produce would be dead
            assert produces(cls, rule.metric), (name, rule.metric)


def _literal_glob(node: ast.expr) -> str | None:
    """A metric name written as a string or an f-string, as a glob (each replacement field a ``*``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)  # type: ignore[misc]
    return None


def names_in_source(path: Path) -> list[str]:
    """First arguments of ``Metric(...)``, ``_count(...)`` and ``.limit(...)`` calls that are written out."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        fn = node.func
        called = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        glob = _literal_glob(node.args[0]) if called in ("Metric", "_count", "limit") else None
        if glob is not None:
            found.append(glob)
    return found


# module -> the checks whose metrics it writes (helpers write for the checks that call them)
WRITERS = {**{m.rsplit(".", 1)[1]: (m.rsplit(".", 1)[1],) for m in BUILTIN_MODULES},
           "disk_space": ("disk_space", "disk"), "fabric": ("fabric", "collectives", "nccl_tests", "rdma"),
           "nccltests/judge": ("nccl_tests",), "p2p_plan": ("p2p",),
           "nvlink_watch": ("p2p", "collectives", "nccl_tests")}
NAMES = {"ddp": "ddp_train"}


@pytest.mark.parametrize("module", sorted(WRITERS))
def test_names_written_in_the_source_are_declared(module: str) -> None:
    path = SRC / (module + ".py" if "/" in module else f"checks/{module}.py")
    names = names_in_source(path)
    checks = [BUILTIN[NAMES.get(c, c)] for c in WRITERS[module]]
    # nccl_tests and rdma write none themselves: their judges do (tests/test_rdma_check.py holds rdma's names)
    assert names or module in ("nccl_tests", "rdma"), f"no metric name found in {path}: the walk sees nothing"
    for glob in names:
        assert any(produces(c, glob) for c in checks), f"{path.name} writes {glob!r}, declared by none of {checks}"


def _report_metrics(report: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(c["name"], m["name"]) for c in report.get("checks", []) for m in c.get("metrics", [])]
    for node in report.get("nodes", []):
        if isinstance(node, dict) and isinstance(node.get("report"), dict):
            out += _report_metrics(node["report"])
    return out


def test_recorded_reports_hold_only_declared_names() -> None:
    seen = []
    for path in sorted([*DATA.glob("reports/*.json"), *DATA.glob("history/reports/*.json")]):
        seen += [(path.name, c, m) for c, m in _report_metrics(json.loads(path.read_text())) if c in BUILTIN]
    assert len({c for _, c, _ in seen}) >= 5, seen  # compute, memory, train, health, env, collectives
    bad = [s for s in seen if not declared_match(BUILTIN[s[1]], s[2])]
    assert not bad, bad


def test_recorded_nvml_snapshots_give_declared_health_metrics() -> None:
    from gpuaccept.checks.health import HealthCheck, evaluate_health
    from gpuaccept.hw.nvml import snapshot_from_dict

    names: set[str] = set()
    for path in sorted((DATA / "nvml").glob("*.json")):
        out = evaluate_health(snapshot_from_dict(json.loads(path.read_text())), HealthCheck.defaults("standard"))
        names |= {m.name for m in out.metrics}
    assert {"temperature_c", "ecc_volatile_uncorrectable", "nvlink_links_down", "xid_fail_count"} <= names
    assert sorted(n for n in names if not declared_match(HealthCheck, n)) == []


def test_recorded_sysfs_trees_give_declared_fabric_metrics() -> None:
    from gpuaccept.checks.fabric import FabricCheck, evaluate_fabric
    from gpuaccept.hw.rdma import diff, read_inventory, read_snapshot

    root = str(DATA / "sysfs" / "ndr_4x")
    deltas = diff(read_snapshot(root, clock=lambda: 1.0), read_snapshot(str(DATA / "sysfs" / "ndr_4x_later"),
                                                                        clock=lambda: 6.0))
    out = evaluate_fabric(read_inventory(root), deltas, {}, FabricCheck.defaults("standard"))
    names = {m.name for m in out.metrics}
    assert {"rdma_port_up", "rdma_ports_active"} <= names and any(n.endswith("_delta") for n in names)
    assert sorted(n for n in names if not declared_match(FabricCheck, n)) == []


def test_recorded_nccl_tests_logs_give_declared_metrics() -> None:
    from gpuaccept.checks.nccl_tests import NcclTestsCheck
    from gpuaccept.nccltests.judge import judge
    from gpuaccept.nccltests.parse import parse_any

    names: set[str] = set()
    for name, test in (("current_2hosts_h100.txt", "all_reduce"), ("wrong_failed.txt", "all_reduce"),
                       ("alltoall_rtx5090_na.txt", "alltoall")):
        names |= {m.name for m in judge(parse_any((DATA / "nccl-tests" / name).read_text()), test).metrics}
    assert {"allreduce_busbw_large_gbs", "allreduce_wrong", "alltoall_busbw_large_gbs"} <= names
    assert sorted(n for n in names if not declared_match(NcclTestsCheck, n)) == []


def _cpu_params(name: str, cls: type[Check], tmp: Path) -> dict[str, Any]:
    small: dict[str, dict[str, Any]] = {
        "compute": {"dtypes": ["fp32"], "cpu_size": 64},
        "memory": {"cpu_mib": 8},
        "memtest": {"cpu_mib": 4, "chunk_mib": 2},
        "nbody": {"cpu_bodies": 128, "steps": 1},
        "stress": {"duration_s": 0.6, "window_s": 0.15, "cpu_threads": 1, "max_drop": 0.99},
        "agreement": {"cpu_size": 64, "chain": 4},
        "reference_train": {"cpu_d_model": 32, "cpu_layers": 1, "cpu_seq": 16, "cpu_batch": 4, "cpu_steps": 4,
                            "heads": 4, "runs": 1},
        "throughput": {"measure_s": 0.2, "warmup_steps": 1, "min_steps": 2, "models": ["cnn"]},
        "disk": {"path": str(tmp), "size_mib": 8, "runtime_s": 0.5, "min_free_gib": 0.0, "engine": "python"},
        "disk_space": {"paths": [str(tmp)]},
    }
    params = {**cls.defaults("quick"), **small.get(name, {})}
    return {k: v for k, v in params.items() if cls.param(k) is not None}


CPU_CHECKS = ["env", "disk_space", "compute", "memory", "memtest", "train", "nbody", "stress", "agreement",
              "reference_train", "throughput", "disk"]


@pytest.mark.parametrize("name", CPU_CHECKS)
def test_what_a_check_produces_on_cpu_is_declared(name: str, tmp_path: Path) -> None:
    cls = BUILTIN[name]
    out = cls().run(CheckContext(device="cpu", params=_cpu_params(name, cls, tmp_path), profile="quick"))
    names = {m.name for m in out.metrics}
    assert names, (name, out.status, out.reason)
    assert sorted(n for n in names if not declared_match(cls, n)) == []
    assert misflagged(out.metrics) == []


def misflagged(metrics: list[Metric]) -> list[tuple[str, str, bool]]:
    """(name, unit, flag) of each figure whose ``performance`` flag disagrees with the decision: every rate,
    bandwidth or time is a performance figure unless :data:`NOT_PERFORMANCE` says why not (issue 25 item 3)."""
    return sorted({(m.name, m.unit, m.performance) for m in metrics if m.performance != performance_expected(m.name,
                                                                                                           m.unit)})


def test_the_flag_decision_is_rate_like_minus_the_listed_exceptions() -> None:
    assert performance_expected("nbody_gflops", "GFLOP/s") and performance_expected("train_step_ms", "ms")
    assert performance_expected("disk_rand_read_iops", "IO/s") and performance_expected("ddp_samples_per_s",
                                                                                         "samples/s")
    assert performance_expected("allreduce_busbw_large_gbs", "GB/s")  # the per-size glob does not swallow it
    assert not performance_expected("allreduce_busbw_gbs", "GB/s") and not performance_expected("stress_tflops_end",
                                                                                              "TFLOP/s")
    assert not performance_expected("temperature_c", "C") and not performance_expected("gpu_count", "count")
    declared = [p for c in BUILTIN.values() for p in c.metrics or ()]
    for glob in NOT_PERFORMANCE:  # an exception that names no declared metric is dead
        assert any(globs_overlap(glob, p) for p in declared), glob
    assert misflagged([Metric("x_gbs", 1.0, "GB/s")]) == [("x_gbs", "GB/s", False)]


def test_recorded_nccl_tests_and_disk_figures_are_flagged_as_decided() -> None:
    from gpuaccept.checks.disk import DiskCheck
    from gpuaccept.checks.disk_io import figures_from_fio, parse_fio_json
    from gpuaccept.nccltests.judge import judge
    from gpuaccept.nccltests.parse import parse_any

    res = judge(parse_any((DATA / "nccl-tests" / "current_2hosts_h100.txt").read_text()), "all_reduce")
    assert any(m.performance for m in res.metrics) and misflagged(res.metrics) == []
    fig = figures_from_fio(parse_fio_json((DATA / "fio" / "direct.json").read_text()), True, 32)
    out = DiskCheck._outcome(fig, Metric("disk_free_gib", 9.0, "GiB"), {}, "/x", 16, 1.0)
    assert misflagged(out.metrics) == []


GPU_CHECKS = ["health", "compute", "memory", "p2p", "memtest", "stress", "agreement", "nbody", "train",
              "reference_train"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_CHECKS)
def test_what_a_check_produces_on_a_gpu_is_declared(name: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The names only a GPU run gives (``gemm_*_tflops_concurrent``, ``d2d_copy_gbs``, the NVML ones). The
    deterministic checks run here in a process whose CUDA earlier tests started: give them the cuBLAS workspace
    setting the runner gives every check process from its start."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    cls = BUILTIN[name]
    small: dict[str, dict[str, Any]] = {
        "compute": {"dtypes": ["fp32", "bf16"], "size": 2048, "concurrent": True},
        "memtest": {"fraction": 0.02},
        "p2p": {"size_mib": 32, "host_mib": 32, "iterations": 2},
        "stress": {"duration_s": 3.0, "window_s": 0.5},
        "reference_train": {"d_model": 256, "layers": 2, "seq": 128, "batch": 4, "steps": 20},
    }
    params = {k: v for k, v in {**cls.defaults("quick"), **small.get(name, {})}.items() if cls.param(k) is not None}
    out = cls().run(CheckContext(device="cuda", params=params, profile="quick"))
    names = {m.name for m in out.metrics}
    assert names, (name, out.status, out.reason)
    assert sorted(n for n in names if not declared_match(cls, n)) == []
    assert misflagged(out.metrics) == []
