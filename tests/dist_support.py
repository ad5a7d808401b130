"""Helpers for the distributed tests: required binaries, free ports, rank launches, env recording.

``python -m tests.dist_support record tests/data/dist/env`` re-records the
launcher environments the rank-detection tests read (see the README there).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, cli_env

KEEP_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_", "GROUP_", "ROLE_", "MASTER_", "TORCHELASTIC_", "OMPI_COMM_WORLD_",
                 "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_num_nodes", "PMIX_NAMESPACE", "PMIX_RANK", "SLURM_",
                 "PET_")
DROP = ("TORCHELASTIC_ERROR_FILE", "SLURM_CONF", "SLURM_SUBMIT_DIR", "SLURM_TOPOLOGY_ADDR",
        "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_WORKING_CLUSTER", "SLURM_SRUN_COMM_HOST", "SLURM_LAUNCH_NODE_IPADDR")
DUMP = ("import json, os; print('ENVDUMP ' + json.dumps({k: v for k, v in sorted(os.environ.items()) "
        f"if k.startswith({KEEP_PREFIXES!r}) and k not in {DROP!r}}}), flush=True)")


def need_binary(name: str) -> str:
    """Path of ``name``; skip the test when it is missing, except under CI=true where that fails it."""
    path = shutil.which(name) or (str(Path("/usr/sbin", name)) if Path("/usr/sbin", name).exists() else None)
    if path:
        return path
    if os.environ.get("CI") == "true":
        pytest.fail(f"{name} is required (CI=true) but not installed")
    pytest.skip(f"{name} is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpuaccept_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuaccept", *args]


def rank_env(rank: int, world: int, port: int, host: str, *, local_rank: int = 0, local_world: int = 1,
             **extra: str) -> dict[str, str]:
    """A hand-made torch-style environment for one rank (what srun/k8s users export)."""
    return cli_env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
                   LOCAL_WORLD_SIZE=str(local_world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GPUACCEPT_HOSTNAME=host, **extra)


def start_rank(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``gpuaccept ARGS`` as one rank in its own process group, output to ``log``."""
    with open(log, "wb") as fh:
        return subprocess.Popen(gpuaccept_argv(*args), env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


# ---------------------------------------------------------------------- recording

def _dumps(text: str) -> list[dict[str, str]]:
    envs = [json.loads(line.split(" ", 1)[1]) for line in text.splitlines() if line.startswith("ENVDUMP ")]
    key = next((k for k in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID") if envs and k in envs[0]), None)
    return sorted(envs, key=lambda e: int(e[key])) if key else envs


def _save(out: Path, name: str, how: str, envs: list[dict[str, str]]) -> None:
    (out / name).write_text(json.dumps({"how": how, "ranks": envs}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {name}: {len(envs)} environment(s)")


def record(out: Path) -> None:
    """Record launcher environments into ``out`` (needs torch, mpirun and the Slurm daemons)."""
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True, cwd=ROOT)

    r = run([py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--no-python", py, "-c", DUMP])
    _save(out, "torchrun_standalone_2.json", "torchrun --standalone --nproc-per-node=2", _dumps(r.stdout))

    port = free_port()
    common = [py, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=rec", "--local-addr=127.0.0.1"]
    a = subprocess.Popen([*common, "--rdzv-conf", "is_host=1", "--no-python", py, "-c", DUMP],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
    b = run([*common, "--rdzv-conf", "is_host=0", "--no-python", py, "-c", DUMP])
    a_out, _ = a.communicate(timeout=120)
    _save(out, "torchrun_2nodes_loopback.json",
          f"two agents: {' '.join(common[2:])} --rdzv-conf is_host=1|0", _dumps(a_out + b.stdout))

    r = run(["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", py, "-c", DUMP])
    _save(out, "mpirun_np2.json", "mpirun -np 2 --allow-run-as-root --oversubscribe (Open MPI 4.1)",
          _dumps(r.stdout))

    from tests.slurm_cluster import LocalSlurm

    with LocalSlurm() as cluster:
        r = cluster.run("srun", "-N2", "-n4", py, "-c", DUMP, timeout=120)
        _save(out, "srun_N2_n4.json", "srun -N2 -n4 on the two-node tests/slurm_cluster.py cluster",
              _dumps(r.stdout))
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "job.sh"
            result = Path(tmp) / "out.txt"
            script.write_text(f"#!/bin/sh\n{py} -c \"{DUMP}\" > {result}\n")
            script.chmod(0o755)
            sub = cluster.run("sbatch", "--parsable", "-N1", "-n2", str(script))
            job = sub.stdout.strip().split(";")[0]
            cluster.wait_job(job)
            _save(out, "sbatch_script_n2.json", "the environment of an sbatch -N1 -n2 job script (no srun)",
                  _dumps(result.read_text()))


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "record":
        record(Path(argv[1]))
        return 0
    print("usage: python -m tests.dist_support record DIR", file=sys.stderr)
    return 2


def load_envs(name: str) -> list[dict[str, Any]]:
    data = json.loads((ROOT / "tests" / "data" / "dist" / "env" / name).read_text())
    return list(data["ranks"])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
