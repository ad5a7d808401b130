"""A fleet's node lines worked on in worker processes (issue #27): results in the file's order, and the first
problem in the file is the one reported, as a read in one process reports it."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.errors import ConfigError, InputError
from gpuaccept.inputs import BadInput
from gpuaccept.results.parallel import flat, ordered_chunks


def _square_chunk(part: list[int]) -> list[int]:
    return [x * x for x in part]


def _fails_on_13(part: list[int]) -> list[int]:
    if 13 in part:
        raise BadInput("f.json", "", f"line {13 + 2}: not valid JSON")
    return part


def _items_then(n: int, error: Exception) -> Iterator[int]:
    yield from range(n)
    raise error


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_come_in_order_whatever_the_workers(workers: int) -> None:
    got = list(flat(ordered_chunks(_square_chunk, range(103), workers=workers, chunk=4)))
    assert got == [x * x for x in range(103)]
    assert list(ordered_chunks(len, range(10), workers=workers, chunk=4)) == [4, 4, 2]
    assert list(ordered_chunks(len, [], workers=workers)) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_chunks_error_comes_where_its_result_would(workers: int) -> None:
    seen: list[int] = []
    with pytest.raises(BadInput, match=r"f\.json: line 15: not valid JSON"):
        for part in ordered_chunks(_fails_on_13, range(40), workers=workers, chunk=5):
            seen += part
    assert seen == list(range(10))  # the chunks before it, and none after


@pytest.mark.parametrize("workers", [1, 2])
def test_a_readers_error_comes_after_the_chunks_read_before_it(workers: int) -> None:
    seen: list[int] = []
    with pytest.raises(InputError, match="cut short"):
        for part in ordered_chunks(_square_chunk, _items_then(22, InputError("f.json: cut short")),
                                   workers=workers, chunk=5):
            seen += part
    assert seen == [x * x for x in range(20)]  # every whole chunk read before the error; the torn one is not


def test_errors_raised_in_a_worker_read_back_whole() -> None:
    for exc in (BadInput("f.json", "nodes[3]", "bad"), ConfigError("c.yaml", "checks.x", "bad value")):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.key == exc.key


def test_a_malformed_fleet_line_names_the_same_place_in_workers(tmp_path: Path) -> None:
    from gpuaccept.results.clusterfile import write_line_layout
    from gpuaccept.results.load import map_valid_chunks, open_cluster_lines

    path = tmp_path / "cluster-report.json"
    good = '{"host": "n%d", "state": "missing", "reason": "no report"}'
    lines = [good % i for i in range(50)]
    lines[37] = '{"host": "n37", "state": "weird"}'
    lines[45] = "[1, 2"
    with open(path, "w") as fh:
        write_line_layout(fh, {"kind": "cluster", "run_id": "r1", "backend": "local",
                               "started": "2026-11-28T00:00:00Z", "schema_version": 1}, lines)
    errors = []
    for workers in (1, 2):
        _, raw = open_cluster_lines(path)
        with pytest.raises(InputError) as got:
            list(map_valid_chunks(raw, len, workers=workers))
        errors.append(str(got.value))
    assert errors[0] == errors[1] and f"{path}: nodes[37]" in errors[0]
