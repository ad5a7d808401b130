"""The collectives' bandwidth expectation (the fabric model fed with what the ranks gather); the message cap."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuaccept.checks.collectives_expect import (
    GATHER_WIDTH,
    _pack,
    busbw_expectation,
    free_bytes_override,
    gathered_inputs,
    local_max_bytes,
    nvml_uuid,
)
from gpuaccept.hw.fabric_expect import NVLINK_EFFICIENCY, FabricInputs, GpuLinks, NodeNics
from gpuaccept.hw.p2p import joins_every_pair, nvlink_matrix
from gpuaccept.hw.sku import load_skus
from gpuaccept.model import Status

SKUS = load_skus()
BIG = 256 << 20


def _mesh(n: int, missing: tuple[tuple[int, int], ...] = ()) -> list[list[bool]]:
    m = [[True] * n for _ in range(n)]
    for i, j in missing:
        m[i][j] = m[j][i] = False
    return m


def _pairs(n: int) -> list[list[bool]]:
    """H100 NVL style: bridges join 0-1, 2-3, ...; every other pair meets over PCIe."""
    return [[i == j or i // 2 == j // 2 for j in range(n)] for i in range(n)]


def _inputs(sku_id: str | None, nodes: int = 1, gpus: int = 8, matrix: list[list[bool]] | None = None
            ) -> FabricInputs:
    return FabricInputs(SKUS[sku_id] if sku_id else None, nodes, gpus,
                        all_pairs=joins_every_pair(matrix) if matrix is not None else None)


@pytest.mark.parametrize("sku_id", ["h100_sxm", "h200_sxm", "a100_sxm4_40gb", "a100_sxm4_80gb", "b200"])
def test_nvswitch_skus_are_judged_against_nvlink_even_without_nvml(sku_id: str) -> None:
    sku = SKUS[sku_id]
    assert sku.nvlink_gbs
    exp, why = busbw_expectation(["allreduce"], _inputs(sku_id), BIG)
    e = exp["allreduce"]
    assert (e.path, e.ceiling_gbs, e.efficiency) == ("nvlink", sku.nvlink_gbs / 2, NVLINK_EFFICIENCY)
    assert "SKU table" in why and e.source.startswith("fabric: ")
    # a broken NVLink/NVSwitch on such a node must still be judged (and fail on its bandwidth)
    assert busbw_expectation(["allreduce"], _inputs(sku_id, matrix=_mesh(8, ((0, 5),))), BIG)[0] == exp


@pytest.mark.parametrize("sku_id", ["h100_pcie", "h100_nvl", "h200_nvl", "a100_pcie_40gb", "a100_pcie_80gb"])
def test_bridged_or_pcie_cards_get_no_nvlink_bound_on_an_8_gpu_server(sku_id: str) -> None:
    sku = SKUS[sku_id]
    assert not sku.nvlink_all_pairs
    for matrix in (None, _pairs(8), _mesh(8, ((3, 4),)), [[True]]):
        exp, why = busbw_expectation(["allreduce"], _inputs(sku_id, matrix=matrix), BIG)
        assert exp == {} and "PCIe generation and width unknown" in why
    # with NVML's PCIe links the PCIe model applies, at WARN
    links = FabricInputs(sku, 1, 8, gpus=[GpuLinks(None, 5, 16)] * 8, all_pairs=False)
    e = busbw_expectation(["allreduce"], links, BIG)[0]["allreduce"]
    assert (e.path, e.ceiling_gbs, e.severity) == ("pcie", 63.015, Status.WARN)


def test_bridged_cards_whose_bridge_spans_every_rank_get_the_nvlink_bound() -> None:
    # two H100 NVL ranks on one bridged pair; four H200 NVL on a 4-way bridge
    exp, _ = busbw_expectation(["allreduce"], _inputs("h100_nvl", gpus=2, matrix=_pairs(2)), BIG)
    assert exp["allreduce"].ceiling_gbs == 300.0 and exp["allreduce"].path == "nvlink"
    assert busbw_expectation(["allreduce"], _inputs("h200_nvl", gpus=4, matrix=_mesh(4)), BIG
                             )[0]["allreduce"].ceiling_gbs == 450.0


def test_no_expectation_for_small_sizes_unread_networks_unmodelled_ops_or_nvlink_less_skus() -> None:
    assert busbw_expectation(["allreduce"], _inputs("h100_sxm"), 32 << 20) == (
        {}, "largest size below 64 MiB: no fabric expectation")
    exp, why = busbw_expectation(["allreduce"], _inputs("h100_sxm", nodes=2), BIG)
    assert exp == {} and "RDMA ports of 2 of 2 nodes unknown" in why
    assert busbw_expectation(["allreduce"], _inputs(None, matrix=_mesh(8)), BIG)[0] == {}
    assert busbw_expectation(["allreduce"], _inputs("l40s", matrix=_mesh(8)), BIG)[0] == {}
    exp, why = busbw_expectation(["allreduce", "sendrecv", "broadcast", "reduce"], _inputs("h100_sxm"), BIG)
    assert list(exp) == ["allreduce", "sendrecv", "broadcast"] and "reduce: " in why and "not modelled" in why


def test_the_gathered_facts_of_every_rank_make_the_inputs() -> None:
    links = GpuLinks(18, 5, 16)
    nics = NodeNics("a", 8, 400.0, "NDR", "InfiniBand", 0)
    texts = [_pack(f"GPU-{k:036d}", links, replace(nics, host=h)) for k, h in enumerate("aabb")]
    assert all(len(t) <= GATHER_WIDTH for t in texts), max(len(t) for t in texts)
    inp = gathered_inputs(texts, ["a", "a", "b", "b"], SKUS["h100_sxm"], 2, 2)
    assert inp.gpus == [links] * 4 and inp.nics == [nics, replace(nics, host="b")]
    # a rank whose NVML could not tell leaves the GPU links unknown for all
    texts[1] = _pack("GPU-x", None, None)
    assert gathered_inputs(texts, ["a", "a", "b", "b"], None, 2, 2).gpus is None


def test_joins_every_pair() -> None:
    assert joins_every_pair(_mesh(8)) and joins_every_pair(_pairs(2))
    assert not joins_every_pair(_pairs(4)) and not joins_every_pair(None) and not joins_every_pair([[True]])


def test_local_message_cap_is_a_quarter_of_free_memory() -> None:
    assert local_max_bytes(256 << 20, None) == 256 << 20  # CPU: no reading, the parameter stands
    assert local_max_bytes(256 << 20, 1 << 30) == 256 << 20
    assert local_max_bytes(256 << 20, 512 << 20) == 128 << 20
    assert local_max_bytes(4096, 0) == 1


def test_free_bytes_override_names_ranks() -> None:
    env = {"GPUACCEPT_TEST_FREE_BYTES": "1=16384, 3=99"}
    assert [free_bytes_override(env, r) for r in range(4)] == [None, 16384, None, 99]
    assert free_bytes_override({}, 0) is None


@pytest.mark.gpu
def test_nvml_reads_the_p2p_matrix_of_the_gpus_torch_sees() -> None:
    import torch

    uuids = [nvml_uuid(torch.cuda.get_device_properties(i)) for i in range(torch.cuda.device_count())]
    assert all(u.startswith("GPU-") for u in uuids), uuids
    m = nvlink_matrix(uuids)
    assert m is not None and len(m) == len(uuids) and all(m[i][i] for i in range(len(m)))
