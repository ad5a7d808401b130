"""A check for the launch tests: it fails on one named node, so a cluster run has a known bad node."""

from __future__ import annotations

import os
import socket

from gpuaccept.checks.base import Check, CheckContext, Outcome, Param


class FailOn(Check):
    name = "failon"
    tag = "HEALTH"
    summary = "fails on the node named by its parameter (GPUACCEPT_HOSTNAME), passes elsewhere"
    params = (Param("host", "str", "", "the node name that fails"),)
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        host = os.environ.get("GPUACCEPT_HOSTNAME") or socket.gethostname()
        if host == ctx.params["host"]:
            return Outcome.failed(f"forced failure on {host}")
        return Outcome.passed(f"{host} is not {ctx.params['host']!r}", [])


CHECKS = (FailOn,)
