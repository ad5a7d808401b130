"""Imported in the warm process, fakes what an import that calls ``torch.cuda.is_available()`` leaves there on a
GPU node (on CPU there is nothing to start): ``GPUACCEPT_TEST_POISON=initialized`` makes
``torch.cuda.is_initialized()`` say True; ``bad_fork`` sets torch's bad-fork flag in every process forked
after it, as torch's own fork handler does. Anywhere but the warm process it does nothing."""

from __future__ import annotations

import os
import sys

import torch

MODE_ENV = "GPUACCEPT_TEST_POISON"


def _bad_fork() -> None:
    torch.cuda._is_in_bad_fork = lambda: True  # type: ignore[attr-defined]


def _in_warm_process() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "gpuaccept.node.zygote"


if _in_warm_process():
    if os.environ.get(MODE_ENV) == "bad_fork":
        os.register_at_fork(after_in_child=_bad_fork)
    else:
        torch.cuda.is_initialized = lambda: True
