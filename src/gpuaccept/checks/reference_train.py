"""A reference training run: a small GPT-style decoder trained on a seeded Markov corpus, on every device.

Every device (each selected GPU, or the CPU) runs the same seeded single-device training: the decoder of
:mod:`gpuaccept.checks.reftrain_model` (fp32 master weights; bf16 autocast on a GPU, fp32 on the CPU) on the
corpus of :mod:`gpuaccept.checks.reftrain_task` (an order-``order`` Markov chain over ``vocab`` tokens), with
``torch.use_deterministic_algorithms(True)`` and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``. Per step it records
the loss and a digest of the loss's bits and of an exact checksum of every gradient's bits.

Judged:

- **Loss**: the mean loss of the last ``window`` steps (10 % of the steps) must be at most
  ``floor + progress x (ln(vocab) - floor)``, where ``floor`` is the chain's entropy rate (nats/token), the
  lowest expected loss any model can have; and it must not be below ``floor`` by more than 5 standard errors
  of the true chain's own loss on that many tokens (a loss under the task's floor is computed wrong).
- **Bits**: every device's digest sequence must equal the majority's; a device that departs is named with
  its first departing step (GPUs of different models are voted on separately). With one device (one GPU,
  or the CPU) the run is repeated ``runs`` times and the runs must agree (repeatability). Several GPUs train
  at once, one thread each, as a node does in a real job.
- **Speed** (a GPU with an SKU entry): tokens/s and model TFLOP/s (``(6 x N + 12 x layers x seq x d_model)
  x tokens/s``, see :mod:`gpuaccept.checks.reftrain_task`) with the dense bf16 peak as their expectation,
  and ``reftrain_mfu``, the fraction of that peak. The compute check's GEMM rate of the same run is not
  visible to a check; the reports show both figures.

Metrics per device: ``reftrain_loss_final`` (loss, threshold ``<=`` the bound), ``reftrain_loss_bound``,
``reftrain_match`` (bool, ``min 1``), ``reftrain_tokens_per_s``, ``reftrain_tflops`` and, with an SKU,
``reftrain_mfu``; judged against a baseline with curves (:mod:`gpuaccept.results.baseline_curves`),
``reftrain_fleet_match`` per device (its digests equal the fleet's for the same configuration and stack:
GPU model, driver, CUDA, torch, cuBLAS; ``min 1``). The equivalent by hand: a short MaxText, Megatron-LM or
TorchTitan run per GPU with deterministic settings, comparing the logged loss curves.

Tests only: ``GPUACCEPT_TEST_REFTRAIN_FAULT=cuda:1@5`` (or ``cpu#1@5``: run 1 of a single device) flips one
bit of one gradient element at step 5 on that device.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import math
import os
import statistics
from collections.abc import Mapping
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.agreement import (
    CUBLAS_ENV,
    CUBLAS_WORKSPACE,
    cublas_refusal,
    deterministic_workspace,
    workspace_problem,
)
from gpuaccept.checks.base import (
    Check,
    CheckContext,
    Outcome,
    Param,
    RequiredMetric,
    ThresholdRule,
    per_device,
    torch_devices_or_skip,
)
from gpuaccept.checks.reftrain_task import (
    MarkovTask,
    ModelShape,
    curve_digest,
    flops_per_token,
    make_task,
    vote_curves,
)
from gpuaccept.model import Metric, Status, Threshold

FAULT_ENV = "GPUACCEPT_TEST_REFTRAIN_FAULT"
NOISE_SIGMAS = 5.0
"""How many standard errors below the floor a final loss may sit before it is impossible (see the doc)."""


def parse_faults(env: Mapping[str, str]) -> dict[str, int]:
    """``GPUACCEPT_TEST_REFTRAIN_FAULT=cuda:1@5,cpu#1@3`` -> ``{"cuda:1": 5, "cpu#1": 3}`` (bad items ignored)."""
    out: dict[str, int] = {}
    for item in env.get(FAULT_ENV, "").split(","):
        label, _, step = item.strip().partition("@")
        if label and step.isdigit():
            out[label] = int(step)
    return out


def shape_of(p: Mapping[str, Any], on_gpu: bool) -> ModelShape:
    """The model for these parameters: the GPU sizes, or the ``cpu_`` ones."""
    pre = "" if on_gpu else "cpu_"
    return ModelShape(vocab=int(p["vocab"]), d_model=int(p[pre + "d_model"]), layers=int(p[pre + "layers"]),
                      heads=int(p["heads"]), seq=int(p[pre + "seq"]))


def config_key(p: Mapping[str, Any], on_gpu: bool) -> str:
    """12 hex digits naming everything that sets a run's bits: task, model, steps, batch, lr, seed, dtype."""
    pre = "" if on_gpu else "cpu_"
    keys = ("vocab", "order", "branch", "heads", "seed", "progress", pre + "d_model", pre + "layers", pre + "seq",
            pre + "batch", ("steps" if on_gpu else "cpu_steps"), ("lr" if on_gpu else "cpu_lr"))
    data = {k.removeprefix("cpu_"): p[k] for k in keys if k != "progress"}
    data["dtype"] = "bf16-autocast" if on_gpu else "fp32"
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def software_stack(models: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``{device: {gpu, driver, cuda, torch, cublas}}``: what a device's bits depend on besides the run's
    configuration (on the CPU: ``gpu`` is ``cpu <torch's CPU capability>``, the kernels' instruction set)."""
    import torch

    driver = cublas = "-"
    if any(d.startswith("cuda") for d in models):
        driver = cublas = "unknown"
        try:
            from gpuaccept.hw.nvml import open_nvml

            nvml = open_nvml()
            try:
                raw = nvml.nvmlSystemGetDriverVersion()
                driver = raw.decode() if isinstance(raw, bytes) else str(raw)
            finally:
                nvml.nvmlShutdown()
        except Exception:  # no NVML: the key says unknown rather than guessing
            pass
        try:
            from importlib.metadata import version

            cublas = version(f"nvidia-cublas-cu{(torch.version.cuda or '0').split('.')[0]}")
        except Exception:  # cuBLAS not from a wheel: the CUDA version stands for it
            cublas = f"cuda {torch.version.cuda}"
    cpu = f"cpu {torch.backends.cpu.get_cpu_capability()}"
    return {dev: {"gpu": cpu if name == "cpu" else name, "driver": driver, "cuda": str(torch.version.cuda or "-"),
                  "torch": torch.__version__, "cublas": cublas} for dev, name in models.items()}


def noise_margin(task: MarkovTask, tokens: int) -> float:
    """``NOISE_SIGMAS`` standard errors of the true chain's mean loss over ``tokens`` tokens (nats)."""
    var = sum(q * math.log(q) ** 2 for q in task.probs) - task.floor_nats ** 2
    return NOISE_SIGMAS * math.sqrt(max(var, 0.0) / max(tokens, 1)) + 1e-6


class ReferenceTrainCheck(Check):
    """The same seeded decoder training on every device: loss under the task's bound, bit-identical curves."""

    name = "reference_train"
    tag = "REFTRAIN"
    summary = ("Train a small GPT-style decoder on a seeded Markov corpus on every GPU: loss under the task's "
               "derived bound, per-step loss/gradient bits identical across GPUs (the departing GPU and step "
               "named), tokens/s and model TFLOP/s against the bf16 peak")
    key_metric = "reftrain_tflops"
    metrics = ("reftrain_loss_final", "reftrain_loss_bound", "reftrain_match", "reftrain_tokens_per_s",
               "reftrain_tflops", "reftrain_mfu", "reftrain_fleet_match")
    profiles: ClassVar[tuple[str, ...]] = ("standard", "full", "burnin")
    params = (
        Param("steps", "int", 300, "optimizer steps on a GPU (one fresh batch each)", minimum=2, maximum=100_000),
        Param("cpu_steps", "int", 60, "optimizer steps on the CPU", minimum=2, maximum=100_000),
        Param("d_model", "int", 2048, "model width on a GPU", minimum=8, maximum=16384),
        Param("layers", "int", 12, "decoder blocks on a GPU", minimum=1, maximum=256),
        Param("seq", "int", 1024, "tokens of context on a GPU", minimum=4, maximum=65536),
        Param("batch", "int", 8, "sequences per step on a GPU", minimum=1, maximum=4096),
        Param("cpu_d_model", "int", 256, "model width on the CPU", minimum=8, maximum=4096),
        Param("cpu_layers", "int", 4, "decoder blocks on the CPU", minimum=1, maximum=64),
        Param("cpu_seq", "int", 64, "tokens of context on the CPU", minimum=4, maximum=4096),
        Param("cpu_batch", "int", 8, "sequences per step on the CPU", minimum=1, maximum=4096),
        Param("heads", "int", 8, "attention heads (must divide the width)", minimum=1, maximum=256),
        Param("vocab", "int", 64, "tokens of the Markov corpus", minimum=2, maximum=65536),
        Param("order", "int", 1, "Markov order of the corpus (tokens of context that set the next)", minimum=1,
              maximum=4),
        Param("branch", "int", 4, "possible successors of each context", minimum=1, maximum=65536),
        Param("progress", "float", 0.5, "the final loss must be within this fraction of the way from the task's "
              "floor to ln(vocab)", minimum=0.0, maximum=1.0),
        Param("lr", "float", 1e-3, "peak AdamW learning rate on a GPU (linear warm-up over 10 % of the steps)",
              minimum=0.0, maximum=1.0),
        Param("cpu_lr", "float", 3e-3, "peak AdamW learning rate on the CPU", minimum=0.0, maximum=1.0),
        Param("runs", "int", 2, "runs on a single device (one GPU, or the CPU), compared with each other",
              minimum=1, maximum=100),
        Param("seed", "int", 31, "seed of the corpus and the weights", minimum=0, maximum=(1 << 32) - 1),
        Param("cpu_threads", "int", 1, "CPU only: torch threads (0 keeps torch's default)", minimum=0, maximum=4096),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "standard": {"steps": 60, "d_model": 1024, "layers": 8, "cpu_steps": 30, "cpu_d_model": 64, "cpu_layers": 2,
                     "cpu_seq": 32, "cpu_lr": 1e-2},
        "full": {},
        "burnin": {"steps": 1000, "cpu_steps": 200},
    }
    thresholds = (ThresholdRule("reftrain_match", min=1),)
    timeout_s: ClassVar[dict[str, float]] = {"standard": 300.0, "full": 1800.0, "burnin": 3600.0}
    #: an optimizer's first parameter group imports torch._dynamo (about 1.8 s on a 2-core CPU)
    warm_imports: ClassVar[tuple[str, ...]] = ("torch._dynamo",)

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """The loss, its bound, the match verdict, tokens/s and TFLOP/s on every device."""
        return per_device(devices, "reftrain_loss_final", "reftrain_loss_bound", "reftrain_match",
                          "reftrain_tokens_per_s", "reftrain_tflops")

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.reference_train(params, device, gpus)

    @classmethod
    def process_env(cls, env: Mapping[str, str]) -> dict[str, str]:
        """A deterministic ``CUBLAS_WORKSPACE_CONFIG`` from the process's start (as the agreement check)."""
        return deterministic_workspace(env)

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        import torch

        p = ctx.params
        on_gpu = devices[0].type == "cuda"
        shape = shape_of(p, on_gpu)
        if shape.d_model % shape.heads:
            return Outcome(Status.ERROR, f"heads={shape.heads} does not divide the width {shape.d_model}")
        if on_gpu:
            problem = workspace_problem(os.environ.get(CUBLAS_ENV), torch.cuda.is_initialized())
            if problem is not None:
                return Outcome(Status.ERROR, problem)
            os.environ.setdefault(CUBLAS_ENV, CUBLAS_WORKSPACE)
        try:
            task = make_task(int(p["vocab"]), int(p["order"]), min(int(p["branch"]), int(p["vocab"])), int(p["seed"]))
        except ValueError as exc:
            return Outcome(Status.ERROR, f"corpus: {exc}")
        old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
        if not on_gpu and int(p["cpu_threads"]) > 0:
            torch.set_num_threads(int(p["cpu_threads"]))
        torch.use_deterministic_algorithms(True)
        try:
            return self._train_all(ctx, devices, task, shape)
        except torch.cuda.OutOfMemoryError as exc:
            return Outcome(Status.ERROR, f"out of memory with {shape.params / 1e6:.0f}M parameters; lower d_model, "
                                         f"layers or batch ({str(exc).splitlines()[0]})")
        except RuntimeError as exc:
            refused = cublas_refusal(exc)
            if refused is None:
                raise
            return Outcome(Status.ERROR, refused)
        finally:
            torch.use_deterministic_algorithms(old_det)
            torch.set_num_threads(old_threads)

    def _train_all(self, ctx: CheckContext, devices: list[Any], task: MarkovTask, shape: ModelShape) -> Outcome:
        import torch

        from gpuaccept.checks import reftrain_model as rm

        p = ctx.params
        on_gpu = devices[0].type == "cuda"
        steps = int(p["steps" if on_gpu else "cpu_steps"])
        batches = rm.make_batches(task, steps, int(p["batch" if on_gpu else "cpu_batch"]), shape.seq)
        faults = parse_faults(os.environ)
        single = len(devices) == 1
        runs = int(p["runs"]) if single else 1
        models = {str(d): torch.cuda.get_device_name(d) if on_gpu else "cpu" for d in devices}
        lr = float(p["lr" if on_gpu else "cpu_lr"])

        def one(dev: Any, label: str, fault: int | None) -> rm.RunResult:
            with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
                res = rm.train(rm.build(shape, int(p["seed"])), batches, dev, lr=lr, bf16=on_gpu, fault_step=fault)
            ctx.log(f"{label}: {shape.params / 1e6:.2f}M parameters, {steps} steps, loss {res.losses[0]:.4f} -> "
                    f"{res.losses[-1]:.4f} (floor {task.floor_nats:.4f}), curve {curve_digest(res.digests)}")
            return res

        results: dict[str, rm.RunResult] = {}
        if len(devices) == 1:
            for r in range(runs):
                label = f"{devices[0]}#{r}" if runs > 1 else str(devices[0])
                results[label] = one(devices[0], label, faults.get(label, faults.get(str(devices[0])) if r == 0
                                                                     else None))
        else:  # every GPU at once, one thread each (kernels run outside the GIL), as a node trains
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(devices)) as pool:
                futures = {str(d): pool.submit(one, d, str(d), faults.get(str(d))) for d in devices}
                results = {label: f.result() for label, f in futures.items()}
        out = judge(results, models, task, shape, p, single=single, on_gpu=on_gpu)
        out.details["config_key"] = config_key(p, on_gpu)
        out.details["stack"] = software_stack(models)
        return out


def _sku_peaks(models: Mapping[str, str]) -> dict[str, tuple[str, float]]:
    """``{device: (sku id, dense bf16 peak TFLOP/s)}`` for GPUs the SKU table knows."""
    from gpuaccept.hw.sku import match_sku

    out: dict[str, tuple[str, float]] = {}
    for dev, name in models.items():
        sku = match_sku(name) if dev.startswith("cuda") else None
        peak = sku.peak_tflops("bf16") if sku else None
        if sku and peak:
            out[dev] = (sku.id, peak)
    return out


def judge(results: Mapping[str, Any], models: Mapping[str, str], task: MarkovTask, shape: ModelShape,
          p: Mapping[str, Any], *, single: bool, on_gpu: bool) -> Outcome:
    """The outcome of the runs ``results`` (``{label: RunResult}``; labels ``dev#run`` for a single device's
    repeated runs), ``models`` the device model names (``{device: name}``)."""
    steps = len(next(iter(results.values())).losses)
    window = max(1, steps // 10)
    bound = task.bound(float(p["progress"]))
    tokens = next(iter(results.values())).tokens_per_step
    low = task.floor_nats - noise_margin(task, window * tokens)
    peaks = _sku_peaks(models) if on_gpu else {}
    problems: list[str] = []
    verdicts: dict[str, bool] = {}
    curves = {label: r.digests for label, r in results.items()}
    for model_name in dict.fromkeys(models.values()):
        group = {lb: c for lb, c in curves.items() if models[lb.split("#")[0]] == model_name}
        v = vote_curves(group)
        for d in v.departures:
            where = "" if v.majority else " (no majority: every curve differs)"
            what = "run" if single else model_name
            problems.append(f"{d.device} departs from the other {what}s' curve at step {d.step}{where}")
        for lb in group:
            dev = lb.split("#")[0]
            ok = not any(d.device == lb for d in v.departures)
            verdicts[dev] = verdicts.get(dev, True) and ok
    metrics: list[Metric] = []
    details: dict[str, Any] = {"task": {"vocab": task.vocab, "order": task.order, "branch": task.branch,
                                        "seed": task.seed, "floor_nats": task.floor_nats,
                                        "start_nats": task.start_nats, "bound_nats": bound},
                               "model": {"params": shape.params, "matmul_params": shape.matmul_params,
                                         "d_model": shape.d_model, "layers": shape.layers, "heads": shape.heads,
                                         "seq": shape.seq, "flops_per_token": flops_per_token(shape)},
                               "steps": steps, "tokens_per_step": tokens, "dtype": "bf16" if on_gpu else "fp32",
                               "devices": {}}
    for dev in models:
        labels = [lb for lb in results if lb.split("#")[0] == dev]
        first = results[labels[0]]
        final = statistics.fmean(first.losses[-window:])
        timed = first.step_s[1:] or first.step_s
        tok_s = tokens / statistics.median(timed)
        tflops = flops_per_token(shape) * tok_s / 1e12
        tags: dict[str, str | int | float] = {"dtype": details["dtype"], "steps": steps, "params": shape.params}
        metrics += [
            Metric("reftrain_loss_final", final, "loss", dev, tags=dict(tags),
                   threshold=Threshold("<=", round(bound, 6), Status.FAIL,
                                       f"task:floor+{p['progress']:g}x(start-floor)")),
            Metric("reftrain_loss_bound", bound, "loss", dev, tags=dict(tags)),
            Metric("reftrain_match", 1.0 if verdicts[dev] else 0.0, "bool", dev, tags=dict(tags)),
        ]
        tp = Metric("reftrain_tokens_per_s", tok_s, "tokens/s", dev, tags=dict(tags), performance=True)
        tf = Metric("reftrain_tflops", tflops, "TFLOP/s", dev, tags=dict(tags), performance=True)
        if dev in peaks:
            sku_id, peak = peaks[dev]
            tf.expected, tp.expected = peak, peak * 1e12 / flops_per_token(shape)
            metrics.append(Metric("reftrain_mfu", tflops / peak, "fraction", dev, tags={**tags, "sku": sku_id}))
        metrics += [tp, tf]
        details["devices"][dev] = {lb: {"loss": [round(x, 6) for x in results[lb].losses],
                                        "digests": results[lb].digests, "curve": curve_digest(results[lb].digests)}
                                   for lb in labels}
        if not all(math.isfinite(x) for x in first.losses):
            problems.append(f"{dev}: loss not finite at step "
                            f"{next(i for i, x in enumerate(first.losses) if not math.isfinite(x))}")
        elif final > bound:
            problems.append(f"{dev}: final loss {final:.4f} is above the bound {bound:.4f} (floor "
                            f"{task.floor_nats:.4f}, start {task.start_nats:.4f} nats/token)")
        elif final < low:
            problems.append(f"{dev}: final loss {final:.4f} is below the task's floor {task.floor_nats:.4f} "
                            "by more than its noise: the loss is computed wrong")
    if problems:
        return Outcome.failed("; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4
                                                          else ""), metrics, **details)
    losses = [m.value for m in metrics if m.name == "reftrain_loss_final"]
    if single:
        dev = next(iter(models))
        same = (f"{len(results)} runs on {dev} bit-identical at every step (one device: repeatability; no other "
                "GPU to vote with)" if len(results) > 1 else f"one run on {dev} (runs=1: nothing compared)")
    else:
        same = f"{len(models)} GPUs' per-step loss and gradient bits identical"
    rates = [m.value for m in metrics if m.name == "reftrain_tflops"]
    speed = (f"{min(rates):.3g}" + (f" to {max(rates):.3g}" if len(rates) > 1 else "") + " model TFLOP/s"
             if max(rates) >= 1 else f"{1e3 * min(rates):.3g} model GFLOP/s")
    return Outcome.passed(f"{same}; loss {max(losses):.4f} <= bound {bound:.4f} after {steps} steps (floor "
                          f"{task.floor_nats:.4f}); {speed}", metrics, **details)


CHECKS = (ReferenceTrainCheck,)
