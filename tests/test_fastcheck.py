"""The compiled report validator agrees with jsonschema on recorded reports and on broken ones (issue #27)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuaccept.errors import InputError
from gpuaccept.results.fastcheck import compile_schema
from gpuaccept.results.load import CLUSTER_SCHEMA, _schema, report_from_dict

DATA = Path(__file__).parent / "data"
SAMPLES = sorted(p for p in DATA.glob("**/*.json") if '"schema_version"' in p.read_text(errors="replace")[:4000])
NODE_SAMPLES = [p for p in SAMPLES if '"kind": "cluster"' not in p.read_text()[:2000] and
                '"checks"' in p.read_text()]
JUNK: list[Any] = [None, True, False, 0, 1, 1.0, 1.5, -3, "", "x", "BAD NAME", [], {}, [1], {"a": 1}]


def _agree(schema: dict[str, Any], value: Any) -> bool:
    """Whether both validators say the same; asserts it and returns the verdict."""
    slow = jsonschema.Draft202012Validator(schema).is_valid(value)
    fast = compile_schema(schema)(value) is None
    assert fast == slow, f"fast {fast}, jsonschema {slow} on {json.dumps(value)[:300]}"
    return fast


def _node_samples() -> list[dict[str, Any]]:
    out = []
    for p in NODE_SAMPLES:
        data = json.loads(p.read_text())
        if isinstance(data, dict) and "checks" in data and data.get("kind") != "cluster":
            out.append(data)
    return out


def test_there_are_recorded_samples() -> None:
    assert len(_node_samples()) >= 3


def test_recorded_node_reports_agree() -> None:
    verdicts = [_agree(_schema(), d) for d in _node_samples()]
    assert sum(verdicts) >= 3  # the recorded reports are valid


def test_recorded_cluster_report_agrees() -> None:
    data = json.loads((DATA / "reports" / "cluster-h100.json").read_text())
    assert _agree(CLUSTER_SCHEMA, data)
    for entry in data["nodes"]:
        if entry.get("report"):
            assert _agree(_schema(), entry["report"])


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            out += _paths(v, (*at, i))
    return out


def _set(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    out = copy.deepcopy(value)
    cur = out
    for key in at[:-1]:
        cur = cur[key]
    cur[at[-1]] = new
    return out


def _drop(value: Any, at: tuple[Any, ...]) -> Any:
    out = copy.deepcopy(value)
    cur = out
    for key in at[:-1]:
        cur = cur[key]
    del cur[at[-1]]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_broken_reports_agree(seed: int) -> None:
    """Every value of a recorded report replaced by junk of another type, or dropped, or a key added."""
    rng = random.Random(seed)
    samples = _node_samples()
    base = samples[seed % len(samples)]
    paths = _paths(base)
    rejected = 0
    for _ in range(400):
        at = rng.choice(paths)
        roll = rng.random()
        if at and roll < 0.2:
            bad = _drop(base, at)
        elif roll < 0.3 and isinstance(_get(base, at), dict):
            bad = _set(base, at, {**_get(base, at), "unexpected_key": 1})
        else:
            bad = _set(base, at, rng.choice(JUNK))
        rejected += not _agree(_schema(), bad)
    assert rejected > 100  # most mutations break the report, and both validators see it


def _get(value: Any, at: tuple[Any, ...]) -> Any:
    for key in at:
        value = value[key]
    return value


@pytest.mark.parametrize("case", [
    {"metric": {"name": "x", "value": True, "unit": "s"}},        # a boolean is not a number
    {"metric": {"name": "x", "value": 1.0, "unit": "s"}},         # fine
    {"metric": {"name": "X-Y", "value": 1.0, "unit": "s"}},       # pattern
    {"metric": {"name": "x", "value": 1.0, "unit": "s", "performance": 1}},  # const true is not 1
    {"metric": {"name": "x", "value": 1.0, "unit": "s", "tags": {"a": None}}},
    # properties and tag maps of a type alone are checked inline (issue 27): each wrong type still found
    {"metric": {"name": "x", "value": 1.0, "unit": "s", "tags": {"a": "b", "n": 2, "f": 0.5}}},
    {"metric": {"name": "x", "value": 1.0, "unit": "s", "tags": {"a": "b", "t": True}}},
    {"metric": {"name": "x", "value": 1.0, "unit": "s", "tags": {"a": "b", "l": [1]}}},
    {"metric": {"name": "x", "value": 1.0, "unit": 5}},
    {"check": {"name": "c", "status": "pass", "reason": 3, "duration_s": 1, "metrics": []}},
    {"check": {"name": "c", "status": "pass", "reason": "", "duration_s": 1, "metrics": [], "details": []}},
    {"check": {"name": "c", "status": "pass", "reason": "", "duration_s": True, "metrics": []}},
    {"check": {"name": "c", "status": "pass", "reason": "", "duration_s": -1.0, "metrics": []}},
    {"check": {"name": "c", "status": "pass", "reason": "", "duration_s": 1, "metrics": [], "rank": 2.0}},
    {"check": {"name": "c", "status": "pass", "reason": "", "duration_s": 1, "metrics": [], "rank": 2.5}},
    {"check": {"name": "c", "status": "pass", "reason": "", "duration_s": 1, "metrics": [], "not_judged": []}},
])
def test_edge_cases_agree(case: dict[str, Any]) -> None:
    (kind, value), = case.items()
    schema = {"$ref": f"#/$defs/{kind}", "$defs": _schema()["$defs"]}
    _agree(schema, value)


def test_an_unknown_keyword_is_refused_at_compile_time() -> None:
    with pytest.raises(ValueError, match="not supported"):
        compile_schema({"type": "object", "patternProperties": {}})


def test_a_rejected_report_is_one_line_naming_where() -> None:
    data = _node_samples()[0]
    bad = _set(data, ("checks", 0, "metrics"), "nope")
    with pytest.raises(InputError) as exc:
        report_from_dict(bad, "r.json")
    assert str(exc.value).startswith("r.json: not a valid gpuaccept report at checks/0/metrics: ")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("depth", [1, 63, 64, 65, 200])
def test_the_level_walk_of_parsed_json_bounds_depth_like_the_shared_walk(depth: int) -> None:
    from gpuaccept.inputs import MAX_DEPTH, check_depth

    value: Any = 1
    for i in range(depth):
        value = [value, 2] if i % 2 else {"k": value, "x": "y"}
    outcomes = []
    for shared in (True, False):
        try:
            check_depth(value, "v", shared=shared)
            outcomes.append("ok")
        except InputError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] == "ok") == (depth <= MAX_DEPTH)
