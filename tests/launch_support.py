"""Helpers for the launch tests: required system binaries, golden files, running the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, cli_env

GOLDEN = ROOT / "tests" / "data" / "golden"
SLURM_DATA = ROOT / "tests" / "data" / "slurm"
PLUGINS = "tests.plugins.fake_checks,tests.plugins.launch_checks"


def require(*binaries: str) -> None:
    """Skip when a system binary is missing, except under CI=true, where that is a failure."""
    missing = [b for b in binaries if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if not missing:
        return
    message = f"needs {', '.join(missing)} (Debian: see .ci/run)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI=true requires it")
    pytest.skip(message)


def check_golden(relpath: str, text: str) -> None:
    """Compare with tests/data/golden/RELPATH; GPUACCEPT_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / relpath
    if os.environ.get("GPUACCEPT_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with GPUACCEPT_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{relpath} differs from the golden file (GPUACCEPT_UPDATE_GOLDEN=1 to accept)"


def shellcheck(path: Path) -> None:
    require("shellcheck")
    r = subprocess.run(["shellcheck", "-x", str(path)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def launch_env(**extra: str) -> dict[str, str]:
    env = cli_env(GPUACCEPT_PLUGINS=PLUGINS)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def gpuaccept(*args: str, env: dict[str, str] | None = None, timeout: float = 180,
              cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuaccept", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or launch_env(), cwd=cwd, check=False)


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, exactly one line on stderr; returns it."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def cluster_report(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "cluster-report.json").read_text())
    return data
