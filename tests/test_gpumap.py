"""CUDA_VISIBLE_DEVICES -> NVML GPUs: the pure mapping on the forms CUDA accepts, and bus-id normalisation."""

from __future__ import annotations

import pytest

from gpuaccept.errors import InputError
from gpuaccept.hw.gpumap import NvmlGpuId, map_visible_devices, normalize_pci_bus_id, select_ordinals

UUIDS = [f"GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c0{i}" for i in range(8)]
INV = [NvmlGpuId(i, u, f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i, u in enumerate(UUIDS)]
INV[6] = NvmlGpuId(6, "GPU-aa11bb22-0000-0000-0000-000000000006", INV[6].pci_bus_id,
                   ("MIG-11111111-2222-3333-4444-555555555555", "MIG-11111111-2222-3333-4444-666666666666"))


def indices(visible: str | None) -> list[int]:
    return [v.index for v in map_visible_devices(visible, INV)]


@pytest.mark.parametrize(("visible", "expected"), [
    (None, list(range(8))),                      # unset: every GPU, NVML order
    ("", []), ("-1", []), ("NoDevFiles", []), ("none", []),
    ("4,5,6,7", [4, 5, 6, 7]),                   # a Slurm job with the upper half
    ("3,1", [3, 1]),                             # order as listed
    (" 2 , 0 ", [2, 0]),                         # whitespace
    ("0,2,-1,1", [0, 2]),                        # stops at the first invalid entry
    ("0,9,1", [0]),                              # an index NVML does not have
    ("1,1,2", [1]),                              # a repeat ends enumeration
    ("junk,0", []),
    (UUIDS[5], [5]),                             # full UUID
    ("GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c07,GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c02", [7, 2]),
    ("gpu-3F1C2A4E-8B7D-4C21-9E0A-5D6F7A8B9C03", [3]),   # case-insensitive
    ("GPU-aa11", [6]),                           # a unique prefix, as CUDA accepts
    ("GPU-3f1c", []),                            # an ambiguous prefix (seven GPUs share it)
    ("GPU-", []),
    ("GPU-ffffffff", []),                        # no such GPU
    (f"1,{UUIDS[4]}", [1, 4]),                   # indices and UUIDs mixed
    ("MIG-11111111-2222-3333-4444-666666666666", [6]),   # a MIG instance: its parent GPU
    ("MIG-GPU-aa11bb22-0000-0000-0000-000000000006/1/0", [6]),   # legacy MIG form
    ("MIG-99999999", []),
])
def test_map_visible_devices(visible: str | None, expected: list[int]) -> None:
    assert indices(visible) == expected


def test_ordinals_uuids_and_mig_labels() -> None:
    got = map_visible_devices("GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c05,MIG-11111111-2222-3333-4444-5555", INV)
    assert [(v.ordinal, v.index, v.uuid, v.device) for v in got] == [
        (0, 5, UUIDS[5], "cuda:0"), (1, 6, INV[6].uuid, "cuda:1")]
    assert got[1].mig_uuid == "MIG-11111111-2222-3333-4444-555555555555" and got[0].mig_uuid == ""
    assert got[0].pci_bus_id == INV[5].pci_bus_id


def test_select_ordinals_are_torch_ordinals() -> None:
    visible = map_visible_devices("4,5,6,7", INV)
    assert [v.index for v in select_ordinals(visible, [0, 1])] == [4, 5]  # --gpus 0,1 in a job given 4-7
    assert [v.index for v in select_ordinals(visible, None)] == [4, 5, 6, 7]
    with pytest.raises(InputError, match="GPU index 4 does not exist: 4 GPU"):
        select_ordinals(visible, [4])


@pytest.mark.parametrize(("raw", "norm"), [
    ("00000000:18:00.0", "0000:18:00"), ("0000:2a:00", "0000:2a:00"), ("PCI:0000:2A:00", "0000:2a:00"),
    ("0000:ab:00.0", "0000:ab:00"), ("00000001:DB:1F.7", "0001:db:1f"),
])
def test_normalize_pci_bus_id(raw: str, norm: str) -> None:
    assert normalize_pci_bus_id(raw) == norm


@pytest.mark.parametrize("raw", ["", "18:00.0", "0000:zz:00.0", "0000:100:00", "0000:18:20"])
def test_normalize_pci_bus_id_rejects(raw: str) -> None:
    with pytest.raises(InputError):
        normalize_pci_bus_id(raw)
