"""The reference training run's model and its training loop (imports torch; loaded inside the check's run).

A GPT-style decoder: token embedding plus a learned position table, ``layers`` pre-norm blocks of causal
multi-head attention and a GELU MLP (``mlp_ratio x d_model`` wide), a final LayerNorm and a head tied to
the embedding. Attention is written out (scores, mask, softmax, weighted sum) rather than through a fused
kernel, so that with ``torch.use_deterministic_algorithms(True)`` every operation has a deterministic
implementation on CPU and CUDA. Weights are initialised from a CPU generator (the same on every device),
kept in fp32 (the master weights), and trained with AdamW; on a GPU the forward runs under bf16 autocast.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from gpuaccept.checks.reftrain_task import MarkovTask, ModelShape, sample_batch, step_digest


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual connection."""

    def __init__(self, d: int, heads: int, ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, ratio * d), nn.Linear(ratio * d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        att = torch.softmax(scores.masked_fill(mask[:t, :t], float("-inf")).float(), dim=-1).to(v.dtype)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    """The decoder of :class:`~gpuaccept.checks.reftrain_task.ModelShape` ``shape``; returns float32 logits."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.d_model)
        self.pos = nn.Parameter(torch.zeros(shape.seq, shape.d_model))
        self.blocks = nn.ModuleList(Block(shape.d_model, shape.heads, shape.mlp_ratio) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.d_model)
        self.register_buffer("mask", torch.ones(shape.seq, shape.seq, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:t]
        for block in self.blocks:
            x = block(x, self.mask)
        return (self.norm(x) @ self.embed.weight.to(x.dtype).t()).float()


def build(shape: ModelShape, seed: int) -> Decoder:
    """The decoder with weights drawn on the CPU from ``seed`` (normal, std 0.02; output projections scaled
    by ``1/sqrt(2 layers)``; norms at 1 and 0), so every device starts from the same bits."""
    gen = torch.Generator().manual_seed(seed)
    model = Decoder(shape)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if "norm" in name:
                prm.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                prm.zero_()
            else:
                std = 0.02 / math.sqrt(2 * shape.layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                prm.copy_(torch.randn(prm.shape, generator=gen) * std)
    return model


def grad_checksum(model: nn.Module) -> int:
    """The sum of every gradient's float32 bit patterns read as int32, as one Python int: exact, so one flipped
    bit anywhere changes it (what :func:`~gpuaccept.checks.reftrain_task.step_digest` hashes)."""
    sums = [p.grad.detach().float().contiguous().view(torch.int32).sum(dtype=torch.int64)
            for p in model.parameters() if p.grad is not None]
    return int(torch.stack(sums).sum().item()) if sums else 0


def flip_one_grad_bit(model: nn.Module) -> None:
    """Fault injection (tests): flip the lowest mantissa bit of the first gradient element."""
    g = next(p.grad for p in model.parameters() if p.grad is not None)
    flat = g.view(-1).view(torch.int32)
    flat[0] ^= 1


@dataclass
class RunResult:
    """One device's training run: per-step loss (nats/token) and digest, and the timed steps' seconds."""

    losses: list[float] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    tokens_per_step: int = 0


def make_batches(task: MarkovTask, steps: int, batch: int, seq: int) -> list[torch.Tensor]:
    """Every step's tokens (``batch x (seq + 1)``, int64 on the CPU), made before training so that the timed
    steps do not include the corpus's Python sampling."""
    return [torch.tensor(sample_batch(task, i, batch, seq + 1), dtype=torch.int64) for i in range(steps)]


def train(model: Decoder, batches: list[torch.Tensor], device: torch.device, *, lr: float, bf16: bool,
          fault_step: int | None = None, shards: int = 1, warm: int | None = None) -> RunResult:
    """Train ``model`` (moved to ``device``) on ``batches``, one AdamW step each (lr warmed up linearly over
    the first 10 % of steps, gradients clipped to norm 1). Records each step's loss and digest; the device
    is synchronized per step so ``step_s`` covers the work. ``fault_step`` flips one gradient bit at that
    step. ``shards > 1`` splits each batch's rows into that many equal parts and accumulates their gradients
    (``loss_k / shards``), the mathematics of DDP over ``shards`` ranks; the loss is then the parts' mean.
    ``warm``: the warm-up's steps when ``batches`` are the first steps of a longer run."""
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = warm or max(1, len(batches) // 10)
    result = RunResult(tokens_per_step=int(batches[0][:, 1:].numel()) if batches else 0)
    cuda = device.type == "cuda"
    for i, cpu_batch in enumerate(batches):
        t0 = time.perf_counter()
        tokens = cpu_batch.to(device, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (i + 1) / warm)
        opt.zero_grad(set_to_none=True)
        parts = []
        for part in tokens.chunk(shards) if shards > 1 else (tokens,):
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(part[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), part[:, 1:].reshape(-1))
            (loss / shards if shards > 1 else loss).backward()
            parts.append(loss.detach())
        loss = torch.stack(parts).mean() if shards > 1 else parts[0]
        if fault_step == i:
            flip_one_grad_bit(model)
        checksum = grad_checksum(model)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.item())
        if cuda:
            torch.cuda.synchronize(device)
        result.step_s.append(time.perf_counter() - t0)
        result.losses.append(value)
        result.digests.append(step_digest(value, checksum))
    return result
