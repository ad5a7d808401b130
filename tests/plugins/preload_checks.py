"""Checks for the tests of the warm process's preloads (``imports_beside``), loaded from a test's registry.

``quiet`` and ``quiet2`` (``imports_beside``) and ``busy`` (not) sleep, then write when they ended;
``needs_stamp`` names :mod:`tests.plugins.stamp_import` in its ``warm_imports`` (that module writes
when it is imported) and ``needs_broken`` names :mod:`tests.plugins.broken_import`, whose import
raises. Time stamps go to the directory in :data:`STAMPS_ENV`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import ClassVar

from gpuaccept.checks.base import Check, CheckContext, Outcome, Param
from gpuaccept.model import Metric

STAMPS_ENV = "GPUACCEPT_TEST_STAMPS"


def stamp(name: str) -> None:
    """Append ``<time.time()> <pid>`` to ``$GPUACCEPT_TEST_STAMPS/<name>``."""
    with open(Path(os.environ[STAMPS_ENV]) / name, "a") as fh:
        fh.write(f"{time.time()!r} {os.getpid()}\n")


def _parent() -> str:
    return Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()


class Quiet(Check):
    """Sleeps: nothing a busy CPU core changes, so the warm process may import beside it."""

    name = "quiet"
    tag = "ENV"
    summary = "sleeps, then writes when it ended"
    params: ClassVar[tuple[Param, ...]] = (
        Param("seconds", "float", 1.5, "how long to sleep", minimum=0.0, maximum=60.0),)
    profiles = ()
    imports_beside = True

    def run(self, ctx: CheckContext) -> Outcome:
        time.sleep(ctx.params["seconds"])
        stamp(f"{self.name}.end")
        return Outcome.passed("slept", [Metric("slept_s", ctx.params["seconds"], "s", "cpu")], parent=_parent())


class Quiet2(Quiet):
    name = "quiet2"


class Busy(Quiet):
    """The same, but a check the warm process must not import beside (as if it timed CPU work)."""

    name = "busy"
    imports_beside = False


class NeedsStamp(Check):
    name = "needs_stamp"
    tag = "TRAIN"
    summary = "asks the warm process to import a module that writes when it is imported"
    profiles = ()
    warm_imports = ("tests.plugins.stamp_import",)

    def run(self, ctx: CheckContext) -> Outcome:
        inherited = "tests.plugins.stamp_import" in sys.modules
        return Outcome.passed("ran", [Metric("ran", 1.0, "x", "cpu")], parent=_parent(), inherited=inherited)


class NeedsBroken(Check):
    name = "needs_broken"
    tag = "TRAIN"
    summary = "asks the warm process to import a module whose import raises"
    profiles = ()
    warm_imports = ("tests.plugins.broken_import",)

    def run(self, ctx: CheckContext) -> Outcome:
        try:
            import tests.plugins.broken_import  # noqa: F401
        except RuntimeError as exc:
            return Outcome.failed(f"cannot import what it needs: {exc}", parent=_parent())
        return Outcome.passed("imported", [Metric("ran", 1.0, "x", "cpu")], parent=_parent())


CHECKS = (Quiet, Quiet2, Busy, NeedsStamp, NeedsBroken)
