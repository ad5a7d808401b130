"""Without --gpus-per-node every backend tests every GPU of each node: the plans of each backend for the default
case and an explicit count, the node-side count run for real (sh, fake nvidia-smi from a recorded output), the
refusal of ``--gpus N`` as a count, and isolate's pair tests carrying the GPU request."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaccept.launch.gpucount import NO_GPU_EXIT, NODE_WRAPPER, PLACEHOLDER
from tests.cli_inproc import run_main
from tests.launch_support import gpuaccept, shellcheck

DATA = Path(__file__).resolve().parent / "data" / "nvidia-smi"
PODS = ["--image", "registry/gpuaccept:1", "--nodes", "2"]


def dry(backend: str, *args: str) -> str:
    r = run_main("launch", backend, "--results-dir", "/r", "--run-id", "x", "--python", "python3", "--dry-run", *args)
    assert r.rc == 0, r.err
    return r.out


def refused(backend: str, *args: str) -> str:
    return run_main("launch", backend, "--results-dir", "/r", "--run-id", "x", "--dry-run", *args).one_line_error()


# ---- --gpus N is an index list, not a count -----------------------------------------------------------------

@pytest.mark.parametrize(("backend", "more"), [("slurm", []), ("ssh", ["--hosts", "a,b"]), ("local", []),
                                               ("k8s", PODS)])
def test_gpus_that_looks_like_a_count_is_refused_with_a_hint(backend: str, more: list[str]) -> None:
    line = refused(backend, "--nodes", "2", "--gpus", "8", *more)
    assert "--gpus-per-node 8" in line and "index" in line


def test_a_gpus_list_sets_the_ranks_and_a_count_with_it_is_an_index() -> None:
    assert "--nproc-per-node=2 " in dry("slurm", "--nodes", "2", "--gpus", "0,1")
    both = dry("slurm", "--nodes", "2", "--gpus-per-node", "8", "--gpus", "3")
    assert "#SBATCH --gpus-per-node=8" in both and "--nproc-per-node=1 " in both and "--gpus 3 " in both


# ---- slurm ----------------------------------------------------------------------------------------------------

def test_slurm_default_counts_on_each_node_and_explicit_requests(tmp_path: Path) -> None:
    default = dry("slurm", "--nodes", "2")
    script = default.split("# ---- commands ----")[0].split("\n", 1)[1]
    assert "--gpus-per-node" not in script.split("set -euo")[0]  # nothing asked of Slurm: the node's own GPUs
    assert "gpuaccept-gpus python3 -m torch.distributed.run" in " ".join(script.split()) and PLACEHOLDER in script
    assert "--nproc-per-node=1" not in script
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    shellcheck(path)
    explicit = dry("slurm", "--nodes", "2", "--gpus-per-node", "8")
    assert "#SBATCH --gpus-per-node=8" in explicit and "--nproc-per-node=8 " in explicit
    assert "node_gpus" not in explicit
    cpu = dry("slurm", "--nodes", "2", "--device", "cpu")
    assert "--nproc-per-node=1 " in cpu and "node_gpus" not in cpu  # asked for CPU: one rank, no GPU count


@pytest.mark.parametrize("command", [[], ["--", "all_reduce_perf", "-g", "1"]])
def test_slurm_container_runtime_counts_on_the_first_node(command: list[str], tmp_path: Path) -> None:
    base = ["--nodes", "2", "--runtime", "podman", "--image", "registry/gpuaccept:1"]
    default = dry("slurm", *base, *command)
    script = default.split("# ---- job.sbatch ----\n")[1].split("# ---- ")[0]
    assert "nproc=$(gpuaccept_gpus)" in script and "GPUACCEPT_SLOTS_PER_NODE=$nproc" in script
    assert ('"--nproc-per-node=$nproc"' in script) == (not command)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    shellcheck(path)
    explicit = dry("slurm", *base, "--gpus-per-node", "4", *command)
    assert "GPUACCEPT_SLOTS_PER_NODE=4" in explicit and "gpuaccept_gpus" not in explicit


# ---- k8s, runai, bcp: the scheduler only gives what is asked -------------------------------------------------

@pytest.mark.parametrize("kind", ["job", "jobset", "pytorchjob", "mpijob", "trainjob"])
def test_k8s_kinds_need_a_count_and_use_it(kind: str) -> None:
    assert "--gpus-per-node" in refused("k8s", "--kind", kind, *PODS)
    out = dry("k8s", "--kind", kind, *PODS, "--gpus-per-node", "8")
    assert "nvidia.com/gpu: '8'" in out or "nvidia.com/gpu: \"8\"" in out
    ranks = {"job": "--nproc-per-node=8", "jobset": "--nproc-per-node=8", "pytorchjob": "nprocPerNode: '8'",
             "mpijob": "slotsPerWorker: 8", "trainjob": "numProcPerNode: 8"}[kind]
    assert ranks in out
    resource = dry("k8s", "--kind", kind, *PODS, "--resource", "nvidia.com/gpu=4")
    assert {"pytorchjob": "nprocPerNode: '4'", "mpijob": "slotsPerWorker: 4",
            "trainjob": "numProcPerNode: 4"}.get(kind, "--nproc-per-node=4") in resource
    cpu = dry("k8s", "--kind", kind, *PODS, "--device", "cpu")
    assert "nvidia.com/gpu" not in cpu


@pytest.mark.parametrize("kind", ["pytorch", "mpi"])
def test_runai_needs_a_count_and_requests_it(kind: str) -> None:
    assert "--gpus-per-node" in refused("runai", "--kind", kind, *PODS, "--project", "p")
    out = dry("runai", "--kind", kind, *PODS, "--project", "p", "--gpus-per-node", "8")
    assert "--gpu-devices-request 8" in out
    assert ("--slots-per-worker 8" in out) == (kind == "mpi")


@pytest.mark.parametrize("array", ["PYTORCH", "MPI"])
def test_bcp_takes_the_count_from_the_instance_type(array: str) -> None:
    base = ["--image", "nvcr.io/acme/gpuaccept:1", "--nodes", "2", "--array-type", array]
    out = dry("bcp", *base, "--instance", "dgxh100.80g.8.norm")
    assert ("--nproc-per-node=8" in out) if array == "PYTORCH" else ("np=16" in out and "ppr:8:node" in out)
    assert "--gpus-per-node" in refused("bcp", *base, "--instance", "custom-box")
    assert "--nproc-per-node=4" in dry("bcp", *base[:-2], "--array-type", "PYTORCH", "--instance", "custom-box",
                                       "--gpus-per-node", "4")


# ---- mpi, ssh, local ------------------------------------------------------------------------------------------

def test_mpi_uses_the_hostfile_slots_or_needs_a_count(tmp_path: Path) -> None:
    cmd = ["--", "all_reduce_perf", "-g", "1"]
    assert "--gpus-per-node" in refused("mpi", "--hosts", "a,b", *cmd)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=4\nb slots=4\n")
    out = dry("mpi", "--hostfile", str(hostfile), *cmd)
    assert "-np 8 --map-by ppr:4:node" in out
    assert "-np 16 --map-by ppr:8:node" in dry("mpi", "--hosts", "a,b", "--gpus-per-node", "8", *cmd)


def test_ssh_hosts_count_their_gpus_unless_told(tmp_path: Path) -> None:
    default = dry("ssh", "--hosts", "a,b", "--nodes", "2")
    assert "exec /bin/sh -s -- 0 a a gpu" in default and 'if [ "$nproc" = gpu ]' in default
    script = default.split("# ---- ssh-node.sh ----\n")[1].split("# ---- commands ----")[0]
    path = tmp_path / "ssh-node.sh"
    path.write_text(script)
    shellcheck(path)
    explicit = dry("ssh", "--hosts", "a,b", "--nodes", "2", "--gpus-per-node", "8")
    assert "exec /bin/sh -s -- 0 a a 8" in explicit and "gpuaccept_gpus" not in explicit


def test_local_nodes_count_the_gpus_of_this_machine() -> None:
    default = dry("local", "--nodes", "2")
    assert "sh -c" in default and PLACEHOLDER in default and "gpuaccept-gpus" in default
    assert "--nproc-per-node=8" in dry("local", "--nodes", "2", "--gpus-per-node", "8")
    assert "gpuaccept-gpus" not in dry("local", "--nodes", "2", "--device", "cpu")


# ---- the count on a node, run for real ------------------------------------------------------------------------

def _fake_nvidia_smi(tmp_path: Path, output: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "out.txt").write_text(output)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\n[ "$1" = -L ] && exec cat {shlex.quote(str(bin_dir / "out.txt"))}\nexit 9\n')
    tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    return env


def _wrap(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", NODE_WRAPPER, "gpuaccept-gpus", "echo", "torchrun", PLACEHOLDER, "a b"],
                          capture_output=True, text=True, env=env, check=False, timeout=30)


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_node_counts_gpu_lines_of_nvidia_smi_not_mig_devices(shell: str, tmp_path: Path) -> None:
    env = _fake_nvidia_smi(tmp_path, (DATA / "L-h100-mig.txt").read_text())
    r = subprocess.run([shell, "-c", NODE_WRAPPER, "gpuaccept-gpus", "echo", PLACEHOLDER, "a b"],
                       capture_output=True, text=True, env=env, check=False, timeout=30)
    assert r.returncode == 0 and r.stdout == "--nproc-per-node=2 a b\n", r.stderr
    assert "2 GPU(s)" in r.stderr


def test_the_scheduler_allocation_comes_before_nvidia_smi(tmp_path: Path) -> None:
    env = _fake_nvidia_smi(tmp_path, (DATA / "L-h100-mig.txt").read_text())
    assert _wrap({**env, "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c"}).stdout == \
        "torchrun --nproc-per-node=3 a b\n"
    assert _wrap({**env, "SLURM_GPUS_ON_NODE": "8", "CUDA_VISIBLE_DEVICES": "0"}).stdout == \
        "torchrun --nproc-per-node=8 a b\n"


@pytest.mark.parametrize("extra", [{}, {"CUDA_VISIBLE_DEVICES": ""}])
def test_a_node_without_gpu_says_so_and_runs_nothing(extra: dict[str, str], tmp_path: Path) -> None:
    r = _wrap({**_fake_nvidia_smi(tmp_path, ""), **extra, "GPUACCEPT_HOSTNAME": "gpu-07"})
    assert r.returncode == NO_GPU_EXIT and r.stdout == ""
    assert r.stderr.startswith("[LAUNCH] gpu-07: no GPU found on this node") and "--gpus-per-node" in r.stderr


def test_local_launch_starts_one_rank_per_visible_gpu_on_each_node(tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    code = ("import os, pathlib; e = os.environ; pathlib.Path(" + repr(str(out)) + ", e['RANK']).write_text("
            "e['WORLD_SIZE'] + ' ' + e['LOCAL_WORLD_SIZE'])")
    r = gpuaccept("launch", "local", "--nodes", "2", "--results-dir", str(tmp_path), "--run-id", "run",
                  "--poll-interval", "0.2", "--env", "CUDA_VISIBLE_DEVICES=0,1", "--", sys.executable, "-c", code,
                  timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["0", "1", "2", "3"]
    assert {p.read_text() for p in out.iterdir()} == {"4 2"}


# ---- isolate ------------------------------------------------------------------------------------------------

def test_isolate_pair_tests_carry_the_gpu_request() -> None:
    base = ["isolate", "--backend", "slurm", "--nodes", "node[1-4]", "--results-dir", "/r", "--dry-run"]
    r = run_main(*base, "--gpus-per-node", "8")
    assert r.rc == 0, r.err
    tests = [shlex.split(line) for line in r.out.splitlines() if line.startswith("gpuaccept launch")]
    assert tests and all(t[t.index("--gpus-per-node") + 1] == "8" for t in tests)
    plain = run_main(*base)
    assert plain.rc == 0 and "--gpus-per-node" not in plain.out  # each node tests every GPU it has
