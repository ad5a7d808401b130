"""The reference training run's pure parts: the synthetic corpus, FLOP accounting, step digests and their comparison.

No torch here: everything is plain Python, so it is tested on its own.

**The corpus** is a seeded order-``k`` Markov chain over ``vocab`` tokens. Every context (the last ``k``
tokens) has ``branch`` possible successors, drawn from the seed, and every context uses the same
probability vector ``p`` over its successors (also drawn from the seed, in another order per context).
So the chain's entropy rate is exactly ``H(p) = -sum(p_i ln p_i)`` nats per token whatever the stationary
distribution: no model can have an expected cross-entropy below it (the **floor**), and an untrained model
that guesses uniformly has ``ln(vocab)`` (the **start**). The check's bound on the final loss is
``floor + progress x (start - floor)``: derived from the task, not tuned to a machine.

**FLOPs** per token, the usual model-FLOP accounting (Kaplan et al. 2020; PaLM appendix B):
``6 x N + 12 x layers x seq x d_model``, where ``N`` is the parameters that take part in matrix products
(every parameter except the position table; the tied embedding counted once stands for the head's GEMM),
``6 = 2`` (forward) ``+ 4`` (backward), and the second term is the attention scores and their weighted sum
(forward and backward). Model TFLOP/s = that x tokens / seconds; MFU = that / the dense bf16 peak.

**Step digests**: per step the first 16 hex digits of SHA-256 of the loss's float32 bits and of an exact
integer checksum of every gradient's bits, so one flipped bit anywhere in the gradients changes that step's
digest. Devices that ran the same seeded training must have equal digest sequences; the odd one is named
with the first step where it departs from the majority.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MarkovTask:
    """A seeded order-``order`` Markov chain over ``vocab`` tokens with ``branch`` successors per context.

    ``probs`` is the probability vector every context uses; ``successors[c]`` the tokens context ``c``
    (the last ``order`` tokens, as a base-``vocab`` number, oldest first) leads to, in the order of ``probs``.
    """

    vocab: int
    order: int
    branch: int
    seed: int
    probs: tuple[float, ...]
    successors: tuple[tuple[int, ...], ...]

    @property
    def floor_nats(self) -> float:
        """The entropy rate, nats per token: no predictor's expected cross-entropy is lower."""
        return -sum(p * math.log(p) for p in self.probs)

    @property
    def start_nats(self) -> float:
        """The cross-entropy of a uniform guess, ``ln(vocab)`` nats per token."""
        return math.log(self.vocab)

    def bound(self, progress: float) -> float:
        """The loss a trained model must reach: ``floor + progress x (start - floor)``, nats per token."""
        return self.floor_nats + progress * (self.start_nats - self.floor_nats)

    def context(self, tokens: Sequence[int]) -> int:
        """The context index of the last ``order`` tokens."""
        c = 0
        for t in tokens[len(tokens) - self.order:]:
            c = c * self.vocab + t
        return c


def make_task(vocab: int, order: int, branch: int, seed: int) -> MarkovTask:
    """The task for these sizes and seed (deterministic: Python's Mersenne Twister, same on every platform)."""
    if vocab < 2 or order < 1 or not 1 <= branch <= vocab:
        raise ValueError(f"need vocab >= 2, order >= 1, 1 <= branch <= vocab; got {vocab}, {order}, {branch}")
    if vocab ** order > 1 << 22:
        raise ValueError(f"vocab^order = {vocab ** order} contexts is too many (at most {1 << 22})")
    rng = random.Random(seed)
    weights = [0.2 + rng.random() for _ in range(branch)]
    total = sum(weights)
    probs = tuple(sorted((w / total for w in weights), reverse=True))
    successors = tuple(tuple(rng.sample(range(vocab), branch)) for _ in range(vocab ** order))
    return MarkovTask(vocab, order, branch, seed, probs, successors)


def sample_batch(task: MarkovTask, step: int, batch: int, length: int) -> list[list[int]]:
    """``batch`` sequences of ``length`` tokens for training step ``step``: each starts at a random context
    and walks the chain. The same (task, step, batch, length) always gives the same tokens."""
    rng = random.Random(task.seed * 1_000_003 + 7919 * step + 1)
    cum = [0.0]
    for p in task.probs:
        cum.append(cum[-1] + p)
    cum = cum[1:]
    cum[-1] = 1.0
    out: list[list[int]] = []
    for _ in range(batch):
        seq = [rng.randrange(task.vocab) for _ in range(task.order)]
        c = task.context(seq)
        mod = task.vocab ** (task.order - 1)
        while len(seq) < length:
            t = task.successors[c][bisect.bisect_right(cum, rng.random())]
            seq.append(t)
            c = (c % mod) * task.vocab + t
        out.append(seq[:length])
    return out


def sequence_nll(task: MarkovTask, seq: Sequence[int]) -> float:
    """Mean negative log-likelihood (nats) of ``seq`` after its first ``order`` tokens under the true chain; its
    expectation is ``floor_nats``. Raises ValueError for a transition the chain cannot make."""
    total, n = 0.0, 0
    for i in range(task.order, len(seq)):
        succ = task.successors[task.context(seq[:i])]
        if seq[i] not in succ:
            raise ValueError(f"token {seq[i]} at {i} cannot follow its context")
        total -= math.log(task.probs[succ.index(seq[i])])
        n += 1
    return total / max(n, 1)


# ---------------------------------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class ModelShape:
    """The decoder's sizes: ``layers`` blocks of width ``d_model``, ``seq`` tokens of context, ``vocab``."""

    vocab: int
    d_model: int
    layers: int
    heads: int
    seq: int
    mlp_ratio: int = 4

    @property
    def matmul_params(self) -> int:
        """Parameters in matrix products: the tied embedding/head, per block QKV and output projections
        (``4 d^2 + 4 d``), the MLP (``2 r d^2 + r d + d``) and two LayerNorms (``4 d``), and the final norm."""
        d, r = self.d_model, self.mlp_ratio
        block = 4 * d * d + 4 * d + 2 * r * d * d + r * d + d + 4 * d
        return self.vocab * d + self.layers * block + 2 * d

    @property
    def params(self) -> int:
        """Every parameter: ``matmul_params`` and the learned position table (``seq x d_model``)."""
        return self.matmul_params + self.seq * self.d_model


def flops_per_token(shape: ModelShape) -> float:
    """Training FLOPs per token: ``6 x matmul_params + 12 x layers x seq x d_model`` (see the module doc)."""
    return 6.0 * shape.matmul_params + 12.0 * shape.layers * shape.seq * shape.d_model


def model_tflops(shape: ModelShape, tokens: int, seconds: float) -> float:
    """Model TFLOP/s: ``flops_per_token x tokens / seconds / 1e12``; NaN for a non-positive time."""
    return flops_per_token(shape) * tokens / seconds / 1e12 if seconds > 0 else math.nan


# ---------------------------------------------------------------------------------------------- digests


def step_digest(loss: float, grad_checksum: int) -> str:
    """First 16 hex digits of SHA-256 of the loss's float32 bits and the gradients' integer bit checksum."""
    data = struct.pack("<f", loss) + int(grad_checksum).to_bytes(16, "little", signed=True)
    return hashlib.sha256(data).hexdigest()[:16]


def curve_digest(digests: Sequence[str]) -> str:
    """One hash of a whole digest sequence (first 16 hex digits of SHA-256 of them, comma-joined)."""
    return hashlib.sha256(",".join(digests).encode()).hexdigest()[:16]


def first_departure(seq: Sequence[str], ref: Sequence[str]) -> int | None:
    """The first step where ``seq`` differs from ``ref`` (a length difference counts at the shorter's end);
    None when they are equal."""
    for i, (a, b) in enumerate(zip(seq, ref, strict=False)):
        if a != b:
            return i
    return None if len(seq) == len(ref) else min(len(seq), len(ref))


@dataclass(frozen=True)
class Departure:
    """A device whose digest sequence departs from the reference, at ``step``."""

    device: str
    step: int


@dataclass(frozen=True)
class CurveVote:
    """The majority's sequence (None when no sequence has more than half), and the devices that depart."""

    majority: tuple[str, ...] | None
    departures: tuple[Departure, ...]


def vote_curves(curves: Mapping[str, Sequence[str]]) -> CurveVote:
    """Majority vote over ``{device: digest sequence}``. A departing device is named with its first departing
    step from the majority. Without a majority (two that differ, three all different) every device departs,
    each at the first step where the sequences are not all equal."""
    if not curves:
        return CurveVote(None, ())
    counts = Counter(tuple(c) for c in curves.values())
    top, n = counts.most_common(1)[0]
    if len(curves) > 1 and 2 * n <= len(curves):
        steps = [first_departure(a, b) for a in curves.values() for b in curves.values()]
        first = min((s for s in steps if s is not None), default=0)
        return CurveVote(None, tuple(Departure(d, first) for d in curves))
    odd = [Departure(d, step) for d, c in curves.items() if (step := first_departure(c, top)) is not None]
    return CurveVote(top, tuple(odd))
