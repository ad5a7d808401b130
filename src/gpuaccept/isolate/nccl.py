"""``gpuaccept isolate --pair-test nccl-tests``: NVIDIA's ``all_reduce_perf`` as the pair test.

The plan (:func:`launch_argv`, pure) is a ``gpuaccept launch`` command line per test:

* ``mpi``: ``--procs-per-node G --gpus-per-node G -- all_reduce_perf ARGS -g 1``: one rank per GPU,
  mpirun's ranks bootstrap NCCL (the layout of NVIDIA's own multi-node examples);
* ``slurm``: ``--gpus-per-node G --no-torchrun -- all_reduce_perf ARGS -g G``: one srun task per node
  driving its G GPUs; the tasks find each other through Slurm's PMI, so srun must start MPI tasks
  (``MpiDefault=pmix`` in slurm.conf, or ``--launch-arg=--srun-arg=--mpi=pmix``; ``pmi2`` where the MPI
  that nccl-tests was built with supports it).

ssh and local have no MPI to bootstrap nccl-tests across hosts: a UsageError. The output is the job's log
(``mpirun.log``, ``slurm-<job>.out`` in the launch directory), parsed by :mod:`gpuaccept.nccltests.parse`
and judged by :func:`gpuaccept.nccltests.judge.judge` (``#wrong`` = 0, the footer OK, busbw at the largest
size); :func:`run_from_output` also requires that the log holds one run whose table covers the test's
nodes: ``2 x G`` ranks, numbered 0..2G-1 once each, on 2 hosts. A log with one run per node task (tasks
started without MPI: each is rank 0 of its own job, even when their lines interleave) or none is a failed
test, with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuaccept.errors import InputError, UsageError
from gpuaccept.isolate.plan import Run
from gpuaccept.model import Status

NCCL_BACKENDS = ("slurm", "mpi")
DEFAULT_ARGS = ("-b", "8M", "-e", "1G", "-f", "2")
BINARY = "all_reduce_perf"
NOT_ONE_JOB = "the tasks did not run as one MPI job (under slurm: srun --mpi=pmix, or MpiDefault=pmix)"


def command(backend: str, gpus: int, args: Sequence[str], binary: str = BINARY) -> list[str]:
    """The nccl-tests command each rank (mpi) or node task (slurm) runs (pure)."""
    if backend not in NCCL_BACKENDS:
        raise UsageError(f"--pair-test nccl-tests runs over {' or '.join(NCCL_BACKENDS)} (nccl-tests needs MPI "
                         f"to start across nodes); not {backend}")
    if gpus < 1:
        raise UsageError(f"--gpus-per-node must be at least 1 for nccl-tests, got {gpus}")
    if "-g" in args or any(a.startswith("--ngpus") for a in args):
        raise UsageError("--nccl-arg: -g is set by the plan (one GPU per rank under mpi, all under slurm)")
    return [binary, *args, "-g", "1" if backend == "mpi" else str(gpus)]


def launch_flags(backend: str, gpus: int, args: Sequence[str], binary: str = BINARY) -> list[str]:
    """The ``gpuaccept launch`` flags after the node flags: GPUs, ranks, and ``-- all_reduce_perf ...`` (pure)."""
    cmd = command(backend, gpus, args, binary)
    if backend == "mpi":
        return ["--gpus-per-node", str(gpus), "--procs-per-node", str(gpus), "--", *cmd]
    return ["--gpus-per-node", str(gpus), "--no-torchrun", "--", *cmd]


def job_output(backend: str, launch_dir: Path, job_id: str) -> str:
    """The job's stdout as the launcher keeps it: ``mpirun.log`` or ``slurm-<job>.out``; '' when none."""
    name = "mpirun.log" if backend == "mpi" else f"slurm-{job_id}.out"
    try:
        return (launch_dir / name).read_text(errors="replace")
    except OSError:
        return ""


def run_from_output(text: str, nodes: int, gpus: int, *, job_ok: bool = True, job_state: str = "",
                    min_busbw: float | None = None) -> Run:
    """A test's run from its all_reduce_perf output (pure): parsed, judged, and checked to span the nodes."""
    from gpuaccept.nccltests.judge import judge
    from gpuaccept.nccltests.parse import parse_text, runs_in

    tail = f"; the job ended {job_state}" if job_state and not job_ok else ""
    if (runs := runs_in(text)) > 1:
        return Run(False, None, f"{runs} nccl-tests runs in one log, not 1: {NOT_ONE_JOB}{tail}")
    try:
        result = parse_text(text)
    except InputError as exc:
        return Run(False, None, f"no nccl-tests result: {exc}{tail}")
    j = judge(result, "all_reduce", min_busbw_gbs=min_busbw, source="--min-busbw")
    busbw = next((m.value for m in j.metrics if m.name == "allreduce_busbw_large_gbs"), None)
    ranks, hosts = len(result.devices), len(result.hosts)
    if j.status is not Status.PASS:
        return Run(False, busbw, j.reason)
    if ranks != nodes * gpus or hosts != nodes:
        return Run(False, busbw, f"the table covers {ranks} rank(s) on {hosts} host(s), not {nodes * gpus} on "
                                 f"{nodes}: {NOT_ONE_JOB}")
    if sorted(d.rank for d in result.devices) != list(range(ranks)):
        return Run(False, busbw, f"the table's ranks are not 0..{ranks - 1} once each: {NOT_ONE_JOB}")
    if not job_ok:
        return Run(False, busbw, f"the job ended {job_state or 'badly'} after a passing table: {j.reason}")
    return Run(True, busbw)
