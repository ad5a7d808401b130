"""``gpuaccept history``, ``compare`` and ``trend`` run as a user would: real processes, real databases."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaccept.model import ClusterReport, NodeReport
from tests.helpers import ROOT, cli_env, gpuaccept, ok, one_line_error
from tests.pg_server import shared_server
from tests.store_reports import T0, cluster_report, node_report

GPU01_TFLOPS = [600.0, 603.0, 598.0, 601.0, 600.0, 540.0]  # the newest run is 10 % slower


def _write(path: Path, report: NodeReport | ClusterReport) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
    return path / "report.json"


def _seed(root: Path) -> Path:
    """Report files for the tests: six runs of gpu01, three of gpu02, one cluster run of n1 and n2."""
    for i, t in enumerate(GPU01_TFLOPS):
        _write(root / f"g1-{i}", node_report("gpu01", f"gpu01-run{i}", T0 + 86400 * i, tflops=t))
    for i in range(3):
        _write(root / f"g2-{i}", node_report("gpu02", f"gpu02-run{i}", T0 + 86400 * i, fail=i == 2))
    _write(root / "cluster", cluster_report("cluster-run", ["n1", "n2"], T0 + 3600))
    return root


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite history filled through ``history --import``."""
    root = tmp_path_factory.mktemp("hist")
    url = f"sqlite:///{root / 'db' / 'history.db'}"
    out = ok(gpuaccept("history", "--import", str(_seed(root / "reports")), "--db", url))
    assert out.strip().endswith(f"10 report(s) stored in {url}")
    return url


def test_history_lists_runs(db: str) -> None:
    text = ok(gpuaccept("history", "--db", db))
    header = text.splitlines()[0].split()
    assert header[:5] == ["RUN", "KIND", "HOST", "STARTED", "VERDICT"]
    assert "cluster-run" in text and "2/2 nodes" in text
    runs = json.loads(ok(gpuaccept("history", "--db", db, "--json")))
    assert [r["run_id"] for r in runs][:3] == ["gpu01-run5", "gpu01-run4", "gpu01-run3"]
    assert len(runs) == 6 + 3 + 1  # cluster members are listed under their cluster run...
    members = {r["run_id"] for r in json.loads(ok(gpuaccept("history", "--db", db, "--json", "--all-nodes")))}
    assert len(members) == 12 and {"cluster-run-n1", "cluster-run-n2"} <= members  # ...unless asked for
    gpu02 = json.loads(ok(gpuaccept("history", "--db", db, "--json", "--host", "gpu02")))
    assert [(r["run_id"], r["verdict"], r["failed"]) for r in gpu02] == [
        ("gpu02-run2", "failure", ["memtest"]), ("gpu02-run1", "success", []), ("gpu02-run0", "success", [])]
    n1 = json.loads(ok(gpuaccept("history", "--db", db, "--json", "--host", "n1")))
    assert [(r["run_id"], r["parent_run_id"]) for r in n1] == [("cluster-run-n1", "cluster-run")]
    since = json.loads(ok(gpuaccept("history", "--db", db, "--json", "--since", "2026-09-25")))
    assert sorted(r["run_id"] for r in since) == ["gpu01-run4", "gpu01-run5"]
    assert len(json.loads(ok(gpuaccept("history", "--db", db, "--json", "--limit", "2")))) == 2
    assert json.loads(ok(gpuaccept("history", "--db", db, "--json", "--check", "ddp_train"))) == []  # none ran it
    one_line_error(gpuaccept("history", "--db", db, "--check", "comput"),
                   "--check 'comput': no such check (did you mean compute?)")
    assert "no runs match" in ok(gpuaccept("history", "--db", db, "--host", "nobody"))


def test_compare(db: str, tmp_path: Path) -> None:
    text = ok(gpuaccept("compare", "gpu01-run0", "gpu01-run5", "--db", db))
    line = next(ln for ln in text.splitlines() if "gemm_bf16_tflops" in ln and "cuda:0" in ln)
    assert "600" in line and "540" in line and "-60" in line and "-10.0%" in line and "worse" in line
    assert "worse in B" in text
    data = json.loads(ok(gpuaccept("compare", "gpu01-run0", "gpu01-run5", "--db", db, "--json",
                                    "--metric", "gemm_bf16_tflops")))
    assert [(d["device"], d["a"], d["b"], d["delta"]) for d in data["deltas"]] == [
        ("cuda:0", 600.0, 540.0, -60.0), ("cuda:1", 601.0, 541.0, -60.0)]
    assert data["deltas"][0]["change"] == pytest.approx(-0.1)
    # Run ids by unique prefix, and report files without any database.
    assert json.loads(ok(gpuaccept("compare", "gpu02-run0", "gpu02-run2", "--db", db, "--json")))["run_b"] == \
        "gpu02-run2"
    fa = _write(tmp_path / "a", node_report("x", "file-a", T0, tflops=100.0))
    fb = _write(tmp_path / "b", node_report("x", "file-b", T0, tflops=110.0))
    data = json.loads(ok(gpuaccept("compare", str(fa), str(fb), "--json", "--metric", "gemm_bf16_tflops",
                                    GPUACCEPT_DB="mysql://never-opened")))
    assert data["deltas"][0]["change"] == pytest.approx(0.1)
    one_line_error(gpuaccept("compare", "gpu01-run0", "nope", "--db", db), "no run 'nope'")
    one_line_error(gpuaccept("compare", "gpu01", "gpu02-run1", "--db", db), "ambiguous")
    one_line_error(gpuaccept("compare", str(tmp_path / "missing.json"), "gpu02-run1", "--db", db), "cannot read")


def test_trend_does_not_call_one_low_run_a_regression(db: str) -> None:
    text = ok(gpuaccept("trend", "--host", "gpu01", "--metric", "gemm_bf16_tflops", "--db", db))
    assert "REGRESSION" not in text and "no regression in the newest run (2 series judged)" in text
    assert "LAST 3 MEDIAN" in text
    assert text.count("(too little history)") == 2 * 5  # 3 recent + 3 earlier runs before the first judgement
    help_text = ok(gpuaccept("trend", "--help"))
    assert "One noisy run is never a regression" in " ".join(help_text.split())


def test_trend_flags_the_drop(db: str) -> None:
    proc = gpuaccept("trend", "--host", "gpu01", "--metric", "gemm_bf16_tflops", "--db", db, "--recent", "1")
    text = ok(proc, rc=1)
    assert "REGRESSION: gpu01 compute gemm_bf16_tflops cuda:0" in text
    assert "540 TFLOP/s vs median 600 of 5 earlier runs (-10.0%" in text
    assert "[TFLOP/s, higher is better]" in text
    assert text.count("(too little history)") == 2 * 3  # the first 3 runs of each GPU are not judged
    data = json.loads(ok(gpuaccept("trend", "--host", "gpu01", "--metric", "gemm_bf16_tflops", "--db", db,
                                    "--json", "--device", "cuda:1", "--recent", "1"), rc=1))
    assert data["regressed"] is True
    (series,) = data["series"]
    assert [p["value"] for p in series["points"]] == [t + 1 for t in GPU01_TFLOPS]
    assert [p["regression"] for p in series["points"]] == [False] * 5 + [True]
    # A looser rule lets the same drop through; so does looking only at the older runs.
    ok(gpuaccept("trend", "--host", "gpu01", "--metric", "gemm_bf16_tflops", "--db", db, "--min-drop-pct", "15",
                  "--recent", "1"))
    text = ok(gpuaccept("trend", "--host", "gpu02", "--metric", "gemm_bf16_tflops", "--db", db,
                         "--min-history", "2", "--recent", "1"))
    assert "no regression in the newest run (2 series judged)" in text
    assert "not enough history" in ok(gpuaccept("trend", "--host", "gpu02", "--metric", "gemm_bf16_tflops",
                                                 "--db", db))


def test_trend_bad_input(db: str) -> None:
    one_line_error(gpuaccept("trend", "--host", "gpu01", "--metric", "nosuch", "--db", db),
                    "host 'gpu01' has no metric 'nosuch'")
    one_line_error(gpuaccept("trend", "--host", "gpu01", "--metric", "gemm_bf16_tflop", "--db", db),
                    "(did you mean gemm_bf16_tflops?)")
    one_line_error(gpuaccept("trend", "--host", "gpu01", "--metric", "gemm_bf16_tflops", "--check", "computee",
                              "--db", db), "--check 'computee': no such check (did you mean compute?)")
    one_line_error(gpuaccept("trend", "--host", "ghost", "--metric", "gemm_bf16_tflops", "--db", db),
                    "no runs of host 'ghost'")
    one_line_error(gpuaccept("trend", "--host", "gpu01", "--metric", "gemm_bf16_tflops", "--db", db,
                              "--since", "last tuesday"), "--since: 'last tuesday' is not a date")
    proc = gpuaccept("trend", "--host", "gpu01", "--metric", "m", "--max-drop-sigma", "0", "--db", db)
    assert proc.returncode == 2 and "must be a finite number > 0" in proc.stderr
    proc = gpuaccept("trend", "--metric", "m", "--db", db)
    assert proc.returncode == 2 and "--host" in proc.stderr


def test_bad_databases(tmp_path: Path) -> None:
    one_line_error(gpuaccept("history", "--db", "mysql://u:pw@h/d"), "--db: unsupported database 'mysql'")
    one_line_error(gpuaccept("history", GPUACCEPT_DB="sqlite://"), "GPUACCEPT_DB: a SQLite URL needs a file")
    foreign = tmp_path / "notes.db"
    foreign.write_bytes(b"not a database at all\n" * 100)
    before = hashlib.sha256(foreign.read_bytes()).hexdigest()
    one_line_error(gpuaccept("history", "--db", f"sqlite:///{foreign}"), "not a SQLite database")
    report = _write(tmp_path / "r", node_report("h", "r1", T0))
    one_line_error(gpuaccept("history", "--import", str(report), "--db", str(foreign)), "did not modify")
    assert hashlib.sha256(foreign.read_bytes()).hexdigest() == before
    bad = tmp_path / "bad" / "report.json"
    bad.parent.mkdir()
    bad.write_text('{"run_id": "x"}')
    target = tmp_path / "fresh.db"
    one_line_error(gpuaccept("history", "--import", str(report), str(bad), "--db", str(target)),
                    f"{bad}: not a valid gpuaccept report")
    assert not target.exists()  # every file is checked before anything is stored


def test_default_database_and_env(tmp_path: Path) -> None:
    report = _write(tmp_path / "r", node_report("h", "r1", T0))
    ok(gpuaccept("history", "--import", str(report), XDG_DATA_HOME=str(tmp_path / "xdg"), GPUACCEPT_DB=""))
    assert (tmp_path / "xdg" / "gpuaccept" / "history.db").is_file()
    env_db = tmp_path / "env.db"
    ok(gpuaccept("history", "--import", str(report), GPUACCEPT_DB=f"sqlite:///{env_db}"))
    runs = json.loads(ok(gpuaccept("history", "--json", GPUACCEPT_DB=str(env_db))))
    assert [r["run_id"] for r in runs] == ["r1"]


def test_commands_on_postgres(tmp_path: Path) -> None:
    url = shared_server().new_database()
    ok(gpuaccept("history", "--import", str(_seed(tmp_path)), "--db", url))
    runs = json.loads(ok(gpuaccept("history", "--json", "--host", "gpu01", GPUACCEPT_DB=url)))
    assert len(runs) == 6 and runs[0]["sku"] == "h100-sxm5-80gb"
    assert "REGRESSION: gpu01" in ok(gpuaccept("trend", "--host", "gpu01", "--metric", "gemm_bf16_tflops",
                                                "--db", url, "--recent", "1"), rc=1)
    data = json.loads(ok(gpuaccept("compare", "cluster-run", "gpu01-run5", "--db", url, "--json")))
    assert data["by_host"] is True
    one_line_error(gpuaccept("compare", "cluster-run", "nope", "--db", url), "no run 'nope'")


def test_read_only_commands_on_an_empty_postgres_create_no_table(tmp_path: Path) -> None:
    import psycopg

    url = shared_server().new_database()
    for argv in (["history"], ["trend", "--host", "gpu01", "--metric", "gemm_bf16_tflops"],
                 ["compare", "a", "b"], ["report", "some-run", "--output", str(tmp_path / "r.html")]):
        one_line_error(gpuaccept(*argv, "--db", url), "run a writing command first")
    with psycopg.connect(url, autocommit=True) as pg:
        assert pg.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema "
                          "NOT IN ('pg_catalog', 'information_schema')").fetchall() == []


@pytest.mark.slow
def test_concurrent_imports_from_the_command_line(tmp_path: Path) -> None:
    """16 ``gpuaccept history --import`` processes into one new SQLite file: all stored, nothing on stderr."""
    n = 16
    files = [_write(tmp_path / f"r{i}", node_report(f"node{i:02d}", f"cli-{i:02d}", T0 + i)) for i in range(n)]
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    procs = [subprocess.Popen([sys.executable, "-m", "gpuaccept", "history", "--import", str(f), "--db", url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT)
             for f in files]
    results = [(p.wait(timeout=120), p.stdout.read() if p.stdout else "", p.stderr.read() if p.stderr else "")
               for p in procs]
    assert [(rc, err) for rc, _out, err in results] == [(0, "")] * n
    runs = json.loads(ok(gpuaccept("history", "--json", "--limit", "0", "--db", url)))
    assert sorted(r["run_id"] for r in runs) == [f"cli-{i:02d}" for i in range(n)]
