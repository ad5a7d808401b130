"""Scenarios run as real gloo ranks by tests/test_dist_procs.py (``python -m tests.dist_scenarios ...``).

``corrupt RANK WORLD PORT OUT``: every collective of the collectives check on
real buffers, then deliberate corruptions (an input element, an output element
after the collective, a NaN in bf16) and a perturbed DDP parameter; writes what
the verification code counted to OUT as JSON. Rank 0 serves the store.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any


def corrupt(rank: int, world: int, port: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from gpuaccept.checks.collectives import DTYPES, OPS, Pattern, count_wrong, fill_input, make_buffers
    from gpuaccept.checks.ddp import mismatched_ranks, param_digest

    store = dist.TCPStore("127.0.0.1", port, None, rank == 0, timedelta(seconds=30), wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30))
    out: dict[str, Any] = {"clean": {}, "corrupt": {}}
    count = 96 * world
    for dtype_name in ("float32", "bfloat16", "int32"):
        _elem, limit = DTYPES[dtype_name]
        pat = Pattern(world, limit)
        send = torch.zeros(count, dtype=getattr(torch, dtype_name))
        recv = torch.zeros(count, dtype=getattr(torch, dtype_name))
        for op in OPS:
            for placement in ("out", "in"):
                b = make_buffers(op, placement, send, recv, count, rank, world)
                fill_input(op, b.inp, rank, pat)
                b.run()
                out["clean"][f"{op}/{dtype_name}/{placement}"] = count_wrong(op, b.out, rank, pat, b.chunk)[0]
    pat = Pattern(world, DTYPES["float32"][1])
    send, recv = torch.zeros(count), torch.zeros(count)
    # 1. one rank's input element is off by one: the reduced element is wrong on every rank
    b = make_buffers("allreduce", "in", send, recv, count, rank, world)
    fill_input("allreduce", b.inp, rank, pat)
    if rank == 1:
        b.inp[5] += 1
    b.run()
    out["corrupt"]["allreduce_input"] = count_wrong("allreduce", b.out, rank, pat, b.chunk)
    # 2. an element of rank 0's gathered output flipped after the collective: only rank 0 sees it
    b = make_buffers("allgather", "out", send, recv, count, rank, world)
    fill_input("allgather", b.inp, rank, pat)
    b.run()
    if rank == 0:
        b.out[b.chunk + 3] = -7
    out["corrupt"]["allgather_output"] = count_wrong("allgather", b.out, rank, pat, b.chunk)
    # 3. a NaN in a bf16 all-to-all input travels to one peer
    bpat = Pattern(world, DTYPES["bfloat16"][1])
    bs, br = torch.zeros(count, dtype=torch.bfloat16), torch.zeros(count, dtype=torch.bfloat16)
    b = make_buffers("alltoall", "out", bs, br, count, rank, world)
    fill_input("alltoall", b.inp, rank, bpat)
    if rank == 0:
        b.inp[b.chunk + 1] = float("nan")  # the chunk rank 0 sends to rank 1
    b.run()
    out["corrupt"]["alltoall_nan"] = count_wrong("alltoall", b.out, rank, bpat, b.chunk)
    # 4. a collective that silently did nothing leaves every element wrong
    out["not_run"] = {}
    for op in ("allreduce", "allgather"):
        send.zero_()
        recv.zero_()
        b = make_buffers(op, "out", send, recv, count, rank, world)
        fill_input(op, b.inp, rank, pat)
        out["not_run"][op] = count_wrong(op, b.out, rank, pat, b.chunk)[0]
    # 5. DDP parameter checksums: rank 1 perturbs one weight by one ulp
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    if rank == 1:
        with torch.no_grad():
            model.weight[0, 0] = torch.nextafter(model.weight[0, 0], torch.tensor(2.0))
    mine = torch.tensor(list(param_digest(model)), dtype=torch.uint8)
    every = torch.empty(world * 32, dtype=torch.uint8)
    dist.all_gather_into_tensor(every, mine)
    raw = every.tolist()
    out["ddp_mismatch"] = mismatched_ranks([bytes(raw[k * 32:(k + 1) * 32]) for k in range(world)])
    out["chunk"] = count // world
    dist.barrier()
    dist.destroy_process_group()
    return out


def main(argv: list[str]) -> int:
    if argv[0] == "corrupt":
        rank, world, port, path = int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
        result = corrupt(rank, world, port)
        with open(path, "w") as fh:
            json.dump(result, fh)
        return 0
    print(f"unknown scenario {argv[0]!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
