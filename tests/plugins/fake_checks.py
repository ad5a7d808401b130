"""Checks used by the engine tests (loaded through GPUACCEPT_PLUGINS).

They exercise the engine, not hardware: one that passes with a metric, one
that hangs forever, one that raises, one whose process dies, one that sleeps.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, RequiredMetric, ThresholdRule
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


class Declared(Check):
    """Declares one figure per device and per size; ``drop`` leaves one out of an otherwise good outcome."""

    name = "declared"
    tag = "MEMORY"
    summary = "reports a figure per size and declares them required"
    params = (Param("sizes", "list", [1024, 4096], "sizes measured", item="int"),
              Param("drop", "int", -1, "a size whose figure is left out (-1: none)"))
    profiles = ()

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        return [RequiredMetric("declared_gbs", d, (("size_bytes", s),)) for d in devices for s in params["sizes"]]

    def run(self, ctx: CheckContext) -> Outcome:
        metrics = [Metric("declared_gbs", 1.0, "GB/s", "cpu", tags={"size_bytes": s})
                   for s in ctx.params["sizes"] if s != ctx.params["drop"]]
        return Outcome.passed("measured every size", metrics)


class Skipper(Check):
    name = "skipper"
    tag = "HEALTH"
    summary = "always skips (nothing to measure here)"
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        return Outcome.skip("nothing to measure on this node")


class Filler(Check):
    """Fills the file system of $GPUACCEPT_TEST_FILL (the report directory in the tests), leaving
    ``leave_kib`` free, then passes with a ``pad_kib`` detail: its outcome or the report no longer fit."""

    name = "filler"
    tag = "MEMORY"
    summary = "fills the disk under the report directory"
    params = (Param("leave_kib", "int", 0, "KiB left free"), Param("pad_kib", "int", 0, "KiB of padding"))
    profiles = ()

    def run(self, ctx: CheckContext) -> Outcome:
        where = os.environ["GPUACCEPT_TEST_FILL"]
        chunks = []
        for i in range(100000):
            path = os.path.join(where, f"ballast{i}")
            try:
                with open(path, "wb") as fh:
                    fh.write(b"x" * 4096)
            except OSError:
                os.unlink(path)
                break
            chunks.append(path)
        for path in chunks[-(ctx.params["leave_kib"] // 4):] if ctx.params["leave_kib"] else []:
            os.unlink(path)
        pad = "p" * (1024 * ctx.params["pad_kib"])
        return Outcome.passed("filled the disk", [Metric("filler_value", 1.0, "GB/s", "cpu")], pad=pad)


CHECKS = (Steady, Hang, Nap, Boom, Crash, GpuOnly, Filler, Declared, Skipper)
