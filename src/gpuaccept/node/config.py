"""Run options and the optional YAML configuration file, validated strictly.

A config file may set run options and, per check, parameters, thresholds,
the timeout and whether it runs::

    profile: standard
    expect_gpus: 8
    checks:
      compute:
        params: {dtypes: [bf16, fp8], size: 8192}
        thresholds:
          - {metric: "gemm_bf16_tflops", min_fraction: 0.7}
          - {metric: "gemm_*_tflops_concurrent", min_fraction: 0.6, severity: warn}
        timeout_s: 600
      memtest: {enabled: false}

Unknown keys and wrong types raise :class:`ConfigError` naming the file, key and reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaccept.checks.base import PROFILES, Check, ThresholdRule
from gpuaccept.errors import ConfigError
from gpuaccept.inputs import BadInput, did_you_mean, load_yaml_file, one_line

DEVICES = ("auto", "cuda", "cpu")
_TOP_KEYS = ("profile", "device", "gpus", "expect_gpus", "require_gpu", "timeout_scale", "report_dir", "checks")
_CHECK_KEYS = ("params", "thresholds", "timeout_s", "enabled")
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""The longest timeout a config may give one check (a week): a watchdog must fire some day."""
MAX_TIMEOUT_SCALE = 1000.0
MAX_EXPECT_GPUS = 4096


@dataclass
class CheckSettings:
    """User settings for one check, already validated against its declaration."""

    params: dict[str, Any] = field(default_factory=dict)
    thresholds: list[ThresholdRule] = field(default_factory=list)
    timeout_s: float | None = None
    enabled: bool | None = None


@dataclass
class Config:
    """A parsed configuration file. ``None`` means "not set here"."""

    source: str = "<none>"
    profile: str | None = None
    device: str | None = None
    gpus: list[int] | None = None
    expect_gpus: int | None = None
    require_gpu: bool | None = None
    timeout_scale: float | None = None
    report_dir: str | None = None
    checks: dict[str, CheckSettings] = field(default_factory=dict)


def _show(value: Any) -> str:
    """``repr(value)`` in one line, cut to a readable length."""
    text = one_line(repr(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _want(value: Any, kind: type | tuple[type, ...], source: str, key: str, what: str) -> Any:
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(source, key, f"expected {what}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(source, key, f"expected {what}, got {type(value).__name__} {_show(value)}")
    return value


def _positive(value: Any, source: str, key: str, what: str, maximum: float) -> float:
    """A finite number in (0, maximum]; ConfigError otherwise (NaN and infinity included)."""
    number = _want(value, (int, float), source, key, what)
    if not math.isfinite(number) or not 0 < number <= maximum:
        raise ConfigError(source, key, f"must be a finite number > 0 and <= {maximum:g}, got {_show(value)}")
    return float(number)


def parse_gpus(value: Any, source: str, key: str) -> list[int]:
    """``"0,1"`` or ``[0, 1]`` to ``[0, 1]``; rejects negatives, repeats and junk."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise ConfigError(source, key, f"expected a list of GPU indices like 0,1 got {_show(value)}")
    out: list[int] = []
    for item in items:
        text = str(item).strip()
        if isinstance(item, bool) or not isinstance(item, (int, str)) or not text.isascii() or not text.isdigit() \
                or len(text) > 6:
            raise ConfigError(source, key, f"{_show(text)} is not a GPU index (a non-negative integer)")
        if int(text) in out:
            raise ConfigError(source, key, f"GPU index {text} is listed twice")
        out.append(int(text))
    return out


def parse_config(data: Any, source: str, registry: dict[str, type[Check]]) -> Config:
    """Validate already-loaded YAML data into a :class:`Config`."""
    if data is None:
        return Config(source=source)
    if not isinstance(data, dict):
        raise ConfigError(source, "", f"the top level must be a mapping, got {type(data).__name__}")
    cfg = Config(source=source)
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(source, one_line(str(key)), f"unknown key; allowed: {', '.join(_TOP_KEYS)}")
    if "profile" in data:
        cfg.profile = _want(data["profile"], str, source, "profile", "a profile name")
        if cfg.profile not in PROFILES:
            raise ConfigError(source, "profile", f"{_show(cfg.profile)} is not one of {', '.join(PROFILES)}")
    if "device" in data:
        cfg.device = _want(data["device"], str, source, "device", "auto, cuda or cpu")
        if cfg.device not in DEVICES:
            raise ConfigError(source, "device", f"{_show(cfg.device)} is not one of {', '.join(DEVICES)}")
    if "gpus" in data:
        cfg.gpus = parse_gpus(data["gpus"], source, "gpus")
    if "expect_gpus" in data:
        cfg.expect_gpus = _want(data["expect_gpus"], int, source, "expect_gpus", "an integer")
        if not 0 <= cfg.expect_gpus <= MAX_EXPECT_GPUS:
            raise ConfigError(source, "expect_gpus", f"must be >= 0 and <= {MAX_EXPECT_GPUS}")
    if "require_gpu" in data:
        cfg.require_gpu = _want(data["require_gpu"], bool, source, "require_gpu", "true or false")
    if "timeout_scale" in data:
        cfg.timeout_scale = _positive(data["timeout_scale"], source, "timeout_scale", "a number", MAX_TIMEOUT_SCALE)
    if "report_dir" in data:
        cfg.report_dir = _want(data["report_dir"], str, source, "report_dir", "a path")
    checks = data.get("checks") or {}
    _want(checks, dict, source, "checks", "a mapping of check name to settings")
    for name, raw in checks.items():
        key = f"checks.{_show(name) if not isinstance(name, str) else one_line(name)}"
        if name not in registry:
            raise ConfigError(source, key, f"unknown check{did_you_mean(str(name), registry)}; known: "
                                          f"{', '.join(registry)}")
        cfg.checks[name] = _parse_check(registry[name], raw, source, key)
    return cfg


def _parse_check(cls: type[Check], raw: Any, source: str, key: str) -> CheckSettings:
    if raw is None:
        return CheckSettings()
    _want(raw, dict, source, key, f"a mapping with keys {', '.join(_CHECK_KEYS)}")
    settings = CheckSettings()
    for sub in raw:
        if sub not in _CHECK_KEYS:
            raise ConfigError(source, f"{key}.{one_line(str(sub))}", f"unknown key; allowed: {', '.join(_CHECK_KEYS)}")
    params = raw.get("params") or {}
    _want(params, dict, source, f"{key}.params", "a mapping of parameter name to value")
    for pname, value in params.items():
        decl = cls.param(pname) if isinstance(pname, str) else None
        shown = one_line(str(pname))
        if decl is None:
            known = ", ".join(p.name for p in cls.params) or "none"
            raise ConfigError(source, f"{key}.params.{shown}", f"unknown parameter; known: {known}")
        settings.params[decl.name] = decl.coerce(value, source, f"{key}.params.{shown}")
    rules = raw.get("thresholds") or []
    _want(rules, list, source, f"{key}.thresholds", "a list of threshold rules")
    settings.thresholds = [ThresholdRule.parse(r, source, f"{key}.thresholds[{i}]") for i, r in enumerate(rules)]
    if "timeout_s" in raw:
        settings.timeout_s = _positive(raw["timeout_s"], source, f"{key}.timeout_s", "a number of seconds",
                                       MAX_TIMEOUT_S)
    if "enabled" in raw:
        settings.enabled = _want(raw["enabled"], bool, source, f"{key}.enabled", "true or false")
    return settings


def load_config(path: str | Path, registry: dict[str, type[Check]]) -> Config:
    """Read and validate a YAML config file (bounded in size; every number finite)."""
    try:
        data = load_yaml_file(path, "YAML config")
    except BadInput as exc:
        raise exc.as_config_error() from None
    return parse_config(data, str(path), registry)
