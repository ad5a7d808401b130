"""The suite plan: which checks run, with which parameters, thresholds and timeouts.

``plan_suite`` is pure: it reads the registry and the validated options and
returns data that ``gpuaccept run --plan`` prints and the runner executes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuaccept.checks import check_path
from gpuaccept.checks.base import PROFILES, Check, MemoryNeed, ThresholdRule
from gpuaccept.checks.metricnames import rule_finding
from gpuaccept.errors import ConfigError, UsageError
from gpuaccept.inputs import did_you_mean
from gpuaccept.node.config import Config

if TYPE_CHECKING:
    from gpuaccept.hw.gpumem import GpuMemory


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
    #: what a person should know about the plan: rules that apply to nothing in this run, rules on a
    #: check that declares no metrics (not verified); ``gpuaccept run`` prints them before it starts
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "device": self.device,
            "gpus": self.gpus,
            "require_gpu": self.require_gpu,
            "expect_gpus": self.expect_gpus,
            "checks": [c.to_dict() for c in self.checks],
            "notes": list(self.notes),
        }


def _unknown(names: list[str], registry: dict[str, type[Check]], flag: str) -> None:
    bad = [n for n in names if n not in registry]
    if bad:
        raise UsageError(f"{flag}: unknown check {bad[0]!r}{did_you_mean(bad[0], registry)}; known: "
                         f"{', '.join(registry)}")


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
        overrides: list[ThresholdRule] = []
        if settings is not None:
            params.update(settings.params)
            overrides = list(settings.thresholds)
        timeout = cls.timeout_for(opts.profile, params)
        if settings is not None and settings.timeout_s is not None:
            timeout = settings.timeout_s
        planned.append(PlannedCheck(
            name=name, path=check_path(cls), tag=cls.tag, params=params,
            defaults=list(cls.thresholds), overrides=overrides,
            timeout_s=timeout * opts.timeout_scale, key_metric=cls.key_metric,
        ))
    if not planned:
        raise UsageError("no check selected: --checks/--skip/profile leave nothing to run")
    plan = SuitePlan(profile=opts.profile, device=device, gpus=opts.gpus, require_gpu=opts.require_gpu,
                     expect_gpus=opts.expect_gpus, checks=planned)
    check_config_metrics(plan, config, registry)
    return plan


def check_config_metrics(plan: SuitePlan, config: Config, registry: dict[str, type[Check]]) -> None:
    """ConfigError when a config threshold names a metric its check cannot produce (misspelt, or of another
    check), with a "did you mean"; a note in ``plan.notes`` for a rule of a check that is not selected or
    declares no metrics. Pure (:func:`gpuaccept.checks.metricnames.rule_finding`)."""
    selected = {c.name for c in plan.checks}
    for name, settings in config.checks.items():
        for i, rule in enumerate(settings.thresholds):
            key = f"checks.{name}.thresholds[{i}].metric"
            found = rule_finding(rule.metric, registry, selected, owner=name)
            if found.error:
                raise ConfigError(config.source, key, found.error)
            if found.note:
                plan.notes.append(f"{config.source}: {key}: {found.note}")


def check_rule_metrics(plan: SuitePlan, registry: dict[str, type[Check]],
                       rules: Iterable[tuple[str, str, str]]) -> None:
    """ConfigError when a rule that applies to every check (a baseline threshold), given as (metric glob,
    source, key), names a metric no check produces; a note in ``plan.notes`` when it names only metrics of
    checks that are not selected, or of none that declares its metrics."""
    selected = {c.name for c in plan.checks}
    for metric, source, key in rules:
        found = rule_finding(metric, registry, selected)
        if found.error:
            raise ConfigError(source, key, found.error)
        if found.note:
            plan.notes.append(f"{source}: {key}: {found.note}")


def preflight(plan: SuitePlan, config: Config, registry: dict[str, type[Check]]) -> None:
    """ConfigError when a planned check's parameters cannot work on this machine (:meth:`Check.preflight`:
    a scratch path that does not exist or is not writable), so that a run refuses before anything runs."""
    for check in plan.checks:
        settings = config.checks.get(check.name)
        source = config.source if settings is not None and settings.params else "defaults"
        registry[check.name].preflight(check.params, source, f"checks.{check.name}.params")


def check_host_fit(plan: SuitePlan, config: Config, registry: dict[str, type[Check]], host_mib: int | None) -> None:
    """ConfigError when a host memory size the configuration sets for a planned check exceeds ``host_mib``.

    Pure. ``host_mib`` is this machine's physical memory in MiB
    (:func:`gpuaccept.checks.base.host_memory_mib`; None: unknown, nothing is checked). Each check's
    :meth:`~gpuaccept.checks.base.Check.host_needs` counts, whichever device the run uses, and, as for GPU
    sizes, only needs set by values the configuration sets.
    """
    if host_mib is None:
        return
    unfit = _first_unfit(plan, config, lambda name, params: registry[name].host_needs(params), host_mib, "host")
    if unfit is not None:
        key, what = unfit
        raise ConfigError(config.source, key, f"{what}, more than this machine's memory ({host_mib} MiB)")


def check_gpu_fit(plan: SuitePlan, config: Config, registry: dict[str, type[Check]],
                  gpus: Sequence[GpuMemory]) -> None:
    """ConfigError when a GPU size the configuration sets for a planned check exceeds the smallest of ``gpus``.

    Pure. ``gpus`` are the selected GPUs' totals (:func:`gpuaccept.hw.gpumem.read_gpu_memory`); those of
    unknown size are left out, and with none known, or on a CPU run, nothing is checked. Only values the
    configuration sets count (a built-in size is the check's own business: ``memory`` shrinks its buffers).
    """
    known = [(g.total_mib, g) for g in gpus if g.total_mib is not None]
    if plan.device != "cuda" or not known:
        return
    limit, smallest = min(known, key=lambda t: t[0])
    unfit = _first_unfit(plan, config, lambda name, params: registry[name].gpu_needs(params), limit, "GPU")
    if unfit is not None:
        key, what = unfit
        raise ConfigError(config.source, key, f"{what}, more than {smallest.device} ({smallest.name}, "
                                              f"the smallest selected GPU) has: {limit} MiB")


def _first_unfit(plan: SuitePlan, config: Config, needs: Callable[[str, dict[str, Any]], list[MemoryNeed]],
                 limit_mib: int, kind: str) -> tuple[str, str] | None:
    """The config key and the words ("size 9 needs 10 MiB of GPU memory (how)") of the first need, among
    those of values the configuration sets for a planned check, above ``limit_mib``; None when all fit."""
    for check in plan.checks:
        settings = config.checks.get(check.name)
        given = settings.params if settings is not None else {}
        for need in needs(check.name, check.params):
            named = [p for p in need.params if p in given]
            if named and need.mib > limit_mib:
                shown = ", ".join(f"{p} {given[p]}" for p in named)
                return (f"checks.{check.name}.params.{named[0]}",
                        f"{shown} need{'s' if len(named) == 1 else ''} {need.mib} MiB of {kind} memory ({need.how})")
    return None


def measures(check: PlannedCheck) -> bool:
    """Whether ``check`` measures the node (False for checks that only take stock, like ``env``)."""
    from gpuaccept.checks import load_check

    return bool(getattr(load_check(check.path), "measures", True))


def child_env(check: PlannedCheck, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the variables ``check``'s process must have from its start (its class's ``process_env``)."""
    from gpuaccept.checks import load_check

    wanted = getattr(load_check(check.path), "process_env", None)
    return {**base, **(wanted(base) if wanted is not None else {})}


def warm_imports(check: PlannedCheck) -> tuple[str, ...]:
    """The modules ``check``'s class names for the warm process to import before its process is forked."""
    from gpuaccept.checks import load_check

    return tuple(getattr(load_check(check.path), "warm_imports", ()))


def imports_beside(check: PlannedCheck) -> bool:
    """Whether the warm process may import other checks' modules while ``check`` runs (its class's
    ``imports_beside``: one busy CPU core changes nothing it measures)."""
    from gpuaccept.checks import load_check

    return bool(getattr(load_check(check.path), "imports_beside", False))


def is_distributed(check: PlannedCheck) -> bool:
    """Whether ``check`` runs as one process per rank (its class sets ``distributed = True``)."""
    from gpuaccept.checks import load_check

    return bool(getattr(load_check(check.path), "distributed", False))
