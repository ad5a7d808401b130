"""The reference training run data-parallel across every rank (DistributedDataParallel; gloo on CPU).

Every rank builds the same seeded decoder as ``reference_train`` and takes its share of each step's global
batch of ``batch`` sequences per rank (``batch x world`` in all, the step's tokens drawn as in
``reference_train``): rank ``r`` trains on rows ``r x batch .. (r + 1) x batch``. Gradients are averaged by
DDP, so the run computes the same mathematics as one device training on the whole global batch. With
``shard: true`` the model is sharded with FSDP2 instead (``torch.distributed.fsdp.fully_shard`` on each decoder
block, then on the whole model: parameters, gradients and optimizer state split across the ranks, gradients
reduce-scattered); the same mathematics, judged the same way.

Judged:

- **Curve**: rank 0 also trains the model alone on one device for the first ``ref_steps`` steps on the same
  global batches (gradients accumulated over the ranks' shares, as DDP averages them); the global mean loss of
  the DDP run (all-reduced) must be within ``tolerance`` (relative) of that single-device loss at every one of
  those steps: ``reftrain_ddp_curve_error`` (``max |ddp - single| / single``, threshold ``max tolerance``).
  Only the order of the gradient sums differs, so on the CPU in fp32 the two agree to about 1e-6.
- **Loss**: the DDP run's mean loss of the last 10 % of the steps must be under the task's bound
  (``reftrain_ddp_loss_final``; see ``reference_train``).
- **Stragglers**: each rank's median forward time (no collective runs in the forward pass, so a slow rank
  shows there, not hidden by the gradient all-reduce's wait); ``reftrain_ddp_forward_spread`` is the slowest
  rank's over the median rank's, at most ``max_spread``; a rank over it is named.

Metrics per rank: ``reftrain_ddp_tokens_per_s`` (its tokens over its median step time) and
``reftrain_ddp_forward_ms``; on rank 0 the curve error, the final loss and the spread. The equivalent by hand:
a short ``torchrun`` MaxText/Megatron-LM/TorchTitan data-parallel run compared with a one-GPU run's log.

Tests only: ``GPUACCEPT_TEST_REFTRAIN_SLOW=1:0.05`` makes rank 1 sleep 0.05 s in each forward pass.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import CheckContext, Outcome, Param, RequiredMetric
from gpuaccept.checks.reference_train import ReferenceTrainCheck, shape_of
from gpuaccept.distributed.group import DistributedCheck, RankContext, train_in_group
from gpuaccept.model import Metric, Status, Threshold

SLOW_ENV = "GPUACCEPT_TEST_REFTRAIN_SLOW"
_SHARED = ("steps", "cpu_steps", "d_model", "layers", "seq", "batch", "cpu_d_model", "cpu_layers", "cpu_seq",
           "cpu_batch", "heads", "vocab", "order", "branch", "progress", "lr", "cpu_lr", "seed", "cpu_threads")


def slow_rank(env: dict[str, str] | os._Environ[str]) -> tuple[int, float] | None:
    """``GPUACCEPT_TEST_REFTRAIN_SLOW=RANK:SECONDS`` -> ``(rank, seconds)``; None when unset or malformed."""
    rank, _, secs = env.get(SLOW_ENV, "").partition(":")
    try:
        return int(rank), float(secs)
    except ValueError:
        return None


def stragglers(medians: list[float], max_spread: float) -> tuple[float, list[int]]:
    """(slowest over median, the ranks over ``max_spread`` x the median) of per-rank median times. Pure."""
    mid = statistics.median(medians)
    if not mid > 0:
        return math.nan, []
    return max(medians) / mid, [r for r, t in enumerate(medians) if t > max_spread * mid]


class ReferenceTrainDdpCheck(DistributedCheck):
    """reference_train's model under DDP: curve equal to one device's, loss under the bound, stragglers named."""

    name = "reference_train_ddp"
    tag = "REFTRAIN"
    summary = ("reference_train's decoder data-parallel across all ranks: loss curve within tolerance of the "
               "single-device curve, tokens/s per rank, forward-time spread with the straggler named")
    key_metric = "reftrain_ddp_tokens_per_s"
    metrics = ("reftrain_ddp_tokens_per_s", "reftrain_ddp_forward_ms", "reftrain_ddp_curve_error",
               "reftrain_ddp_loss_final", "reftrain_ddp_forward_spread")
    profiles: ClassVar[tuple[str, ...]] = ("full", "burnin")
    params = (*(p for p in ReferenceTrainCheck.params if p.name in _SHARED),
              Param("ref_steps", "int", 10, "steps of the single-device reference run on rank 0", minimum=1,
                    maximum=100_000),
              Param("tolerance", "float", 0.02, "largest relative difference of the DDP loss from the single-device "
                    "loss over the reference steps", minimum=0.0, maximum=1.0),
              Param("max_spread", "float", 1.5, "slowest rank's median forward time over the median rank's",
                    minimum=1.0, maximum=100.0),
              Param("shard", "bool", False, "shard the model with FSDP2 (fully_shard on each block, then the "
                    "model) instead of replicating it with DDP"))
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"steps": 100, "cpu_steps": 30, "cpu_d_model": 64, "cpu_layers": 2, "cpu_seq": 32,
                 "cpu_lr": 1e-2},
        "burnin": {"steps": 300, "cpu_steps": 60, "cpu_d_model": 64, "cpu_layers": 2, "cpu_seq": 32,
                 "cpu_lr": 1e-2},
    }
    timeout_s: ClassVar[dict[str, float]] = {"full": 1800.0, "burnin": 3600.0}
    warm_imports: ClassVar[tuple[str, ...]] = ("torch._dynamo",)

    @classmethod
    def rank_required_metrics(cls, params: dict[str, Any], rc: RankContext) -> list[RequiredMetric]:
        """Tokens/s and forward time on every rank; rank 0 also the curve error, final loss and spread."""
        out = [RequiredMetric(m, rc.device_label) for m in ("reftrain_ddp_tokens_per_s", "reftrain_ddp_forward_ms")]
        if rc.rank == 0:
            out += [RequiredMetric(m) for m in ("reftrain_ddp_curve_error", "reftrain_ddp_loss_final",
                                                "reftrain_ddp_forward_spread")]
        return out

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        single = {**params, "runs": 1}
        ref = int(params["ref_steps"]) / max(1, int(params["steps" if device == "cuda" else "cpu_steps"]))
        return 2.0 + estimates.reference_train(single, device, 1) * (1.0 + ref * max(gpus, 2))

    def run_rank(self, ctx: CheckContext, rc: RankContext) -> Outcome:
        return train_in_group(ctx, rc, self._train)

    def _train(self, ctx: CheckContext, rc: RankContext, device: Any, backend: str) -> Outcome:
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel

        from gpuaccept.checks import reftrain_model as rm
        from gpuaccept.checks.reftrain_task import make_task

        p = ctx.params
        on_gpu = device.type == "cuda"
        if not on_gpu and int(p["cpu_threads"]) > 0:
            torch.set_num_threads(int(p["cpu_threads"]))
        shape = shape_of(p, on_gpu)
        task = make_task(int(p["vocab"]), int(p["order"]), min(int(p["branch"]), int(p["vocab"])), int(p["seed"]))
        steps, per_rank = int(p["steps" if on_gpu else "cpu_steps"]), int(p["batch" if on_gpu else "cpu_batch"])
        world, lr = rc.world_size, float(p["lr" if on_gpu else "cpu_lr"])
        batches = rm.make_batches(task, steps, per_rank * world, shape.seq)
        ref_steps = min(int(p["ref_steps"]), steps)
        single: list[float] = []
        if rc.rank == 0:  # the same global batches on one device, gradients accumulated over the ranks' shares
            single = rm.train(rm.build(shape, int(p["seed"])), batches[:ref_steps], device, lr=lr, bf16=on_gpu,
                              shards=world, warm=max(1, steps // 10)).losses
        shard = bool(p["shard"])
        model: nn.Module = rm.build(shape, int(p["seed"])).to(device)
        if shard:  # FSDP2: each block its own unit, the embedding (tied to the head) and norms in the root's
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:  # type: ignore[union-attr]
                fully_shard(block)
            fully_shard(model)
        else:
            model = DistributedDataParallel(model, device_ids=[device.index] if on_gpu else None,
                                            broadcast_buffers=False)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        warm = max(1, steps // 10)
        slow = slow_rank(os.environ)
        losses = torch.empty(steps, dtype=torch.float32, device=device)
        step_s: list[float] = []
        forward_s: list[float] = []
        for i, global_batch in enumerate(batches):
            t0 = time.perf_counter()
            tokens = global_batch[rc.rank * per_rank:(rc.rank + 1) * per_rank].to(device)
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, (i + 1) / warm)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=on_gpu):
                logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            if slow is not None and slow[0] == rc.rank:
                time.sleep(slow[1])
            if on_gpu:
                torch.cuda.synchronize(device)
            forward_s.append(time.perf_counter() - t0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses[i] = loss.detach()
            if on_gpu:
                torch.cuda.synchronize(device)
            step_s.append(time.perf_counter() - t0)
        dist.all_reduce(losses)
        losses /= world
        mine = torch.tensor([statistics.median(forward_s)], dtype=torch.float64, device=device)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        medians = [float(t.item()) for t in every]
        curve = [float(x) for x in losses.tolist()]
        timed = step_s[1:] or step_s
        tok_s = per_rank * shape.seq / statistics.median(timed)
        tags: dict[str, str | int | float] = {"rank": rc.rank, "world_size": world, "steps": steps,
                                             "parallel": "fsdp2" if shard else "ddp"}
        metrics = [Metric("reftrain_ddp_tokens_per_s", tok_s, "tokens/s", rc.device_label, tags=dict(tags),
                          performance=True),
                   Metric("reftrain_ddp_forward_ms", medians[rc.rank] * 1e3, "ms", rc.device_label, tags=dict(tags),
                          performance=True)]
        details: dict[str, Any] = {"backend": backend, "world_size": world, "rank": rc.rank,
                                   "host": rc.host_of(rc.rank), "parallel": "fsdp2" if shard else "ddp",
                                   # elements held by this rank (its shards under FSDP2), of shape.params
                                   "params_on_rank": sum(int((q.to_local() if hasattr(q, "to_local") else q).numel())
                                                         for q in model.parameters()),
                                   "params": shape.params}
        if rc.rank != 0:
            return Outcome.passed(f"rank {rc.rank}: {tok_s:.4g} tokens/s", metrics, **details)
        return self._judge_rank0(p, rc, task, curve, single, medians, metrics, details, tags)

    @staticmethod
    def _judge_rank0(p: dict[str, Any], rc: RankContext, task: Any, curve: list[float], single: list[float],
                     medians: list[float], metrics: list[Metric], details: dict[str, Any],
                     tags: dict[str, str | int | float]) -> Outcome:
        tol, max_spread = float(p["tolerance"]), float(p["max_spread"])
        how = "FSDP2" if details.get("parallel") == "fsdp2" else "DDP"
        errors = [abs(a - b) / abs(b) if b else math.inf for a, b in zip(curve, single, strict=False)]
        error = max(errors) if errors else math.nan
        window = max(1, len(curve) // 10)
        final = statistics.fmean(curve[-window:])
        bound = task.bound(float(p["progress"]))
        spread, slow = stragglers(medians, max_spread)
        metrics += [
            Metric("reftrain_ddp_curve_error", error, "fraction", tags=dict(tags),
                   threshold=Threshold("<=", tol, Status.FAIL, "param:tolerance")),
            Metric("reftrain_ddp_loss_final", final, "loss", tags=dict(tags),
                   threshold=Threshold("<=", round(bound, 6), Status.FAIL, "task:floor+progress x (start-floor)")),
            Metric("reftrain_ddp_forward_spread", spread, "ratio", tags=dict(tags),
                   threshold=Threshold("<=", max_spread, Status.FAIL, "param:max_spread")),
        ]
        details.update(loss_curve=[round(x, 6) for x in curve], single_curve=[round(x, 6) for x in single],
                       forward_ms={str(r): round(t * 1e3, 3) for r, t in enumerate(medians)},
                       stragglers=[{"rank": r, "host": rc.host_of(r)} for r in slow])
        problems = []
        if not math.isfinite(error) or error > tol:
            step = max(range(len(errors)), key=lambda k: errors[k]) if errors else 0
            problems.append(f"the {how} loss departs from the single-device loss by {error:.3g} (relative, at step "
                            f"{step}; tolerance {tol:g})")
        if not final <= bound:
            problems.append(f"final loss {final:.4f} is above the bound {bound:.4f}")
        if slow:
            named = ", ".join(f"rank {r} ({rc.host_of(r)}, {medians[r] * 1e3:.3g} ms)" for r in slow)
            problems.append(f"straggler: {named}, over {max_spread:g} x the median rank's forward "
                            f"{statistics.median(medians) * 1e3:.3g} ms")
        if problems:
            return Outcome.failed("; ".join(problems), metrics, **details)
        return Outcome.passed(f"{rc.world_size} ranks: {how} loss within {error:.2g} of one device's over "
                              f"{len(single)} steps (tolerance {tol:g}); final {final:.4f} <= bound {bound:.4f}; "
                              f"forward spread {spread:.2f}", metrics, **details)


CHECKS = (ReferenceTrainDdpCheck,)
