"""What each node executes, as argv: the suite or the user's command, directly or under torchrun.

The rule every backend here follows (documented in docs/howto/launch.md):

- ``spec.distributed`` False: the job argv runs once per node. This is the
  suite on one node, or under ``--per-node-only``.
- ``spec.distributed`` True: one torchrun agent per node starts
  ``spec.nproc`` ranks (when the launch gave no count, one per GPU of the
  node, counted there: :mod:`gpuaccept.launch.gpucount`) that run the job argv (``--no-python`` unless the
  command is a ``.py`` script). This is the default for a user command, and
  for the suite on 2+ nodes (``gpuaccept run --distributed``: node checks once
  per node, the cross-node checks over every rank).

The suite runs as ``<python> -m gpuaccept run ...`` with ``spec.python``, so
the node needs no ``gpuaccept`` on its PATH, only in that interpreter.
"""

from __future__ import annotations

import zlib

from gpuaccept.launch.spec import JobSpec


def node_argv(spec: JobSpec) -> list[str]:
    """The job argv with the ``gpuaccept`` entry point replaced by ``spec.python -m gpuaccept``."""
    argv = spec.job_argv()
    if spec.command is None and argv and argv[0] == "gpuaccept":
        return [spec.python, "-m", "gpuaccept", *argv[1:]]
    return argv


def torchrun_argv(spec: JobSpec, rendezvous: list[str], nnodes: str) -> list[str]:
    """``python -m torch.distributed.run`` (torchrun) with ``rendezvous`` options, then the job.

    ``nnodes`` is text so that a script can pass ``"$SLURM_JOB_NUM_NODES"``.
    """
    head = [spec.python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", nproc_option(spec), *rendezvous]
    return [*head, *torchrun_job(spec)]


def nproc_option(spec: JobSpec) -> str:
    """torchrun's ``--nproc-per-node=N``, or the placeholder a node replaces with its GPU count."""
    from gpuaccept.launch.gpucount import PLACEHOLDER

    return PLACEHOLDER if spec.nproc is None else f"--nproc-per-node={spec.nproc}"


def torchrun_job(spec: JobSpec) -> list[str]:
    """What follows torchrun's own options: a ``.py`` script as is, anything else after ``--no-python``."""
    job = node_argv(spec)
    return job if job[0].endswith(".py") else ["--no-python", *job]


def port_from(text: str, base: int = 20000, span: int = 20000) -> int:
    """A deterministic TCP port in ``[base, base+span)`` derived from ``text`` (a run id): same spec, same port."""
    return base + zlib.crc32(text.encode()) % span


def launch_dir(spec: JobSpec) -> str:
    """Where a launch keeps its plan files, scheduler logs and ``job.json``: ``<run dir>/launch``."""
    return f"{spec.run_results_dir}/launch"
