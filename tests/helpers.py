"""Helpers for tests that run the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "src" / "gpuaccept" / "data" / "report.schema.json"


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["GPUACCEPT_PLUGINS"] = "tests.plugins.fake_checks"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


def gpuaccept(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gpuaccept ARGS`` with stdout and stderr captured (so stdout is not a TTY)."""
    return subprocess.run([sys.executable, "-m", "gpuaccept", *args], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(**env), cwd=ROOT)


def validate_report(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    return data


def only_run_dir(report_dir: Path) -> Path:
    dirs = [d for d in report_dir.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` (0 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def process_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children, their children...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            children.setdefault(parent_of(int(entry.name)), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not count)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def wait_for_check_process(root: subprocess.Popen[Any], name: str, limit: float = 120) -> list[int]:
    """Wait until a process below ``root`` (a ``gpuaccept run``) writes its output to ``logs/<name>.log``: check
    ``name`` then runs in its own process (the event to send a signal after, not a fixed sleep). Returns the
    processes below ``root`` then; fails when ``root`` ends or ``limit`` seconds pass first."""
    deadline = time.monotonic() + limit
    while True:
        family = descendants(root.pid)
        for pid in family:
            try:
                if os.readlink(f"/proc/{pid}/fd/1").endswith(f"/logs/{name}.log"):
                    return family
            except OSError:
                continue
        assert root.poll() is None, f"the run ended (status {root.returncode}) before {name} started"
        assert time.monotonic() < deadline, f"{name} did not start within {limit:g} s"
        time.sleep(0.05)


def ok(proc: subprocess.CompletedProcess[str], rc: int = 0) -> str:
    """``proc``'s stdout, once its exit code is ``rc`` (else the assertion shows both streams)."""
    assert proc.returncode == rc, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def one_line_error(proc: subprocess.CompletedProcess[str], text: str) -> None:
    """Exit 2 with one ``gpuaccept: error:`` line holding ``text``, and no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuaccept: error: "), proc.stderr
    assert text in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
