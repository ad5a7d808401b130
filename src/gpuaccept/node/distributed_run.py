"""``gpuaccept run --distributed``: one rank of a run started by torchrun, srun, mpirun or an operator.

Every rank joins the control plane (:mod:`gpuaccept.distributed.control`), agrees on
the run id, and walks the suite in order:

- node-local checks run once per node, on local rank 0 (the others go on);
- before a distributed check, a barrier; then this rank's process for the check
  (``python -m gpuaccept.node.rank_child``) with its :class:`RankContext`, watched:
  when a peer is declared dead (no heartbeat for the timeout) it gets a quarter of the
  timeout to give up on its own, then it is killed; a barrier after;
- once a rank is gone, the remaining distributed checks are recorded as errors
  without running (their process group could never form).

Files under ``<report-dir>/<run-id>/``: each rank appends its own results to
``rank-<r>.jsonl`` as they finish (``host`` and ``rank`` set), so nothing is
lost if rank 0 dies; rank 0 gathers everyone's through the store and rewrites
``report.json`` (every rank's results, plus an error for each rank that never
reported) after each of its own checks. Logs go to ``logs/rank-<r>/``.

After a peer dies, the survivors finish within about 1.25 times the timeout:
up to one timeout for its heartbeat to go stale, a quarter timeout of grace for
this rank's check process, then the remaining work skips the dead rank.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from gpuaccept.argtypes import check_run_id
from gpuaccept.checks.base import Outcome
from gpuaccept.distributed.control import Control, LeaderLost
from gpuaccept.distributed.env import RankInfo
from gpuaccept.distributed.gather import missing_rank_result, order_results, rank_jsonl_name
from gpuaccept.distributed.group import RankContext
from gpuaccept.distributed.local import partial_path, rank_env
from gpuaccept.errors import UsageError
from gpuaccept.faults import with_fault
from gpuaccept.model import CheckResult, NodeReport, Status, Verdict
from gpuaccept.node import warm as warm_process
from gpuaccept.node.childproc import kill_tree, read_outcome
from gpuaccept.node.local_group import with_partial
from gpuaccept.node.runner import RunEvents, Runner, is_distributed, new_run_id, utc_now
from gpuaccept.node.suite import PlannedCheck, SuitePlan
from gpuaccept.node.warm import WarmProcess


def local_position(rank: int, hosts: list[str | None]) -> tuple[int, int]:
    """(local rank, ranks on this host) from the rank-to-host map, for launchers that do not say."""
    mine = hosts[rank]
    same = [r for r, h in enumerate(hosts) if h == mine]
    return same.index(rank), len(same)


def node_position(rank: int, hosts: list[str | None]) -> tuple[int, int]:
    """(node index, number of nodes): hosts numbered in order of their lowest rank."""
    order = list(dict.fromkeys(h for h in hosts if h is not None))
    mine = hosts[rank]
    return (order.index(mine) if mine is not None else 0), len(order)


class DistributedRunner(Runner):
    """Runs the suite as one rank of a multi-process run; see the module docstring."""

    def __init__(self, plan: SuitePlan, report_dir: Path, info: RankInfo, *, run_id: str | None = None,
                 host: str | None = None, argv: list[str] | None = None, events: RunEvents | None = None,
                 verbose: bool = False, dist_timeout_s: float = 120.0, warm: bool | WarmProcess | None = None,
                 requested_device: str = "auto") -> None:
        super().__init__(plan, report_dir, run_id="pending", host=host, argv=argv, events=events,
                         verbose=verbose, nproc=1, dist_timeout_s=dist_timeout_s, warm=warm,
                         requested_device=requested_device)
        self.report_root = Path(report_dir)
        self.info = info
        self.rank = info.rank
        self.requested_run_id = run_id
        self.control = Control(info, self.host, dist_timeout_s, log=self.log)
        self.local_rank = info.local_rank if info.local_rank is not None else 0
        self.local_world = info.local_world_size or 1
        self.node_rank = info.node_rank if info.node_rank is not None else 0
        self.num_nodes = info.num_nodes or 1
        self.leader_lost: str | None = None
        self.verdict_from_rank0: str | None = None
        self._reported_dead: set[int] = set()
        self.joined = False

    def log(self, message: str) -> None:
        print(f"[DIST] rank {self.rank}: {message}", file=sys.stderr, flush=True)

    @property
    def results_path(self) -> Path:
        return self.run_dir / rank_jsonl_name(self.rank)

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs" / f"rank-{self.rank}"

    @property
    def scratch_dir(self) -> Path:
        return self.log_dir

    def _save(self) -> None:
        if self.rank == 0:
            super()._save()

    def refuse_reused_run_id(self) -> None:
        """Rank 0 alone: the other ranks share the run directory, where rank 0 has just written report.json."""
        if self.rank == 0:
            super().refuse_reused_run_id()

    # ---- joining ------------------------------------------------------------------------------
    def join(self) -> None:
        """Rendezvous (once); sets the agreed run id and the derived local/node positions."""
        if self.joined:
            return
        self.joined = True
        run_id = self.control.join(self.requested_run_id, lambda: new_run_id(self.host))
        try:
            check_run_id(run_id)  # it came over the network from rank 0
        except ValueError as exc:
            raise UsageError(f"run id from rank 0: {exc}") from None
        self.run_id = run_id
        self.run_dir = self.report_root / run_id
        self.report.run_id = run_id
        hosts = self.control.hosts
        if self.info.local_rank is None:
            self.local_rank, self.local_world = local_position(self.rank, hosts)
        if self.info.node_rank is None:
            self.node_rank, self.num_nodes = node_position(self.rank, hosts)
        self.log(f"joined run {run_id} as {self.info.describe()}; local rank {self.local_rank}, "
                 f"node {self.node_rank} of {self.num_nodes}")
        if self.control.dead:
            self.log(f"missing from the start: {self.control.describe_dead()}")

    # ---- the run ------------------------------------------------------------------------------
    def run(self) -> NodeReport:
        self.join()
        self.prepare()
        try:
            with self.interruptible():
                total = len(self.plan.checks)
                for seq, check in enumerate(self.plan.checks, 1):
                    distributed = is_distributed(check)
                    if not distributed and self.local_rank != 0:
                        continue
                    self.events.on_start(check, seq, total)
                    self.report.in_flight = check.name
                    self._save()
                    result = self._run_distributed(check, seq) if distributed else self._run_one(check)
                    result.rank, result.host = self.rank, self.host
                    if distributed:  # tells a cluster report the cross-node results from the per-node ones
                        result.details["distributed"] = True
                    self._record(result)
                    self.events.on_end(check, result)
                self._finish()
        finally:
            self.close_warm()
            self.control.close()
        return self.report

    def _not_run(self, check: PlannedCheck, why: str) -> CheckResult:
        return CheckResult(check.name, Status.ERROR, f"not run: {why}", details={"not_run": True})

    def _gone(self) -> str | None:
        if self.leader_lost:
            return self.leader_lost
        if self.control.dead:
            return f"{self.control.describe_dead()}"
        return None

    def _run_distributed(self, check: PlannedCheck, seq: int) -> CheckResult:
        gone = self._gone()
        if gone:
            self._add_missing(check)
            return self._not_run(check, gone)
        try:
            self.control.barrier(f"pre/{seq}")
        except LeaderLost as exc:
            self.leader_lost = str(exc)
            return self._not_run(check, self.leader_lost)
        gone = self._gone()
        if gone:
            self._add_missing(check)
            return self._not_run(check, gone)
        dead_before = set(self.control.dead)
        result = self._run_rank(check, seq, dead_before)
        if self.leader_lost is None:
            try:
                self.control.barrier(f"post/{seq}")
            except LeaderLost as exc:
                self.leader_lost = str(exc)
        lost = set(self.control.dead) - dead_before
        notes = []
        if lost:
            notes.append(f"peer lost during the check: {self.control.describe_dead(lost)}")
            result.details["lost_ranks"] = {str(r): {"host": self.control.host_of(r), "why": self.control.dead[r]}
                                            for r in sorted(lost)}
        if self.leader_lost:
            notes.append(self.leader_lost)
        if notes:
            result.reason = f"{result.reason}; {'; '.join(notes)}" if result.reason else "; ".join(notes)
            if result.status in (Status.PASS, Status.SKIP, Status.WARN):
                result.status = Status.ERROR
        self._add_missing(check)
        return result

    def _rank_context(self, seq: int) -> RankContext:
        device_index = None
        if self.plan.device == "cuda":
            gpus = self.plan.gpus
            # provisional: the rank process re-derives it from what it can see (distributed.devices)
            device_index = gpus[self.local_rank] if gpus and self.local_rank < len(gpus) else self.local_rank
        addr, port = self.control.store_address()
        return RankContext(rank=self.rank, world_size=self.info.world_size, local_rank=self.local_rank,
                           local_world_size=self.local_world, node_rank=self.node_rank, num_nodes=self.num_nodes,
                           hosts=tuple(h or "unknown host" for h in self.control.hosts), store_host=addr,
                           store_port=port, prefix=f"{self.info.key_prefix}chk/{seq}/",
                           timeout_s=self.dist_timeout_s, device_index=device_index, launcher=self.info.launcher)

    def _run_rank(self, check: PlannedCheck, seq: int, dead_before: set[int]) -> CheckResult:
        """This rank's process for a distributed check, watched for peer loss and the check timeout."""
        rc = self._rank_context(seq)
        out = self.scratch_dir / f".{check.name}.outcome.json"
        log = self.log_dir / f"{check.name}.log"
        log.unlink(missing_ok=True)
        started = time.monotonic()
        partial_path(out).unlink(missing_ok=True)
        child = self.spawn(check, out, log, env=rank_env(rc, self.local_world, partial_path(out)),
                            module="gpuaccept.node.rank_child")
        self.preload_beside(check)
        grace = self.dist_timeout_s / 4
        kill_at: float | None = None
        killed: str | None = None
        step = 0.01
        while child.poll() is None:
            now = time.monotonic()
            clock = child.clock_start()  # not while the warm process is still in its first imports
            if clock is None and now - started > warm_process.BUSY_S:
                killed = f"not started: the warm process was still in its first imports after {now - started:.1f} s"
                break
            if clock is not None and (now - clock > check.timeout_s or now >= (self.run_deadline or math.inf)):
                killed = f"timed out after {now - clock:.1f} s (limit {check.timeout_s:g} s); killed"
                break
            if kill_at is None:
                try:
                    lost = set(self.control.watch()) - dead_before
                except LeaderLost as exc:
                    self.leader_lost = str(exc)
                    lost = {0}
                if lost:
                    kill_at = now + grace
                    self.log(f"{check.name}: lost {self._gone()}; giving this rank's process {grace:g} s")
            elif now >= kill_at:
                killed = f"killed {grace:g} s after a peer was lost (it did not give up on its own)"
                break
            time.sleep(step)
            step = min(0.2, step * 1.5)
        if killed is not None:
            kill_tree(child)
        self._children = []
        elapsed = time.monotonic() - (child.clock_start() or started)
        raw = read_outcome(out)
        if raw is not None:
            partial_path(out).unlink(missing_ok=True)
            return self._judge(check, raw, elapsed)
        if killed is not None:
            status = Status.FAIL if killed.startswith("timed out") else Status.ERROR
            failed = Outcome(status, f"rank {self.rank} ({self.host}): {killed}",
                             details={"log": str(log), "timeout": status is Status.FAIL})
        else:
            self.outcome_not_written(check, child.returncode)
            failed = Outcome(Status.ERROR, f"rank {self.rank} ({self.host}): {self.died_reason(child, log)}",
                             details={"log": str(log)})
        result = self.judge_outcome(check, with_partial(failed, out, self), elapsed)
        return result

    def _add_missing(self, check: PlannedCheck) -> None:
        """Rank 0: one error per rank that died and has not been accounted for yet."""
        if self.rank != 0:
            return
        for r, why in sorted(self.control.dead.items()):
            if r in self._reported_dead:
                continue
            self._reported_dead.add(r)
            self.report.checks.append(with_fault(missing_rank_result(check.name, r, self.control.host_of(r), why)))

    # ---- results ------------------------------------------------------------------------------
    def _record(self, result: CheckResult) -> None:
        result = with_fault(result)
        self.report.in_flight = None
        self.report.checks.append(result)
        self._append(result)
        if self.leader_lost is None:
            try:
                self.control.post(result.to_dict())
            except LeaderLost as exc:
                self.leader_lost = str(exc)
        if self.rank == 0:
            self._gather()
            self._save()

    def _gather(self) -> None:
        for items in self.control.collect().values():
            self.report.checks.extend(CheckResult.from_dict(d) for d in items)
        self.report.checks = order_results(self.report.checks, [c.name for c in self.plan.checks])

    def _finish(self) -> None:
        if self.leader_lost is None:
            try:
                self.control.barrier("end")
            except LeaderLost as exc:
                self.leader_lost = str(exc)
        if self.rank == 0:
            self._gather()
            self.report.verdict = self.report.decide(self.inventory_checks())
            self.report.finished = utc_now()
            self._save()
            self.control.announce_final({"verdict": self.report.verdict.value,
                                         "failed": sorted(set(self.report.failed_checks()))})
            return
        final: dict[str, Any] | None = None
        if self.leader_lost is None:
            try:
                final = self.control.await_final()
            except LeaderLost as exc:
                self.leader_lost = str(exc)
        self.report.finished = utc_now()
        if final is not None:
            self.verdict_from_rank0 = str(final.get("verdict"))
            ok = self.verdict_from_rank0 == Verdict.SUCCESS.value and not self.report.failed_checks()
            if self.verdict_from_rank0 == Verdict.NOTHING_MEASURED.value and not self.report.failed_checks():
                self.report.verdict = Verdict.NOTHING_MEASURED
            else:
                self.report.verdict = Verdict.SUCCESS if ok else Verdict.FAILURE
        else:
            self.report.verdict = Verdict.FAILURE
