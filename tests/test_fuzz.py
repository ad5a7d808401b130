"""Property-based fuzz of every command that reads a file: never an internal error.

Random YAML configs and baselines, and random mutations of a real report, are fed to
the loaders and to ``main()`` in-process. Each call must exit 0, 1 or 2, and an exit 2
must be exactly one line on stderr. Bounded and derandomized, so CI is reproducible
and takes about a minute.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaccept.checks import registry
from gpuaccept.errors import GpuacceptError
from gpuaccept.inputs import loads_json, loads_yaml
from gpuaccept.node.config import parse_config
from gpuaccept.results.baseline import parse_baseline
from gpuaccept.results.load import report_from_dict
from tests.cli_inproc import Result, run_main
from tests.report_data import NODE_CPU

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
NODE = json.loads(NODE_CPU.read_text())

_NUMBERS = st.one_of(st.integers(-10**30, 10**30), st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from([0, -1, 1 << 63, 10**400]))
_SCALARS = st.one_of(st.none(), st.booleans(), _NUMBERS, st.text(max_size=12),
                     st.sampled_from(["quick", "cpu", "compute", "memtest", "gemm_fp32_tflops", "\n", "0,1"]))
_KEYS = st.sampled_from(["profile", "device", "gpus", "expect_gpus", "require_gpu", "timeout_scale", "report_dir",
                         "checks", "compute", "memtest", "memory", "params", "thresholds", "timeout_s", "enabled",
                         "metric", "min", "max", "min_fraction", "severity", "fraction", "cpu_mib", "dtypes",
                         "schema", "skus", "metrics", "value", "unit", "mad", "n", "source", "cpu"])
_TREES = st.recursive(_SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                       st.dictionaries(_KEYS, kids, max_size=5)), max_leaves=25)
_YAML_SNIPPETS = st.sampled_from([
    "!!int ''", "!!timestamp 'x'", "!!float 'x'", ".nan", ".inf", "-.inf", "!!binary 'zz'", "&a [*a]", "*b",
    "? [a]\n: 1", "[" * 200, "{a: " * 50, "1" + "0" * 400, "!!python/object:os.system ls", "'\\n'", "\t", "\x00",
    "!!set {a, b}", "!!omap [a: 1]", "2001-12-14", "0x1F", "0o17", "1_000", "~", "<<: {a: 1}",
])


def _yaml_texts() -> st.SearchStrategy[str]:
    dumped = _TREES.map(lambda t: yaml.safe_dump(t, allow_unicode=True))
    spliced = st.tuples(dumped, _YAML_SNIPPETS, st.integers(0, 400)).map(
        lambda x: x[0][:x[2]] + x[1] + x[0][x[2]:])
    keyed = st.tuples(_KEYS, _YAML_SNIPPETS).map(lambda x: f"{x[0]}: {x[1]}\n")
    return st.one_of(dumped, spliced, keyed, st.text(max_size=80))


def _mutate(data: Any, path: list[Any], value: Any) -> Any:
    """``data`` with the node at the (wrapped) ``path`` replaced by ``value``."""
    if not path or not isinstance(data, (dict, list)) or not data:
        return value
    if isinstance(data, dict):
        keys = sorted(data)
        key = keys[path[0] % len(keys)] if isinstance(path[0], int) else path[0]
        out = dict(data)
        out[key] = _mutate(data.get(key), path[1:], value)
        return out
    i = path[0] % len(data) if isinstance(path[0], int) else 0
    items = list(data)
    items[i] = _mutate(items[i], path[1:], value)
    return items


_REPORT_VALUES = st.one_of(_TREES, st.sampled_from(["../../x", "", 999, 2, None, {"kind": "cluster"}]))
_PATHS = st.lists(st.one_of(st.integers(0, 20), st.sampled_from(["checks", "metrics", "run_id", "schema_version",
                                                                 "kind", "nodes", "device", "value"])), max_size=5)


def _report_texts() -> st.SearchStrategy[str]:
    mutated = st.tuples(_PATHS, _REPORT_VALUES).map(lambda x: json.dumps(_mutate(NODE, x[0], x[1]), default=str))
    cluster = st.tuples(_PATHS, _REPORT_VALUES).map(lambda x: json.dumps(_mutate(
        {"schema_version": 1, "kind": "cluster", "run_id": "c1", "backend": "ssh", "started": "2026-11-22T10:00:00Z",
         "finished": None, "expected_nodes": 1, "nodes": [{"host": "vm", "state": "reported", "report": NODE}]},
        x[0], x[1]), default=str))
    base = json.dumps(NODE)
    cut = st.integers(0, len(base)).map(lambda n: base[:n])
    spliced = st.tuples(st.integers(0, len(base)), st.sampled_from(["NaN", "1e400", "1" + "0" * 400, "[" * 5000,
                                                                    "\"\\ud800\"", "-", "{}", "\x00"])).map(
        lambda x: base[:x[0]] + x[1] + base[x[0]:])
    return st.one_of(mutated, cluster, cut, spliced)


def _check(r: Result, what: str) -> None:
    assert r.rc in (0, 1, 2), (what, r.rc, r.err)
    assert "internal error" not in r.err and "Traceback" not in r.err, (what, r.err)
    if r.rc == 2:
        assert len(r.err_lines) == 1, (what, r.err)


# ---- the loaders -----------------------------------------------------------------------------------------------------
@FUZZ
@given(_yaml_texts())
def test_config_loader(text: str) -> None:
    try:
        parse_config(loads_yaml(text, "cfg.yaml"), "cfg.yaml", registry())
    except GpuacceptError:
        pass


@FUZZ
@given(_yaml_texts())
def test_baseline_loader(text: str) -> None:
    try:
        parse_baseline(loads_yaml(text, "b.yaml"), "b.yaml")
    except GpuacceptError:
        pass


@FUZZ
@given(_report_texts())
def test_report_loader(text: str) -> None:
    try:
        report_from_dict(loads_json(text, "r.json"), "r.json")
    except GpuacceptError:
        pass


# ---- the commands --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def baseline_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fuzz-baseline") / "baseline.yaml"
    r = run_main("baseline", "create", "--from", str(NODE_CPU), "--min-samples", "1", "--output", str(out))
    assert r.rc == 0, r.err
    return out


@FUZZ
@given(text=_yaml_texts())
def test_run_config_command(tmp_path: Path, text: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(text, errors="surrogatepass")
    _check(run_main("run", "--plan", "--device", "cpu", "--no-history", "--config", str(path)), text)


@FUZZ
@given(text=_yaml_texts())
def test_baseline_commands(tmp_path: Path, text: str) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(text, errors="surrogatepass")
    _check(run_main("baseline", "show", str(path)), text)
    _check(run_main("baseline", "apply", str(NODE_CPU), "--baseline", str(path)), text)
    _check(run_main("baseline", "create", "--from", str(NODE_CPU), "--min-samples", "1", "--thresholds", str(path)),
           text)


@FUZZ
@given(text=_report_texts())
def test_report_commands(tmp_path: Path, baseline_file: Path, text: str) -> None:
    path = tmp_path / "report.json"
    path.write_text(text, errors="surrogatepass")
    db = f"sqlite:///{tmp_path / 'h.db'}"
    for args in (("report", str(path), "--format", "json", "--output", "-"),
                 ("compare", str(path), str(NODE_CPU)),
                 ("baseline", "create", "--from", str(path), "--min-samples", "1"),
                 ("baseline", "apply", str(path), "--baseline", str(baseline_file)),
                 ("analyze", str(path)),
                 ("history", "--import", str(path), "--db", db),
                 ("nccl-tests", "parse", str(path))):
        _check(run_main(*args), " ".join(args[:2]))


@FUZZ
@given(lines=st.lists(_report_texts(), min_size=1, max_size=3))
def test_results_jsonl_run_directory(tmp_path_factory: pytest.TempPathFactory, lines: list[str]) -> None:
    run_dir = tmp_path_factory.mktemp("fuzz") / "20261122T101500Z-node17-3fa2"
    run_dir.mkdir()
    checks = [json.dumps(c) for c in NODE["checks"]]
    (run_dir / "results.jsonl").write_text("\n".join(checks + lines), errors="surrogatepass")
    _check(run_main("report", str(run_dir), "--format", "json", "--output", "-"), "report")
    db = f"sqlite:///{run_dir.parent / 'h.db'}"
    _check(run_main("history", "--import", str(run_dir), "--db", db), "history --import")
