"""The streamed gather (launch/stream.py) writes what the whole-cluster path writes, byte for byte (issue #27)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpuaccept.errors import InputError
from gpuaccept.launch.collect import analysed_table, iter_reports, write_cluster
from gpuaccept.launch.gather import merge_reports, summary_lines
from gpuaccept.launch.stream import stream_gather
from gpuaccept.model import CheckResult, Metric, NodeReport, Status, Verdict
from gpuaccept.results.clusterfile import LINE_LAYOUT_MIN_NODES, is_line_layout
from tests.fleet_sim import node_report

KW = {"run_id": "run-s", "backend": "slurm", "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T01:00:00Z",
      "job_id": "77"}
JOB = {"state": "COMPLETED", "ok": True, "detail": "", "timed_out": False, "interrupted": False}


def _conformance(fw: str) -> CheckResult:
    items = {"gpu.0.name": "NVIDIA H100 80GB HBM3", "gpu_count": 2, "nic.mlx5_0.fw_ver": fw}
    return CheckResult("conformance", Status.PASS, "", details={"conformance": {"items": items}})


def _fleet(nodes: int, seed: int = 5) -> list[NodeReport]:
    """Reports of ``nodes`` hosts: one slow GPU (an outlier), one node failing, one odd firmware, cross-node
    collectives on every rank, a not-judged figure."""
    rng = np.random.default_rng(seed)
    out = []
    for n in range(nodes):
        host = f"node{n:03d}"
        extra = [_conformance("28.41" if n == 2 else "28.39"),
                 CheckResult("collectives", Status.FAIL if n == 3 else Status.PASS, "slow" if n == 3 else "",
                             metrics=[Metric("allreduce_busbw_gbs", 300.0 + n, "GB/s")],
                             details={"distributed": True}, rank=n, host=host)]
        rep = node_report(host, rng, gpus=2, slow={1: 0.7} if n == 1 else None, extra=extra, run_id="run-s")
        rep.verdict = rep.decide()
        out.append(rep)
    return out


def _old(reports: list[NodeReport], run_dir: Path, hosts: list[str], nodes: int) -> tuple[bytes, list[str]]:
    cluster = merge_reports(reports, expected_hosts=hosts, expected_nodes=nodes, **KW)
    cluster.analysis["job"] = dict(JOB)
    cluster, table = analysed_table(cluster)
    path = write_cluster(cluster, run_dir, None, table)
    return path.read_bytes(), summary_lines(cluster)


def _new(reports: list[NodeReport], run_dir: Path, hosts: list[str], nodes: int) -> tuple[bytes, list[str]]:
    got = stream_gather(iter(reports), run_dir, expected_hosts=hosts, expected_nodes=nodes, job=dict(JOB), **KW)
    return got.path.read_bytes(), got.lines


def _same(tmp_path: Path, reports: list[NodeReport], hosts: list[str], nodes: int,
          capsys: pytest.CaptureFixture[str]) -> bytes:
    old, old_lines = _old(reports, tmp_path / "old", hosts, nodes)
    old_out = capsys.readouterr().out
    new, new_lines = _new(reports, tmp_path / "new", hosts, nodes)
    assert capsys.readouterr().out == old_out  # the same [RESULT] lines of the analysis
    assert new == old and new_lines == old_lines
    table_old = np.load(tmp_path / "old" / "cluster-report.metrics.npz")
    table_new = np.load(tmp_path / "new" / "cluster-report.metrics.npz")
    assert sorted(table_old.files) == sorted(table_new.files)
    assert all(np.array_equal(table_old[k], table_new[k]) for k in table_old.files)
    assert sorted(os.listdir(tmp_path / "new")) == ["cluster-report.json", "cluster-report.metrics.npz"]
    return new


def test_line_layout_is_byte_for_byte_the_old_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = _fleet(LINE_LAYOUT_MIN_NODES + 6)
    hosts = [r.host for r in reports[:-2]] + ["gone01"]  # one expected host never reported, two unexpected
    text = _same(tmp_path, reports, hosts, len(reports) + 2, capsys)  # and one whose name is unknown
    assert is_line_layout(tmp_path / "new" / "cluster-report.json")
    doc = json.loads(text)
    assert doc["analysis"]["gather"]["missing"] == ["gone01", f"missing-{len(reports) + 1}"]
    assert doc["analysis"]["cross_node"]["checks"]["collectives"]["failed_ranks"] == [3]
    assert doc["analysis"]["outliers"] and doc["analysis"]["conformance"]["odd"]


def test_reports_out_of_cluster_order_give_the_same_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = _fleet(LINE_LAYOUT_MIN_NODES + 3)
    hosts = [r.host for r in reports]
    random.Random(1).shuffle(reports)  # rebuilt from the node lines in cluster order
    _same(tmp_path, reports, hosts, len(hosts), capsys)
    reports.sort(key=lambda r: r.host, reverse=True)  # no expected hosts: every host is sorted by name
    _same(tmp_path / "b", reports, [], 0, capsys)


def test_a_small_cluster_is_the_same_indented_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = _fleet(5)
    text = _same(tmp_path, reports, [r.host for r in reports] + ["late"], 6, capsys)
    assert text.startswith(b'{\n  "schema_version"')


def test_reports_that_merge_are_held_and_merged_as_before(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    reports = _fleet(LINE_LAYOUT_MIN_NODES + 2)
    a, b = reports[4].host, reports[9].host
    # a second report of a host already written, and a rank-0 report holding another host's results
    again = NodeReport("run-s", a, "standard", "2026-01-01T00:00:00Z", "2026-01-01T00:20:00Z", Verdict.FAILURE,
                       [CheckResult("health", Status.FAIL, "xid 79")])
    both = NodeReport("run-s", b, "standard", "2026-01-01T00:00:00Z", "2026-01-01T00:20:00Z", Verdict.SUCCESS,
                      [CheckResult("env", Status.PASS, "", host=b), CheckResult("env", Status.PASS, "", host="zz")])
    reports += [again, both]
    text = _same(tmp_path, reports, [r.host for r in reports[:-2]], 0, capsys)
    doc = json.loads(text)
    by = {n["host"]: n for n in doc["nodes"]}
    assert by[a]["verdict"] == "failure" and [c["name"] for c in by[a]["report"]["checks"]][-1] == "health"
    assert "zz" in by and doc["analysis"]["gather"]["unexpected"] == ["zz"]


def test_iter_reports_reads_lazily_and_warns_once_per_bad_file(tmp_path: Path) -> None:
    for rep in _fleet(3):
        (tmp_path / rep.host).mkdir()
        (tmp_path / rep.host / "report.json").write_text(json.dumps(rep.to_dict()))
    (tmp_path / "zz-broken").mkdir()
    (tmp_path / "zz-broken" / "report.json").write_text("{not json")
    warned: list[str] = []
    it = iter_reports(tmp_path, warned.append)
    assert next(it).host == "node000" and warned == []  # nothing else read yet
    assert [r.host for r in it] == ["node001", "node002"]
    bad = tmp_path / "zz-broken" / "report.json"
    assert len(warned) == 1 and warned[0].startswith(f"{bad}: not a gpuaccept report (JSONDecodeError")


def test_an_error_while_streaming_leaves_no_file_behind(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "cluster-report.json").write_text("earlier\n")

    def reports() -> Iterator[NodeReport]:
        yield from _fleet(2)
        raise InputError("node002/report.json: not a gpuaccept report")

    with pytest.raises(InputError):
        stream_gather(reports(), run, **KW)
    assert sorted(os.listdir(run)) == ["cluster-report.json"]  # the temporary node lines went with the error
    assert (run / "cluster-report.json").read_text() == "earlier\n"


def test_gather_cli_reads_the_run_dir_one_report_at_a_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuaccept.launch.collect import read_reports_tolerant
    from tests.cli_inproc import run_main

    run = tmp_path / "run"
    reports = _fleet(LINE_LAYOUT_MIN_NODES + 1)
    for rep in reports:
        (run / rep.host).mkdir(parents=True)
        (run / rep.host / "report.json").write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
    (run / "zz-broken").mkdir()
    (run / "zz-broken" / "report.json").write_text("[]")
    hosts = [r.host for r in reports]
    (run / "launch").mkdir()
    (run / "launch" / "job.json").write_text(json.dumps({"run_id": "run-s", "backend": "slurm", "nodes": len(hosts),
                                                         "expected_hosts": hosts, "started": KW["started"]}))
    r = run_main("gather", str(run), "--local", "--no-history", "--cluster-report", str(tmp_path / "copy.json"))
    assert r.rc == 1  # node003 failed
    assert [line for line in r.err_lines if "not a gpuaccept report" in line] == [
        f"[LAUNCH] warning: {run / 'zz-broken' / 'report.json'}: not a gpuaccept report "
        "(TypeError: list indices must be integers or slices, not str)"]
    got = (run / "cluster-report.json").read_bytes()
    assert (tmp_path / "copy.json").read_bytes() == got
    finished = json.loads(got.split(b"\n", 1)[0][:-len(b', "nodes": [')] + b"}")["finished"]
    old = merge_reports(read_reports_tolerant(run)[0], run_id="run-s", backend="slurm", started=KW["started"],
                        finished=finished, expected_hosts=hosts, expected_nodes=len(hosts))
    old, table = analysed_table(old)
    assert write_cluster(old, tmp_path / "old", None, table).read_bytes() == got
    lines = summary_lines(old)
    assert r.out.splitlines()[-len(lines) - 1:] == [*lines, f"[RESULT] cluster report: {run / 'cluster-report.json'}"]


def test_worker_processes_write_the_same_file_and_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuaccept.launch.collect import ReportFiles

    reports = _fleet(LINE_LAYOUT_MIN_NODES + 2)
    again = NodeReport("run-s", reports[7].host, "standard", "2026-01-01T00:00:00Z", "2026-01-01T00:20:00Z",
                       Verdict.FAILURE, [CheckResult("health", Status.FAIL, "xid 79")])
    outs = []
    for workers in (1, 3):
        run = tmp_path / f"w{workers}"
        for i, rep in enumerate([*reports, again]):
            (run / f"n{i:03d}").mkdir(parents=True)  # the second report of one host comes last
            (run / f"n{i:03d}" / "report.json").write_text(json.dumps(rep.to_dict(), indent=2))
        (run / "n010" / "report.json").write_text('{"host": 1}')
        warned: list[str] = []
        got = stream_gather(ReportFiles(run, warned.append), run, expected_hosts=[r.host for r in reports],
                            workers=workers, **KW)
        outs.append((got.path.read_bytes(), got.lines, [w.replace(str(run), "RUN") for w in warned],
                     capsys.readouterr().out))
    assert outs[0] == outs[1]
    _text, lines, warned, _out = outs[0]
    assert warned == ["RUN/n010/report.json: not a gpuaccept report (KeyError: 'run_id')"]
    assert "[NODE] node010: MISSING" in "\n".join(lines) and "[NODE] node007: FAILURE - failed: health" in lines


@pytest.mark.parametrize("nodes", [4, LINE_LAYOUT_MIN_NODES + 1])
def test_the_history_gets_the_cluster_read_back_from_the_file(tmp_path: Path, nodes: int) -> None:
    from gpuaccept.launch.collect import ReportFiles
    from gpuaccept.launch.stream import read_back
    from tests.cli_inproc import run_main

    run = tmp_path / "run"
    reports = _fleet(nodes)
    for rep in reports:
        (run / rep.host).mkdir(parents=True)
        (run / rep.host / "report.json").write_text(json.dumps(rep.to_dict()))
    got = stream_gather(ReportFiles(run, print), run, expected_hosts=[r.host for r in reports], workers=1, **KW)
    old = merge_reports(reports, expected_hosts=[r.host for r in reports], **KW)
    old, _table = analysed_table(old)
    assert read_back(got.path).to_dict() == json.loads(json.dumps(old.to_dict()))
    r = run_main("gather", str(run), "--local", "--db", f"sqlite:///{tmp_path / 'h.db'}")
    assert f"stored cluster run {run.name} ({nodes} nodes)" in r.err


def test_gather_stores_the_history_a_batch_of_nodes_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """The history gets the written file's node lines in batches (``Store.add_cluster_stream``), never the whole
    cluster as objects, and stores what ``history --import`` of the same file stores."""
    from gpuaccept.launch.stream import read_back
    from gpuaccept.results import store as store_mod
    from gpuaccept.results.history import open_store
    from tests.cli_inproc import run_main

    run = tmp_path / "run"
    reports = _fleet(LINE_LAYOUT_MIN_NODES + 6)
    for rep in reports:
        (run / rep.host).mkdir(parents=True)
        (run / rep.host / "report.json").write_text(json.dumps(rep.to_dict()))
    held: list[int] = []
    real = store_mod._batched

    def watched(items, n):  # type: ignore[no-untyped-def]
        for part in real(items, n):
            held.append(len(part))
            yield part
    monkeypatch.setattr(store_mod, "_batched", watched)
    monkeypatch.setattr(store_mod.Store, "add_cluster_report", lambda *a: pytest.fail("whole cluster stored"))
    r = run_main("gather", str(run), "--local", "--db", f"sqlite:///{tmp_path / 'h.db'}")
    assert f"stored cluster run {run.name} ({len(reports)} nodes)" in r.err, r.err
    assert len(held) >= 2 and max(held) <= store_mod.NODE_BATCH and sum(held) == len(reports)
    with open_store(f"sqlite:///{tmp_path / 'h.db'}", read_only=True) as st:
        stored = st.get_run(run.name).report
    assert stored.to_dict() == read_back(run / "cluster-report.json").to_dict()
