"""Every numeric parameter of every registered check is bounded, and its defaults lie inside the bounds.

Issue 15: ``memtest cpu_mib: 999999999999999`` spent 20 s allocating and ended
as ERROR, ``fraction: 5.0`` was accepted. The registry is read here, so a new
parameter without a maximum fails this file, not a node.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks import BUILTIN_MODULES, registry
from gpuaccept.checks.base import PROFILES, Check, Param
from gpuaccept.errors import ConfigError
from gpuaccept.node.config import parse_config
from tests.cli_inproc import run_main


def _numeric(p: Param) -> bool:
    return p.kind in ("int", "float") or (p.kind == "list" and p.item in ("int", "float"))


NUMERIC = [(name, p) for name, cls in registry().items() if cls.__module__ in BUILTIN_MODULES
           for p in cls.params if _numeric(p)]
IDS = [f"{name}.{p.name}" for name, p in NUMERIC]


def test_the_registry_has_numeric_parameters() -> None:
    assert len(NUMERIC) > 40 and ("compute", "size") in {(n, p.name) for n, p in NUMERIC}


@pytest.mark.parametrize("name, param", NUMERIC, ids=IDS)
def test_every_numeric_parameter_declares_both_bounds(name: str, param: Param) -> None:
    assert param.maximum is not None, f"{name}.{param.name} declares no maximum"
    assert param.minimum is not None, f"{name}.{param.name} declares no minimum"
    assert param.minimum < param.maximum


@pytest.mark.parametrize("name, param", NUMERIC, ids=IDS)
def test_defaults_of_every_profile_lie_within_the_bounds(name: str, param: Param) -> None:
    cls: type[Check] = registry()[name]
    for profile in PROFILES:
        value = cls.defaults(profile)[param.name]
        assert param.coerce(value, "defaults", f"{name}.{param.name}") == value, profile


def _above(param: Param) -> Any:
    assert param.maximum is not None
    value = param.maximum * 2 + 1
    item = param.item if param.kind == "list" else param.kind
    value = int(value) if item == "int" else float(value)
    return [value] if param.kind == "list" else value


@pytest.mark.parametrize("name, param", NUMERIC, ids=IDS)
def test_a_value_above_the_maximum_is_refused_naming_the_limit(name: str, param: Param) -> None:
    value = _above(param)
    with pytest.raises(ConfigError) as info:
        parse_config({"checks": {name: {"params": {param.name: value}}}}, "site.yaml", registry())
    line = str(info.value)
    assert line.startswith(f"site.yaml: checks.{name}.params.{param.name}") and "above the maximum" in line, line
    shown = int(param.maximum) if float(param.maximum).is_integer() else param.maximum  # type: ignore[arg-type]
    assert line.endswith(f"above the maximum {shown}"), line
    at_max = [param.maximum] if param.kind == "list" else param.maximum
    if (param.item if param.kind == "list" else param.kind) == "int":
        at_max = [int(v) for v in at_max] if isinstance(at_max, list) else int(at_max)  # type: ignore[arg-type]
    parse_config({"checks": {name: {"params": {param.name: at_max}}}}, "site.yaml", registry())


# ---------------------------------------------------------------- gpuaccept run, before anything runs

@pytest.mark.parametrize("check, param, value, words", [
    ("memtest", "cpu_mib", "999999999999999", "999999999999999 is above the maximum 16777216"),
    ("memtest", "fraction", "5.0", "5.0 is above the maximum 1"),
    ("compute", "size", "100000", "100000 is above the maximum 65536"),
    ("compute", "cpu_size", "1000000", "1000000 is above the maximum 32768"),
    ("compute", "buffers", "2000", "2000 is above the maximum 1024"),
    ("nbody", "bodies", "100000000", "100000000 is above the maximum 4194304"),
    ("nbody", "cpu_bodies", "10000000", "10000000 is above the maximum 1048576"),
    ("train", "batch", "10000000", "10000000 is above the maximum 65536"),
    ("train", "hidden", "1000000", "1000000 is above the maximum 16384"),
    ("ddp_train", "batch", "10000000", "10000000 is above the maximum 65536"),
    ("ddp_train", "hidden", "1000000", "1000000 is above the maximum 16384"),
])
def test_run_refuses_an_absurd_value_with_one_line(tmp_path: Path, check: str, param: str, value: str,
                                                   words: str) -> None:
    cfg = tmp_path / "site.yaml"
    cfg.write_text(f"checks: {{{check}: {{params: {{{param}: {value}}}}}}}\n")
    for plan in (["--plan"], ["--report-dir", str(tmp_path / "reports"), "--no-history"]):
        line = run_main("run", *plan, "--device", "cpu", "--checks", check, "--config", str(cfg)).one_line_error()
        assert f"checks.{check}.params.{param}: {words}" in line, line
    assert not (tmp_path / "reports").exists()


def test_checks_lists_the_bounds() -> None:
    r = run_main("checks", "--json")
    rows = {row["name"]: {p["name"]: p for p in row["params"]} for row in json.loads(r.out)}
    assert (rows["compute"]["size"]["minimum"], rows["compute"]["size"]["maximum"]) == (16, 65536)
    assert rows["compute"]["dtypes"]["maximum"] is None
    text = run_main("checks").out
    assert "    size (int, 16 to 65536) = 8192: matrix dimension N on GPU, elements" in text
    assert "    cpu_mib (int, 1 to 16777216) = 256: CPU: MiB of host memory to test" in text
