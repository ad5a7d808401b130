"""A tiny training run per GPU: the loss of a small MLP fitting a fixed teacher network must fall.

Proves that the whole training stack (autograd, cuBLAS GEMMs, optimizer,
optional bf16 autocast) computes sensibly, not just fast. Data is synthetic and
seeded: inputs ``x ~ N(0, 1)`` and targets ``teacher(x)`` from a random, frozen
two-layer teacher, a fresh batch every step (one pass, no data reused). The
run is judged on the mean loss of the first ``window`` steps against the mean
of the last ``window`` steps, so even a short run is decided.

Metrics per device: ``train_loss_first`` and ``train_loss_last`` (MSE, unit
``loss``), ``train_loss_drop`` (fraction ``1 - last/first``, with a pre-set
threshold ``>= min_loss_drop``) and ``train_step_ms`` (median wall time of one
step: batch generation, forward, backward, Adam update; synchronized on GPU).
A non-finite loss, or a final loss above the untrained step-0 loss (divergence),
fails the check. The closest reference is
the PyTorch examples' MNIST run, ``python main.py --epochs 1``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import (
    Check,
    CheckContext,
    Outcome,
    Param,
    RequiredMetric,
    per_device,
    torch_devices_or_skip,
)
from gpuaccept.model import Metric, Status, Threshold


@dataclass
class TrainResult:
    """The loss curve and step times of one training run on one device."""

    losses: list[float]
    step_ms: list[float]
    window: int

    @property
    def first(self) -> float:
        return statistics.fmean(self.losses[: self.window])

    @property
    def last(self) -> float:
        return statistics.fmean(self.losses[-self.window:])

    @property
    def drop(self) -> float:
        return loss_drop(self.losses, self.window)

    @property
    def finite(self) -> bool:
        return all(math.isfinite(x) for x in self.losses)


def loss_drop(losses: list[float], window: int) -> float:
    """Fractional fall of the loss: ``1 - mean(last window) / mean(first window)``.

    1.0 means the loss went to zero, 0 no change, negative a rise; NaN when any
    loss is not finite or the first window's mean is not positive.
    """
    if window < 1 or len(losses) < window:
        raise ValueError(f"need at least window={window} >= 1 losses, got {len(losses)}")
    first = statistics.fmean(losses[:window])
    last = statistics.fmean(losses[-window:])
    if not all(math.isfinite(x) for x in losses) or first <= 0:
        return math.nan
    return 1.0 - last / first


def train_mlp(device: Any, *, steps: int, batch: int, in_dim: int = 64, hidden: int = 256, out_dim: int = 16,
              lr: float = 1e-3, window: int = 10, seed: int = 0, bf16: bool = False) -> TrainResult:
    """Train a 3-layer MLP student on a frozen random teacher for ``steps`` Adam steps on ``device``.

    Returns every step's MSE loss and wall time in ms (the device is
    synchronized after each step so the time covers the work). Deterministic
    for a given seed on CPU.
    """
    import torch
    from torch import nn

    gen = torch.Generator(device="cpu").manual_seed(seed)
    teacher = nn.Sequential(nn.Linear(in_dim, 4 * out_dim), nn.Tanh(), nn.Linear(4 * out_dim, out_dim))
    student = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                            nn.Linear(hidden, out_dim))
    with torch.no_grad():
        for module in (teacher, student):
            for prm in module.parameters():
                # Seeded init independent of the global RNG; teacher weights are larger so targets have signal.
                scale = (2.0 if module is teacher else 1.0) / math.sqrt(prm.shape[-1])
                prm.copy_(torch.randn(prm.shape, generator=gen) * scale)
    teacher.to(device).requires_grad_(False)
    student.to(device)
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    data_gen = torch.Generator(device=device).manual_seed(seed + 1)
    cuda = torch.device(device).type == "cuda"
    losses = torch.empty(steps, dtype=torch.float32, device=device)
    step_ms: list[float] = []
    for i in range(steps):
        t0 = time.perf_counter()
        x = torch.randn(batch, in_dim, device=device, generator=data_gen)
        with torch.no_grad():
            y = teacher(x)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            pred = student(x)
        loss = nn.functional.mse_loss(pred.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses[i] = loss.detach()
        if cuda:
            torch.cuda.synchronize(device)
        step_ms.append((time.perf_counter() - t0) * 1e3)
    return TrainResult(losses=[float(v) for v in losses.tolist()], step_ms=step_ms, window=window)


class TrainCheck(Check):
    """Short synthetic training run per GPU; the loss must fall and stay finite."""

    name = "train"
    tag = "TRAIN"
    summary = "Train a small MLP on a seeded teacher task: loss must fall by min_loss_drop, step time reported"
    key_metric = "train_loss_drop"
    metrics = ("train_loss_first", "train_loss_last", "train_loss_drop", "train_step_ms")
    params = (
        Param("steps", "int", 200, "optimizer steps (one fresh batch each)", minimum=2, maximum=100_000),
        Param("window", "int", 20, "steps averaged at the start and at the end to judge the loss drop", minimum=1,
              maximum=50_000),
        Param("min_loss_drop", "float", 0.3, "required fractional loss fall, first window to last window",
              minimum=0.0, maximum=1.0),
        Param("batch", "int", 512, "batch size, samples per step", minimum=1, maximum=1 << 16),
        Param("hidden", "int", 512, "hidden width of the student MLP, units", minimum=1, maximum=1 << 14),
        Param("lr", "float", 1e-3, "Adam learning rate", minimum=0.0, maximum=10.0),
        Param("seed", "int", 0, "seed of weights and data", minimum=0, maximum=(1 << 32) - 1),
        Param("bf16", "bool", False, "run the student forward pass under bfloat16 autocast"),
        Param("all_gpus", "bool", True, "train on every selected GPU (else only the first)"),
        Param("cpu_threads", "int", 1, "CPU only: torch threads while training (tiny GEMMs gain nothing from more "
              "and oversubscribed cores make step times erratic); 0 keeps torch's default", minimum=0, maximum=4096),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"steps": 60, "window": 10, "batch": 256, "hidden": 256},
        "standard": {"steps": 200, "window": 20, "batch": 512, "hidden": 512},
        "full": {"steps": 1000, "window": 50, "batch": 2048, "hidden": 2048},
    }
    #: an optimizer's first parameter group imports torch._dynamo (about 1.8 s on a 2-core CPU)
    warm_imports: ClassVar[tuple[str, ...]] = ("torch._dynamo",)
    timeout_s: ClassVar[dict[str, float]] = {"quick": 60.0, "standard": 300.0, "full": 900.0}

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """First, last and drop of the loss and the step time on every device trained on (the first one
        only with ``all_gpus: false``)."""
        chosen = devices if params.get("all_gpus", True) else devices[:1]
        return per_device(chosen, "train_loss_first", "train_loss_last", "train_loss_drop", "train_step_ms")

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.train(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        import torch

        p = ctx.params
        if not p["all_gpus"]:
            devices = devices[:1]
        steps, window = int(p["steps"]), int(p["window"])
        if 2 * window > steps:
            return Outcome(Status.ERROR, f"window={window} needs steps >= {2 * window}, got steps={steps}")
        old_threads = torch.get_num_threads()
        if devices[0].type == "cpu" and int(p["cpu_threads"]) > 0:
            torch.set_num_threads(int(p["cpu_threads"]))
        try:
            return self._train_all(ctx, devices)
        finally:
            torch.set_num_threads(old_threads)

    def _train_all(self, ctx: CheckContext, devices: list[Any]) -> Outcome:
        import torch

        p = ctx.params
        steps, window = int(p["steps"]), int(p["window"])
        min_drop = float(p["min_loss_drop"])
        metrics: list[Metric] = []
        details: dict[str, Any] = {"devices": {}}
        not_finite: list[str] = []
        diverged: list[str] = []
        for dev in devices:
            label = "cpu" if dev.type == "cpu" else f"cuda:{dev.index}"
            r = train_mlp(dev, steps=steps, batch=int(p["batch"]), hidden=int(p["hidden"]), lr=float(p["lr"]),
                          window=window, seed=int(p["seed"]), bf16=bool(p["bf16"]))
            tags: dict[str, str | int | float] = {"dtype": "bf16" if p["bf16"] else "fp32", "steps": steps}
            if dev.type == "cpu":
                tags["threads"] = torch.get_num_threads()
            median_ms = statistics.median(r.step_ms)
            metrics += [
                Metric("train_loss_first", r.first, "loss", device=label, tags=dict(tags)),
                Metric("train_loss_last", r.last, "loss", device=label, tags=dict(tags)),
                Metric("train_loss_drop", r.drop, "fraction", device=label, tags=dict(tags),
                       threshold=Threshold(">=", min_drop, Status.FAIL, "param:min_loss_drop")),
                Metric("train_step_ms", median_ms, "ms", device=label, tags=dict(tags), performance=True),
            ]
            details["devices"][label] = {"loss_curve": _downsample(r.losses, 20)}
            ctx.log(f"{label}: loss {r.first:.4g} -> {r.last:.4g} ({r.drop:.0%} drop) in {steps} steps, "
                    f"{median_ms:.2f} ms/step")
            if not r.finite:
                bad_step = next(i for i, v in enumerate(r.losses) if not math.isfinite(v))
                not_finite.append(f"{label} at step {bad_step}")
            elif r.last >= r.losses[0]:
                # A loss that blew up early and then came down part way is not learning.
                diverged.append(f"{label} (last {r.last:.4g} >= initial {r.losses[0]:.4g})")
        if not_finite:
            return Outcome.failed("loss is not finite: " + ", ".join(not_finite), metrics, **details)
        if diverged:
            return Outcome.failed("loss ended above its untrained value: " + ", ".join(diverged), metrics, **details)
        drops = [m.value for m in metrics if m.name == "train_loss_drop"]
        return Outcome.passed(f"{len(devices)} device(s): loss fell by {min(drops):.0%} (lowest) in {steps} steps; "
                              f"needs {min_drop:.0%}", metrics, **details)


def _downsample(values: list[float], points: int) -> list[float]:
    """About ``points`` evenly spaced values of ``values`` (rounded), for the report's details."""
    step = max(1, len(values) // points)
    return [round(v, 6) for v in values[::step]]


CHECKS = (TrainCheck,)
