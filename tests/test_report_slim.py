"""``gpuaccept report`` of a fleet read a node at a time (issue 27): the same text as from the whole report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuaccept.cli import main
from gpuaccept.errors import InputError
from gpuaccept.model import CheckResult, ClusterReport, Metric, NodeEntry, NodeState, Status
from gpuaccept.report.html import render_html
from gpuaccept.report.markdown import render_markdown
from gpuaccept.report.slim import FULL_UP_TO, load_slim
from gpuaccept.results.analysis import analyze
from gpuaccept.results.clusterfile import write_cluster_file
from gpuaccept.results.load import load_file
from tests.fleet_sim import node_report

SIZES = [1 << k for k in range(16, 28, 2)]
WHEN = "2026-11-28T00:00:00Z"


def _collectives(host: str, rng: np.random.Generator, ranks: int = 2) -> list[CheckResult]:
    """Per-rank collective sweeps as the check reports them (a ``rank`` tag, the rank's host)."""
    return [CheckResult("collectives", Status.PASS, "", 1.5, rank=r, host=host, metrics=[
        Metric(f"allreduce_{kind}_gbs", float(100 * s / SIZES[-1] * (1 + rng.normal(0, 0.01))), "GB/s",
               device=f"cuda:{r}", tags={"op": "allreduce", "dtype": "bf16", "size_bytes": s, "rank": r})
        for kind in ("busbw", "algbw") for s in SIZES]) for r in range(ranks)]


def _fleet(n: int, seed: int = 3) -> ClusterReport:
    """``n`` 8-GPU nodes: node 5 fails memtest, 6 warns, 9 is missing, 11 has a slow GPU (an outlier), 12 has a
    figure measured but not judged, 14 a ``run --budget`` re-run; every node reference training and sweeps."""
    rng = np.random.default_rng(seed)
    entries = []
    for i in range(n):
        host = f"node{i:04d}"
        if i == 9:
            entries.append(NodeEntry(host, NodeState.MISSING, None, i, "no report.json after the job ended"))
            continue
        status = Status.FAIL if i == 5 else Status.WARN if i == 6 else Status.PASS
        extra = [CheckResult("memtest", status, "bit errors" if i == 5 else "", 2.0,
                             metrics=[Metric("memtest_errors", 3.0 if i == 5 else 0.0, "count")]),
                 CheckResult("reference_train", Status.PASS, "trained", 9.0, details={"dtype": "bf16"},
                             metrics=[Metric("model_tflops", 300.0 + i, "TFLOP/s", device="cuda:0")]),
                 *_collectives(host, rng)]
        if i == 12:
            extra.append(CheckResult("disk", Status.PASS, "", metrics=[Metric("write_gbs", 2.0, "GB/s",
                                                                              performance=True)]))
        if i == 14:
            extra.append(CheckResult("memtest", Status.PASS, "deeper", details={"rerun": {"level": 2}}))
        rep = node_report(host, rng, slow={2: 0.7} if i == 11 else None, extra=extra, run_id="fleet-run")
        rep.verdict = rep.decide()
        entries.append(NodeEntry(host, NodeState.REPORTED, rep, i))
    cr = ClusterReport("fleet-run", "slurm", WHEN, expected_nodes=n, nodes=entries)
    cr.analysis = analyze(cr)
    return cr


def _write(tmp_path: Path, cluster: ClusterReport) -> Path:
    path = tmp_path / "cluster-report.json"
    with open(path, "w") as fh:
        write_cluster_file(cluster, fh, line_layout=True)
    return path


def _metric_count(cluster: ClusterReport) -> int:
    return sum(len(c.metrics) for e in cluster.nodes if e.report is not None for c in e.report.checks)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("n", [FULL_UP_TO + 16, 20])
def test_the_streamed_pages_equal_those_of_the_whole_report(tmp_path: Path, n: int, workers: int) -> None:
    """In one process, and with the nodes read in two worker processes (chunks of 16 nodes, their grids merged)."""
    path = _write(tmp_path, _fleet(n))
    whole = load_file(path)
    assert isinstance(whole, ClusterReport)
    got = load_slim(path, workers=workers)
    assert got is not None and got[1] is not None
    slim, grid = got
    assert render_markdown(slim) == render_markdown(whole)
    assert render_html(slim, generated=WHEN, grid=grid) == render_html(whole, generated=WHEN)
    md_only = load_slim(path, grid=False, workers=workers)
    assert md_only is not None and md_only[1] is None
    assert render_markdown(md_only[0]) == render_markdown(whole)
    if n > FULL_UP_TO:  # a fleet: healthy nodes keep a few metrics; those that need a look keep every one
        assert _metric_count(slim) < _metric_count(whole) / 3
        by_host = {e.host: e for e in slim.nodes}
        for host in ("node0005", "node0006", "node0011"):
            assert _metric_count(ClusterReport("r", "b", WHEN, nodes=[by_host[host]])) == \
                _metric_count(ClusterReport("r", "b", WHEN, nodes=[e for e in whole.nodes if e.host == host]))
    else:  # a small cluster in the line layout: every node whole
        assert _metric_count(slim) == _metric_count(whole)


def test_a_report_without_a_stored_analysis_is_read_whole(tmp_path: Path) -> None:
    cluster = _fleet(FULL_UP_TO + 2)
    cluster.analysis = {}
    assert load_slim(_write(tmp_path, cluster)) is None


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_the_cli_renders_a_fleet_as_from_the_whole_report(tmp_path: Path, fmt: str) -> None:
    path = _write(tmp_path, _fleet(FULL_UP_TO + 4))
    out = tmp_path / f"out.{fmt}"
    assert main(["report", str(path), "-f", fmt, "-o", str(out)]) == 0
    whole = load_file(path)
    text = out.read_text()
    if fmt == "md":
        assert text == render_markdown(whole)
    else:
        when = text.rsplit("Generated by gpuaccept ", 1)[1].split(" at ", 1)[1].split(". ", 1)[0]
        assert text == render_html(whole, generated=when)


def test_a_malformed_node_line_is_exit_2_naming_file_and_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _fleet(FULL_UP_TO + 2))
    lines = path.read_text().split("\n")
    lines[40] = lines[40].replace('"status": "pass"', '"status": "fine"', 1)
    lines[60] = "{not json},"  # a later bad line, in a later chunk: the first one is reported
    path.write_text("\n".join(lines))
    for workers in (1, 2):
        with pytest.raises(InputError, match=r"nodes\[39\] \(node0039\)"):
            load_slim(path, workers=workers)
    assert main(["report", str(path), "-f", "md", "-o", str(tmp_path / "x.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "nodes[39] (node0039)" in err and "Traceback" not in err
