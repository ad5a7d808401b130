"""Helpers of the k8s and runai tests: specs, golden files, required binaries."""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.launch.spec import JobSpec, Mount

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
UPDATE = os.environ.get("GPUACCEPT_UPDATE_GOLDEN") == "1"


def need_binary(name: str) -> str:
    """Path of ``name``; skip when it is missing, except under CI=true where that is a failure."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(message)
    return path


def need_module(name: str) -> None:
    """At module level: skip the module when a Python package is missing; under CI=true that is a failure."""
    try:
        importlib.import_module(name)
    except ImportError:
        message = f"the {name} package is not installed (it is in the dev extra)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(message, allow_module_level=True)


def check_golden(relpath: str, text: str) -> None:
    """``text`` must equal the golden file; ``GPUACCEPT_UPDATE_GOLDEN=1`` rewrites it instead."""
    path = GOLDEN / relpath
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with GPUACCEPT_UPDATE_GOLDEN=1 to record it"
    assert text == path.read_text(), f"{path} differs (GPUACCEPT_UPDATE_GOLDEN=1 re-records it after a review)"


def suite_spec(options: dict[str, Any], **over: Any) -> JobSpec:
    """The acceptance suite on 4 nodes of 8 GPUs, once per node, as ``gpuaccept launch`` builds it."""
    values: dict[str, Any] = dict(
        name="accept-h100", nodes=4, run_id="20260101T000000Z-accept-h100-ab12", results_dir="/shared/reports",
        gpus_per_node=8, suite_args=["--profile", "quick"], image="nvcr.io/nvidia/pytorch:25.01-py3",
        env={"NCCL_DEBUG": "INFO"}, mounts=[Mount("/data", "/data", True), Mount("datasets", "/datasets")],
        time_limit_min=30, distributed=False, options=options,
    )
    values.update(over)
    return JobSpec(**values)


def command_spec(options: dict[str, Any], **over: Any) -> JobSpec:
    """A user's training command under torchrun (or mpirun) on 2 nodes of 8 GPUs."""
    values: dict[str, Any] = dict(
        name="train", nodes=2, run_id="20260101T000000Z-train-cd34", results_dir="/shared/reports",
        gpus_per_node=8, command=["python", "train.py", "--lr", "3e-4"], image="registry.example.com/ml/train:1.0",
        env={"NCCL_IB_HCA": "mlx5"}, distributed=True, options=options,
    )
    values.update(over)
    return JobSpec(**values)
