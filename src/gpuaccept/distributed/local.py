"""The ranks of a distributed check on one node: how many, and each one's environment.

A plain ``gpuaccept run`` starts ``nproc`` rank processes for a distributed check (torchrun
``--standalone`` style); :mod:`gpuaccept.node.local_group` starts and watches them with these.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuaccept.distributed.group import ENV_VAR, PARTIAL_ENV, RankContext


def default_nproc(device: str, gpus: list[int] | None, env: dict[str, str] | Any) -> int:
    """Ranks for the distributed checks of a plain run: one per selected GPU, 2 gloo ranks on CPU.

    On CPU two ranks keep the whole pipeline (rendezvous, process group,
    collectives, verification, DDP) under test at a cost of a few seconds.
    """
    if device != "cuda":
        return 2
    if gpus:
        return len(gpus)
    from gpuaccept.hw.devices import visible_gpu_count

    return visible_gpu_count(env)


def rank_env(rc: RankContext, nproc: int, partial: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of one rank process: the parent's, the rank context, where to checkpoint partial
    results (``partial``), and a fair share of CPU threads."""
    env = dict(os.environ if base is None else base)
    env[ENV_VAR] = rc.to_json()
    env[PARTIAL_ENV] = str(partial)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    return env


def partial_path(out: Path) -> Path:
    """Where a rank process checkpoints what it measured (see DistributedCheck.checkpoint)."""
    return out.with_name(out.name + ".partial")
