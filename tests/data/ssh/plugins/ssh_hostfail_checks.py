"""A check for the ssh launcher tests: fails on the host named by ``SSH_TEST_FAIL_HOST``, passes elsewhere.

Loaded on the "remote" side with ``PYTHONPATH=<this dir>`` and
``GPUACCEPT_PLUGINS=ssh_hostfail_checks``; the host is ``GPUACCEPT_HOSTNAME``,
which the ssh node script exports.
"""

from __future__ import annotations

import os

from gpuaccept.checks.base import Check, CheckContext, Outcome
from gpuaccept.model import Metric, Status


class HostFail(Check):
    name = "hostfail"
    tag = "HEALTH"
    summary = "fails on the host named by SSH_TEST_FAIL_HOST"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        host = os.environ.get("GPUACCEPT_HOSTNAME", "")
        if host == os.environ.get("SSH_TEST_FAIL_HOST"):
            return Outcome(Status.FAIL, f"{host} is the host told to fail", [Metric("hostfail", 1.0, "count")])
        return Outcome.passed(f"{host} passes", [Metric("hostfail", 0.0, "count")])


CHECKS = (HostFail,)
