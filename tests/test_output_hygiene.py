"""What a hostile report, baseline or config file can make gpuaccept print: no terminal control sequence, no
300-digit number, no numpy warning, no ``+nan%``; a YAML key given twice is an error naming it and its line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuaccept.errors import InputError
from gpuaccept.inputs import loads_yaml
from gpuaccept.report.units import fmt_number, fmt_value
from gpuaccept.results.cli import _pct
from tests.helpers import gpuaccept
from tests.launch_support import one_error_line

DATA = Path(__file__).parent / "data" / "reports"
HOSTILE = "evil \x1b[2J\x1b]0;owned\x07 \u202ereversed\u202c \u2067isolate"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _hostile_report(tmp_path: Path) -> Path:
    data = json.loads((DATA / "node-cpu.json").read_text())
    check = next(c for c in data["checks"] if c.get("metrics"))
    check["reason"] = HOSTILE
    for m in check["metrics"]:
        m["value"] = -1e308
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    return path


def test_a_hostile_report_prints_no_control_sequence_nor_a_huge_number(tmp_path: Path) -> None:
    r = gpuaccept("report", "-f", "md", str(_hostile_report(tmp_path)), PYTHONWARNINGS="default")
    assert r.returncode in (0, 1), r.stderr
    assert not CONTROL.search(r.stdout), [m.group() for m in CONTROL.finditer(r.stdout)][:5]
    assert not re.search(r"\d{20}", r.stdout.replace(",", "")), "a 300-digit number"
    assert "Warning" not in r.stderr, r.stderr
    assert "evil \\x1b\\[2J" in r.stdout and "\\u202ereversed" in r.stdout  # shown, escaped
    assert "-1e+3" in r.stdout


def test_numbers_at_the_float_range_ends_are_short() -> None:
    assert fmt_number(-1e308) == "-1e+308" and fmt_number(1e15) == "1e+15"
    assert fmt_number(123456.0) == "123,456"
    assert len(fmt_value(-1e308, "TFLOP/s")) < 20


def test_a_baseline_show_prints_names_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text('schema: 1\nskus:\n  "h100\\nsxm":\n    metrics:\n'
                    '      - {metric: "gemm\\nbf16\\u001b[2J", value: 1, unit: u, mad: 0.1, n: 3}\n')
    r = gpuaccept("baseline", "show", str(path))
    assert r.returncode == 0, r.stderr
    assert not CONTROL.search(r.stdout)
    row = next(line for line in r.stdout.splitlines() if line.startswith("h100"))
    assert row.split()[:2] == ["h100\\nsxm", "gemm\\nbf16\\x1b[2J"]


def test_trend_change_of_an_infinite_value_is_not_nan_percent() -> None:
    assert _pct(float("nan")) == "-" and _pct(float("inf")) == "-" and _pct(None) == "-"
    assert _pct(-0.125) == "-12.5%"


@pytest.mark.parametrize(("text", "where"), [
    ("a: 1\nb: 2\na: 3\n", "line 3: invalid YAML: duplicate key 'a' (first on line 1)"),
    ("checks:\n  compute: {timeout_s: 1, timeout_s: 2}\n", "line 2: invalid YAML: duplicate key 'timeout_s'"),
])
def test_a_yaml_key_given_twice_is_an_error_naming_it(text: str, where: str) -> None:
    with pytest.raises(InputError, match=re.escape(where)):
        loads_yaml(text, "c.yaml")
    assert loads_yaml("a: &x {b: 1}\nc: {<<: *x, d: 2}\n", "m.yaml") == {"a": {"b": 1}, "c": {"b": 1, "d": 2}}


def test_a_config_with_a_duplicate_key_is_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("checks:\n  steady:\n    timeout_s: 10\n  steady:\n    timeout_s: 99\n")
    line = one_error_line(gpuaccept("run", "--device", "cpu", "--checks", "steady", "--config", str(cfg),
                                    "--report-dir", str(tmp_path / "rep")))
    assert line.endswith("c.yaml: line 4: invalid YAML: duplicate key 'steady' (first on line 2)"), line
    assert not (tmp_path / "rep").exists()
