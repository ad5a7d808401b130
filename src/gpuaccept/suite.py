"""The suite plan: which checks run, with which parameters, thresholds and timeouts.

``plan_suite`` is pure: it reads the registry and the validated options and
returns data that ``gpuaccept run --plan`` prints and the runner executes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuaccept.checks import check_path
from gpuaccept.checks.base import PROFILES, Check, ThresholdRule
from gpuaccept.config import Config
from gpuaccept.errors import UsageError


@dataclass
class RunOptions:
    """Options of ``gpuaccept run`` after flags and config are merged."""

    profile: str = "standard"
    checks: list[str] | None = None
    skip: list[str] = field(default_factory=list)
    device: str = "auto"
    gpus: list[int] | None = None
    timeout_scale: float = 1.0
    require_gpu: bool = False
    expect_gpus: int | None = None


@dataclass
class PlannedCheck:
    name: str
    path: str
    tag: str
    params: dict[str, Any]
    defaults: list[ThresholdRule]
    overrides: list[ThresholdRule]
    timeout_s: float
    key_metric: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tag": self.tag,
            "params": self.params,
            "timeout_s": self.timeout_s,
            "thresholds": [r.to_dict() for r in (*self.defaults, *self.overrides)],
        }


@dataclass
class SuitePlan:
    profile: str
    device: str
    gpus: list[int] | None
    require_gpu: bool
    expect_gpus: int | None
    checks: list[PlannedCheck]

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "device": self.device,
            "gpus": self.gpus,
            "require_gpu": self.require_gpu,
            "expect_gpus": self.expect_gpus,
            "checks": [c.to_dict() for c in self.checks],
        }


def _unknown(names: list[str], registry: dict[str, type[Check]], flag: str) -> None:
    bad = [n for n in names if n not in registry]
    if bad:
        raise UsageError(f"{flag}: unknown check {bad[0]!r}; known: {', '.join(registry)}")


def plan_suite(opts: RunOptions, config: Config, registry: dict[str, type[Check]], device: str) -> SuitePlan:
    """Select and parameterise checks. ``device`` is the resolved device (cuda or cpu)."""
    if opts.profile not in PROFILES:
        raise UsageError(f"--profile: {opts.profile!r} is not one of {', '.join(PROFILES)}")
    if opts.timeout_scale <= 0:
        raise UsageError("--timeout-scale must be > 0")
    if opts.checks is not None:
        _unknown(opts.checks, registry, "--checks")
    _unknown(opts.skip, registry, "--skip")

    planned: list[PlannedCheck] = []
    for name, cls in registry.items():
        settings = config.checks.get(name)
        if opts.checks is not None:
            selected = name in opts.checks
        elif settings is not None and settings.enabled is not None:
            selected = settings.enabled
        else:
            selected = opts.profile in cls.profiles
        if not selected or name in opts.skip:
            continue
        params = cls.defaults(opts.profile)
        timeout = cls.timeout_s.get(opts.profile, max(cls.timeout_s.values(), default=300.0))
        overrides: list[ThresholdRule] = []
        if settings is not None:
            params.update(settings.params)
            overrides = list(settings.thresholds)
            if settings.timeout_s is not None:
                timeout = settings.timeout_s
        planned.append(PlannedCheck(
            name=name, path=check_path(cls), tag=cls.tag, params=params,
            defaults=list(cls.thresholds), overrides=overrides,
            timeout_s=timeout * opts.timeout_scale, key_metric=cls.key_metric,
        ))
    if not planned:
        raise UsageError("no check selected: --checks/--skip/profile leave nothing to run")
    return SuitePlan(profile=opts.profile, device=device, gpus=opts.gpus, require_gpu=opts.require_gpu,
                     expect_gpus=opts.expect_gpus, checks=planned)
