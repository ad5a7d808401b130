"""NVLink peer-to-peer status between GPUs, from NVML (``nvidia-smi topo -p2p n``).

``nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK)`` is
``NVML_P2P_STATUS_OK`` when NVLink joins GPUs ``a`` and ``b`` (directly, or
through NVSwitch). GPUs are named by NVML UUID (``GPU-...``), which is stable
under ``CUDA_VISIBLE_DEVICES`` renumbering and per-task binding.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuaccept.hw.fabric_expect import GpuLinks
from gpuaccept.hw.nvml import NVLINK_LINKS

Matrix = list[list[bool]]


def nvlink_matrix(uuids: Sequence[str]) -> Matrix | None:
    """``m[i][j]``: NVLink P2P is OK between ``uuids[i]`` and ``uuids[j]`` (the diagonal is True).

    None when NVML cannot be loaded or a GPU is not found by UUID (a MIG
    instance, a GPU outside this node): the caller then knows nothing.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids]
        return [[i == j or pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                 == pynvml.NVML_P2P_STATUS_OK for j, b in enumerate(handles)] for i, a in enumerate(handles)]
    except Exception:  # NVML error on a query: unknown, not "no NVLink"
        return None
    finally:
        pynvml.nvmlShutdown()


def joins_every_pair(matrix: Matrix | None) -> bool:
    """NVLink joins every pair of the GPUs (False when unknown or for a single GPU)."""
    if not matrix or len(matrix) < 2:
        return False
    return all(matrix[i][j] for i in range(len(matrix)) for j in range(len(matrix)) if i != j)


def read_gpu_links(uuid: str) -> GpuLinks | None:
    """Active NVLink links and the PCIe link's maximum generation and width of the GPU ``uuid``
    (``nvidia-smi nvlink -s``, ``nvidia-smi -q -d PCIE``); None when NVML cannot tell."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        links: int | None = 0
        for link in range(NVLINK_LINKS):
            try:
                on = pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
            except Exception:  # past the last link, or no NVLink at all
                links = links if link else None
                break
            links = (links or 0) + int(on)
        gen = width = None
        try:
            gen = int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
            width = int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
        except Exception:  # not reported on this GPU or driver
            pass
        return GpuLinks(links, gen, width)
    except Exception:  # NVML error on a query: unknown
        return None
    finally:
        pynvml.nvmlShutdown()
