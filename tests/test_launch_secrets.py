"""``--env`` values in stored launch files: secret values never in clear in a file others can read."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from gpuaccept.launch.secrets import REDACTED, is_secret, redact_env
from tests.launch_support import gpuaccept, launch_env

SECRET = "s3cr3t-Value-7f1e"


def files_holding(root: Path, text: str) -> dict[Path, int]:
    """Every file under ``root`` whose bytes contain ``text``, with its permission bits."""
    return {p: stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")
            if p.is_file() and text.encode() in p.read_bytes()}


def test_names_are_secret_unless_known_to_be_configuration() -> None:
    assert all(is_secret(n) for n in ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "WANDB_API_KEY", "MSG"))
    assert not any(is_secret(n) for n in ("NCCL_DEBUG", "UCX_TLS", "OMPI_MCA_btl", "CUDA_VISIBLE_DEVICES",
                                          "GPUACCEPT_DB_X", "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "OMP_NUM_THREADS"))
    assert redact_env({"HF_TOKEN": "abc", "NCCL_DEBUG": "INFO", "EMPTY": ""}) == {
        "HF_TOKEN": REDACTED, "NCCL_DEBUG": "INFO", "EMPTY": ""}


@pytest.mark.parametrize("argv", [
    ["slurm", "--nodes", "2", "--partition", "debug", "--device", "cpu"],
    ["k8s", "--image", "img", "--nodes", "2", "--gpus-per-node", "8"],
    ["runai", "--image", "img", "--nodes", "2", "--gpus-per-node", "8", "--project", "team"],
    ["bcp", "--image", "img", "--instance", "dgxa100.80g.8.norm", "--nodes", "2"],
    ["ssh", "--hosts", "gpu-01,gpu-02"],
], ids=lambda a: a[0])
def test_plan_files_holding_a_secret_are_written_owner_only(tmp_path: Path, argv: list[str]) -> None:
    out = tmp_path / "plan"
    env = launch_env()
    env["PATH"] = str(Path(sys.executable).parent)  # no scheduler binaries: a dry run needs none
    r = gpuaccept("launch", *argv, "--results-dir", str(tmp_path / "res"), "--run-id", "r1",
                  "--env", f"AWS_SECRET_ACCESS_KEY={SECRET}", "--env", "NCCL_DEBUG=INFO",
                  "--dry-run", "--output", str(out), env=env)
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout + r.stderr and REDACTED in r.stdout and "INFO" in r.stdout
    assert "the value of --env AWS_SECRET_ACCESS_KEY is shown as <redacted>" in r.stdout
    held = files_holding(out, SECRET)
    assert held, "the plan needs the value on the nodes"
    assert all(mode in (0o600, 0o700) for mode in held.values()), held
    # a plan without a secret value keeps the ordinary modes
    r = gpuaccept("launch", *argv, "--results-dir", str(tmp_path / "res"), "--run-id", "r1",
                  "--env", "NCCL_DEBUG=INFO", "--dry-run", "--output", str(tmp_path / "plain"), env=env)
    assert r.returncode == 0, r.stderr
    modes = [stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "plain").rglob("*") if p.is_file()]
    assert modes and all(m & 0o044 for m in modes), modes


def test_show_env_prints_the_values_in_a_dry_run(tmp_path: Path) -> None:
    r = gpuaccept("launch", "slurm", "--partition", "debug", "--results-dir", str(tmp_path / "res"),
                  "--env", f"HF_TOKEN={SECRET}", "--dry-run", "--show-env")
    assert r.returncode == 0, r.stderr
    assert SECRET in r.stdout and REDACTED not in r.stdout


def test_a_rewritten_plan_file_is_narrowed_before_the_secret_is_written(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    out.mkdir()
    (out / "job.sbatch").write_text("old\n")
    (out / "job.sbatch").chmod(0o644)
    r = gpuaccept("launch", "slurm", "--partition", "debug", "--results-dir", str(tmp_path / "res"),
                  "--env", f"HF_TOKEN={SECRET}", "--dry-run", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((out / "job.sbatch").stat().st_mode) == 0o700
    assert SECRET in (out / "job.sbatch").read_text()


def test_a_local_launch_stores_no_secret_value(tmp_path: Path) -> None:
    code = ("import hashlib, os; "
            "print('digest', hashlib.sha256(os.environ['AWS_SECRET_ACCESS_KEY'].encode()).hexdigest())")
    r = gpuaccept("launch", "local", "--results-dir", str(tmp_path), "--run-id", "sec", "--no-torchrun",
                  "--poll-interval", "0.2", "--no-history", "--env", f"AWS_SECRET_ACCESS_KEY={SECRET}",
                  "--env", "NCCL_DEBUG=INFO", "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stdout + r.stderr
    import hashlib
    assert f"digest {hashlib.sha256(SECRET.encode()).hexdigest()}" in r.stdout + r.stderr  # the job got it
    assert files_holding(tmp_path, SECRET) == {}
    job = json.loads((tmp_path / "sec" / "launch" / "job.json").read_text())
    assert job["spec"]["env"] == {"AWS_SECRET_ACCESS_KEY": REDACTED, "NCCL_DEBUG": "INFO"}
