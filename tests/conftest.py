"""Shared fixtures. GPU tests are marked ``gpu`` and skipped only where no CUDA GPU is present."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Iterator

import pytest


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_configure(config: pytest.Config) -> None:
    """The Ctrl-C tests press Ctrl-C as a terminal would. A test run started in the background of a
    non-interactive shell (``.ci/run > log &``, a CI runner's job) inherits SIGINT ignored (POSIX, for background
    jobs without job control), Python then keeps it ignored, and so would every process the tests start: each
    launch under test would ignore Ctrl-C as such a background job should. Give the tests a terminal's SIGINT."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _isolated_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs started by the tests store their history in a temporary database, never the user's."""
    path = tmp_path_factory.mktemp("history") / "history.db"
    old = os.environ.get("GPUACCEPT_DB")
    os.environ["GPUACCEPT_DB"] = f"sqlite:///{path}"
    yield
    if old is None:
        os.environ.pop("GPUACCEPT_DB", None)
    else:
        os.environ["GPUACCEPT_DB"] = old


@pytest.fixture(autouse=True)
def _stop_signals_restored() -> Iterator[None]:
    """A test that changes how this process handles SIGINT, SIGTERM or SIGHUP must not change it for later tests:
    a SIGINT left ignored here is inherited by every process a later test starts, which then ignores Ctrl-C."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
