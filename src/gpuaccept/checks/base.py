"""The check interface: parameters, thresholds, context and outcome.

A check is one class with a name, a log tag, declared parameters with
per-profile defaults, default thresholds as data, a timeout, and a ``run``
method that returns an :class:`Outcome`. Check modules must not import torch
at module level: import it inside ``run`` so that listing checks stays cheap.
"""

from __future__ import annotations

import abc
import fnmatch
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuaccept.errors import ConfigError
from gpuaccept.model import Metric, Status, Threshold

PROFILES = ("quick", "standard", "full", "burnin")
"""Every profile. ``burnin`` runs the long checks (stress, agreement, disk, throughput) for long durations,
with the inventory and health checks around them; the others a growing share of the suite."""
SUITE_PROFILES = ("quick", "standard", "full")
"""The profiles a check is in unless it says otherwise (:attr:`Check.profiles`)."""

_KINDS: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool, "list": list}


@dataclass(frozen=True)
class Param:
    """A declared check parameter.

    ``kind`` is ``int``, ``float``, ``str``, ``bool`` or ``list`` (of ``item``);
    ``choices`` restricts values (each list item for lists); ``minimum`` and
    ``maximum`` bound numbers (each list item for lists; every number declares
    a ``maximum``); ``memory_mib`` marks a size in MiB of which the check holds
    ``host_buffers`` buffers in host memory at once (see :meth:`Check.host_needs`);
    ``gpu_memory_mib`` marks a size in MiB of which the check holds
    ``gpu_buffers`` buffers on each selected GPU at once (see :meth:`Check.gpu_needs`).
    """

    name: str
    kind: str
    default: Any
    help: str
    item: str = "str"
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    memory_mib: bool = False
    host_buffers: int = 1
    gpu_memory_mib: bool = False
    gpu_buffers: int = 1
    max_items: int = 64

    def coerce(self, value: Any, source: str, key: str) -> Any:
        """Validate ``value`` for this parameter; raise :class:`ConfigError` if wrong."""
        if self.kind == "list":
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list):
                raise ConfigError(source, key, f"expected a list, got {type(value).__name__}")
            if len(value) > self.max_items:
                raise ConfigError(source, key, f"a list of {len(value)} items; at most {self.max_items}")
            item = Param(self.name, self.item, None, self.help, choices=self.choices, minimum=self.minimum,
                         maximum=self.maximum)
            return [item.coerce(v, source, f"{key}[{i}]") for i, v in enumerate(value)]
        want = _KINDS[self.kind]
        ok = isinstance(value, want) and not (want in (int, float) and isinstance(value, bool))
        if self.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ConfigError(source, key, f"expected {self.kind}, got {type(value).__name__} {_show(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(source, key, f"{value!r} is not a finite number")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(source, key, f"{_show(value)} is not one of {', '.join(map(str, self.choices))}")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(source, key, f"{_show(value)} is below the minimum {format_bound(self.minimum)}")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(source, key, f"{_show(value)} is above the maximum {format_bound(self.maximum)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
            raise ConfigError(source, key, f"{_show(value)} is out of range (at most {MAX_NUMBER:.0e} in size)")
        if isinstance(value, str) and len(value) > 4096:
            raise ConfigError(source, key, f"a string of {len(value)} characters; at most 4096")
        return value


@dataclass(frozen=True)
class MemoryNeed:
    """Memory a check needs, at least, for its parameter values: host memory, or GPU memory on each selected GPU.

    ``params`` are the parameters that set the size (the ones a user set are
    named in errors), ``mib`` the MiB needed (on one GPU for GPU memory),
    ``how`` a few words on how it follows from the values ("2 buffers of 1024 MiB").
    """

    params: tuple[str, ...]
    mib: int
    how: str


MAX_NUMBER = 1e15
"""No declared parameter is meaningful beyond this magnitude (and such numbers overflow downstream)."""


def host_memory_mib() -> int | None:
    """Physical memory of this machine in MiB (None where the OS does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024))
    except (ValueError, OSError, AttributeError):
        return None


def format_bound(value: float) -> str:
    """A declared bound as written in a config: 4194304, not 4.1943e+06; 0.01 as 0.01."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _show(value: Any) -> str:
    """``repr(value)`` on one line (control characters escaped), cut to a readable length."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in repr(value))
    return text if len(text) <= 80 else text[:77] + "..."


_BOUND_KEYS = ("min", "max", "min_fraction", "max_fraction")


@dataclass(frozen=True)
class ThresholdRule:
    """A declarative bound on the metrics whose name matches ``metric`` (a glob).

    Exactly one of ``min``/``max`` (absolute, in the metric's unit) or
    ``min_fraction``/``max_fraction`` (of the metric's ``expected`` value) is
    set. A fraction rule does not apply to a metric without an expectation.
    """

    metric: str
    min: float | None = None
    max: float | None = None
    min_fraction: float | None = None
    max_fraction: float | None = None
    severity: Status = Status.FAIL
    source: str = "default"

    def matches(self, metric: Metric) -> bool:
        return fnmatch.fnmatchcase(metric.name, self.metric)

    def bound_for(self, metric: Metric) -> Threshold | None:
        """The concrete bound for ``metric``, or None when the rule cannot apply."""
        if self.min is not None:
            return Threshold(">=", self.min, self.severity, self.source)
        if self.max is not None:
            return Threshold("<=", self.max, self.severity, self.source)
        if metric.expected is None:
            return None
        if self.min_fraction is not None:
            return Threshold(">=", self.min_fraction * metric.expected, self.severity, self.source)
        if self.max_fraction is not None:
            return Threshold("<=", self.max_fraction * metric.expected, self.severity, self.source)
        return None

    def describe(self) -> str:
        for key in _BOUND_KEYS:
            v = getattr(self, key)
            if v is not None:
                op = ">=" if key.startswith("min") else "<="
                rhs = f"{v:g} x expected" if key.endswith("fraction") else f"{v:g}"
                return f"{self.metric} {op} {rhs} ({self.severity.value})"
        return self.metric

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"metric": self.metric}
        for key in _BOUND_KEYS:
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        d["severity"] = self.severity.value
        return d

    @classmethod
    def parse(cls, raw: Any, source: str, key: str) -> ThresholdRule:
        """Build a rule from YAML data, rejecting unknown keys and wrong types."""
        if not isinstance(raw, dict):
            raise ConfigError(source, key, "a threshold must be a mapping with 'metric' and one bound")
        unknown = set(raw) - {"metric", "severity", *_BOUND_KEYS}
        if unknown:
            raise ConfigError(source, f"{key}.{_show(sorted(map(str, unknown))[0])[1:-1]}",
                              f"unknown key; allowed: metric, severity, {', '.join(_BOUND_KEYS)}")
        metric = raw.get("metric")
        if not isinstance(metric, str) or not metric or not metric.isprintable():
            raise ConfigError(source, f"{key}.metric", "must be a non-empty string (a metric name or glob)")
        bounds = {k: raw[k] for k in _BOUND_KEYS if k in raw}
        if len(bounds) != 1:
            raise ConfigError(source, key, f"needs exactly one of {', '.join(_BOUND_KEYS)}")
        (bkey, bval), = bounds.items()
        if isinstance(bval, bool) or not isinstance(bval, (int, float)):
            raise ConfigError(source, f"{key}.{bkey}", f"expected a number, got {_show(bval)}")
        if not math.isfinite(bval) or abs(bval) > 1e300:
            raise ConfigError(source, f"{key}.{bkey}", f"{_show(bval)} is not a finite number")
        sev_raw = raw.get("severity", "fail")
        if sev_raw not in ("fail", "warn"):
            raise ConfigError(source, f"{key}.severity", f"must be 'fail' or 'warn', got {_show(sev_raw)}")
        return cls(metric=metric, severity=Status(sev_raw), source=source, **{bkey: float(bval)})


@dataclass(frozen=True)
class RequiredMetric:
    """A metric a passing outcome must contain (see :meth:`Check.required_metrics`).

    ``metric`` is a name or glob; ``device`` the device label it must carry (``cuda:1``,
    ``cpu``; None: any); ``tags`` the tag values it must carry (e.g. ``(("size_bytes", 1024),)``).
    """

    metric: str
    device: str | None = None
    tags: tuple[tuple[str, str | int | float], ...] = ()

    def found_in(self, metrics: list[Metric]) -> bool:
        return any(fnmatch.fnmatchcase(m.name, self.metric)
                   and (self.device is None or m.device == self.device)
                   and all(m.tags.get(k) == v for k, v in self.tags)
                   for m in metrics)

    def describe(self) -> str:
        where = f" on {self.device}" if self.device else ""
        tags = ", ".join(f"{k}={v}" for k, v in self.tags)
        return f"{self.metric}{where}" + (f" ({tags})" if tags else "")


def per_device(devices: list[str], *metrics: str) -> list[RequiredMetric]:
    """Each of ``metrics`` on each of ``devices``."""
    return [RequiredMetric(m, d) for d in devices for m in metrics]


@dataclass
class Outcome:
    """What ``Check.run`` returns: its own status, a reason, metrics, details.

    The engine then applies thresholds, which can only make the status worse.
    ``needs_gpu`` marks a skip caused by the absence of a GPU, which
    ``--require-gpu`` turns into a failure.
    """

    status: Status
    reason: str = ""
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    needs_gpu: bool = False

    @classmethod
    def skip(cls, reason: str, *, needs_gpu: bool = False, **details: Any) -> Outcome:
        return cls(Status.SKIP, reason, details=dict(details), needs_gpu=needs_gpu)

    @classmethod
    def passed(cls, reason: str, metrics: list[Metric], **details: Any) -> Outcome:
        return cls(Status.PASS, reason, metrics, dict(details))

    @classmethod
    def failed(cls, reason: str, metrics: list[Metric] | None = None, **details: Any) -> Outcome:
        return cls(Status.FAIL, reason, metrics or [], dict(details))


@dataclass
class CheckContext:
    """What a running check knows about its invocation.

    ``device`` is ``cuda`` or ``cpu`` (already resolved from ``auto``);
    ``gpus`` are torch CUDA ordinals to test (None: all visible);
    ``timeout_s`` is the time the engine allows before killing the check.
    """

    device: str
    params: dict[str, Any]
    gpus: list[int] | None = None
    require_gpu: bool = False
    expect_gpus: int | None = None
    timeout_s: float = 60.0
    profile: str = "standard"
    verbose: bool = False

    def log(self, message: str) -> None:
        """A progress line for the check's log file (stderr of the child)."""
        print(message, file=sys.stderr, flush=True)


def torch_devices_or_skip(ctx: CheckContext) -> list[Any] | Outcome:
    """The torch devices a check measures (``hw.devices.torch_devices``), or the SKIP it should return.

    Torch missing is a skip (a GPU skip when CUDA was asked for); CUDA asked for
    but unusable is a GPU skip, which ``--require-gpu`` turns into a failure.
    Imports torch.
    """
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return Outcome.skip(f"torch is not installed ({exc}); install gpuaccept[torch]",
                            needs_gpu=ctx.device == "cuda")
    from gpuaccept.hw.devices import torch_devices

    try:
        return torch_devices(ctx.device, ctx.gpus)
    except RuntimeError as exc:
        return Outcome.skip(str(exc), needs_gpu=True)


class Check(abc.ABC):
    """Base class of every check. Subclasses set the class attributes and ``run``."""

    name: ClassVar[str]
    tag: ClassVar[str]
    summary: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    profile_params: ClassVar[dict[str, dict[str, Any]]] = {}
    thresholds: ClassVar[tuple[ThresholdRule, ...]] = ()
    timeout_s: ClassVar[dict[str, float]] = {"quick": 60.0, "standard": 300.0, "full": 1800.0}
    profiles: ClassVar[tuple[str, ...]] = SUITE_PROFILES
    key_metric: ClassVar[str | None] = None
    #: the names of the metrics the check can produce (fnmatch patterns allowed): threshold rules, baseline
    #: rules and metric filters are checked against them before anything runs
    #: (:mod:`gpuaccept.checks.metricnames`); None (a plugin that declares none): its rules are not verified
    metrics: ClassVar[tuple[str, ...] | None] = None
    #: False for a check that only takes stock (``env``): its pass alone does not make a run a pass
    measures: ClassVar[bool] = True
    #: modules the warm process (:mod:`gpuaccept.node.zygote`) imports before it forks this check's process,
    #: so that a run imports them once, not in every check that needs them (torch is always imported)
    warm_imports: ClassVar[tuple[str, ...]] = ()
    #: the warm process may import other checks' modules while this one runs: it measures nothing that one
    #: busy CPU core changes (it takes stock, or samples slow counters); the runner then asks for the later
    #: checks' ``warm_imports`` beside it, so that they are not imported before those checks' forks
    imports_beside: ClassVar[bool] = False

    @abc.abstractmethod
    def run(self, ctx: CheckContext) -> Outcome:
        """Measure and return an outcome. Raise only for unexpected errors."""

    @classmethod
    def defaults(cls, profile: str) -> dict[str, Any]:
        """Parameter values for ``profile`` before any user configuration."""
        values = {p.name: p.default for p in cls.params}
        values.update(cls.profile_params.get(profile, {}))
        return values

    @classmethod
    def timeout_for(cls, profile: str, params: dict[str, Any]) -> float:
        """Seconds the engine allows this check in ``profile`` with these parameter values (before
        ``--timeout-scale``). Default: the ``timeout_s`` table (its largest entry for a profile it lacks);
        a check whose run time follows a parameter (a duration) overrides this."""
        return cls.timeout_s.get(profile, max(cls.timeout_s.values(), default=300.0))

    @classmethod
    def estimate_s(cls, params: dict[str, Any], device: str, gpus: int) -> float | None:
        """Seconds this check should take with these parameter values on ``device`` (``cuda`` with ``gpus``
        selected GPUs, or ``cpu``), its process start not counted: a rough figure that ``run --budget`` plans
        with (:mod:`gpuaccept.node.budget`). Default None: unknown, and the planner counts the timeout instead."""
        return None

    @classmethod
    def process_env(cls, env: Mapping[str, str]) -> dict[str, str]:
        """Variables this check's process must have from its start, given the environment ``env`` it would
        get: the runner sets them before the interpreter starts or the warm process forks, so a library that
        reads one once (cuBLAS) sees it. Default: none."""
        return {}

    @classmethod
    def budget_stretch(cls, params: dict[str, Any]) -> tuple[str, float] | None:
        """``(parameter, shortest)``: a duration in seconds that the run time follows about linearly, which
        ``run --budget`` may shorten, down to ``shortest``, to fit a window. Default None: none."""
        return None

    @classmethod
    def preflight(cls, params: dict[str, Any], source: str, key: str) -> None:
        """Raise :class:`ConfigError` (exit 2, before any check runs) when these parameter values cannot work on
        this machine, e.g. a scratch path that is not a writable directory. ``source`` and ``key`` name where
        the values came from (a config file and ``checks.<name>.params``). Default: nothing to check."""
        return None

    @classmethod
    def required_metrics(cls, params: dict[str, Any], devices: list[str]) -> list[RequiredMetric]:
        """The metrics a PASS or WARN outcome must contain, for these parameters and devices (labels such
        as ``cuda:0`` or ``cpu``, the devices the check was asked to measure). An outcome that lacks one
        becomes an ERROR naming what is missing. Default: nothing declared."""
        return []

    @classmethod
    def gpu_needs(cls, params: dict[str, Any]) -> list[MemoryNeed]:
        """The GPU memory these parameter values need on each selected GPU (at least). Default: one need per
        ``gpu_memory_mib`` parameter, ``gpu_buffers`` times its value in MiB (the largest item of a list)."""
        return [_buffer_need(p, p.gpu_buffers, params.get(p.name)) for p in cls.params
                if p.gpu_memory_mib and _sizes(params.get(p.name))]

    @classmethod
    def host_needs(cls, params: dict[str, Any]) -> list[MemoryNeed]:
        """The host memory these parameter values need (at least), whichever device the run uses. Default:
        one need per ``memory_mib`` parameter, ``host_buffers`` times its value in MiB (the largest item of a
        list). Checks whose host sizes follow from other parameters (matrix sizes, body counts) add theirs."""
        return [_buffer_need(p, p.host_buffers, params.get(p.name)) for p in cls.params
                if p.memory_mib and _sizes(params.get(p.name))]

    @classmethod
    def param(cls, name: str) -> Param | None:
        return next((p for p in cls.params if p.name == name), None)


def _sizes(value: Any) -> list[int]:
    """The integer sizes in a parameter value (one, or each item of a list)."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _buffer_need(param: Param, buffers: int, value: Any) -> MemoryNeed:
    """``buffers`` buffers of the largest size (MiB) in ``value``, the value of ``param``."""
    size = max(_sizes(value))
    how = f"{buffers} buffers of {size} MiB" if buffers != 1 else f"a buffer of {size} MiB"
    return MemoryNeed((param.name,), buffers * size, how)


def device_labels(ctx: CheckContext) -> list[str]:
    """Labels of the devices a check was asked to measure (``cpu``, or ``cuda:N`` for each selected GPU);
    empty when they cannot be known (torch missing or CUDA unusable: the check skips then anyway)."""
    if ctx.device == "cpu":
        return ["cpu"]
    try:
        from gpuaccept.hw.devices import torch_devices

        return [str(d) for d in torch_devices(ctx.device, ctx.gpus)]
    except (ImportError, RuntimeError):
        return []


def enforce_required(cls: type[Check], ctx: CheckContext, outcome: Outcome) -> Outcome:
    """``outcome``, or an ERROR naming the declared metrics a PASS/WARN outcome lacks."""
    if outcome.status not in (Status.PASS, Status.WARN):
        return outcome
    return require(outcome, cls.required_metrics(ctx.params, device_labels(ctx)))


def require(outcome: Outcome, required: list[RequiredMetric]) -> Outcome:
    """``outcome``, or, when it is a PASS/WARN lacking any of ``required``, an ERROR naming what is missing
    (for checks whose required metrics are known only while they run, e.g. one rank's collective sweep)."""
    if outcome.status not in (Status.PASS, Status.WARN):
        return outcome
    missing = [r.describe() for r in required if not r.found_in(outcome.metrics)]
    if not missing:
        return outcome
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    reason = f"missing metrics: {shown} (the check reported {outcome.status.value}: {outcome.reason})"
    details = {**outcome.details, "missing_metrics": missing}
    return Outcome(Status.ERROR, reason, outcome.metrics, details, outcome.needs_gpu)


def outcome_to_dict(outcome: Outcome) -> dict[str, Any]:
    """The outcome as JSON data, as a check process writes it for the runner."""
    return {
        "status": outcome.status.value,
        "reason": outcome.reason,
        "metrics": [m.to_dict() for m in outcome.metrics],
        "details": outcome.details,
        "needs_gpu": outcome.needs_gpu,
    }
