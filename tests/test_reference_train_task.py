"""The reference training run's pure parts: corpus, FLOP accounting, step digests and the curve vote."""

from __future__ import annotations

import math
import statistics

import pytest

from gpuaccept.checks.reftrain_task import (
    ModelShape,
    curve_digest,
    first_departure,
    flops_per_token,
    make_task,
    model_tflops,
    sample_batch,
    sequence_nll,
    step_digest,
    vote_curves,
)


def test_task_is_fixed_by_its_seed_and_differs_with_another():
    a, b, c = make_task(32, 2, 4, 7), make_task(32, 2, 4, 7), make_task(32, 2, 4, 8)
    assert a == b
    assert a.successors != c.successors
    assert sample_batch(a, 3, 2, 50) == sample_batch(b, 3, 2, 50)
    assert sample_batch(a, 3, 2, 50) != sample_batch(a, 4, 2, 50)


def test_floor_is_the_entropy_of_the_shared_vector_and_the_empirical_loss_meets_it():
    task = make_task(16, 1, 4, 3)
    assert math.isclose(sum(task.probs), 1.0)
    assert task.floor_nats == pytest.approx(-sum(p * math.log(p) for p in task.probs))
    assert 0 < task.floor_nats <= math.log(4) < task.start_nats == math.log(16)
    # the true chain's NLL of sampled text averages to the floor (law of large numbers, 40k tokens)
    nll = statistics.fmean(sequence_nll(task, s) for s in sample_batch(task, 0, 40, 1001))
    assert nll == pytest.approx(task.floor_nats, abs=0.02)


def test_samples_only_make_transitions_the_chain_allows():
    task = make_task(8, 2, 3, 5)
    for seq in sample_batch(task, 1, 4, 64):
        assert len(seq) == 64 and all(0 <= t < 8 for t in seq)
        sequence_nll(task, seq)  # raises on an impossible transition
    with pytest.raises(ValueError, match="cannot follow"):
        bad = sample_batch(task, 1, 1, 10)[0]
        succ = task.successors[task.context(bad[:2])]
        bad[2] = next(t for t in range(8) if t not in succ)
        sequence_nll(task, bad)


def test_bound_lies_between_floor_and_start():
    task = make_task(64, 2, 4, 0)
    assert task.bound(0.0) == task.floor_nats and task.bound(1.0) == pytest.approx(task.start_nats)
    assert task.floor_nats < task.bound(0.3) < task.start_nats


@pytest.mark.parametrize("args", [(1, 1, 1, 0), (8, 0, 2, 0), (8, 1, 9, 0), (4096, 2, 4, 0)])
def test_bad_task_sizes_are_refused(args):
    with pytest.raises(ValueError):
        make_task(*args)


def test_flops_formula_as_stated():
    s = ModelShape(vocab=1000, d_model=64, layers=2, heads=4, seq=128)
    block = 12 * 64 * 64 + 13 * 64
    assert s.matmul_params == 1000 * 64 + 2 * block + 128
    assert s.params == s.matmul_params + 128 * 64
    assert flops_per_token(s) == 6 * s.matmul_params + 12 * 2 * 128 * 64
    assert model_tflops(s, 10_000, 2.0) == pytest.approx(flops_per_token(s) * 5000 / 1e12)
    assert math.isnan(model_tflops(s, 10, 0.0))


def test_step_digest_sees_one_bit():
    base = step_digest(2.5, 123456789)
    assert base == step_digest(2.5, 123456789) and len(base) == 16
    assert step_digest(2.5 + 2.0 ** -22, 123456789) != base  # one float32 ulp at 2.5
    assert step_digest(2.5, 123456789 ^ 1) != base
    assert curve_digest([base, base]) != curve_digest([base])


def test_first_departure():
    assert first_departure(["a", "b", "c"], ["a", "b", "c"]) is None
    assert first_departure(["a", "x", "c"], ["a", "b", "c"]) == 1
    assert first_departure(["a", "b"], ["a", "b", "c"]) == 2


def test_vote_names_the_departing_device_and_step():
    good = ["a", "b", "c", "d"]
    v = vote_curves({"cuda:0": good, "cuda:1": good, "cuda:2": ["a", "b", "X", "Y"], "cuda:3": good})
    assert v.majority == tuple(good)
    assert [(d.device, d.step) for d in v.departures] == [("cuda:2", 2)]
    assert vote_curves({"cuda:0": good, "cuda:1": good}).departures == ()


def test_vote_without_majority_names_every_device():
    v = vote_curves({"cuda:0": ["a", "b"], "cuda:1": ["a", "c"]})
    assert v.majority is None
    assert [(d.device, d.step) for d in v.departures] == [("cuda:0", 1), ("cuda:1", 1)]
