"""Training throughput (samples/s) of two standard small models on synthetic data, per device.

* ``cnn``: a ResNet-style CNN (a 3x3 stem, three stages of ``cnn_blocks`` basic
  residual blocks of width ``w``, ``2w``, ``4w`` with batch norm, global average
  pooling, a 10-way classifier) on random ``3 x image x image`` images, cross-entropy loss;
  like ``python examples/imagenet/main.py -a resnet18 --dummy`` of the PyTorch examples, smaller.
* ``transformer``: a pre-norm transformer encoder (``tf_layers`` layers of
  width ``tf_dim``, ``tf_dim / 64`` heads) over random token sequences of length
  ``tf_seq`` with a next-token head over a 1024-token vocabulary.

Each model trains with SGD (momentum 0.9) under autocast in ``dtype``
(``auto``: bf16 on GPUs that have it, fp16 with a gradient scaler on older
ones, fp32 on CPU); ``warmup_steps`` untimed steps, then steps until
``measure_s`` have passed (at least ``min_steps``), the device synchronized
before the clock stops. On CPU the sizes are the reduced ``cpu_*`` ones.

Metrics per device: ``throughput_cnn_samples_s`` and
``throughput_transformer_samples_s`` (samples/s). They carry no built-in bound:
the fleet baseline (``gpuaccept run --baseline``) judges them; without one
they are reported, not judged. A non-finite loss fails the check.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
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
from gpuaccept.checks.timing import synchronize
from gpuaccept.model import Metric, Status

MODELS = ("cnn", "transformer")
VOCAB = 1024


@dataclass
class Sizes:
    """The model and batch sizes for one device kind."""

    cnn_batch: int
    cnn_width: int
    cnn_blocks: int
    image: int
    tf_batch: int
    tf_dim: int
    tf_layers: int
    tf_seq: int


def build_cnn(width: int, blocks: int, classes: int = 10) -> Any:
    """A small ResNet: stem, three stages of basic blocks (stride 2 between stages), pooling, classifier."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip: nn.Module = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            self.act = nn.ReLU(inplace=True)

        def forward(self, x: Any) -> Any:
            return self.act(self.body(x) + self.skip(x))

    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
    cin = width
    for stage in range(3):
        cout = width * 2 ** stage
        for i in range(blocks):
            layers.append(Block(cin, cout, 2 if stage > 0 and i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def build_transformer(dim: int, layers: int, seq: int) -> Any:
    """Token embedding plus learned positions, a pre-norm encoder, and a vocabulary head."""
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, dim)
            self.pos = nn.Parameter(torch.zeros(1, seq, dim))
            layer = nn.TransformerEncoderLayer(dim, max(1, dim // 64), 4 * dim, dropout=0.0, batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(dim, VOCAB)

        def forward(self, tokens: Any) -> Any:
            return self.head(self.encoder(self.embed(tokens) + self.pos))

    return Model()


@dataclass
class Throughput:
    samples_s: float
    steps: int
    seconds: float
    loss: float


def train_throughput(model: Any, x: Any, y: Any, loss_fn: Callable[[Any, Any], Any], device: Any, amp: str, *,
                     warmup_steps: int, measure_s: float, min_steps: int) -> Throughput:
    """Samples/s of SGD steps of ``model`` on the batch ``x``, ``y`` (made once, reused) under autocast."""
    import torch

    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    batch = int(x.shape[0])

    def step() -> Any:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    for _ in range(warmup_steps):
        step()
    synchronize(device)
    t0 = time.perf_counter()
    steps = 0
    loss = None
    while steps < min_steps or time.perf_counter() - t0 < measure_s:
        loss = step()
        steps += 1
        if steps % 8 == 0:
            synchronize(device)  # the clock reads the queue, not the GPU, without it
    synchronize(device)
    seconds = time.perf_counter() - t0
    return Throughput(batch * steps / seconds, steps, seconds, float(loss) if loss is not None else math.nan)


def pick_amp(requested: str, device: Any) -> tuple[str, str | None]:
    """(dtype that runs, note when it differs from what was asked) for ``device``."""
    import torch

    if device.type == "cuda":
        bf16 = torch.cuda.get_device_capability(device) >= (8, 0)
        if requested == "auto":
            return ("bf16" if bf16 else "fp16"), None
        if requested == "bf16" and not bf16:
            return "fp16", f"{device} has no bf16 (compute capability < 8.0): fp16 instead"
        return requested, None
    if requested in ("auto", "fp32"):
        return "fp32", None
    if requested == "fp16":
        return "fp32", "fp16 autocast is not a meaningful CPU test: fp32 instead"
    return requested, None


class ThroughputCheck(Check):
    """Samples/s of a small ResNet-style CNN and a small transformer, trained on synthetic data."""

    name = "throughput"
    tag = "THRUPUT"
    summary = ("Training samples/s of a small ResNet-style CNN and a small transformer on synthetic data "
               "(bf16/fp16 autocast on GPU), judged against the fleet baseline")
    key_metric = "throughput_transformer_samples_s"
    metrics = tuple(f"throughput_{m}_samples_s" for m in MODELS)
    profiles: ClassVar[tuple[str, ...]] = ("full", "burnin")
    params = (
        Param("models", "list", list(MODELS), "models to train", item="str", choices=MODELS),
        Param("dtype", "str", "auto", "autocast dtype (auto: bf16 on GPUs with it, else fp16; fp32 on CPU)",
              choices=("auto", "fp32", "bf16", "fp16")),
        Param("measure_s", "float", 10.0, "timed seconds per model and device", minimum=0.1, maximum=3600.0),
        Param("warmup_steps", "int", 5, "untimed steps first", minimum=0, maximum=10000),
        Param("min_steps", "int", 5, "timed steps at least", minimum=1, maximum=100000),
        Param("cnn_batch", "int", 256, "CNN batch on GPU", minimum=1, maximum=65536),
        Param("cnn_width", "int", 64, "CNN width of the first stage on GPU", minimum=4, maximum=1024),
        Param("cnn_blocks", "int", 2, "basic blocks per CNN stage", minimum=1, maximum=32),
        Param("image", "int", 64, "image side on GPU", minimum=8, maximum=1024),
        Param("tf_batch", "int", 64, "transformer batch on GPU", minimum=1, maximum=65536),
        Param("tf_dim", "int", 512, "transformer width on GPU", minimum=64, maximum=8192),
        Param("tf_layers", "int", 6, "transformer layers on GPU", minimum=1, maximum=128),
        Param("tf_seq", "int", 256, "sequence length on GPU", minimum=8, maximum=32768),
        Param("cpu_scale", "int", 8, "CPU: batch, widths and image side divided by this (reduced size)",
              minimum=1, maximum=64),
        Param("seed", "int", 0, "seed of weights and data", minimum=0, maximum=(1 << 32) - 1),
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"measure_s": 10.0},
        "burnin": {"measure_s": 60.0},
    }
    timeout_s: ClassVar[dict[str, float]] = {"full": 900.0, "burnin": 3600.0}

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """Samples/s of every model asked for on every device."""
        return per_device(devices, *(f"throughput_{m}_samples_s" for m in dict.fromkeys(params["models"])))

    @staticmethod
    def sizes(p: dict[str, Any], on_gpu: bool) -> Sizes:
        """The GPU sizes, or on CPU the batch, widths and image side divided by ``cpu_scale`` (layers halved)."""
        s = 1 if on_gpu else int(p["cpu_scale"])
        return Sizes(max(2, int(p["cnn_batch"]) // s), max(4, int(p["cnn_width"]) // s), int(p["cnn_blocks"]),
                     max(8, int(p["image"]) // s), max(2, int(p["tf_batch"]) // s),
                     max(64, int(p["tf_dim"]) // s // 64 * 64), max(1, int(p["tf_layers"]) // (1 if on_gpu else 2)),
                     max(8, int(p["tf_seq"]) // s))

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.throughput(params, device, gpus)

    @classmethod
    def budget_stretch(cls, params: dict[str, Any]) -> tuple[str, float] | None:
        return "measure_s", 2.0

    def run(self, ctx: CheckContext) -> Outcome:
        devices = torch_devices_or_skip(ctx)
        if isinstance(devices, Outcome):
            return devices
        import torch
        from torch import nn

        p = ctx.params
        on_gpu = devices[0].type == "cuda"
        sz = self.sizes(p, on_gpu)
        models = list(dict.fromkeys(p["models"]))
        metrics: list[Metric] = []
        notes: list[str] = []
        bad: list[str] = []
        results: dict[str, dict[str, Any]] = {}
        for dev in devices:
            amp, note = pick_amp(str(p["dtype"]), dev)
            if note and note not in notes:
                notes.append(note)
            gen = torch.Generator(device="cpu").manual_seed(int(p["seed"]))
            for name in models:
                torch.manual_seed(int(p["seed"]))
                if name == "cnn":
                    model = build_cnn(sz.cnn_width, sz.cnn_blocks)
                    images = torch.randn(sz.cnn_batch, 3, sz.image, sz.image, generator=gen).to(dev)
                    labels = torch.randint(0, 10, (sz.cnn_batch,), generator=gen).to(dev)

                    x, y = images, labels

                    loss_fn: Callable[[Any, Any], Any] = nn.functional.cross_entropy
                    shape: dict[str, str | int | float] = {"batch": sz.cnn_batch, "width": sz.cnn_width,
                                                           "image": sz.image}
                else:
                    model = build_transformer(sz.tf_dim, sz.tf_layers, sz.tf_seq)
                    tokens = torch.randint(0, VOCAB, (sz.tf_batch, sz.tf_seq + 1), generator=gen).to(dev)

                    x, y = tokens[:, :-1], tokens[:, 1:]

                    def loss_fn(out: Any, y: Any) -> Any:
                        return nn.functional.cross_entropy(out.reshape(-1, VOCAB).float(), y.reshape(-1))

                    shape = {"batch": sz.tf_batch, "dim": sz.tf_dim, "layers": sz.tf_layers, "seq": sz.tf_seq}
                try:
                    r = train_throughput(model, x, y, loss_fn, dev, amp, warmup_steps=int(p["warmup_steps"]),
                                         measure_s=float(p["measure_s"]), min_steps=int(p["min_steps"]))
                except torch.cuda.OutOfMemoryError as exc:
                    return Outcome(Status.ERROR, f"{dev} {name}: out of memory; lower the batch "
                                                 f"({str(exc).splitlines()[0]})")
                del model
                label = str(dev)
                metrics.append(Metric(f"throughput_{name}_samples_s", round(r.samples_s, 3), "samples/s", label,
                                      tags={"dtype": amp, **shape}, performance=True))
                results.setdefault(label, {})[name] = {"samples_s": round(r.samples_s, 3), "steps": r.steps,
                                                       "seconds": round(r.seconds, 3), "loss": r.loss, "dtype": amp}
                ctx.log(f"{label} {name} {amp}: {r.samples_s:.1f} samples/s ({r.steps} steps in {r.seconds:.2f} s, "
                        f"loss {r.loss:.3g})")
                if not math.isfinite(r.loss):
                    bad.append(f"{label} {name}")
        details: dict[str, Any] = {"devices": results, "sizes": vars(sz), "judged": "against --baseline only"}
        if notes:
            details["notes"] = notes
        if bad:
            return Outcome.failed(f"loss is not finite: {', '.join(bad)}", metrics, **details)
        parts = []
        for name in models:
            vals = [m for m in metrics if m.name == f"throughput_{name}_samples_s"]
            low = min(vals, key=lambda m: m.value)
            where_low = f", min {low.device}" if len(vals) > 1 else ""
            parts.append(f"{name} {low.value:.4g} samples/s ({low.tags['dtype']}{where_low})")
        where = f"{len(devices)} GPU(s)" if on_gpu else f"cpu (reduced size, 1/{p['cpu_scale']})"
        reason = f"{where}: {'; '.join(parts)}; not judged without a baseline (--baseline)"
        if notes:
            reason += "; " + "; ".join(notes)
        return Outcome.passed(reason, metrics, **details)


CHECKS = (ThroughputCheck,)
