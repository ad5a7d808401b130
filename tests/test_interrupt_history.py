"""An interrupted run reaches the history: a second SIGTERM while the history row waits for a locked database
does not lose it, and ``healthcheck --db`` stores an interrupted run. Real processes, signals and SQLite."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT, cli_env, gpuaccept


def _popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuaccept", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT)


def _wait_for(path_glob: tuple[Path, str], proc: subprocess.Popen[str], within_s: float = 90) -> None:
    """Until a file matching the glob exists under the directory (the check in flight has its log)."""
    root, pattern = path_glob
    deadline = time.monotonic() + within_s
    while not (root.is_dir() and any(root.glob(pattern))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no {pattern} under {root}"
        time.sleep(0.1)


def _runs(url: str) -> list[dict[str, object]]:
    r = gpuaccept("history", "--db", url, "--json")
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout))


def test_a_second_sigterm_while_the_database_is_locked_keeps_the_row(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    url = f"sqlite:///{db}"
    proc = _popen("run", "--device", "cpu", "--checks", "steady,nap", "--report-dir", str(tmp_path / "rep"),
                  "--db", url)
    lock = sqlite3.connect(db, isolation_level=None)
    try:
        _wait_for((tmp_path / "rep", "*/logs/nap.log"), proc)
        lock.execute("BEGIN EXCLUSIVE")  # the history write must wait for this
        proc.send_signal(signal.SIGTERM)
        time.sleep(2.0)
        assert proc.poll() is None, "the run ended without waiting for the history"
        proc.send_signal(signal.SIGTERM)  # a scheduler's second SIGTERM
        time.sleep(1.0)
    finally:
        if lock.in_transaction:
            lock.rollback()
        lock.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    runs = _runs(url)
    assert len(runs) == 1 and runs[0]["verdict"] == "interrupted", runs


def test_healthcheck_db_stores_an_interrupted_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("checks:\n  compute: {params: {cpu_size: 1024, warmup_s: 60, warmup_max_s: 60}}\n")
    proc = _popen("healthcheck", "--device", "cpu", "--skip", "env,health", "--config", str(cfg), "--deadline",
                  "60", "--report-dir", str(tmp_path / "rep"), "--db", url)
    _wait_for((tmp_path / "rep", "*/logs/compute.log"), proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert out.startswith("[HEALTHCHECK] INTERRUPTED"), out
    runs = _runs(url)
    assert len(runs) == 1 and runs[0]["verdict"] == "interrupted" and str(runs[0]["run_id"]).startswith("hc-")
