"""Bad input is exit 2 with one line (never an internal error), and nothing measured is lost.

Configs, baselines, reports, results.jsonl, history databases, host lists: each case
below is one that gave an internal error, a crash after measuring, a path escape, a
stored secret, or a silently wrong reading before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import ConfigError, GpuacceptError
from gpuaccept.launch.hosts import parse_host_list
from gpuaccept.model import NodeReport
from tests.cli_inproc import run_main
from tests.report_data import NODE_CPU

NODE = json.loads(NODE_CPU.read_text())


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _plan(tmp_path: Path, config: str | bytes) -> Any:
    cfg = _write(tmp_path / "cfg.yaml", config)
    return run_main("run", "--plan", "--device", "cpu", "--config", str(cfg))


# ---- configs -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, words", [
    ("checks: {compute: {thresholds: [{metric: gemm_fp32_tflops, min: .nan}]}}", "finite"),
    ("checks: {compute: {thresholds: [{metric: gemm_fp32_tflops, max: .inf}]}}", "finite"),
    ("checks: {compute: {timeout_s: .nan}}", "finite"),
    ("checks: {compute: {timeout_s: .inf}}", "finite"),
    ("checks: {compute: {timeout_s: 1.0e+12}}", "<= 604800"),
    ("timeout_scale: .nan", "finite"),
    ("timeout_scale: -.inf", "finite"),
    ("checks: {memtest: {params: {cpu_mib: 999999999999999}}}", "maximum"),
    ("checks: {memtest: {params: {fraction: 5.0}}}", "maximum"),
    ("checks: {memtest: {params: {fraction: .nan}}}", "finite"),
    ("expect_gpus: !!int ''", "invalid YAML"),
    ("profile: !!timestamp 'x'", "invalid YAML"),
    ("checks: " + "[" * 5000 + "]" * 5000, "nested"),
    ("checks: " + "{a: " * 200 + "1" + "}" * 200, "nested"),
    ("expect_gpus: 1" + "0" * 400, "digits"),
    ("profile: \"quick\\nsecond line\"", "second line"),
    ("checks: {\"comp\\nute\": {}}", "unknown check"),
    ("report_dir: x\n? [a, b]\n: 1", "invalid YAML"),
])
def test_bad_config_is_one_line_exit_2_before_anything_runs(tmp_path: Path, config: str, words: str) -> None:
    line = _plan(tmp_path, config).one_line_error()
    assert "cfg.yaml" in line and words in line, line


def test_non_utf8_config(tmp_path: Path) -> None:
    line = _plan(tmp_path, b"profile: quick\n# \xff\xfe\n").one_line_error()
    assert "not UTF-8" in line


def test_config_from_dev_zero_is_capped_not_a_memory_error() -> None:
    line = run_main("run", "--plan", "--device", "cpu", "--config", "/dev/zero").one_line_error()
    assert "/dev/zero" in line and "MiB" in line


def test_memory_size_larger_than_this_machine(tmp_path: Path) -> None:
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    if total + 1 > 1 << 22:
        pytest.skip("a machine with more memory than the parameter's maximum")
    line = _plan(tmp_path, f"checks: {{memtest: {{params: {{cpu_mib: {total + 1}}}}}}}").one_line_error()
    assert "checks.memtest.params.cpu_mib" in line and "more than this machine's memory" in line, line


def test_plan_is_strict_json(tmp_path: Path) -> None:
    r = _plan(tmp_path, "timeout_scale: 2\nchecks: {compute: {timeout_s: 30}}\n")
    assert r.rc == 0, r.err

    def no_constants(name: str) -> None:
        raise AssertionError(f"--plan printed {name}")

    json.loads(r.out, parse_constant=no_constants)


def test_bad_db_url_is_refused_before_the_suite_runs(tmp_path: Path) -> None:
    r = run_main("run", "--plan", "--device", "cpu", "--db", "mysql://x")
    assert "mysql" in r.one_line_error()
    # The run itself: refused before a run directory is made.
    r = run_main("run", "--device", "cpu", "--checks", "env", "--db", "mysql://x", "--report-dir", str(tmp_path))
    assert "mysql" in r.one_line_error() and list(tmp_path.iterdir()) == []


# ---- baselines -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, words", [
    ("schema: 1\nskus: " + "[" * 3000 + "]" * 3000, "nested"),
    ("schema: 1" + "0" * 400 + "\nskus: {}", "digits"),
    ("schema: 1\nskus: {cpu: {metrics: [{metric: m, value: 1" + "0" * 400 + ", unit: u, mad: 1, n: 3}]}}", "digits"),
])
def test_bad_baseline_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    path = _write(tmp_path / "b.yaml", text)
    line = run_main("baseline", "show", str(path)).one_line_error()
    assert words in line, line


# ---- reports: one definition for every command -------------------------------------------------------------------
def _baseline(tmp_path: Path) -> Path:
    out = tmp_path / "baseline.yaml"
    r = run_main("baseline", "create", "--from", str(NODE_CPU), "--min-samples", "1", "--output", str(out))
    assert r.rc == 0, r.err
    return out


def _readers(tmp_path: Path, report: Path) -> dict[str, tuple[str, ...]]:
    db = f"sqlite:///{tmp_path / 'h.db'}"
    return {
        "report": ("report", str(report), "--format", "json", "--output", "-"),
        "compare": ("compare", str(report), str(NODE_CPU)),
        "baseline create": ("baseline", "create", "--from", str(report), "--min-samples", "1"),
        "baseline apply": ("baseline", "apply", str(report), "--baseline", str(_baseline(tmp_path))),
        "analyze": ("analyze", str(report)),
        "history --import": ("history", "--import", str(report), "--db", db),
    }


def _node(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(NODE))
    data.update(changes)
    return data


BAD_REPORTS: dict[str, tuple[Any, str]] = {
    "newer schema": (_node(schema_version=999), "written by a newer gpuaccept: schema_version 999 > 1"),
    "integer run id": (_node(run_id=17), "run_id"),
    "unknown top-level key": (_node(surprise=1), "surprise"),
    "run id escaping": (_node(run_id="../../../../tmp/x"), "not a valid run id"),
    "integer metric device": (None, "device"),
    "huge integer": (None, "digits"),
    "deep nesting": ("[" * 100000 + "]" * 100000, "nested"),
    "NaN": (None, "finite"),
}


def _bad_report_text(name: str) -> str:
    data, _ = BAD_REPORTS[name]
    if isinstance(data, str):
        return data
    if name == "integer metric device":
        data = _node()
        data["checks"][0]["metrics"] = [{"name": "x", "value": 1, "unit": "u", "device": 0}]
    if name == "huge integer":
        return json.dumps(_node()).replace('"duration_s": ', '"duration_s": 1' + "0" * 400 + ", \"x\": ", 1)
    if name == "NaN":
        return json.dumps(_node()).replace('"duration_s": ', '"duration_s": NaN, "x": ', 1)
    return json.dumps(data)


@pytest.mark.parametrize("case", sorted(BAD_REPORTS))
def test_every_command_rejects_the_same_bad_reports(tmp_path: Path, case: str) -> None:
    report = _write(tmp_path / "report.json", _bad_report_text(case))
    for command, args in _readers(tmp_path, report).items():
        r = run_main(*args)
        line = r.one_line_error()
        assert BAD_REPORTS[case][1] in line, (command, line)
        assert str(report) in line, (command, line)


def test_every_command_reads_a_good_report(tmp_path: Path) -> None:
    for command, args in _readers(tmp_path, NODE_CPU).items():
        r = run_main(*args)
        assert r.rc in (0, 1), (command, r.err)


def test_report_with_escaping_run_id_writes_nothing_outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    report = _write(tmp_path / "r.json", json.dumps(_node(run_id="../../escaped")))
    r = run_main("report", str(report), "--format", "html", "--output", str(tmp_path / "out"))
    assert "not a valid run id" in r.one_line_error()
    assert not list(tmp_path.rglob("*.html")) and not (tmp_path.parent / "escaped.html").exists()


def test_history_import_of_dev_null_and_directories(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert "/dev/null" in run_main("history", "--import", "/dev/null", "--db", db).one_line_error()


# ---- a run directory holding only results.jsonl --------------------------------------------------------------------
def _results_only(tmp_path: Path, torn: bool = False) -> Path:
    run_dir = tmp_path / "20261122T101500Z-node17-3fa2"
    run_dir.mkdir()
    lines = [json.dumps(c) for c in NODE["checks"]]
    text = "\n".join(lines) + "\n" + ('{"name": "compu' if torn else "")
    _write(run_dir / "results.jsonl", text)
    return run_dir


def test_report_and_history_import_read_a_run_dir_without_report_json(tmp_path: Path) -> None:
    run_dir = _results_only(tmp_path, torn=True)
    r = run_main("report", str(run_dir), "--format", "json", "--output", "-")
    assert r.rc == 0, r.err
    data = json.loads(r.out)
    host = next(c["host"] for c in NODE["checks"] if c.get("host"))  # the host the results name
    assert data["run_id"] == run_dir.name and data["host"] == host and data["verdict"] == "interrupted"
    assert [c["name"] for c in data["checks"]] == [c["name"] for c in NODE["checks"]]
    db = f"sqlite:///{tmp_path / 'h.db'}"
    r = run_main("history", "--import", str(run_dir), "--db", db)
    assert r.rc == 0 and run_dir.name in r.out, r.err


# ---- history: read-only commands create nothing --------------------------------------------------------------------
def test_read_only_commands_create_no_database(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "dir" / "h.db"
    for args in (("history",), ("compare", "a", "b"), ("trend", "--host", "h", "--metric", "m")):
        line = run_main(*args, "--db", f"sqlite:///{missing}").one_line_error()
        assert "no history database" in line, line
    assert not (tmp_path / "nonexistent").exists()


def test_read_only_commands_leave_the_history_untouched(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    assert run_main("history", "--import", str(NODE_CPU), "--db", f"sqlite:///{path}").rc == 0
    for extra in ("-wal", "-shm"):
        Path(str(path) + extra).unlink(missing_ok=True)
    before = path.read_bytes()
    r = run_main("history", "--db", f"sqlite:///{path}")
    assert r.rc == 0 and NODE["run_id"] in r.out, r.err
    assert path.read_bytes() == before
    assert {p.name for p in tmp_path.iterdir()} <= {"h.db", "h.db-wal", "h.db-shm"}


def test_history_on_read_only_media_is_read_not_called_corrupt(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from gpuaccept.results import store_sqlite

    path = tmp_path / "h.db"
    assert run_main("history", "--import", str(NODE_CPU), "--db", f"sqlite:///{path}").rc == 0
    real = sqlite3.connect

    def read_only_media(database: str, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        if not kwargs.get("uri") or "mode=ro" not in database:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        conn = real(database, *args, **kwargs)
        if "immutable=1" not in database:  # as on a read-only mount: no WAL index can be created
            conn.close()
            raise sqlite3.OperationalError("unable to open database file")
        return conn

    monkeypatch.setattr(store_sqlite.sqlite3, "connect", read_only_media)
    r = run_main("history", "--db", f"sqlite:///{path}")
    assert r.rc == 0 and NODE["run_id"] in r.out, r.err


# ---- secrets -------------------------------------------------------------------------------------------------------
def test_credentials_in_argv_are_not_stored(tmp_path: Path) -> None:
    argv = ["run", "--db", "postgresql://admin:s3cret@db.example/gpuaccept", "--db=postgres://u:hunter2@h/d",
            "--api-token=abc123", "--profile", "quick"]
    rep = NodeReport(run_id="r1", host="h", profile="quick", started="2026-11-22T10:15:00Z", argv=argv)
    text = json.dumps(rep.to_dict())
    assert "s3cret" not in text and "hunter2" not in text and "abc123" not in text
    assert "postgresql://admin:***@db.example/gpuaccept" in rep.argv and "--profile" in rep.argv
    loaded = NodeReport.from_dict(json.loads(json.dumps(_node(argv=argv))))
    assert "s3cret" not in " ".join(loaded.argv)


# ---- host lists ----------------------------------------------------------------------------------------------------
def test_host_with_a_blank_inside_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot contain blanks"):
        parse_host_list("host name")
    with pytest.raises(ConfigError, match="cannot contain blanks"):
        parse_host_list("a, b c")
    assert [h.name for h in parse_host_list(" a , b\nc ")] == ["a", "b", "c"]


def test_error_messages_are_one_line() -> None:
    from gpuaccept.inputs import one_line

    assert one_line("a\nb\tc") == "a\\nb\\tc"
    assert isinstance(GpuacceptError("x"), Exception)


@pytest.mark.parametrize(("text", "ok"), [
    ("[" + "9" * 30 + "." + "9" * 30 + "e99, -1E-99, 0.5]", True),  # no risky shape: parsed without the hooks
    ("[" + "1" * 31 + "]", False),                                    # an integer of 31 digits
    ("[1e400]", False), ("[-1E+308]", True), ("[1e-400]", True),      # 3-digit exponents take the strict path
    ('["e999 in a string", 1' + "0" * 31 + "]", False),
])
def test_json_numbers_are_strict_with_or_without_the_hooks(text: str, ok: bool) -> None:
    """The per-number hooks run only when the text may need them (issue 27); the verdict is the same."""
    from gpuaccept.inputs import loads_json

    if ok:
        assert loads_json(text, "x") == json.loads(text)
    else:
        with pytest.raises(GpuacceptError, match="not valid JSON"):
            loads_json(text, "x")
