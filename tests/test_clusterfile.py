"""cluster-report.json in the line layout: written a node at a time, read a line at a time (issue #27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaccept.errors import InputError
from gpuaccept.launch.collect import write_cluster
from gpuaccept.model import ClusterReport
from gpuaccept.results import clusterfile
from gpuaccept.results.clusterfile import LINE_LAYOUT_MIN_NODES, is_line_layout
from gpuaccept.results.load import load_file, load_report, open_cluster
from tests.cli_inproc import run_main
from tests.fleet_sim import fleet


def _big(nodes: int = LINE_LAYOUT_MIN_NODES + 2) -> ClusterReport:
    c = fleet(3, nodes=nodes, gpus=2)
    c.analysis["gather"] = {"reported": nodes, "missing": [], "failed": [], "unexpected": []}
    return c


def _written(tmp_path: Path, cluster: ClusterReport) -> Path:
    return write_cluster(cluster, tmp_path / "run", None)


def test_a_big_cluster_is_one_json_document_a_node_per_line(tmp_path: Path) -> None:
    c = _big()
    path = _written(tmp_path, c)
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + len(c.nodes) + 1 and lines[-1] == "]}"
    assert lines[0].endswith('"nodes": [') and all(line.endswith(",") for line in lines[1:-2])
    assert json.loads(path.read_text()) == json.loads(json.dumps(c.to_dict()))  # any JSON reader reads it as before
    assert is_line_layout(path)
    assert load_file(path).to_dict() == json.loads(json.dumps(c.to_dict()))


def test_a_small_cluster_is_written_indented_as_before(tmp_path: Path) -> None:
    c = fleet(4, nodes=3, gpus=2)
    path = _written(tmp_path, c)
    assert path.read_text() == json.dumps(c.to_dict(), indent=2) + "\n"
    assert not is_line_layout(path)
    header, nodes = open_cluster(path)
    assert header.nodes == [] and [e.host for e in nodes] == [e.host for e in c.nodes]


def test_open_cluster_reads_the_header_then_one_node_at_a_time(tmp_path: Path) -> None:
    c = _big()
    path = _written(tmp_path, c)
    header, nodes = open_cluster(path)
    assert header.nodes == [] and header.run_id == c.run_id and header.analysis["gather"]["reported"] == len(c.nodes)
    first = next(nodes)
    assert first.host == c.nodes[0].host and first.report is not None and len(first.report.checks) == 5
    assert len(list(nodes)) == len(c.nodes) - 1


def test_the_extra_copy_is_the_same_file(tmp_path: Path) -> None:
    c = _big()
    path = write_cluster(c, tmp_path / "run", str(tmp_path / "copy" / "c.json"))
    assert (tmp_path / "copy" / "c.json").read_bytes() == path.read_bytes()


def _broken(tmp_path: Path, edit: str) -> Path:
    path = _written(tmp_path, _big())
    lines = path.read_text().splitlines(keepends=True)
    if edit == "cut":
        lines = lines[:10]
    elif edit == "no-comma":
        lines[3] = lines[3].replace("},\n", "}\n")
    elif edit == "trailing-comma":
        lines[-2] = lines[-2].rstrip("\n") + ",\n"
    elif edit == "bad-entry":
        lines[5] = lines[5].replace('"unit": "TFLOP/s"', '"unit": 7', 1)
    elif edit == "after":
        lines.append("{}\n")
    elif edit == "not-json":
        lines[2] = "{nope,\n"
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize(("edit", "says"), [
    ("cut", "cut short: no closing ]} after 9 node line(s)"),
    ("no-comma", "line 4: no comma between two node entries"),
    ("trailing-comma", "a comma before the closing ]}"),
    ("bad-entry", "nodes[4] (node004): not a valid gpuaccept report at checks/1/metrics/0/unit"),
    ("after", "text after the closing ]}"),
    ("not-json", "line 3: not valid JSON"),
])
def test_a_broken_line_layout_is_one_line_naming_where(tmp_path: Path, edit: str, says: str) -> None:
    path = _broken(tmp_path, edit)
    with pytest.raises(InputError) as exc:
        load_file(path)
    assert says in str(exc.value) and str(path) in str(exc.value) and "\n" not in str(exc.value)
    r = run_main("report", str(path), "-f", "md")
    assert says in r.one_line_error()


def test_each_line_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _written(tmp_path, _big())
    monkeypatch.setattr(clusterfile, "MAX_ENTRY_BYTES", 1000)
    with pytest.raises(InputError, match="line 2 is longer than 0 MiB"):
        load_file(path)


def test_a_line_layout_report_bigger_than_the_whole_file_limit_is_read(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuaccept.inputs as inputs

    path = _written(tmp_path, _big())
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 1024)  # what a whole-document read would refuse
    rep = load_report(str(path))
    assert isinstance(rep, ClusterReport) and len(rep.nodes) == LINE_LAYOUT_MIN_NODES + 2


def test_consumers_read_the_line_layout_through_the_cli(tmp_path: Path) -> None:
    path = _written(tmp_path, _big())
    md = run_main("report", str(path), "-f", "md", "-o", str(tmp_path / "r.md"))
    assert md.rc == 0, md.err
    assert "node065" in (tmp_path / "r.md").read_text()
    base = run_main("baseline", "create", "--from", str(path), "-o", str(tmp_path / "b.yaml"))
    assert base.rc == 0, base.err
    assert "gemm_bf16_tflops" in (tmp_path / "b.yaml").read_text()
    an = run_main("analyze", str(path), "--json")
    assert an.rc in (0, 1), an.err
    assert "outliers" in json.loads(an.out)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    imp = run_main("history", "--import", str(path), "--db", db)
    assert imp.rc == 0, imp.err
    listed = run_main("history", "--db", db, "--json")
    assert listed.rc == 0 and "cluster-3" in listed.out


def test_a_few_nodes_too_big_to_read_whole_are_written_a_line_each(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuaccept.inputs as inputs

    c = fleet(5, nodes=4, gpus=2)
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 20_000)  # the indented text of 4 nodes is larger
    path = _written(tmp_path, c)
    assert is_line_layout(path) and len(path.read_text().splitlines()) == 6
    assert len(load_file(path).nodes) == 4


def test_a_fifo_is_not_opened_to_look_for_the_line_layout(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    assert is_line_layout(fifo) is False  # would block if it opened the FIFO
    assert is_line_layout(tmp_path / "absent.json") is False
