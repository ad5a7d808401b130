"""Collective bandwidth and correctness across ranks, with nccl-tests semantics.

For each operation (allreduce, allgather, reducescatter, alltoall, broadcast
from rank 0, sendrecv to the ring neighbour), dtype, placement (in-place and
out-of-place where torch offers both) and message size of the sweep
``min_bytes, min_bytes*step_factor, ... <= max_bytes`` (nccl-tests ``-b -e -f``),
every rank runs ``warmup`` untimed and ``iters`` timed operations back to back,
then refills its input and runs one more whose result is compared element by
element with the exact expected value (nccl-tests ``-c 1``).

Per row, from rank 0 only (the job's row, as nccl-tests prints one; every rank's time per row is in rank
0's ``rank_time_us``, other ranks keep their rows only when they failed or found wrong elements):
``<op>_time_us`` (µs per operation, rank 0's clock),
``<op>_algbw_gbs`` = size / time and ``<op>_busbw_gbs`` = algbw × factor in
GB/s (10^9 B/s), with the nccl-tests factors 2(n-1)/n for allreduce, (n-1)/n for
allgather, reducescatter and alltoall, 1 for broadcast and sendrecv. Sizes are
nccl-tests' too: the whole buffer for allreduce, broadcast, sendrecv and
alltoall (per rank), the gathered output for allgather and the scattered input
for reducescatter. Per rank and op: ``<op>_wrong`` (elements that differ from
the expected value, summed over rows, like nccl-tests' ``#wrong``; must be 0) and
``<op>_busbw_large_gbs`` (the lowest busbw at the judged sizes, by default the
largest; nccl-tests' "Avg bus bandwidth" over all sizes is not used because
small sizes drag it down). Equivalent reference: ``all_reduce_perf -b 4K -e 256M
-f 16 -w 2 -n 5 -c 1`` and its siblings from nccl-tests.

The busbw at large sizes is judged like the nccl_tests check's
(:mod:`gpuaccept.nccltests.busbw`): a baseline, else ``min_busbw_gbs``, else the
expectation derived from the fabric the ranks report (:mod:`gpuaccept.hw.fabric_expect`),
which is shown as the metric's expected value. Off GPU there is no expectation: the check passes
when every element is right. Rank 0's details hold every rank's time per row, so a slow rank is
visible. Local rank 0 reads the RDMA counters before and after the sweep (``fabric_root``;
:mod:`gpuaccept.checks.fabric_watch`): errors that rose under the load are reported per port; on GPUs it
reads every GPU's NVLink error counters too (:mod:`gpuaccept.checks.nvlink_watch`): a link whose CRC, replay
or recovery errors rise under the load fails the check.

On GPUs the largest size is capped at a quarter of the free memory (two
buffer pools plus verification slices); with gloo on CPU at ``cpu_max_bytes``.
The ranks agree on the cap (the smallest over ranks, one all-reduce with MIN)
before building the sweep, so a GPU with less free memory shortens every
rank's sweep alike instead of leaving the ranks on different rows.

Input patterns are small integers, exact in every dtype: for the reducing ops
each element is owned by one rank (``i mod n``) that adds a varying value on
top of a base of 1 from every rank, so the expected sum is exact for any world
size and a missing, doubled or misplaced contribution shows; for the copying
ops each rank's values are ``1 + (i + 7919 r) mod K``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import CheckContext, Outcome, Param, RequiredMetric, ThresholdRule, require
from gpuaccept.checks.collectives_expect import free_bytes, injected_fault, local_max_bytes, rank_busbw_expectation
from gpuaccept.checks.collectives_table import (  # re-exported: split from this module
    alg_bandwidth_gbs,
    bus_bandwidth_gbs,
    rank_table,
)
from gpuaccept.checks.collectives_table import (
    bus_factor as bus_factor,
)
from gpuaccept.checks.fabric_watch import DELTA_METRICS, DELTA_RULES, FABRIC_ROOT, FabricWatch
from gpuaccept.checks.nvlink_watch import DELTA_METRICS as NVLINK_DELTAS
from gpuaccept.checks.nvlink_watch import NvlinkWatch, node_reader
from gpuaccept.distributed.group import (
    Abandon,
    DistributedCheck,
    RankContext,
    agree_min,
    first_line,
    process_group,
)
from gpuaccept.hw.fabric_expect import MODELLED_OPS, Expectation
from gpuaccept.model import Metric, Status
from gpuaccept.nccltests.busbw import Reference, busbw_reference

if TYPE_CHECKING:
    import torch

OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")
OP_METRICS = ("time_us", "algbw_gbs", "busbw_gbs", "busbw_large_gbs", "wrong")
"""Each op's metrics: ``<op>_time_us`` and so on."""
PLACEMENTS: dict[str, tuple[str, ...]] = {
    "allreduce": ("in",), "broadcast": ("in",), "allgather": ("out", "in"), "reducescatter": ("out", "in"),
    "alltoall": ("out",), "sendrecv": ("out",),
}
# Bytes per element and the largest integer M such that 0..M are all exact in the dtype.
DTYPES: dict[str, tuple[int, int]] = {
    "float32": (4, 2**24), "float64": (8, 2**53), "float16": (2, 2048), "bfloat16": (2, 256),
    "int32": (4, 2**31 - 1), "int8": (1, 127),
}
STRIDE = 7919
COPY_MODULUS_CAP = 65521
CHUNK_ELEMS = 1 << 24  # elements per slice when filling and verifying (bounded temporary memory)


def sweep_sizes(min_bytes: int, max_bytes: int, step_factor: int) -> list[int]:
    """Sizes of the sweep in bytes, like nccl-tests ``-b min -e max -f factor``."""
    if min_bytes < 1 or max_bytes < min_bytes or step_factor < 2:
        raise ValueError(f"bad sweep: min_bytes={min_bytes}, max_bytes={max_bytes}, step_factor={step_factor}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= step_factor
    return sizes


def element_count(op: str, size_bytes: int, elem_bytes: int, n: int) -> int:
    """Elements of the op's large buffer for a nominal size (rounded down to a multiple of ``n`` where split)."""
    count = size_bytes // elem_bytes
    if op in ("allgather", "reducescatter", "alltoall"):
        count -= count % n
    return count


def _placement_word(inplace: bool) -> str:
    return "in-place" if inplace else "out-of-place"


def fmt_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class Pattern:
    """The exact integer values in every rank's input and every expected output (see module doc)."""

    world: int
    limit: int

    @property
    def copy_modulus(self) -> int:
        return min(self.limit, COPY_MODULUS_CAP) - 1

    @property
    def base(self) -> int:
        return 1 if self.limit - self.world >= 2 else 0

    @property
    def reduce_modulus(self) -> int:
        return max(1, min(self.copy_modulus, self.limit - self.base * self.world))

    def copy_values(self, rank: int, idx: torch.Tensor) -> torch.Tensor:
        return 1 + (idx + rank * STRIDE) % self.copy_modulus

    def reduce_values(self, rank: int, idx: torch.Tensor) -> torch.Tensor:
        owned = (idx % self.world == rank).to(idx.dtype)
        return self.base + owned * (1 + (idx // self.world) % self.reduce_modulus)

    def reduced_sum(self, idx: torch.Tensor) -> torch.Tensor:
        return self.base * self.world + 1 + (idx // self.world) % self.reduce_modulus


def _input_values(op: str, pat: Pattern, rank: int, idx: torch.Tensor) -> torch.Tensor:
    return pat.reduce_values(rank, idx) if op in ("allreduce", "reducescatter") else pat.copy_values(rank, idx)


def _expected_values(op: str, pat: Pattern, rank: int, idx: torch.Tensor, chunk: int) -> torch.Tensor:
    """Expected output at positions ``idx`` of this rank's output buffer."""
    n = pat.world
    if op == "allreduce":
        return pat.reduced_sum(idx)
    if op == "reducescatter":
        return pat.reduced_sum(rank * chunk + idx)
    if op == "allgather":
        return _by_rank(pat, idx // chunk, idx % chunk)
    if op == "broadcast":
        return pat.copy_values(0, idx)
    if op == "alltoall":
        return _by_rank(pat, idx // chunk, rank * chunk + idx % chunk)
    if op == "sendrecv":
        return pat.copy_values((rank - 1) % n, idx)
    raise ValueError(f"unknown op {op!r}")


def _by_rank(pat: Pattern, ranks: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return 1 + (idx + ranks * STRIDE) % pat.copy_modulus


def fill_input(op: str, tensor: torch.Tensor, rank: int, pat: Pattern) -> None:
    """Write this rank's input pattern into ``tensor`` (1-D), a slice at a time."""
    import torch

    for a in range(0, tensor.numel(), CHUNK_ELEMS):
        b = min(a + CHUNK_ELEMS, tensor.numel())
        idx = torch.arange(a, b, dtype=torch.int64, device=tensor.device)
        tensor[a:b].copy_(_input_values(op, pat, rank, idx))


def count_wrong(op: str, out: torch.Tensor, rank: int, pat: Pattern, chunk: int) -> tuple[int, int | None]:
    """Elements of ``out`` that differ from the exact expected value, and the first such index.

    Compared in float64, which holds every pattern value exactly; NaN and
    infinities count as wrong.
    """
    import torch

    wrong, first = 0, None
    for a in range(0, out.numel(), CHUNK_ELEMS):
        b = min(a + CHUNK_ELEMS, out.numel())
        idx = torch.arange(a, b, dtype=torch.int64, device=out.device)
        bad = out[a:b].to(torch.float64) != _expected_values(op, pat, rank, idx, chunk).to(torch.float64)
        n_bad = int(bad.sum().item())
        if n_bad and first is None:
            first = a + int(bad.nonzero()[0].item())
        wrong += n_bad
    return wrong, first


@dataclass
class Buffers:
    """One row's tensors: ``run()`` issues the collective; ``inp`` is filled, ``out`` is verified."""

    run: Callable[[], None]
    inp: torch.Tensor
    out: torch.Tensor
    chunk: int


def make_buffers(op: str, placement: str, send: torch.Tensor, recv: torch.Tensor, count: int,
                 rank: int, n: int) -> Buffers:
    """Views of the preallocated ``send``/``recv`` pools for one row, and the call that runs it."""
    import torch.distributed as dist

    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    chunk = count // n
    if op == "allreduce":
        buf = recv[:count]
        return Buffers(lambda: dist.all_reduce(buf), buf, buf, chunk)
    if op == "broadcast":
        buf = recv[:count]
        return Buffers(lambda: dist.broadcast(buf, src=0), buf, buf, chunk)
    if op == "allgather":
        out = recv[:count]
        inp = out[rank * chunk:(rank + 1) * chunk] if placement == "in" else send[:chunk]
        return Buffers(lambda: all_gather(out, inp), inp, out, chunk)
    if op == "reducescatter":
        inp = send[:count]
        out = inp[rank * chunk:(rank + 1) * chunk] if placement == "in" else recv[:chunk]
        return Buffers(lambda: reduce_scatter(out, inp), inp, out, chunk)
    if op == "alltoall":
        inp, out = send[:count], recv[:count]
        return Buffers(lambda: dist.all_to_all_single(out, inp), inp, out, chunk)
    if op == "sendrecv":
        inp, out = send[:count], recv[:count]
        peer_to, peer_from = (rank + 1) % n, (rank - 1) % n

        def sendrecv() -> None:
            ops = [dist.P2POp(dist.isend, inp, peer_to), dist.P2POp(dist.irecv, out, peer_from)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        return Buffers(sendrecv, inp, out, chunk)
    raise ValueError(f"unknown op {op!r}")


def time_op(run: Callable[[], None], warmup: int, iters: int, sync: Callable[[], None]) -> float:
    """Seconds per operation: ``warmup`` untimed calls, a barrier, then ``iters`` back-to-back timed calls
    closed by one device synchronisation (nccl-tests' loop, timed on this rank's clock)."""
    import torch.distributed as dist

    for _ in range(warmup):
        run()
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    sync()
    return (time.perf_counter() - t0) / iters


@dataclass
class Row:
    """One measured line of the sweep (one rank's view). ``wrong`` is None when not verified."""

    op: str
    dtype: str
    inplace: bool
    size_bytes: int
    count: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None

    @property
    def key(self) -> str:
        return f"{self.op}/{self.dtype}/{'in' if self.inplace else 'out'}/{self.size_bytes}"

    def compact(self) -> list[Any]:
        return [self.op, self.dtype, "in" if self.inplace else "out", self.size_bytes, round(self.time_us, 3),
                round(self.algbw_gbs, 4), round(self.busbw_gbs, 4), self.wrong]


def placements_for(op: str, wanted: Sequence[str]) -> tuple[str, ...]:
    """The requested placements ``op`` supports, else the one it has (allreduce is in-place in torch)."""
    chosen = tuple(p for p in PLACEMENTS[op] if p in wanted)
    return chosen or PLACEMENTS[op][:1]


def planned_rows(ops: Sequence[str], dtypes: Sequence[str], placements: Sequence[str], sizes: Sequence[int],
                 n: int) -> list[tuple[str, str, bool, int]]:
    """``(op, dtype, inplace, size_bytes)`` of every row a sweep over ``n`` ranks measures, in order."""
    return [(op, dt, pl == "in", element_count(op, size, DTYPES[dt][0], n) * DTYPES[dt][0])
            for dt in dtypes for op in ops for pl in placements_for(op, placements) for size in sizes
            if element_count(op, size, DTYPES[dt][0], n)]


def _summary_metrics(rows: list[Row], rc: RankContext, judge_min_bytes: int, tags: dict[str, str | int | float],
                     reference: Callable[[str], Reference]) -> list[Metric]:
    out: list[Metric] = []
    for op in dict.fromkeys(r.op for r in rows):
        mine = [r for r in rows if r.op == op]
        floor = judge_min_bytes or max(r.size_bytes for r in mine)
        large = [r for r in mine if r.size_bytes >= floor] or [max(mine, key=lambda r: r.size_bytes)]
        low = min(large, key=lambda r: r.busbw_gbs)
        ref = reference(op)
        out.append(Metric(f"{op}_busbw_large_gbs", low.busbw_gbs, "GB/s", device=rc.device_label,
                          expected=ref.expected, threshold=ref.threshold, expected_source=ref.expected_source,
                          tags={**tags, "op": op, "size_bytes": low.size_bytes, "dtype": low.dtype,
                                "inplace": int(low.inplace)}, performance=op in MODELLED_OPS))
        checked = [r.wrong for r in mine if r.wrong is not None]
        if checked:
            out.append(Metric(f"{op}_wrong", float(sum(checked)), "count", device=rc.device_label,
                              tags={**tags, "op": op}))
    return out


def rows_to_outcome(rows: list[Row], rc: RankContext, *, judge_min_bytes: int = 0, min_busbw_gbs: float = 0.0,
                    fabric: Mapping[str, Expectation] | None = None, backend: str = "gloo",
                    failure: str | None = None, details: dict[str, Any] | None = None,
                    planned: Sequence[tuple[str, str, bool, int]] = ()) -> Outcome:
    """Metrics, status and reason of one rank's sweep (pure).

    Per-row figures and ``details["rows"]`` come from rank 0 only (the job's rows, as in nccl-tests); other
    ranks keep theirs only as evidence of a failure (see the module doc).

    ``fabric`` maps an op to its fabric-derived busbw expectation
    (:func:`gpuaccept.checks.collectives_expect.busbw_expectation`); the bound of each
    ``<op>_busbw_large_gbs`` comes from :func:`gpuaccept.nccltests.busbw.busbw_reference`, as in
    the nccl_tests check. ``failure`` is the error that cut the sweep short. A passing sweep
    lacking the busbw of a ``planned`` row (:func:`planned_rows`) is an ERROR naming the row.
    """
    tags: dict[str, str | int | float] = {"rank": rc.rank}
    bad = [r for r in rows if r.wrong]
    job_rows = rc.rank == 0 or failure is not None or bool(bad)
    metrics: list[Metric] = []
    for r in rows:
        t = {**tags, "op": r.op, "size_bytes": r.size_bytes, "count": r.count, "dtype": r.dtype,
             "inplace": int(r.inplace)}
        metrics += [Metric(f"{r.op}_time_us", r.time_us, "us", device=rc.device_label, tags=dict(t)),
                    Metric(f"{r.op}_algbw_gbs", r.algbw_gbs, "GB/s", device=rc.device_label, tags=dict(t)),
                    Metric(f"{r.op}_busbw_gbs", r.busbw_gbs, "GB/s", device=rc.device_label, tags=dict(t))]
    fabric = fabric or {}

    def reference(op: str) -> Reference:
        return busbw_reference(fabric.get(op), min_busbw_gbs=min_busbw_gbs or None)

    if rows:
        metrics += _summary_metrics(rows, rc, judge_min_bytes, tags, reference)
    info = dict(details or {})
    if job_rows:
        info["rows"] = [r.compact() for r in rows]
        info["row_columns"] = ["op", "dtype", "placement", "size_bytes", "time_us", "algbw_gbs", "busbw_gbs",
                               "wrong"]
    where = f"rank {rc.rank} ({rc.host_of(rc.rank)}, {rc.device_label})"
    if failure is not None:
        return Outcome(Status.ERROR, f"{where}: {failure}" + (f" after {len(rows)} good rows" if rows else ""),
                       metrics, info)
    if bad:
        listed = "; ".join(f"{r.op} {r.dtype} {_placement_word(r.inplace)} {fmt_bytes(r.size_bytes)}: "
                           f"{r.wrong} wrong" for r in bad[:3])
        more = f"; and {len(bad) - 3} more rows" if len(bad) > 3 else ""
        return Outcome.failed(f"{where}: wrong results: {listed}{more}", metrics, **info)
    if not rows:
        return Outcome(Status.ERROR, f"{where}: no size of the sweep fits the world size", metrics, info)
    first = rows[0].op
    top = max(r.size_bytes for r in rows if r.op == first)
    best = min((r for r in rows if r.op == first and r.size_bytes == top), key=lambda r: r.busbw_gbs)
    ops = list(dict.fromkeys(r.op for r in rows))
    sizes = sorted({r.size_bytes for r in rows})
    checked = "every element right" if all(r.wrong is not None for r in rows) else "results not verified"
    reason = (f"{rc.world_size} ranks ({backend}): {len(ops)} ops x {len(sizes)} sizes "
              f"{fmt_bytes(sizes[0])}-{fmt_bytes(sizes[-1])}, {checked}; {first} busbw "
              f"{best.busbw_gbs:.3g} GB/s at {fmt_bytes(top)}")
    ref = reference(first)
    if ref.threshold is None:
        reason += " (no bandwidth expectation here: not judged)"
    elif ref.expected is not None:
        reason += f" (expected {ref.expected:.4g}, {ref.expected_source})"
    required = [RequiredMetric(f"{op}_busbw_gbs", rc.device_label,
                               (("dtype", dt), ("inplace", int(inp)), ("size_bytes", size)))
                for op, dt, inp, size in planned]
    outcome = require(Outcome.passed(reason, metrics, **info), required)
    if not job_rows:  # checked against every row above; the rows themselves are rank 0's to report
        outcome.metrics[:] = [m for m in outcome.metrics if m.name.endswith(("_busbw_large_gbs", "_wrong"))]
    return outcome


class CollectivesCheck(DistributedCheck):
    """Collective sweep with nccl-tests semantics on every rank; every element verified."""

    name = "collectives"
    tag = "COLLECTIVES"
    summary = ("allreduce, allgather, reducescatter, alltoall, broadcast, sendrecv across ranks: time, algbw, "
               "busbw per size; every element checked")
    key_metric = "*_busbw_large_gbs"
    metrics = (*(f"{op}_{m}" for op in OPS for m in OP_METRICS), *DELTA_METRICS, *NVLINK_DELTAS)
    params = (
        Param("ops", "list", list(OPS), "operations to sweep", choices=OPS),
        Param("dtypes", "list", ["float32"], "element types", choices=tuple(DTYPES)),
        Param("placements", "list", ["out", "in"], "out-of-place and/or in-place (where torch offers it)",
              choices=("out", "in")),
        Param("min_bytes", "int", 4096, "smallest message in bytes (nccl-tests -b)", minimum=1, maximum=1 << 36),
        Param("max_bytes", "int", 256 << 20, "largest message in bytes on GPUs (nccl-tests -e)", minimum=1,
              maximum=1 << 36),
        Param("cpu_max_bytes", "int", 64 << 10, "largest message in bytes with gloo on CPU", minimum=1,
              maximum=1 << 32),
        Param("step_factor", "int", 16, "multiplication factor between sizes (nccl-tests -f)", minimum=2,
              maximum=1024),
        Param("warmup", "int", 2, "untimed operations per row (nccl-tests -w)", minimum=0, maximum=10_000),
        Param("iters", "int", 5, "timed operations per row (nccl-tests -n)", minimum=1, maximum=100_000),
        Param("check", "bool", True, "verify every element of one extra operation per row (nccl-tests -c)"),
        Param("min_busbw_gbs", "float", 0.0, "required busbw at the judged sizes, GB/s (0: SKU or none)",
              minimum=0.0, maximum=10000.0),
        Param("judge_min_bytes", "int", 0, "sizes in bytes at least this large are judged (0: only the largest)",
              minimum=0, maximum=1 << 36),
        FABRIC_ROOT,
    )
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"min_bytes": 4096, "max_bytes": 256 << 20, "step_factor": 16, "warmup": 2, "iters": 5,
                  "cpu_max_bytes": 64 << 10, "dtypes": ["float32"]},
        "standard": {"min_bytes": 1024, "max_bytes": 1 << 30, "step_factor": 4, "warmup": 5, "iters": 20,
                     "cpu_max_bytes": 1 << 20, "dtypes": ["float32", "bfloat16"]},
        "full": {"min_bytes": 8, "max_bytes": 8 << 30, "step_factor": 2, "warmup": 10, "iters": 50,
                 "cpu_max_bytes": 16 << 20, "dtypes": ["float32", "bfloat16", "float16", "int32"]},
    }
    thresholds = (ThresholdRule(metric="*_wrong", max=0.0), *DELTA_RULES)
    timeout_s: ClassVar[dict[str, float]] = {"quick": 120.0, "standard": 600.0, "full": 3600.0}

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        top = int(params["max_bytes" if device == "cuda" else "cpu_max_bytes"])
        rows = len(params["dtypes"]) * sum(len(placements_for(op, params["placements"])) for op in params["ops"])
        sizes = sweep_sizes(min(int(params["min_bytes"]), top), top, int(params["step_factor"]))
        return estimates.collective_sweep(sizes, rows, int(params["warmup"]) + int(params["iters"]) + 1, device)

    def run_rank(self, ctx: CheckContext, rc: RankContext) -> Outcome:
        p = ctx.params
        requested = int(p["max_bytes"] if ctx.device == "cuda" else min(p["max_bytes"], p["cpu_max_bytes"]))
        details: dict[str, Any] = {"world_size": rc.world_size, "rank": rc.rank, "host": rc.host_of(rc.rank),
                                   "launcher": rc.launcher}
        rows: list[Row] = []
        failure: str | None = None
        with process_group(rc, ctx.device) as pg:
            details["backend"] = pg.backend
            mine = local_max_bytes(requested, free_bytes(ctx.device, rc))
            max_bytes = agree_min(mine, pg.device)  # every rank must build the same sweep
            if max_bytes < requested:
                details["max_bytes_requested"] = requested
            if max_bytes < mine:
                details["max_bytes_local"] = mine
                ctx.log(f"rank {rc.rank}: largest message {fmt_bytes(max_bytes)}, agreed with the rank with the "
                        f"least free memory (this rank could hold {fmt_bytes(mine)})")
            details["max_bytes"] = max_bytes
            sizes = sweep_sizes(min(int(p["min_bytes"]), max_bytes), max_bytes, int(p["step_factor"]))
            fabric, why, sku = rank_busbw_expectation(rc, ctx.device, max(sizes), pg.device, p["ops"],
                                                      str(p.get("fabric_root", "/")))
            details["busbw_expectation"] = why
            if sku is not None:  # the SKU a baseline is looked up under
                details["sku"] = {rc.device_label: sku}
            where = ["setting up"]
            watch = FabricWatch.start(str(p.get("fabric_root", "/"))) if rc.local_rank == 0 else None  # once a node
            links = NvlinkWatch.start(node_reader) if rc.local_rank == 0 and ctx.device == "cuda" else None
            started = time.monotonic()
            def partial() -> Outcome:
                return rows_to_outcome(rows, rc, backend=pg.backend, details=details,
                                       failure=f"stopped during {where[0]} before the sweep ended")

            try:
                self._sweep(ctx, rc, pg.device, sizes, rows, where, lambda: self.checkpoint(partial))
            except Exception as exc:
                failure = f"{where[0]} failed after {time.monotonic() - started:.1f} s: {first_line(exc)}"
                ctx.log(f"rank {rc.rank}: {failure}")
            if failure is None:
                try:
                    details.update(self._gather(rc, pg.device, rows))
                except Exception as exc:
                    failure = f"gathering per-rank timings failed: {first_line(exc)}"
            outcome = rows_to_outcome(rows, rc, judge_min_bytes=int(p["judge_min_bytes"]),
                                      min_busbw_gbs=float(p["min_busbw_gbs"]), fabric=fabric,
                                      backend=pg.backend, failure=failure, details=details,
                                      planned=planned_rows(p["ops"], p["dtypes"], p["placements"], sizes,
                                                           rc.world_size))
            if watch is not None:
                watch.finish(outcome)
            if links is not None:
                links.finish(outcome)
            if failure is not None:
                raise Abandon(outcome)
        rail = ctx.gpus[rc.local_rank] if ctx.gpus and rc.local_rank < len(ctx.gpus) else rc.device_index
        fault = injected_fault(os.environ, details["host"], rail)  # tests only
        return Outcome.failed(fault, outcome.metrics, **outcome.details) if fault else outcome

    def _sweep(self, ctx: CheckContext, rc: RankContext, device: Any, sizes: list[int], rows: list[Row],
               where: list[str], after_row: Callable[[], None]) -> None:
        """Measure every row into ``rows``; ``where[0]`` names the row in progress (for error messages);
        ``after_row`` runs after each row (to checkpoint what was measured)."""
        import torch

        p = ctx.params
        n, rank = rc.world_size, rc.rank
        sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        for dtype_name in p["dtypes"]:
            elem, limit = DTYPES[dtype_name]
            dtype = getattr(torch, dtype_name)
            pat = Pattern(n, limit)
            pool = max(sizes) // elem + n
            send = torch.zeros(pool, dtype=dtype, device=device)
            recv = torch.zeros(pool, dtype=dtype, device=device)
            for op in p["ops"]:
                for placement in placements_for(op, p["placements"]):
                    for size in sizes:
                        count = element_count(op, size, elem, n)
                        if count == 0:
                            continue
                        where[0] = f"{op} {dtype_name} {_placement_word(placement == 'in')} {fmt_bytes(count * elem)}"
                        bufs = make_buffers(op, placement, send, recv, count, rank, n)
                        fill_input(op, bufs.inp, rank, pat)
                        elapsed = time_op(bufs.run, int(p["warmup"]), int(p["iters"]), sync)
                        wrong: int | None = None
                        if p["check"]:
                            fill_input(op, bufs.inp, rank, pat)
                            bufs.run()
                            sync()
                            wrong, first = count_wrong(op, bufs.out, rank, pat, bufs.chunk)
                            if wrong:
                                ctx.log(f"rank {rank}: {where[0]}: {wrong} wrong, first at element {first}")
                        size_b = count * elem
                        row = Row(op, dtype_name, placement == "in", size_b, count, elapsed * 1e6,
                                  alg_bandwidth_gbs(size_b, elapsed), bus_bandwidth_gbs(op, size_b, elapsed, n), wrong)
                        rows.append(row)
                        after_row()
                        ctx.log(f"rank {rank}: {where[0]}: {row.time_us:.1f} us, algbw {row.algbw_gbs:.3g} GB/s, "
                                f"busbw {row.busbw_gbs:.3g} GB/s, wrong {wrong}")
            del send, recv

    def _gather(self, rc: RankContext, device: Any, rows: list[Row]) -> dict[str, Any]:
        """All-gather every rank's (time, wrong) per row; rank 0 keeps the table."""
        import torch
        import torch.distributed as dist

        mine = torch.tensor([[r.time_us, float(r.wrong or 0)] for r in rows] or [[0.0, 0.0]],
                            dtype=torch.float64, device=device)
        every = torch.empty((rc.world_size * mine.shape[0], 2), dtype=torch.float64, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(every, mine)
        if rc.rank != 0 or not rows:
            return {}
        data = every.view(rc.world_size, mine.shape[0], 2).cpu().tolist()
        times = [[row[0] for row in data[k]] for k in range(rc.world_size)]
        wrongs = [[row[1] for row in data[k]] for k in range(rc.world_size)]
        return rank_table(rows, times, wrongs, rc.world_size, rc.hosts)


CHECKS = (CollectivesCheck,)
