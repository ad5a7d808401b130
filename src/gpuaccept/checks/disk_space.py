"""Free space on the file systems a node needs (``df``): part of ``gpuaccept healthcheck``.

Each of ``paths`` must exist and have at least ``min_free_gib`` GiB and
``min_free_pct`` percent of its size free, as ``statvfs`` counts what an
ordinary user may use (``f_bavail``, so root's reserved blocks do not count).
A path that does not exist is a FAIL (a scratch file system that did not mount
is a node fault). The check is in no profile of ``gpuaccept run``; select it
with ``--checks disk_space`` or run ``gpuaccept healthcheck``. No torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from gpuaccept.checks import estimates
from gpuaccept.checks.base import Check, CheckContext, Outcome, Param, RequiredMetric
from gpuaccept.model import Metric, Status


@dataclass(frozen=True)
class Space:
    """What ``statvfs`` says about one path: bytes an ordinary user may still write, and the size."""

    path: str
    free_bytes: int
    total_bytes: int

    @property
    def free_pct(self) -> float:
        return 100.0 * self.free_bytes / self.total_bytes if self.total_bytes else 0.0


def read_space(path: str) -> Space:
    """``statvfs(path)`` as a :class:`Space` (OSError when the path cannot be read)."""
    st = os.statvfs(path)
    return Space(path, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def judge_space(spaces: list[Space], missing: dict[str, str], min_free_gib: float, min_free_pct: float) -> Outcome:
    """The outcome for these readings (pure): FAIL naming each path short of space or unreadable."""
    metrics: list[Metric] = []
    problems: list[str] = [f"{p}: {why}" for p, why in missing.items()]
    for s in spaces:
        gib = s.free_bytes / (1 << 30)
        metrics.append(Metric("disk_free_gib", round(gib, 3), "GiB", tags={"path": s.path}))
        metrics.append(Metric("disk_free_pct", round(s.free_pct, 2), "%", tags={"path": s.path}))
        if gib < min_free_gib:
            problems.append(f"{s.path}: {gib:.2f} GiB free, below {min_free_gib:g} GiB")
        elif s.free_pct < min_free_pct:
            problems.append(f"{s.path}: {s.free_pct:.1f} % free, below {min_free_pct:g} %")
    details: dict[str, Any] = {"paths": [s.path for s in spaces] + list(missing)}
    if problems:
        return Outcome(Status.FAIL, "; ".join(problems), metrics, details)
    shown = ", ".join(f"{s.path} {s.free_bytes / (1 << 30):.1f} GiB" for s in spaces)
    return Outcome(Status.PASS, f"free: {shown}", metrics, details)


class DiskSpaceCheck(Check):
    """Free space (GiB and percent) on each of ``paths``."""

    name = "disk_space"
    tag = "DISK"
    summary = "free space on the node's scratch and temporary file systems (statvfs, no load)"
    params: ClassVar[tuple[Param, ...]] = (
        Param("paths", "list", ["/tmp"], "paths whose file systems must have room (each must exist)"),
        Param("min_free_gib", "float", 1.0, "fail below this many GiB free on any path", minimum=0.0,
              maximum=1 << 20),
        Param("min_free_pct", "float", 1.0, "fail below this percentage free on any path", minimum=0.0,
              maximum=100.0),
    )
    profiles: ClassVar[tuple[str, ...]] = ()  # gpuaccept healthcheck, or --checks disk_space
    timeout_s: ClassVar[dict[str, float]] = {"quick": 10.0, "standard": 10.0, "full": 10.0}
    key_metric = "disk_free_gib"
    metrics = ("disk_free_gib", "disk_free_pct")
    imports_beside = True  # statvfs only

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        return [RequiredMetric("disk_free_gib", tags=(("path", p),)) for p in params["paths"]]

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float:
        return estimates.disk_space(params, device, gpus)

    def run(self, ctx: CheckContext) -> Outcome:
        paths = list(ctx.params["paths"])
        if not paths:
            return Outcome(Status.ERROR, "paths is empty: nothing to check")
        spaces: list[Space] = []
        missing: dict[str, str] = {}
        for path in paths:
            try:
                spaces.append(read_space(path))
            except OSError as exc:
                missing[path] = exc.strerror or str(exc)
        return judge_space(spaces, missing, float(ctx.params["min_free_gib"]), float(ctx.params["min_free_pct"]))


CHECKS = (DiskSpaceCheck,)
