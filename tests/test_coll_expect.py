"""The collectives' bandwidth expectation: only where NVLink joins every pair of ranks; the message cap."""

from __future__ import annotations

import pytest

from gpuaccept.checks.collectives_expect import (
    busbw_expectation,
    free_bytes_override,
    local_max_bytes,
    nvml_uuid,
)
from gpuaccept.hw.p2p import joins_every_pair, nvlink_matrix
from gpuaccept.hw.sku import load_skus

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


@pytest.mark.parametrize("sku_id", ["h100_sxm", "h200_sxm", "a100_sxm4_40gb", "a100_sxm4_80gb", "b200"])
def test_nvswitch_skus_are_judged_against_nvlink_even_without_nvml(sku_id: str) -> None:
    sku = SKUS[sku_id]
    exp, why = busbw_expectation(sku, 1, BIG, None)
    assert exp == (f"sku:{sku_id}", sku.nvlink_gbs / 2, 0.6) and "every GPU pair" in why
    # a broken NVLink/NVSwitch on such a node must still be judged (and fail on its bandwidth)
    assert busbw_expectation(sku, 1, BIG, _mesh(8, ((0, 5),)))[0] == exp


@pytest.mark.parametrize("sku_id", ["h100_pcie", "h100_nvl", "h200_nvl", "a100_pcie_40gb", "a100_pcie_80gb"])
def test_bridged_or_pcie_cards_get_no_nvlink_bound_on_an_8_gpu_server(sku_id: str) -> None:
    sku = SKUS[sku_id]
    assert not sku.nvlink_all_pairs
    for matrix in (None, _pairs(8), _mesh(8, ((3, 4),)), [[True]]):
        exp, why = busbw_expectation(sku, 1, BIG, matrix)
        assert exp is None and "no SKU expectation" in why and sku_id in why


def test_bridged_cards_whose_bridge_spans_every_rank_get_the_nvlink_bound() -> None:
    # two H100 NVL ranks on one bridged pair; four H200 NVL on a 4-way bridge
    exp, why = busbw_expectation(SKUS["h100_nvl"], 1, BIG, _pairs(2))
    assert exp == ("sku:h100_nvl", 300.0, 0.6) and "NVML reports NVLink P2P" in why
    assert busbw_expectation(SKUS["h200_nvl"], 1, BIG, _mesh(4))[0] == ("sku:h200_nvl", 450.0, 0.6)


def test_no_expectation_across_nodes_for_small_sizes_unknown_or_nvlink_less_skus() -> None:
    assert busbw_expectation(SKUS["h100_sxm"], 2, BIG, None)[0] is None
    assert busbw_expectation(SKUS["h100_sxm"], 1, 32 << 20, None)[0] is None
    assert busbw_expectation(None, 1, BIG, _mesh(8))[0] is None
    exp, why = busbw_expectation(SKUS["l40s"], 1, BIG, _mesh(8))
    assert exp is None and "no NVLink" in why


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
