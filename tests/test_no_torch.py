"""No hidden slowness: ``--help`` of every command, a dry run of every launch backend and the healthcheck
process never import torch.

Each case runs in a fresh interpreter and looks at ``sys.modules`` after ``main``; a case that
fails to produce its plan fails too, so a broken command cannot pass by doing nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch_support import launch_env

ROOT = Path(__file__).resolve().parent.parent

_PODS = ["--nodes", "2", "--gpus-per-node", "8", "--image", "registry/gpuaccept:1"]
DRY_RUNS: dict[str, list[str]] = {
    "slurm": ["--nodes", "2", "--partition", "gpu"],
    "slurm-pyxis-command": ["--nodes", "2", "--image", "nvcr.io#nvidia/pytorch:24.08-py3", "--", "python", "t.py"],
    "ssh": ["--hosts", "gpu01,gpu02", "--nodes", "2"],
    "mpi": ["--hosts", "gpu01,gpu02", "--nodes", "2", "--gpus-per-node", "8", "--", "hostname"],
    "local": ["--nodes", "2", "--device", "cpu"],
    "k8s-job": ["--kind", "job", *_PODS],
    "k8s-jobset": ["--kind", "jobset", *_PODS],
    "k8s-pytorchjob": ["--kind", "pytorchjob", *_PODS],
    "k8s-mpijob": ["--kind", "mpijob", *_PODS],
    "k8s-trainjob": ["--kind", "trainjob", *_PODS],
    "runai-pytorch": ["--kind", "pytorch", *_PODS, "--project", "p"],
    "runai-mpi": ["--kind", "mpi", *_PODS, "--project", "p"],
    "bcp-mpi": ["--nodes", "2", "--image", "nvcr.io/acme/gpuaccept:1", "--instance", "dgxa100.80g.8.norm"],
    "bcp-pytorch": ["--nodes", "2", "--image", "nvcr.io/acme/gpuaccept:1", "--instance", "dgxa100.80g.8.norm",
                    "--array-type", "PYTORCH"],
}


def _run_main(argv: list[str], expect_rc: int | None) -> str:
    code = (
        "import contextlib, io, sys\n"
        "from gpuaccept.cli import main\n"
        "out = io.StringIO()\n"
        "try:\n"
        "    with contextlib.redirect_stdout(out):\n"
        f"        rc = main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    rc = exc.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(f'rc={rc}')\n"
        "print(out.getvalue())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=launch_env(), cwd=ROOT,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    first, _, rest = r.stdout.partition("\n")
    if expect_rc is not None:
        assert first == f"rc={expect_rc}", r.stdout + r.stderr
    return rest


@pytest.mark.parametrize("case", sorted(DRY_RUNS))
def test_launch_dry_run_does_not_import_torch(case: str, tmp_path: Path) -> None:
    backend = case.split("-")[0]
    out = _run_main(["launch", backend, "--results-dir", str(tmp_path), "--dry-run",
                     *DRY_RUNS[case]], 0)
    assert out.strip(), f"{case}: the dry run printed no plan"


def _commands() -> list[list[str]]:
    sys.path.insert(0, str(ROOT / "src"))
    from gpuaccept.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    out: list[list[str]] = [[]]
    for name, p in sub.choices.items():  # type: ignore[attr-defined]
        out.append([name])
        inner = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        for action in inner:
            out.extend([name, child] for child in action.choices)
    return out


@pytest.mark.parametrize("words", _commands(), ids=lambda w: " ".join(w) or "gpuaccept")
def test_help_of_every_command_does_not_import_torch(words: list[str]) -> None:
    out = _run_main([*words, "--help"], 0)
    assert "usage:" in out


def test_healthcheck_leaves_torch_to_its_check_processes(tmp_path: Path) -> None:
    """The compute check imports torch in its child process; the healthcheck process itself never does."""
    out = _run_main(["healthcheck", "--device", "cpu", "--skip", "env", "--report-dir", str(tmp_path)], 0)
    assert out.startswith("[HEALTHCHECK] HEALTHY") and "compute NOT JUDGED" in out, out
