"""Backends by name, imported lazily (``gpuaccept launch --help`` stays fast)."""

from __future__ import annotations

import importlib

from gpuaccept.errors import UsageError
from gpuaccept.launch.base import Backend

BACKENDS: dict[str, str] = {
    "slurm": "gpuaccept.launch.slurm.backend:SlurmBackend",
    "ssh": "gpuaccept.launch.ssh.backend:SshBackend",
    "k8s": "gpuaccept.launch.k8s.backend:K8sBackend",
    "runai": "gpuaccept.launch.runai.backend:RunaiBackend",
    "bcp": "gpuaccept.launch.bcp.backend:BcpBackend",
    "mpi": "gpuaccept.launch.mpi.backend:MpiBackend",
    "local": "gpuaccept.launch.local.backend:LocalBackend",
}


def backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    module_name, _, cls_name = BACKENDS[name].partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    assert isinstance(cls, type) and issubclass(cls, Backend)
    return cls
