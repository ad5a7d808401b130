"""A short DistributedDataParallel training run across every rank.

Each rank trains the same seeded MLP student on its own shard of a seeded
synthetic teacher task (rank-dependent data, so the gradient all-reduce
matters) with SGD and momentum. The per-step losses are averaged over ranks
(one all-reduce at the end); the check passes when the global mean loss of the
last ``window`` steps is at least ``min_loss_drop`` below that of the first
``window`` steps, and the parameters are bit-identical on every rank afterwards
(each rank's SHA-256 of its parameter bytes, all-gathered and compared with
rank 0's).

Metrics: on rank 0 ``ddp_loss_first``/``ddp_loss_last`` (global mean MSE,
unit ``loss``), ``ddp_loss_drop`` (fraction ``1 - last/first``, threshold
``>= min_loss_drop``), ``ddp_samples_per_s`` (all ranks' samples per second
of wall time of the slowest rank, first step excluded) and
``ddp_param_mismatch_ranks`` (ranks whose parameters differ from rank 0's, must
be 0); on every rank ``ddp_step_ms`` (median step time). The closest reference
is PyTorch's DDP tutorial example run with ``torchrun --nproc-per-node=N``.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import CheckContext, Outcome, Param, RequiredMetric, ThresholdRule
from gpuaccept.distributed.group import DistributedCheck, RankContext, train_in_group
from gpuaccept.model import Metric, Status, Threshold


def param_digest(model: Any) -> bytes:
    """SHA-256 of every parameter's bytes, in ``named_parameters`` order (bit-exact comparison)."""
    h = hashlib.sha256()
    for name, prm in model.named_parameters():
        h.update(name.encode())
        h.update(prm.detach().cpu().contiguous().view(-1).numpy().tobytes())
    return h.digest()


def mismatched_ranks(digests: list[bytes]) -> list[int]:
    """Ranks whose digest differs from rank 0's."""
    return [r for r, d in enumerate(digests) if d != digests[0]]


def global_loss_drop(losses: list[float], window: int) -> tuple[float, float, float]:
    """(first-window mean, last-window mean, fractional drop ``1 - last/first``); NaN drop when not finite."""
    first = statistics.fmean(losses[:window])
    last = statistics.fmean(losses[-window:])
    if not all(math.isfinite(x) for x in losses) or first <= 0:
        return first, last, math.nan
    return first, last, 1.0 - last / first


class DdpTrainCheck(DistributedCheck):
    """DDP smoke test: the globally averaged loss falls and parameters stay identical on every rank."""

    name = "ddp_train"
    tag = "TRAIN"
    summary = "DistributedDataParallel on seeded synthetic data: loss must fall, parameters bit-identical on all ranks"
    key_metric = "ddp_samples_per_s"
    metrics = ("ddp_step_ms", "ddp_loss_first", "ddp_loss_last", "ddp_loss_drop", "ddp_samples_per_s",
               "ddp_param_mismatch_ranks")
    params = (
        Param("steps", "int", 60, "optimizer steps", minimum=2, maximum=100_000),
        Param("window", "int", 10, "steps averaged at the start and at the end to judge the loss drop", minimum=1,
              maximum=50_000),
        Param("min_loss_drop", "float", 0.3, "required fractional fall of the global loss", minimum=0.0, maximum=1.0),
        Param("batch", "int", 64, "samples per rank and step", minimum=1, maximum=1 << 16),
        Param("hidden", "int", 128, "hidden width of the student MLP, units", minimum=1, maximum=1 << 14),
        Param("lr", "float", 0.05, "SGD learning rate (momentum 0.9)", minimum=0.0, maximum=10.0),
        Param("seed", "int", 0, "seed of weights and data", minimum=0, maximum=(1 << 32) - 1),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"steps": 40, "window": 8, "batch": 32, "hidden": 64},
        "standard": {"steps": 200, "window": 20, "batch": 256, "hidden": 512},
        "full": {"steps": 1000, "window": 50, "batch": 1024, "hidden": 2048},
    }
    thresholds = (ThresholdRule(metric="ddp_param_mismatch_ranks", max=0.0),)
    #: an optimizer's first parameter group imports torch._dynamo (about 1.8 s on a 2-core CPU)
    warm_imports: ClassVar[tuple[str, ...]] = ("torch._dynamo",)
    timeout_s: ClassVar[dict[str, float]] = {"quick": 120.0, "standard": 300.0, "full": 1200.0}

    @classmethod
    def rank_required_metrics(cls, params: dict[str, Any], rc: RankContext) -> list[RequiredMetric]:
        """The step time on every rank's device; rank 0 also the global loss, throughput and mismatch count."""
        out = [RequiredMetric("ddp_step_ms", rc.device_label)]
        if rc.rank == 0:
            out += [RequiredMetric(m) for m in ("ddp_loss_first", "ddp_loss_last", "ddp_loss_drop",
                                                "ddp_samples_per_s", "ddp_param_mismatch_ranks")]
        return out

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.ddp(params, device, gpus)

    def run_rank(self, ctx: CheckContext, rc: RankContext) -> Outcome:
        p = ctx.params
        steps, window = int(p["steps"]), int(p["window"])
        if 2 * window > steps:
            return Outcome(Status.ERROR, f"window={window} needs steps >= {2 * window}, got steps={steps}")
        return train_in_group(ctx, rc, self._train)

    def _train(self, ctx: CheckContext, rc: RankContext, device: Any, backend: str) -> Outcome:
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel

        p = ctx.params
        steps, window, batch = int(p["steps"]), int(p["window"]), int(p["batch"])
        in_dim, out_dim, hidden = 32, 8, int(p["hidden"])
        gen = torch.Generator().manual_seed(int(p["seed"]))
        teacher = nn.Sequential(nn.Linear(in_dim, 4 * out_dim), nn.Tanh(), nn.Linear(4 * out_dim, out_dim))
        student = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                nn.Linear(hidden, out_dim))
        with torch.no_grad():
            for module in (teacher, student):
                for prm in module.parameters():
                    scale = (2.0 if module is teacher else 1.0) / math.sqrt(prm.shape[-1])
                    prm.copy_(torch.randn(prm.shape, generator=gen) * scale)
        teacher.to(device).requires_grad_(False)
        student.to(device)
        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(student, device_ids=ids)
        opt = torch.optim.SGD(model.parameters(), lr=float(p["lr"]), momentum=0.9)
        data_gen = torch.Generator(device=device).manual_seed(int(p["seed"]) * 1000 + rc.rank + 1)
        losses = torch.empty(steps, dtype=torch.float32, device=device)
        step_ms: list[float] = []
        cuda = device.type == "cuda"
        t_first = 0.0
        for i in range(steps):
            t0 = time.perf_counter()
            x = torch.randn(batch, in_dim, device=device, generator=data_gen)
            with torch.no_grad():
                y = teacher(x)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses[i] = loss.detach()
            if cuda:
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            step_ms.append((now - t0) * 1e3)
            if i == 0:
                t_first = now
        elapsed = torch.tensor([time.perf_counter() - t_first], dtype=torch.float64, device=device)
        dist.all_reduce(losses)
        losses /= rc.world_size
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        mine = torch.tensor(list(param_digest(model.module)), dtype=torch.uint8, device=device)
        every = torch.empty(rc.world_size * mine.numel(), dtype=torch.uint8, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(every, mine)
        raw = every.cpu().tolist()
        digests = [bytes(raw[k * 32:(k + 1) * 32]) for k in range(rc.world_size)]
        bad = mismatched_ranks(digests)
        curve = [float(v) for v in losses.tolist()]
        first, last, drop = global_loss_drop(curve, window)
        slowest = float(elapsed.item())
        samples_per_s = rc.world_size * batch * (steps - 1) / slowest if slowest > 0 else math.nan
        tags: dict[str, str | int | float] = {"rank": rc.rank, "world_size": rc.world_size, "steps": steps}
        metrics = [Metric("ddp_step_ms", statistics.median(step_ms), "ms", device=rc.device_label, tags=dict(tags),
                          performance=True)]
        details: dict[str, Any] = {"backend": backend, "world_size": rc.world_size, "rank": rc.rank,
                                   "host": rc.host_of(rc.rank), "launcher": rc.launcher,
                                   "param_sha256": digests[rc.rank].hex()}
        min_drop = float(p["min_loss_drop"])
        if rc.rank == 0:
            metrics += [
                Metric("ddp_loss_first", first, "loss", tags=dict(tags)),
                Metric("ddp_loss_last", last, "loss", tags=dict(tags)),
                Metric("ddp_loss_drop", drop, "fraction", tags=dict(tags),
                       threshold=Threshold(">=", min_drop, Status.FAIL, "param:min_loss_drop")),
                Metric("ddp_samples_per_s", samples_per_s, "samples/s", tags=dict(tags), performance=True),
                Metric("ddp_param_mismatch_ranks", float(len(bad)), "count", tags=dict(tags)),
            ]
            step = max(1, steps // 20)
            details["loss_curve"] = [round(v, 6) for v in curve[::step]]
            details["mismatched_ranks"] = [{"rank": r, "host": rc.host_of(r)} for r in bad]
        ctx.log(f"rank {rc.rank}: global loss {first:.4g} -> {last:.4g} ({drop:.0%} drop), "
                f"{samples_per_s:.4g} samples/s, parameter mismatches {bad}")
        if not math.isfinite(drop):
            return Outcome.failed("global loss is not finite", metrics, **details)
        if rc.rank in bad:
            return Outcome.failed(f"rank {rc.rank} ({rc.host_of(rc.rank)}): parameters differ from rank 0's after "
                                  f"{steps} DDP steps", metrics, **details)
        if bad:
            listed = ", ".join(f"rank {r} ({rc.host_of(r)})" for r in bad[:5])
            return Outcome.failed(f"parameters differ from rank 0's on {len(bad)} rank(s): {listed}",
                                  metrics, **details)
        return Outcome.passed(f"{rc.world_size} ranks ({backend}): global loss fell by {drop:.0%} in {steps} steps "
                              f"(needs {min_drop:.0%}), parameters identical on every rank, "
                              f"{samples_per_s:.4g} samples/s", metrics, **details)


CHECKS = (DdpTrainCheck,)
