"""Which CUDA device a rank uses: per-task binding, --gpus lists, and the errors that say what to change."""

from __future__ import annotations

import pytest

from gpuaccept.distributed.devices import DeviceSelectionError, rank_device
from gpuaccept.distributed.group import RankContext, with_visible_device
from gpuaccept.errors import UsageError


def test_per_task_binding_uses_device_0_for_every_local_rank() -> None:
    # srun --gpus-per-task=1 / --gpu-bind=single:1: 8 tasks per node, each sees one GPU
    assert [rank_device(r, 8, 1, None) for r in range(8)] == [0] * 8


def test_all_gpus_visible_maps_local_rank_to_ordinal() -> None:
    assert [rank_device(r, 8, 8, None) for r in range(8)] == list(range(8))
    assert rank_device(1, 2, 4, None) == 1


def test_more_ranks_than_visible_devices_is_refused_with_advice() -> None:
    with pytest.raises(DeviceSelectionError, match=r"local rank 2 needs CUDA device 2 but this process sees 2"):
        rank_device(2, 4, 2, None)
    with pytest.raises(DeviceSelectionError, match="sees no CUDA device"):
        rank_device(0, 1, 0, None)


def test_gpus_list_selects_per_local_rank() -> None:
    assert [rank_device(r, 2, 8, [4, 6]) for r in range(2)] == [4, 6]
    assert rank_device(0, 1, 1, [0]) == 0


def test_short_or_duplicate_gpus_list_is_refused() -> None:
    with pytest.raises(DeviceSelectionError, match=r"--gpus lists 2 GPU\(s\) \(0,1\) but this node runs 4 ranks"):
        rank_device(0, 4, 8, [0, 1])  # refused on every rank, also those the list would cover
    with pytest.raises(DeviceSelectionError, match="names GPU 3 more than once"):
        rank_device(0, 2, 8, [3, 3])
    assert issubclass(DeviceSelectionError, UsageError)


def test_gpus_list_naming_an_invisible_ordinal_is_refused() -> None:
    # per-task binding (one visible device) with a node-wide --gpus list
    with pytest.raises(DeviceSelectionError, match="GPU 1 from --gpus, but this process sees 1 device"):
        rank_device(1, 2, 1, [0, 1])


def _rc(local_rank: int, local_world: int, launcher: str) -> RankContext:
    return RankContext(rank=local_rank, world_size=local_world, local_rank=local_rank,
                       local_world_size=local_world, node_rank=0, num_nodes=1, hosts=("n",) * local_world,
                       store_host="127.0.0.1", store_port=1, prefix="p/", timeout_s=5.0,
                       device_index=local_rank, launcher=launcher)


def test_wiring_replaces_the_parents_guess() -> None:
    assert with_visible_device(_rc(3, 4, "slurm"), None, 1).device_index == 0
    assert with_visible_device(_rc(1, 2, "torchrun"), [5, 7], 8).device_index == 7
    # the local launcher gives every rank the same view: two ranks on one GPU are refused, not doubled up
    with pytest.raises(DeviceSelectionError, match="GPU 1 from --gpus, but this process sees 1 device"):
        with_visible_device(_rc(1, 2, "local"), None, 1)
