"""A distributed check on one node, started by a plain ``gpuaccept run`` (torchrun ``--standalone`` style).

``nproc`` rank processes (one per selected GPU; two gloo ranks on CPU, so the
same pipeline runs there) meet on a c10d store that rank 0 serves on a free
loopback port (it writes the port to a file the others read, so the runner
itself never imports torch). The runner watches them: when one dies without a result, the
others get ``dist_timeout_s`` to give up on their own (a gloo peer loss fails
at once; a hung NCCL collective fails at its timeout) and are then killed. The
per-rank outcomes are merged into one result with every rank's metrics.
"""

from __future__ import annotations

import math
import time
import uuid
from pathlib import Path
from typing import Any

from gpuaccept.checks.base import Outcome
from gpuaccept.distributed.gather import merge_rank_outcomes
from gpuaccept.distributed.group import RankContext
from gpuaccept.distributed.local import partial_path, rank_env
from gpuaccept.model import CheckResult, Status
from gpuaccept.node import warm as warm_process
from gpuaccept.node.childproc import CheckProcess, ProcessHost, kill_tree, read_outcome
from gpuaccept.node.suite import PlannedCheck


def wait_ranks(procs: dict[int, CheckProcess], limit_s: float, grace_s: float,
               has_result: Any, deadline: float | None = None) -> dict[int, str]:
    """Wait for every rank process; returns ``{rank: why}`` for those that were killed.

    ``limit_s`` bounds the whole check, counted from when the last rank's clock started
    (:meth:`~gpuaccept.node.childproc.CheckProcess.clock_start`: not while the warm process is still in its
    first imports, a wait bounded by :data:`~gpuaccept.node.warm.BUSY_S`); ``deadline`` (a ``time.monotonic()``
    value) bounds it too. Once a rank has died without a result (``has_result(rank)`` false after it exits),
    the rest get ``grace_s`` more.
    """

    started = time.monotonic()
    end = math.inf if deadline is None else deadline
    kill_at = math.inf
    killed: dict[int, str] = {}
    first_death: int | None = None
    step = 0.01
    while True:
        running = [r for r, p in procs.items() if p.poll() is None]
        if not running:
            return killed
        now = time.monotonic()
        starts = [p.clock_start() for p in procs.values()]
        begun = None if None in starts else max(t for t in starts if t is not None)
        limit_at = min(end, started + warm_process.BUSY_S if begun is None else begun + limit_s)
        if first_death is None:
            dead = [r for r, p in procs.items() if p.poll() is not None and not has_result(r)]
            if dead:
                first_death = dead[0]
                kill_at = now + grace_s
        if now >= min(kill_at, limit_at):
            for r in running:
                started_r = procs[r].clock_start()
                kill_tree(procs[r])
                if now < limit_at:
                    killed[r] = f"killed {grace_s:g} s after rank {first_death} died (it did not give up on its own)"
                elif started_r is None:
                    killed[r] = (f"not started: the warm process was still in its first imports after "
                                 f"{now - started:.1f} s; killed")
                else:
                    killed[r] = f"timed out after {now - (begun or started):.1f} s (limit {limit_s:g} s); killed"
            return killed
        time.sleep(step)
        step = min(0.2, step * 1.5)


def with_partial(lost: Outcome, out: Path, runner: ProcessHost) -> Outcome:
    """``lost`` (a killed or dead rank's outcome) plus the metrics its last checkpoint saved, if any."""

    raw = read_outcome(partial_path(out))
    if raw is None:
        return lost
    try:
        saved = runner.outcome_of(raw)
    except (KeyError, TypeError, ValueError):
        return lost
    lost.metrics = saved.metrics
    lost.details = {**saved.details, **lost.details, "partial": True}
    lost.reason += f"; kept {len(saved.metrics)} metrics it had measured"
    return lost


def run_local_group(runner: ProcessHost, check: PlannedCheck) -> CheckResult:
    """Run ``check`` as ``runner.nproc`` local ranks and return the merged, judged result."""

    n = runner.nproc
    plan = runner.plan
    if n < 2:
        why = "one GPU selected on this node" if plan.device == "cuda" else "--nproc 1"
        return CheckResult(check.name, Status.SKIP, f"needs at least 2 ranks: {why} (use --distributed across "
                           "nodes)", host=runner.host)
    gpus: list[int] = list(plan.gpus) if plan.gpus else list(range(n))
    if plan.device == "cuda" and len(gpus) < n:
        return CheckResult(check.name, Status.ERROR, f"--nproc {n} needs {n} GPUs, {len(gpus)} selected",
                           host=runner.host)
    started = time.monotonic()
    tag = uuid.uuid4().hex[:8]
    store_file = runner.scratch_dir / f".{check.name}.{tag}.store-port"
    prefix = f"local/{check.name}/{tag}/"
    procs: dict[int, CheckProcess] = {}
    outs = {r: runner.scratch_dir / f".{check.name}.rank{r}.outcome.json" for r in range(n)}
    logs = {r: runner.log_dir / f"{check.name}.rank{r}.log" for r in range(n)}
    labels: dict[int, str] = {}
    try:
        for r in range(n):
            rc = RankContext(rank=r, world_size=n, local_rank=r, local_world_size=n, node_rank=0, num_nodes=1,
                             hosts=(runner.host,) * n, store_host="127.0.0.1", store_port=0, prefix=prefix,
                             timeout_s=runner.dist_timeout_s, device_index=gpus[r] if plan.device == "cuda" else None,
                             launcher="local", store_file=str(store_file))
            labels[r] = rc.device_label
            logs[r].unlink(missing_ok=True)
            partial_path(outs[r]).unlink(missing_ok=True)
            procs[r] = runner.spawn(check, outs[r], logs[r], env=rank_env(rc, n, partial_path(outs[r])),
                                     module="gpuaccept.node.rank_child")
        runner.preload_beside(check)  # after every rank is forked: never in front of a rank's fork
        killed = wait_ranks(procs, check.timeout_s, runner.dist_timeout_s, lambda r: outs[r].exists(),
                            runner.run_deadline)
    finally:
        runner.kill_children()
        store_file.unlink(missing_ok=True)
    elapsed = time.monotonic() - started
    outcomes: dict[int, Outcome] = {}
    dead: list[int] = []
    for r in range(n):
        raw = read_outcome(outs[r])
        if raw is not None:
            partial_path(outs[r]).unlink(missing_ok=True)
            try:
                outcomes[r] = runner.outcome_of(raw)
                continue
            except (KeyError, TypeError, ValueError) as exc:
                outcomes[r] = Outcome(Status.ERROR, f"rank {r}: malformed check result: {exc}")
                continue
        if r in killed:
            status = Status.FAIL if "timed out" in killed[r] else Status.ERROR
            why = killed[r]
        else:
            runner.outcome_not_written(check, procs[r].returncode)
            dead.append(r)
            status = Status.ERROR
            why = runner.died_reason(procs[r], logs[r])
        outcomes[r] = with_partial(Outcome(status, f"rank {r} ({labels[r]}): {why}", details={"log": str(logs[r])}),
                                   outs[r], runner)
    merged = merge_rank_outcomes(outcomes, labels, lead=dead)
    merged.details["logs"] = {str(r): str(logs[r]) for r in range(n)}
    if dead:
        merged.details["dead_ranks"] = dead
    return runner.judge_outcome(check, merged, elapsed)
