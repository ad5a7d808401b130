"""Checks for the warm process's fork-safety tests: ``poisoner`` names :mod:`tests.plugins.poison_cuda` in its
``warm_imports`` (the warm process imports it before the fork); ``calm`` imports nothing. Both report their
parent. With ``GPUACCEPT_TEST_POISON_PLUGIN=1`` this plugin module poisons at its own import (listed in
``GPUACCEPT_PLUGINS``, the warm process imports it before its first fork)."""

from __future__ import annotations

import os
from pathlib import Path

from gpuaccept.checks.base import Check, CheckContext, Outcome
from gpuaccept.model import Metric

if os.environ.get("GPUACCEPT_TEST_POISON_PLUGIN") == "1":
    import tests.plugins.poison_cuda  # noqa: F401


class Calm(Check):
    name = "calm"
    tag = "ENV"
    summary = "reports its parent"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return Outcome.passed("ran", [Metric("ran", 1.0, "x", "cpu")], parent=parent)


class Poisoner(Calm):
    name = "poisoner"
    warm_imports = ("tests.plugins.poison_cuda",)


class Calm2(Calm):
    name = "calm2"


CHECKS = (Calm, Poisoner, Calm2)
