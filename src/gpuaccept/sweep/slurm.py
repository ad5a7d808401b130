"""The sweep's edges: read ``sinfo`` and ``squeue``, write each node's job script, submit it with ``sbatch``.

The plan (which nodes, what each job asks for and runs) is :mod:`gpuaccept.sweep.plan`; this module only runs
the Slurm clients. Each sweep's job scripts (0700) and job logs go into a new 0700 directory under the results
directory (``sweep-<UTC stamp>-<pid>``), kept as the record of what was submitted.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpuaccept.errors import InputError, UsageError
from gpuaccept.safefs import private_dir
from gpuaccept.sweep.plan import (
    Decision,
    SweepOptions,
    decide,
    job_script,
    parse_sinfo,
    parse_squeue,
    sbatch_argv,
    sinfo_argv,
    squeue_argv,
)

CLIENT_TIMEOUT_S = 60.0
"""How long one sinfo, squeue or sbatch call may take (s) before the sweep gives up on it."""


@dataclass(frozen=True)
class Submitted:
    node: str
    job_id: str | None
    script: Path
    error: str = ""


def _client(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise UsageError(f"{argv[0]} not found on PATH (the sweep runs on a host with the Slurm clients)") from None
    except subprocess.TimeoutExpired:
        raise InputError(f"{' '.join(argv[:2])}: no answer within {CLIENT_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InputError(f"{' '.join(argv[:2])} failed (exit {proc.returncode}): {last[:200]}")
    return proc.stdout


def survey(opts: SweepOptions) -> list[Decision]:
    """Ask Slurm which nodes are idle and which already have a sweep job, and decide per node."""
    try:
        nodes = parse_sinfo(_client(sinfo_argv(opts.partition)))
        queued = parse_squeue(_client(squeue_argv()))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return decide(nodes, queued, opts.max_nodes)


def submit(decisions: list[Decision], opts: SweepOptions) -> list[Submitted]:
    """Write and submit one job per node to submit to. A node whose sbatch fails is reported, and the others
    are still submitted."""
    todo = [d.node for d in decisions if d.submit]
    if not todo:
        return []
    private_dir(opts.results_dir, "results directory")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    where = private_dir(Path(opts.results_dir) / f"sweep-{stamp}-{os.getpid()}", "sweep directory", parents=False)
    out: list[Submitted] = []
    for node in todo:
        script = where / f"{node}.sbatch"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
        with os.fdopen(fd, "w") as f:
            f.write(job_script(node, opts, str(where)))
        try:
            text = _client(sbatch_argv(str(script)))
        except (InputError, UsageError) as exc:
            out.append(Submitted(node, None, script, str(exc)))
            continue
        out.append(Submitted(node, text.strip().split(";")[0] or None, script))
    return out
