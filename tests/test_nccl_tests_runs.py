"""nccl-tests logs of several runs one after another (recorded runs concatenated), and the old rows with an empty
redop column, through the parser and ``gpuaccept nccl-tests parse``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaccept.cli import main
from gpuaccept.errors import InputError
from gpuaccept.nccltests.judge import judge
from gpuaccept.nccltests.parse import Measure, parse_runs, parse_text, split_runs

DATA = Path(__file__).parent / "data" / "nccl-tests"
LOOP = ("cputime_C1.txt", "alltoall_old_noredop_a100.txt", "current_2hosts_h100.txt")
"""A script that runs all_reduce, alltoall (an older build) and all_reduce again, appending to one file."""


def text(*names: str) -> str:
    return "".join((DATA / n).read_text() for n in names)


def test_old_alltoall_rows_without_a_redop_value_parse() -> None:
    r = parse_text(text("alltoall_old_noredop_a100.txt"))
    assert len(r.rows) == 8 and len(r.devices) == 8 and r.hosts == ["dgx-a17"]
    first, last = r.rows[0], r.rows[-1]
    assert (first.size_bytes, first.count, first.type, first.redop, first.root) == (1048576, 32768, "float", "", -1)
    assert last.out_of_place == Measure(1190.5, 112.74, 98.65, 0.0)
    assert last.in_place == Measure(1188.2, 112.96, 98.84, 0.0)
    assert judge(r, "alltoall", min_busbw_gbs=90).status.value == "pass"


@pytest.mark.parametrize("row, message", [
    ("  8  2 float sum 1.0 0.0 0.0 0 1.0 0.0 0.0 0", "not a number|fields where the header has 13"),  # no root
    ("  8  2 float -1 1.0 0.0 0.0 0 1.0 0.0 0.0", "fields where the header has 13"),  # two short
])
def test_a_row_short_of_anything_but_the_redop_is_still_refused(row: str, message: str) -> None:
    header = "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
    with pytest.raises(InputError, match=message):
        parse_text(header + row + "\n")


def test_a_log_of_several_runs_is_split_and_each_parsed() -> None:
    log = text(*LOOP)
    chunks = split_runs(log)
    assert chunks[0][0] == 1 and len(chunks) == 3
    assert "".join(t for _, t in chunks) == log  # nothing lost or repeated
    runs = parse_runs(log)
    assert [r.program for r in runs] == ["all_reduce_perf", None, None]
    assert [len(r.rows) for r in runs] == [3, 8, len(parse_text(text(LOOP[2])).rows)]
    assert [r.time_column for r in runs] == ["cputime", "time", "time"]
    assert runs[1].rows[0].redop == "" and runs[2].hosts == ["ztan-mig-235z", "ztan-mig-gq73"]
    assert parse_runs(text("all_reduce_J.json"))[0].source == "json"


def test_an_error_in_one_run_names_the_run_and_the_line_of_the_whole_log() -> None:
    good = text("cputime_C1.txt")
    bad = text("cputime_C1.txt").replace("  2147483648     536870912     float     sum      -1     5431",
                                         "  2147483648     536870912     float     sum      -1     -5431")
    assert bad != good
    line = good.count("\n") + bad.splitlines().index(next(x for x in bad.splitlines() if "-5431" in x)) + 1
    with pytest.raises(InputError, match=rf"run 2 of 2 \(from line {good.count(chr(10)) + 1}\): line {line}: "):
        parse_runs(good + bad)


def test_cli_judges_every_run_and_the_last_line_is_the_worst(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    log = tmp_path / "loop.log"
    log.write_text(text("cputime_C1.txt", "wrong_failed.txt", "alltoall_old_noredop_a100.txt"))
    assert main(["nccl-tests", "parse", str(log), "--min-busbw", "60"]) == 1
    out = capsys.readouterr().out
    assert "run 1 of 3: all_reduce (named by the log), 8 ranks on node-a01" in out
    assert "run 3 of 3: all_reduce (assumed: the run does not name its test), 8 ranks on dgx-a17" in out
    assert out.strip().splitlines()[-1] == "FAIL: 3 runs: 1 all_reduce PASS, 2 all_reduce FAIL, 3 all_reduce PASS"
    assert main(["nccl-tests", "parse", str(log), "--min-busbw", "60", "--json",
                 "--test", "all_reduce,all_reduce,alltoall"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "fail" and [r["status"] for r in doc["runs"]] == ["pass", "fail", "pass"]
    assert [r["test"] for r in doc["runs"]] == ["all_reduce", "all_reduce", "alltoall"]
    assert doc["runs"][2]["test_from"] == "given by --test" and "alltoall_busbw_large_gbs" in {
        m["name"] for m in doc["runs"][2]["metrics"]}
    assert "#wrong > 0" in doc["runs"][1]["reason"]


def test_cli_passes_a_log_whose_runs_all_pass_and_refuses_a_wrong_count_of_tests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "loop.log"
    log.write_text(text(*LOOP))
    assert main(["nccl-tests", "parse", str(log), "--min-busbw", "60"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("PASS: 3 runs: ")
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["nccl-tests", "parse", str(log), "--test", "all_reduce,alltoall"]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--test names 2 tests for a log of 3 runs" in err and len(err.strip().splitlines()) == 1
