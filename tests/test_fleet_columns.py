"""The cluster's columnar metrics table (issue #27): gather writes it, analyze and baseline create read it, and
what they print is what reading every node report gives."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpuaccept.model import ClusterReport, NodeReport
from gpuaccept.results.columns import merge, read_table, table_path, write_table
from gpuaccept.results.load import load_file
from gpuaccept.results.samples import collect
from tests.cli_inproc import run_main
from tests.fleet_sim import fleet

DATA = Path(__file__).parent / "data" / "reports"


def _run_dir(tmp_path: Path, reports: list[NodeReport], name: str = "run1") -> Path:
    run = tmp_path / name
    (run / "launch").mkdir(parents=True)
    hosts = [r.host for r in reports]
    (run / "launch" / "job.json").write_text(json.dumps(
        {"run_id": name, "backend": "slurm", "nodes": len(hosts), "expected_hosts": hosts,
         "started": "2026-11-28T00:00:00Z"}))
    for r in reports:
        (run / r.host).mkdir()
        (run / r.host / "report.json").write_text(json.dumps(r.to_dict(), indent=2))
    return run


def _gathered(tmp_path: Path, reports: list[NodeReport]) -> Path:
    run = _run_dir(tmp_path, reports)
    res = run_main("gather", str(run), "--local", "--no-history")
    assert res.rc in (0, 1), res.err
    return run / "cluster-report.json"


def _slow_fleet() -> list[NodeReport]:
    c = fleet(3, nodes=12, slow={(2, 5): 0.8}, slow_nodes={7: 0.85})
    return [e.report for e in c.nodes if e.report is not None]


def _fixture_nodes() -> list[NodeReport]:
    """The recorded cluster report's nodes and the recorded CPU node reports, as node reports of one run."""
    cluster = load_file(str(DATA / "cluster-h100.json"))
    assert isinstance(cluster, ClusterReport)
    nodes = [e.report for e in cluster.nodes if e.report is not None]
    for i, name in enumerate(("node-cpu.json", "node-cpu-collectives.json", "node-cpu-budget.json")):
        rep = load_file(str(DATA / name))
        assert isinstance(rep, NodeReport)
        nodes.append(replace(rep, host=f"{rep.host}{i}"))  # all three ran on host vm
    return nodes


def _both_ways(path: Path, *args: str) -> tuple[str, str]:
    """``analyze PATH ARGS`` with the table, then with the table moved away (every node report read)."""
    with_table = run_main("analyze", str(path), *args)
    assert with_table.rc in (0, 1), with_table.err
    table_path(path).rename(path.parent / "moved.npz")
    without = run_main("analyze", str(path), *args)
    assert without.rc == with_table.rc, without.err
    return with_table.out, without.out


@pytest.mark.parametrize("nodes", [_slow_fleet, _fixture_nodes], ids=["simulated", "recorded"])
def test_analyze_from_the_table_is_what_reading_the_reports_gives(tmp_path: Path, nodes) -> None:  # type: ignore[no-untyped-def]
    path = _gathered(tmp_path, nodes())
    assert table_path(path).is_file()
    fast, slow = _both_ways(path, "--json")
    assert json.loads(fast) == json.loads(slow)
    assert fast == slow
    result = json.loads(fast)
    cluster = json.loads(path.read_text())
    assert result["samples"] > 0 and result["nodes"] == sum(e["state"] == "reported" for e in cluster["nodes"]) > 3
    # and it is the analysis gather stored in the cluster report itself
    stored = cluster["analysis"]
    assert stored["outliers"] == result["outliers"] and stored["stats"] == result["stats"]


def test_the_simulated_slow_gpu_and_node_are_found_from_the_table(tmp_path: Path) -> None:
    path = _gathered(tmp_path, _slow_fleet())
    out = json.loads(run_main("analyze", str(path), "--json").out)
    found = {(o["host"], o["device"], o["scope"]) for o in out["outliers"]}
    assert ("node002", "cuda:5", "node") in found
    assert ("node007", None, "cluster") in found


def test_the_console_text_is_the_same_both_ways(tmp_path: Path) -> None:
    path = _gathered(tmp_path, _fixture_nodes())
    fast, slow = _both_ways(path, "--limit", "0")
    assert fast == slow and "value(s)" in fast


def test_baseline_create_from_the_table_is_the_same_baseline(tmp_path: Path) -> None:
    path = _gathered(tmp_path, _slow_fleet())
    outs = []
    for name in ("fast.yaml", "slow.yaml"):
        res = run_main("baseline", "create", "--from", str(path), "-o", str(tmp_path / name))
        assert res.rc == 0, res.err
        outs.append(re.sub(r"(?m)^  created: .*$", "", (tmp_path / name).read_text()))
        if name == "fast.yaml":
            table_path(path).unlink()
    assert outs[0] == outs[1] and "gemm_bf16_tflops" in outs[0]


def test_a_table_of_another_version_of_the_report_is_not_used(tmp_path: Path) -> None:
    path = _gathered(tmp_path, _slow_fleet())
    samples, configs = read_table(path) or (None, None)
    assert samples is not None
    samples.value[:] = 1.0  # a table that would say something else
    write_table(samples, configs or {}, path)
    assert read_table(path) is not None
    path.write_text(path.read_text() + "\n")  # the report changed after its table was written
    assert read_table(path) is None
    out = json.loads(run_main("analyze", str(path), "--json").out)
    assert out["outliers"]  # the report's own values, not the table's ones


def test_a_malformed_table_that_matches_the_report_is_one_line_exit_2(tmp_path: Path) -> None:
    path = _gathered(tmp_path, _slow_fleet())
    samples, configs = read_table(path) or (None, None)
    assert samples is not None
    samples.key[:] = len(samples.keys) + 3   # ids past the end of the key table
    write_table(samples, configs or {}, path)
    res = run_main("analyze", str(path))
    assert res.rc == 2
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and "not a gpuaccept metrics table" in lines[0] and "Traceback" not in res.err


def test_a_link_in_place_of_the_table_is_not_followed(tmp_path: Path) -> None:
    path = _gathered(tmp_path, _slow_fleet())
    table = table_path(path)
    real = table.rename(tmp_path / "elsewhere.npz")
    table.symlink_to(real)
    assert read_table(path) is None


def test_merging_tables_keeps_every_row_and_its_names() -> None:
    a, b = collect([fleet(1, nodes=3)]), collect([fleet(2, nodes=4, gpus=4, sku="a100_sxm4_80gb")])
    m = merge([a, b])
    assert len(m) == len(a) + len(b) and len(m.nodes) == 7
    for s, rows in ((a, slice(0, len(a))), (b, slice(len(a), len(m)))):
        assert np.array_equal(m.value[rows], s.value)
        assert [m.keys[k] for k in m.key[rows]] == [s.keys[k] for k in s.key]
        assert [m.skus[k] for k in m.sku[rows]] == [s.skus[k] for k in s.sku]
        assert [m.devices[k] for k in m.device[rows]] == [s.devices[k] for k in s.device]
    assert set(m.skus) == {"h100_sxm", "a100_sxm4_80gb"}


def test_a_table_that_unpacks_past_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuaccept.results.columns as columns

    path = _gathered(tmp_path, _slow_fleet())
    np.savez_compressed(table_path(path), meta=np.zeros(1, np.uint8), value=np.zeros(8 << 20))  # 64 MiB of zeros
    assert table_path(path).stat().st_size < 1 << 20
    monkeypatch.setattr(columns, "MAX_TABLE_BYTES", 16 << 20)
    with pytest.raises(columns.InputError, match="once unpacked"):
        read_table(path)
