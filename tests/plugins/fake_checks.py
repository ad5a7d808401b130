"""Checks used by the engine tests (loaded through GPUACCEPT_PLUGINS).

They exercise the engine, not hardware: one that passes with a metric, one
that hangs forever, one that raises, one whose process dies, one that sleeps.
"""

from __future__ import annotations

import os
import signal
import time

from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, ThresholdRule
from gpuaccept.model import Metric, Status


class Steady(Check):
    name = "steady"
    tag = "COMPUTE"
    summary = "returns a fixed metric given by its parameter"
    params = (Param("value", "float", 10.0, "the value reported"),)
    thresholds = (ThresholdRule(metric="steady_value", min=5.0),)
    profiles = ()
    key_metric = "steady_value"

    def run(self, ctx: CheckContext) -> Outcome:
        return Outcome.passed("reported the value", [Metric("steady_value", ctx.params["value"], "GB/s", "cpu")])


class Hang(Check):
    name = "hang"
    tag = "COMPUTE"
    summary = "never returns, like a hung CUDA call"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL can stop it
        while True:
            time.sleep(1)


class Nap(Check):
    name = "nap"
    tag = "MEMORY"
    summary = "sleeps for a while, then passes"
    params = (Param("seconds", "float", 30.0, "how long to sleep"),)
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        time.sleep(ctx.params["seconds"])
        return Outcome.passed("woke up", [])


class Boom(Check):
    name = "boom"
    tag = "TRAIN"
    summary = "raises an exception"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        raise RuntimeError("simulated failure in check code")


class Crash(Check):
    name = "crash"
    tag = "TRAIN"
    summary = "its process dies without a result"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        print("about to die", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return Outcome(Status.PASS)


class GpuOnly(Check):
    name = "gpuonly"
    tag = "HEALTH"
    summary = "skips for want of a GPU"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        return Outcome.skip("no GPU on this node", needs_gpu=True)


CHECKS = (Steady, Hang, Nap, Boom, Crash, GpuOnly)
