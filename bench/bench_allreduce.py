"""The collectives check's allreduce busbw against a plain torch.distributed loop, same ranks, same sizes.

Spawns ``--ranks`` processes itself (gloo on CPU, NCCL with one GPU per rank
when ``--device cuda``). Each size is measured in alternating rounds: the
check's own path (``make_buffers`` + ``time_op`` from
``gpuaccept.checks.collectives``, in-place allreduce on a slice of its
preallocated pool) and an independently written loop here (a fresh tensor,
``dist.all_reduce`` in a loop, synchronised, timed with ``perf_counter``).
Bus bandwidth for the reference is computed here from the nccl-tests formula,
not with the check's helpers. Rank 0 prints one line per size with the median
of the rounds and the ratio check / reference of the best round each (goal
>= 0.95 at the largest size; the ratio of medians is printed too), then
``BENCH {json}``.

Usage: ``python bench/bench_allreduce.py [--device cpu|cuda] [--ranks N] [--sizes 65536,1048576,...]
[--iters N] [--rounds N]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any


def reference_busbw_gbs(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests allreduce busbw, written out independently: bytes/s x 2(n-1)/n, in GB/s."""
    return size_bytes / seconds * (2.0 * (ranks - 1) / ranks) / 1e9


def worker(rank: int, ranks: int, port: int, device: str, sizes: list[int], iters: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from gpuaccept.checks.collectives import bus_bandwidth_gbs, make_buffers, time_op

    store = dist.TCPStore("127.0.0.1", port, None, rank == 0, timedelta(seconds=60), wait_for_workers=False)
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        backend = "nccl"

        def sync() -> None:
            torch.cuda.synchronize()
    else:
        dev = torch.device("cpu")
        backend = "gloo"

        def sync() -> None:
            return None
    dist.init_process_group(backend, store=store, rank=rank, world_size=ranks, timeout=timedelta(seconds=120))
    pool_send = torch.zeros(max(sizes) // 4, dtype=torch.float32, device=dev)
    pool_recv = torch.zeros(max(sizes) // 4, dtype=torch.float32, device=dev)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        count = size // 4
        ours: list[float] = []
        plain: list[float] = []
        bufs = make_buffers("allreduce", "in", pool_send, pool_recv, count, rank, ranks)
        ref = torch.ones(count, dtype=torch.float32, device=dev)
        for _ in range(rounds):
            seconds = time_op(bufs.run, 3, iters, sync)
            ours.append(bus_bandwidth_gbs("allreduce", size, seconds, ranks))
            for _ in range(3):
                dist.all_reduce(ref)
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(ref)
            sync()
            plain.append(reference_busbw_gbs(size, (time.perf_counter() - t0) / iters, ranks))
        a, b = max(ours), max(plain)
        ma, mb = statistics.median(ours), statistics.median(plain)
        rows.append({"size_bytes": size, "check_busbw_gbs": a, "plain_busbw_gbs": b, "ratio": a / b,
                     "median_ratio": ma / mb})
        if rank == 0:
            print(f"allreduce {size:>11} B  best of {rounds}: check {a:9.4f} GB/s, plain loop {b:9.4f} GB/s, "
                  f"ratio {a / b:.3f}; medians {ma:.4g} / {mb:.4g} = {ma / mb:.3f}", flush=True)
    if rank == 0:
        print("BENCH " + json.dumps({"bench": "allreduce", "device": device, "backend": backend, "ranks": ranks,
                                     "iters": iters, "rounds": rounds, "rows": rows,
                                     "ratio_at_largest": rows[-1]["ratio"]}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--ranks", type=int, default=None, help="processes (default: GPUs on cuda, 2 on cpu)")
    ap.add_argument("--sizes", default=None, help="bytes, comma-separated (default depends on the device)")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--worker", nargs=2, type=int, metavar=("RANK", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "cpu"
    if args.ranks is None:
        if device == "cuda":
            import torch

            args.ranks = torch.cuda.device_count()
        else:
            args.ranks = 2
    gpu = device == "cuda"
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [1 << 20, 16 << 20, 256 << 20, 1 << 30] if gpu else [64 << 10, 1 << 20, 8 << 20])
    iters = args.iters or (50 if gpu else 20)
    if args.worker:
        worker(args.worker[0], args.ranks, args.worker[1], device, sizes, iters, args.rounds)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.ranks)))
    base = [sys.executable, __file__, "--device", device, "--ranks", str(args.ranks), "--sizes",
            ",".join(map(str, sizes)), "--iters", str(iters), "--rounds", str(args.rounds)]
    procs = [subprocess.Popen([*base, "--worker", str(r), str(port)], env=env) for r in range(args.ranks)]
    codes = [p.wait() for p in procs]
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
