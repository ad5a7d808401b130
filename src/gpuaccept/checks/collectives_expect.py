"""What the collectives sweep may expect of this node: its largest message and its bus bandwidth.

Largest message: a quarter of the device's free memory at most (two buffer
pools plus verification slices and the backend's buffers); the ranks then
agree on the smallest cap (:func:`gpuaccept.distributed.group.agree_min`).

Bus bandwidth (allreduce, allgather, reducescatter at the largest size of at
least 64 MiB, on one node): ``nvlink_gbs / 2`` (one direction) times the SKU's
``nvlink`` pass fraction, only where NVLink joins every pair of ranks: the SKU
has ``nvlink_all_pairs`` (SXM on HGX: NVSwitch or a full mesh), or NVML reports
NVLink P2P between every pair of the ranks' GPUs (``nvidia-smi topo -p2p n``
all OK; bridged PCIe/NVL cards whose bridge spans every rank). Otherwise no
expectation: the ring crosses PCIe, where busbw depends on PCIe switches,
sockets and P2P settings more than on the cards' PCIe generation and width
(the host link itself is judged by the memory check's host copies), so a
SKU-derived bound would fail healthy servers; set ``min_busbw_gbs`` for such
fleets. Across nodes the network sets the bandwidth: no SKU expectation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuaccept.distributed.group import RankContext, all_gather_text
from gpuaccept.hw.p2p import Matrix, joins_every_pair, nvlink_matrix

if TYPE_CHECKING:
    from gpuaccept.hw.sku import Sku

LARGE_ENOUGH_BYTES = 64 << 20  # below this, busbw says little about the links: no SKU expectation
SKU_JUDGED_OPS = ("allreduce", "allgather", "reducescatter")
FREE_BYTES_ENV = "GPUACCEPT_TEST_FREE_BYTES"
FAULT_HOST_ENV = "GPUACCEPT_TEST_FAULT_HOST"

Expectation = tuple[str, float, float]  # (source such as "sku:h100_sxm", expected busbw GB/s, pass fraction)


def free_bytes_override(env: Mapping[str, str], rank: int) -> int | None:
    """Free memory this rank is told it has, from ``GPUACCEPT_TEST_FREE_BYTES=RANK=BYTES[,RANK=BYTES]``
    (tests: a rank with a leftover process, on CPU too); None when this rank is not listed."""
    for item in env.get(FREE_BYTES_ENV, "").split(","):
        who, _, val = item.partition("=")
        if who.strip() == str(rank) and val.strip():
            return int(val)
    return None


def injected_fault(env: Mapping[str, str], host: str) -> str | None:
    """Tests only: ``GPUACCEPT_TEST_FAULT_HOST=H1[,H2]`` makes the ranks on those hosts fail the check, as a broken
    node would (``gpuaccept isolate`` must then find them); None on every other host and without the variable."""
    hosts = {h.strip() for h in env.get(FAULT_HOST_ENV, "").split(",") if h.strip()}
    return f"injected fault on {host} ({FAULT_HOST_ENV})" if host in hosts else None


def free_bytes(device: str, rc: RankContext) -> int | None:
    """Free memory of this rank's device in bytes (``torch.cuda.mem_get_info``); None on CPU."""
    override = free_bytes_override(os.environ, rc.rank)
    if override is not None or device != "cuda" or rc.device_index is None:
        return override
    import torch

    return int(torch.cuda.mem_get_info(rc.device_index)[0])


def local_max_bytes(max_bytes: int, free: int | None) -> int:
    """Largest message this rank can hold: ``max_bytes``, or a quarter of ``free`` bytes when that is less."""
    if free is None or 4 * max_bytes <= free:
        return max_bytes
    return max(1, free // 4)


def busbw_expectation(sku: Sku | None, num_nodes: int, max_bytes: int, nvlink: Matrix | None
                      ) -> tuple[Expectation | None, str]:
    """The busbw expectation and why (see the module doc). ``nvlink`` is the NVLink P2P matrix of the
    ranks' GPUs (:func:`gpuaccept.hw.p2p.nvlink_matrix`), None when unknown."""
    if num_nodes != 1:
        return None, f"ranks on {num_nodes} nodes: the network sets the bandwidth, no SKU expectation"
    if max_bytes < LARGE_ENOUGH_BYTES:
        return None, f"largest size below {LARGE_ENOUGH_BYTES >> 20} MiB: no SKU expectation"
    if sku is None:
        return None, "GPU model not in the SKU table: no expectation"
    if not sku.nvlink_gbs:
        return None, f"{sku.id} has no NVLink: GPUs meet over PCIe, no SKU expectation"
    if sku.nvlink_all_pairs:
        why = f"{sku.id}: NVLink joins every GPU pair (NVSwitch or full mesh)"
    elif joins_every_pair(nvlink):
        why = f"{sku.id}: NVML reports NVLink P2P between every pair of ranks"
    else:
        seen = "unknown (NVML unavailable)" if nvlink is None else "not between every pair of ranks"
        return None, (f"{sku.id}: NVLink {seen} (bridges join pairs or quads): traffic crosses PCIe, "
                      "no SKU expectation")
    try:
        frac = sku.pass_fraction("nvlink")
    except KeyError:
        return None, f"{why}, but no nvlink pass fraction"
    return (f"sku:{sku.id}", sku.nvlink_gbs / 2, frac), why


def nvml_uuid(props: Any) -> str:
    """NVML's name (``GPU-<uuid>``) of the GPU whose ``torch.cuda.get_device_properties`` are ``props``;
    "" when torch does not report it."""
    uuid = str(getattr(props, "uuid", "") or "")
    return uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def rank_busbw_expectation(rc: RankContext, device: str, max_bytes: int, torch_device: Any
                           ) -> tuple[Expectation | None, str]:
    """:func:`busbw_expectation` for this rank. On one CUDA node every rank all-gathers its GPU's UUID
    (a collective: every rank calls this) and reads the NVLink P2P matrix from NVML."""
    if device != "cuda" or rc.device_index is None:
        return None, "not on GPUs: no bandwidth expectation"
    import torch

    from gpuaccept.hw.sku import match_sku

    matrix = None
    if rc.num_nodes == 1:
        uuids = all_gather_text(nvml_uuid(torch.cuda.get_device_properties(rc.device_index)), torch_device)
        sku = match_sku(torch.cuda.get_device_name(rc.device_index))
        if all(uuids) and sku is not None and sku.nvlink_gbs and not sku.nvlink_all_pairs:
            matrix = nvlink_matrix(uuids)
    else:
        sku = match_sku(torch.cuda.get_device_name(rc.device_index))
    return busbw_expectation(sku, rc.num_nodes, max_bytes, matrix)
