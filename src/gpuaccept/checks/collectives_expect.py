"""What the collectives sweep may expect of this node: its largest message and its bus bandwidth.

Largest message: a quarter of the device's free memory at most (two buffer
pools plus verification slices and the backend's buffers); the ranks then
agree on the smallest cap (:func:`gpuaccept.distributed.group.agree_min`).

Bus bandwidth (allreduce, allgather, reducescatter, alltoall at the largest size of at least
64 MiB): the fabric model of :mod:`gpuaccept.hw.fabric_expect` fed with what the ranks report:
each rank's GPU links from NVML (active NVLink links, PCIe generation and width), the NVLink P2P
matrix on one node (``nvidia-smi topo -p2p n``), and across nodes each node's RDMA ports from
sysfs (the ``fabric`` check's reader). The bound is set by :mod:`gpuaccept.nccltests.busbw`, the
path the ``nccl_tests`` check shares.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpuaccept.distributed.group import RankContext, all_gather_text
from gpuaccept.errors import GpuacceptError
from gpuaccept.hw.fabric_expect import Expectation, FabricInputs, GpuLinks, NodeNics, expect_all, node_nics
from gpuaccept.hw.p2p import Matrix, joins_every_pair, nvlink_matrix, read_gpu_links

if TYPE_CHECKING:
    from gpuaccept.hw.sku import Sku

LARGE_ENOUGH_BYTES = 64 << 20  # below this, busbw says little about the links: no fabric expectation
FREE_BYTES_ENV = "GPUACCEPT_TEST_FREE_BYTES"
FAULT_HOST_ENV = "GPUACCEPT_TEST_FAULT_HOST"
GATHER_WIDTH = 192  # bytes per rank of the gathered fabric facts (UUID, links, NICs as JSON)


def free_bytes_override(env: Mapping[str, str], rank: int) -> int | None:
    """Free memory this rank is told it has, from ``GPUACCEPT_TEST_FREE_BYTES=RANK=BYTES[,RANK=BYTES]``
    (tests: a rank with a leftover process, on CPU too); None when this rank is not listed."""
    for item in env.get(FREE_BYTES_ENV, "").split(","):
        who, _, val = item.partition("=")
        if who.strip() == str(rank) and val.strip():
            return int(val)
    return None


def injected_fault(env: Mapping[str, str], host: str, rail: int | None = None) -> str | None:
    """Tests only: ``GPUACCEPT_TEST_FAULT_HOST=H1[,H2]`` makes the ranks on those hosts fail the check, as a broken
    node would (``gpuaccept isolate`` must then find them); None on every other host and without the variable.

    ``H:R`` is a broken rail R (GPU R and its NIC) of host H: it fails the ranks of H whose ``rail`` (the GPU
    the rank tests; None: not one GPU, the whole node) is R or None, so a whole-node test fails and a per-rail
    test fails on that rail only."""
    for item in env.get(FAULT_HOST_ENV, "").split(","):
        name, sep, which = item.strip().partition(":")
        if name != host or not name:
            continue
        if not sep:
            return f"injected fault on {host} ({FAULT_HOST_ENV})"
        if rail is None or which.strip() == str(rail):
            return f"injected fault on {host} rail {which.strip()} ({FAULT_HOST_ENV})"
    return None


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


def busbw_expectation(ops: Sequence[str], inputs: FabricInputs, max_bytes: int
                      ) -> tuple[dict[str, Expectation], str]:
    """The fabric expectation of each judged op (:func:`gpuaccept.hw.fabric_expect.expect_busbw`) and why;
    none when the largest size is below :data:`LARGE_ENOUGH_BYTES`."""
    if max_bytes < LARGE_ENOUGH_BYTES:
        return {}, f"largest size below {LARGE_ENOUGH_BYTES >> 20} MiB: no fabric expectation"
    found, why = expect_all(ops, inputs)
    by_reason: dict[str, list[str]] = {}
    for op, text in why.items():
        by_reason.setdefault(text, []).append(op)
    return found, "; ".join(f"{', '.join(names)}: {text}" for text, names in by_reason.items())


def _pack(uuid: str, links: GpuLinks | None, nics: NodeNics | None) -> str:
    """This rank's fabric facts as one short JSON line for :func:`all_gather_text`."""
    doc: dict[str, Any] = {"u": uuid}
    if links is not None:
        doc["l"] = [links.nvlink_links, links.pcie_gen, links.pcie_width]
    if nics is not None:
        doc["n"] = [nics.ports, nics.rate_gbps, nics.speed, nics.layer or "", nics.excluded]
    return json.dumps(doc, separators=(",", ":"))


def gathered_inputs(texts: Sequence[str], hosts: Sequence[str], sku: Sku | None, num_nodes: int,
                    gpus_per_node: int, matrix: Matrix | None = None) -> FabricInputs:
    """:class:`FabricInputs` from every rank's :func:`_pack` line (rank order) and host (pure)."""
    docs = []
    for t in texts:
        try:
            docs.append(json.loads(t))
        except ValueError:  # cut at the width: this rank's facts are unknown
            docs.append({})
    gpus = [GpuLinks(*d["l"]) for d in docs if "l" in d]
    nics: dict[str, NodeNics] = {}
    for d, host in zip(docs, hosts, strict=False):
        if "n" in d and host not in nics:
            ports, rate, speed, layer, excluded = d["n"]
            nics[host] = NodeNics(host, int(ports), float(rate), speed, layer or None, int(excluded))
    return FabricInputs(sku, num_nodes, gpus_per_node, gpus if len(gpus) == len(docs) else None,
                        joins_every_pair(matrix) if matrix is not None else None,
                        list(nics.values()) if num_nodes > 1 else None)


def nvml_uuid(props: Any) -> str:
    """NVML's name (``GPU-<uuid>``) of the GPU whose ``torch.cuda.get_device_properties`` are ``props``;
    "" when torch does not report it."""
    uuid = str(getattr(props, "uuid", "") or "")
    return uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def rank_busbw_expectation(rc: RankContext, device: str, max_bytes: int, torch_device: Any, ops: Sequence[str],
                           fabric_root: str = "/") -> tuple[dict[str, Expectation], str, str | None]:
    """:func:`busbw_expectation` for this rank's run, and the SKU id of its GPU (None: unknown). Every
    rank reads its GPU's links from NVML and, across nodes, its node's RDMA ports from sysfs under
    ``fabric_root``, then all-gathers them (a collective: every rank calls this); on one node the
    NVLink P2P matrix comes from NVML too."""
    if device != "cuda" or rc.device_index is None:
        return {}, "not on GPUs: no bandwidth expectation", None
    import torch

    from gpuaccept.hw.rdma import read_inventory
    from gpuaccept.hw.sku import match_sku

    uuid = nvml_uuid(torch.cuda.get_device_properties(rc.device_index))
    sku = match_sku(torch.cuda.get_device_name(rc.device_index))
    links = read_gpu_links(uuid) if uuid else None
    nics = None
    if rc.num_nodes > 1:
        try:
            nics = node_nics(read_inventory(fabric_root).ports, rc.host_of(rc.rank))
        except GpuacceptError:
            nics = None
    texts = all_gather_text(_pack(uuid, links, nics), torch_device, width=GATHER_WIDTH)
    matrix = None
    if rc.num_nodes == 1 and sku is not None and sku.nvlink_gbs and not sku.nvlink_all_pairs:
        uuids = [json.loads(t).get("u", "") if t.startswith("{") else "" for t in texts]
        matrix = nvlink_matrix(uuids) if all(uuids) else None
    inputs = gathered_inputs(texts, rc.hosts, sku, rc.num_nodes, rc.local_world_size, matrix)
    major, minor = torch.cuda.get_device_capability(rc.device_index)
    inputs = replace(inputs, compute_capability=(int(major), int(minor)))
    return (*busbw_expectation(ops, inputs, max_bytes), sku.id if sku is not None else None)
