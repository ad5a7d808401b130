"""The fabric model (hw/fabric_expect) on the recorded NVML snapshots and sysfs trees, and the one
judging path (nccltests/busbw) that the collectives check, the nccl_tests check and the CLI share."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gpuaccept.checks.collectives import Row, rows_to_outcome
from gpuaccept.distributed.group import RankContext
from gpuaccept.hw.fabric_expect import (
    NETWORK_EFFICIENCY,
    NVLINK_EFFICIENCY,
    PCIE_EFFICIENCY,
    Expectation,
    FabricInputs,
    GpuLinks,
    expect_busbw,
    gpu_links,
    node_nics,
)
from gpuaccept.hw.nvml import NvmlSnapshot, snapshot_from_dict
from gpuaccept.hw.rdma import read_inventory
from gpuaccept.hw.sku import load_skus
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Threshold, Verdict
from gpuaccept.nccltests.busbw import FABRIC_TOLERANCE, FabricFacts, Reference, busbw_reference, result_fabric
from gpuaccept.nccltests.judge import judge
from gpuaccept.nccltests.parse import parse_text
from tests.helpers import gpuaccept

DATA = Path(__file__).resolve().parent / "data"
SKUS = load_skus()
SRC = Path(__file__).resolve().parent.parent / "src" / "gpuaccept"


def _snap(name: str) -> NvmlSnapshot:
    return snapshot_from_dict(json.loads((DATA / "nvml" / f"{name}.json").read_text()))


def _nics(tree: str, host: str = "n"):  # type: ignore[no-untyped-def]
    return node_nics(read_inventory(DATA / "sysfs" / tree).ports, host)


def _inputs(snap: str, sku: str, nodes: int = 1, tree: str | None = None, per_node: int | None = None,
            all_pairs: bool | None = None) -> FabricInputs:
    s = _snap(snap)
    gpus = [gpu_links(g) for g in s.gpus]
    nics = [_nics(tree, f"n{i}") for i in range(nodes)] if tree else None
    return FabricInputs(SKUS[sku], nodes, per_node or len(gpus), gpus, all_pairs,
                        [n for n in nics if n is not None] if nics is not None else None)


# ------------------------------------------------------------------------------------------ the model


def test_nvswitch_node_from_the_healthy_h100_snapshot() -> None:
    e, why = expect_busbw("allreduce", _inputs("healthy_h100_sxm_8x", "h100_sxm"))
    assert e is not None and (e.path, e.ceiling_gbs, e.efficiency, e.severity) == (
        "nvlink", 450.0, NVLINK_EFFICIENCY, Status.FAIL)
    assert e.gbs == 337.5 and "NVLink4 18 links x 25 GB/s per GPU = 450 GB/s" in why
    assert e.source == f"fabric: {why}, efficiency {NVLINK_EFFICIENCY}"
    # allgather, reducescatter, alltoall, broadcast and sendrecv have the same intra-node ceiling; reduce,
    # gather and scatter are not modelled
    for op in ("allgather", "reducescatter", "alltoall", "broadcast", "sendrecv"):
        assert expect_busbw(op, _inputs("healthy_h100_sxm_8x", "h100_sxm"))[0] == e
    assert expect_busbw("reduce", _inputs("healthy_h100_sxm_8x", "h100_sxm"))[0] is None


def test_a_down_nvlink_link_lowers_the_ceiling_to_the_weakest_gpu() -> None:
    e, why = expect_busbw("allreduce", _inputs("nvlink_down", "h100_sxm"))
    assert e is not None and e.ceiling_gbs == 425.0 and "17 links (fewest of 8 GPUs)" in why


def test_pcie_cards_use_the_link_maximum_and_warn() -> None:
    e, why = expect_busbw("allreduce", _inputs("unsupported_l40s_4x", "l40s"))  # idle at gen1 of gen4 x16
    assert e is not None and (e.path, e.severity, e.efficiency) == ("pcie", Status.WARN, PCIE_EFFICIENCY)
    assert e.ceiling_gbs == pytest.approx(31.508, abs=1e-3) and "PCIe gen4 x16" in why
    # NVLink cards whose bridges do not join every pair meet over PCIe; a trained-down link is the health check's
    e, why = expect_busbw("allreduce", _inputs("pcie_downgraded", "h100_nvl", all_pairs=False))
    assert e is not None and e.path == "pcie" and "gen5 x16" in why


@pytest.mark.parametrize(("tree", "per_node", "ceiling", "text"), [
    ("ndr_4x", 8, 200.0, "4x NDR 400 Gb/s per node = 200 GB/s"),
    ("hdr_8x", 8, 200.0, "8x HDR 200 Gb/s per node = 200 GB/s"),
    ("ndr_4x_degraded", 8, 150.0, "3x NDR 400 Gb/s per node = 150 GB/s (1 active ports at other rates left out)"),
    ("ndr_4x_port_down", 8, 150.0, "3x NDR 400 Gb/s per node"),
    ("roce_2x", 8, 50.0, "2x RoCE 200 Gb/s per node = 50 GB/s"),
    ("ndr_8x", 4, 200.0, "4x NDR 400 Gb/s per node"),  # at most one NIC per GPU of the node
])
def test_network_ceiling_from_the_recorded_sysfs_trees(tree: str, per_node: int, ceiling: float, text: str) -> None:
    e, why = expect_busbw("allreduce", _inputs("healthy_h100_sxm_8x", "h100_sxm", 2, tree, per_node))
    assert e is not None and (e.path, e.ceiling_gbs, e.efficiency) == ("network", ceiling, NETWORK_EFFICIENCY)
    assert text in why and e.source.startswith("fabric: ")


def test_across_nodes_the_slower_of_nvlink_and_network_binds() -> None:
    # 8 x NDR 400: 400 x 0.85 = 340 GB/s; NVLink 450 x 0.75 = 337.5 GB/s binds
    e, why = expect_busbw("allreduce", _inputs("healthy_h100_sxm_8x", "h100_sxm", 2, "ndr_8x"))
    assert e is not None and e.path == "nvlink" and e.gbs == 337.5 and "below the network's" in why


def test_alltoall_across_nodes_crosses_a_nic_share() -> None:
    e, why = expect_busbw("alltoall", _inputs("healthy_h100_sxm_8x", "h100_sxm", 2, "ndr_8x"))
    assert e is not None and e.path == "network" and e.ceiling_gbs == pytest.approx(400 / 8 * 15 / 8)
    assert "alltoall: / 8 GPUs x 15/8" in why


def test_sendrecv_across_nodes_crosses_one_port_and_broadcast_is_a_ring() -> None:
    # the pair at a node boundary goes through one NIC: one NDR port = 50 GB/s, not the node's 400
    e, why = expect_busbw("sendrecv", _inputs("healthy_h100_sxm_8x", "h100_sxm", 2, "ndr_8x"))
    assert e is not None and e.path == "network" and e.ceiling_gbs == 50.0
    assert "one NDR 400 Gb/s port per node boundary = 50 GB/s (sendrecv)" in why
    ring, _ = expect_busbw("allreduce", _inputs("healthy_h100_sxm_8x", "h100_sxm", 2, "ndr_4x"))
    assert expect_busbw("broadcast", _inputs("healthy_h100_sxm_8x", "h100_sxm", 2, "ndr_4x"))[0] == ring


def test_no_network_expectation_without_rdma_or_for_one_rank() -> None:
    assert _nics("no_rdma") is None and _nics("malformed") is None
    e, why = expect_busbw("allreduce", _inputs("healthy_h100_sxm_8x", "h100_sxm", 2, "no_rdma"))
    assert e is None and "RDMA ports of 2 of 2 nodes unknown" in why
    assert expect_busbw("allreduce", FabricInputs(SKUS["h100_sxm"], 1, 1))[0] is None
    # one GPU per node: the network alone, one NIC each
    e, _ = expect_busbw("allreduce", _inputs("healthy_h100_sxm_8x", "h100_sxm", 4, "ndr_8x", 1))
    assert e is not None and e.path == "network" and e.ceiling_gbs == 50.0


def test_the_sku_caps_the_link_count_and_stands_in_without_nvml() -> None:
    e, why = expect_busbw("allreduce", FabricInputs(SKUS["h100_sxm"], 1, 8, [GpuLinks(24, 5, 16)] * 8))
    assert e is not None and e.ceiling_gbs == 450.0  # 24 x 25 = 600 > the SKU's 900 / 2
    e, why = expect_busbw("allreduce", FabricInputs(SKUS["b200"], 1, 8))
    assert e is not None and e.ceiling_gbs == SKUS["b200"].nvlink_gbs / 2 and "SKU table" in why


# ------------------------------------------------------------------------------- one judging path


def _rc(world: int = 8) -> RankContext:
    return RankContext(rank=0, world_size=world, local_rank=0, local_world_size=world, node_rank=0, num_nodes=1,
                       hosts=("h",) * world, store_host="127.0.0.1", store_port=1, prefix="p/", timeout_s=5.0,
                       device_index=0)


def _collectives_metric(busbw: float, **kw: object) -> Metric:
    size = 1 << 30
    t = size / (busbw * 1e9 / (2 * 7 / 8))
    row = Row("allreduce", "float32", True, size, size // 4, t * 1e6, size / t / 1e9, busbw, 0)
    out = rows_to_outcome([row], _rc(), **kw)  # type: ignore[arg-type]
    return next(m for m in out.metrics if m.name == "allreduce_busbw_large_gbs")


def _nccl_metric(busbw: float, **kw: object) -> tuple[Status, Metric]:
    text = (DATA / "nccl-tests" / "current_2hosts_h100.txt").read_text()
    text = text.replace("  338.82 ", f"  {busbw:6.2f} ").replace("  337.35 ", f"  {busbw:6.2f} ")
    j = judge(parse_text(text), "all_reduce", **kw)  # type: ignore[arg-type]
    return j.status, next(m for m in j.metrics if m.name == "allreduce_busbw_large_gbs")


@pytest.mark.parametrize("fabric", [
    Expectation(450.0, NVLINK_EFFICIENCY, "nvlink", "fabric: NVLink4 18 links"),
    Expectation(63.015, PCIE_EFFICIENCY, "pcie", "fabric: PCIe gen5 x16", Status.WARN),
])
@pytest.mark.parametrize("min_busbw", [None, 100.0])
def test_both_checks_take_the_same_expectation_and_bound(fabric: Expectation, min_busbw: float | None) -> None:
    for busbw in (20.0, 200.0, 300.0):
        c = _collectives_metric(busbw, fabric={"allreduce": fabric}, min_busbw_gbs=min_busbw or 0.0)
        status, n = _nccl_metric(busbw, fabric=fabric, min_busbw_gbs=min_busbw, source="param:min_busbw_gbs")
        assert (c.expected, c.expected_source, c.threshold) == (n.expected, n.expected_source, n.threshold)
        ref = busbw_reference(fabric, min_busbw_gbs=min_busbw)
        assert c.threshold == ref.threshold and c.expected == fabric.gbs
        bound = min_busbw if min_busbw else round(fabric.gbs * FABRIC_TOLERANCE, 3)
        assert c.threshold is not None and c.threshold.value == bound
        want = Status.PASS if busbw >= bound else (Status.FAIL if min_busbw else fabric.severity)
        assert status is want, (busbw, bound, status)


def test_no_module_builds_its_own_busbw_bound() -> None:
    """The checks reach the bound only through busbw_reference: neither builds a Threshold."""
    for rel in ("checks/collectives.py", "nccltests/judge.py", "checks/nccl_tests.py"):
        tree = ast.parse((SRC / rel).read_text())
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "Threshold" not in called, rel
    assert "busbw_reference" in (SRC / "checks/collectives.py").read_text()
    assert "busbw_reference" in (SRC / "nccltests/judge.py").read_text()


def test_precedence_baseline_then_explicit_then_fabric() -> None:
    fabric = Expectation(450.0, NVLINK_EFFICIENCY, "nvlink", "fabric: NVLink4")
    base = Reference(362.0, "baseline:fleet.yaml", Threshold(">=", 350.0, Status.FAIL, "baseline:fleet.yaml:min=350"))
    assert busbw_reference(fabric, min_busbw_gbs=100.0, baseline=base) == base
    explicit = busbw_reference(fabric, min_busbw_gbs=100.0, min_source="--min-busbw")
    assert explicit.threshold == Threshold(">=", 100.0, Status.FAIL, "--min-busbw")
    assert explicit.expected == 337.5 and explicit.expected_source == "fabric: NVLink4"
    derived = busbw_reference(fabric)
    assert derived.threshold == Threshold(">=", 270.0, Status.FAIL, "fabric:nvlink x 0.8")
    assert busbw_reference(None) == Reference()


def test_a_baseline_overrides_the_fabric_expectation_at_run_time() -> None:
    from gpuaccept.results.baseline import Baseline, BaselineEntry
    from gpuaccept.results.baseline_judge import overlay_baseline

    m = _collectives_metric(300.0, fabric={"allreduce": Expectation(450.0, 0.75, "nvlink", "fabric: NVLink4")})
    check = CheckResult("collectives", Status.PASS, "ok", metrics=[m], details={"sku": {"cuda:0": "h100_sxm"}})
    node = NodeReport(run_id="r", host="h", profile="quick", started="2025-01-01T00:00:00Z", checks=[check])
    entry = BaselineEntry("allreduce_busbw_large_gbs", 362.0, "GB/s", 2.0, 64)
    baseline = Baseline(skus={"h100_sxm": (entry,)}, path="fleet.yaml")
    changed = overlay_baseline(check, node, baseline)
    assert changed and m.expected == 362.0 and m.expected_source == "baseline:fleet.yaml"
    assert m.threshold is not None and m.threshold.source.startswith("baseline:fleet.yaml")


# ------------------------------------------------------------------------------- nccl-tests inputs


def test_a_saved_log_gets_its_expectation_from_the_gpu_model_and_the_recorded_fabric() -> None:
    result = parse_text((DATA / "nccl-tests" / "current_2hosts_h100.txt").read_text())
    e, why = result_fabric(result, "allreduce")  # 2 hosts, network unknown
    assert e is None and "RDMA ports" in why
    e, why = result_fabric(result, "allreduce", FabricFacts(nics=_nics("hdr_8x")))
    assert e is not None and e.path == "network" and e.ceiling_gbs == 200.0
    e, _ = result_fabric(result, "allreduce", FabricFacts(_snap("nvlink_down"), _nics("ndr_8x")))
    assert e is not None and e.path == "nvlink" and e.ceiling_gbs == 425.0


def test_cli_parse_shows_the_fabric_expectation() -> None:
    log = str(DATA / "nccl-tests" / "current_2hosts_h100.txt")
    r = gpuaccept("nccl-tests", "parse", log, "--sysfs-root", str(DATA / "sysfs" / "hdr_8x"), "--json")
    doc = json.loads(r.stdout)
    large = next(m for m in doc["metrics"] if m["name"] == "allreduce_busbw_large_gbs")
    assert r.returncode == 0 and large["expected"] == 170.0
    assert large["expected_source"].startswith("fabric: 8x HDR 200")
    assert large["threshold"] == {"op": ">=", "value": 136.0, "severity": "fail", "source": "fabric:network x 0.8"}
    r = gpuaccept("nccl-tests", "parse", log, "--sysfs-root", str(DATA / "sysfs" / "hdr_8x"), "--min-busbw", "400")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "expected 170 GB/s (fabric: 8x HDR 200 Gb/s" in r.stdout and "below 400 GB/s (--min-busbw)" in r.stdout


# ------------------------------------------------------------------------------------------ reports


def test_every_report_format_shows_the_derived_figure_next_to_the_measured_one() -> None:
    from gpuaccept.report.console import metric_line
    from gpuaccept.report.html import render_html
    from gpuaccept.report.junit import render_junit
    from gpuaccept.report.markdown import render_markdown

    fabric = Expectation(400.0, NETWORK_EFFICIENCY, "network", "fabric: 8x NDR 400 Gb/s per node = 400 GB/s, "
                                                                 "efficiency 0.85")
    m = _collectives_metric(300.0, fabric={"allreduce": fabric})
    check = CheckResult("collectives", Status.PASS, "ok", metrics=[m])
    node = NodeReport(run_id="r", host="h", profile="quick", started="2025-01-01T00:00:00Z",
                      finished="2025-01-01T00:01:00Z", verdict=Verdict.SUCCESS, checks=[check])
    note = "(8x NDR 400 Gb/s per node = 400 GB/s, efficiency 0.85)"
    line = metric_line(m)
    assert "= 300.0 GB/s" in line and f"fabric 340.0 GB/s {note}" in line
    md = render_markdown(node)
    assert "fabric 340" in md and note in md
    html = render_html(node)
    assert 'title="fabric: 8x NDR 400 Gb/s per node' in html and "<th>fabric</th>" in html
    junit = render_junit(node)
    assert "EXPECTED: allreduce_busbw_large_gbs on cuda:0 = 300" in junit and note in junit
    assert "threshold &gt;= 272" in junit and "fabric:network x 0.8" in junit
