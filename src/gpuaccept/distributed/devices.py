"""Which CUDA device a rank uses, given what this process can see (pure; no torch import).

Rules, in order:

1. A ``--gpus`` list names one GPU per local rank: a list shorter than the
   ranks on this node, or one that names a GPU twice, is refused (NCCL rejects
   two ranks on one GPU: "Duplicate GPU detected").
2. With a list, local rank ``i`` uses ``gpus[i]``; it must be visible.
3. Without one, a rank that sees exactly one device uses device 0: per-task
   binding (``srun --gpus-per-task=1``, ``--gpu-bind=single:1``, a Kubernetes
   pod per rank) gives each task its own GPU as ordinal 0. Otherwise local
   rank ``i`` uses device ``i``, which must be below the device count.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuaccept.errors import UsageError


class DeviceSelectionError(UsageError):
    """A rank cannot be given a CUDA device of its own; the message says what to change."""


def rank_device(local_rank: int, local_world: int, device_count: int, gpus: Sequence[int] | None) -> int:
    """CUDA ordinal for ``local_rank`` of ``local_world`` ranks on this node, when this process sees
    ``device_count`` devices and ``gpus`` is the ``--gpus`` list (None: not given). See the module doc."""
    if not 0 <= local_rank < max(local_world, 1):
        raise DeviceSelectionError(f"local rank {local_rank} is outside the {local_world} ranks of this node")
    if gpus is not None:
        listed = list(gpus)
        if len(listed) < local_world:
            raise DeviceSelectionError(
                f"--gpus lists {len(listed)} GPU(s) ({','.join(map(str, listed))}) but this node runs "
                f"{local_world} ranks; each rank needs a GPU of its own (NCCL refuses duplicate GPUs): list "
                f"{local_world} GPUs or start fewer ranks per node")
        dupes = sorted({g for g in listed if listed.count(g) > 1})
        if dupes:
            raise DeviceSelectionError(f"--gpus names GPU {dupes[0]} more than once; each rank needs a GPU of "
                                       "its own (NCCL refuses duplicate GPUs)")
    if device_count < 1:
        raise DeviceSelectionError(f"local rank {local_rank} sees no CUDA device (check CUDA_VISIBLE_DEVICES "
                                   "and the launcher's GPU binding)")
    if gpus is not None:
        index = list(gpus)[local_rank]
        if not 0 <= index < device_count:
            raise DeviceSelectionError(
                f"local rank {local_rank} is to use GPU {index} from --gpus, but this process sees "
                f"{device_count} device(s) (ordinals 0-{device_count - 1}); under per-task GPU binding leave "
                "--gpus out, otherwise name visible ordinals")
        return index
    if device_count == 1:
        return 0
    if local_rank >= device_count:
        raise DeviceSelectionError(
            f"local rank {local_rank} needs CUDA device {local_rank} but this process sees {device_count} "
            f"device(s): run at most {device_count} ranks per node, or bind one GPU per task "
            "(srun --gpus-per-task=1)")
    return local_rank
