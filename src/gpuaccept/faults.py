"""The fault catalogue (``gpuaccept/data/faults.yaml``): a stable code for each kind of FAIL and ERROR, its
severity, part, origin (the node's fault or a job's) and remediation ladder. Pure functions, no I/O but the
catalogue's one read.

- :func:`load` reads and validates the catalogue (unknown keys, duplicate or malformed codes, unknown ladder steps
  or match keys are :class:`~gpuaccept.errors.ConfigError`);
- :func:`classify` gives a result's code from its check, status, reason, details and metrics;
- :func:`next_step` the ladder's rung after ``tries`` attempts; :func:`nvml_step` NVML's recovery action
  (``nvmlDeviceGetGpuRecoveryAction``), which takes precedence for a live GPU;
- :func:`describe` the ``fault`` block a result carries in report.json.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from gpuaccept.errors import ConfigError
from gpuaccept.model import CheckResult, Status

STEPS: Final = ("rerun", "reset_gpu", "reboot_node", "drain_for_service", "replace_part")
"""The rungs of a ladder, mildest first."""
IN_SERVICE_STEPS: Final = frozenset({"rerun"})
"""Rungs the node stays in service for; every other rung takes it out (a GPU reset needs the GPU idle)."""
SEVERITIES: Final = ("critical", "major", "minor")
PARTS: Final = ("gpu", "nvlink", "pcie", "nic", "node", "disk", "software")
ORIGINS: Final = ("node", "job")
MATCH_KEYS: Final = frozenset({"check", "status", "reason", "xid", "metric", "source", "details"})
ENTRY_KEYS: Final = frozenset({"code", "title", "severity", "part", "origin", "ladder", "evidence", "match"})
CODE_RE: Final = re.compile(r"^GA-[A-Z]{2,5}-\d{3}$")
FALLBACK: Final = "GA-RUN-000"
"""The code of a FAIL no other entry names (a check added without its own code: the drift test says so)."""

NVML_RECOVERY: Final[dict[int, str | None]] = {0: None, 1: "reset_gpu", 2: "reboot_node", 3: "drain_for_service",
                                                4: "reset_gpu", 5: "drain_for_service", 6: "reset_gpu",
                                                7: "reboot_node"}
"""``nvmlDeviceGetGpuRecoveryAction`` (field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``) as ladder rungs: NONE (the
driver asks for nothing), GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET (a reset, which drains),
RECOVER_IMEX_DOMAIN,
BUS_RESET, SYSTEM_REBOOT."""


SOURCE: Final = "gpuaccept/data/faults.yaml"


def _bad(reason: str) -> ConfigError:
    return ConfigError(SOURCE, "", reason)


@dataclass(frozen=True)
class Rule:
    """One ``match`` rule; every key given must hold."""

    check: str | None = None
    status: Status | None = None
    reason: re.Pattern[str] | None = None
    xid: int | None = None
    metric: str | None = None
    source: str | None = None
    details: str | None = None

    @property
    def catch_all(self) -> bool:
        """A rule naming only a check: that check's code for any FAIL the entries before it do not name."""
        return self.check is not None and all(
            v is None for v in (self.status, self.reason, self.xid, self.metric, self.source, self.details))

    def matches(self, r: CheckResult) -> bool:
        if self.check is not None and r.name != self.check:
            return False
        if self.status is not None and r.status is not self.status:
            return False
        if self.reason is not None and not self.reason.search(r.reason):
            return False
        if self.xid is not None and self.xid not in xids_in(r.reason):
            return False
        if self.details is not None and not (isinstance(r.details, dict) and r.details.get(self.details)):
            return False
        if self.metric is not None or self.source is not None:
            missed = [m for m in r.metrics if m.threshold is not None and m.threshold.severity is Status.FAIL
                      and not m.threshold.met_by(m.value)]
            if not any((self.metric is None or fnmatch.fnmatchcase(m.name, self.metric))
                       and (self.source is None or (m.threshold is not None
                                                    and m.threshold.source.startswith(self.source)))
                       for m in missed):
                return False
        return True


@dataclass(frozen=True)
class Fault:
    """One catalogue entry."""

    code: str
    title: str
    severity: str
    part: str
    origin: str
    ladder: tuple[str, ...]
    evidence: str
    rules: tuple[Rule, ...]


_XID_IN_REASON = re.compile(r"(?:XID |, )(\d{1,4})\b")


def xids_in(reason: str) -> list[int]:
    """The Xid numbers a health reason names (``XID 48 (double-bit ...), 79 x2 (GPU has fallen ...)``)."""
    if "XID " not in reason:
        return []
    return [int(x) for x in _XID_IN_REASON.findall(reason[reason.index("XID "):])]


def _rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict) or not raw:
        raise _bad(f"{where}: a match rule is a non-empty mapping")
    bad = sorted(set(raw) - MATCH_KEYS)
    if bad:
        raise _bad(f"{where}: unknown match key {bad[0]!r} (known: {', '.join(sorted(MATCH_KEYS))})")
    try:
        status = Status(raw["status"]) if "status" in raw else None
        pattern = re.compile(str(raw["reason"])) if "reason" in raw else None
    except (ValueError, re.error) as exc:
        raise _bad(f"{where}: {exc}") from None
    if status is not None and not status.is_failure:
        raise _bad(f"{where}: status {status.value!r}: a code names a fail or an error")
    xid = raw.get("xid")
    if xid is not None and (not isinstance(xid, int) or isinstance(xid, bool)):
        raise _bad(f"{where}: xid {xid!r} is not a number")
    return Rule(check=raw.get("check"), status=status, reason=pattern, xid=xid, metric=raw.get("metric"),
                source=raw.get("source"), details=raw.get("details"))


def _entry(raw: Any, i: int) -> Fault:
    where = f"faults[{i}]"
    if not isinstance(raw, dict):
        raise _bad(f"{where}: an entry is a mapping")
    code = raw.get("code")
    where = f"{where} ({code})"
    bad = sorted(set(raw) - ENTRY_KEYS)
    if bad:
        raise _bad(f"{where}: unknown key {bad[0]!r} (known: {', '.join(sorted(ENTRY_KEYS))})")
    missing = sorted(ENTRY_KEYS - set(raw))
    if missing:
        raise _bad(f"{where}: missing {missing[0]!r}")
    if not isinstance(code, str) or not CODE_RE.match(code):
        raise _bad(f"{where}: a code is GA-<AREA>-<NNN>, e.g. GA-MEM-001")
    for key, allowed in (("severity", SEVERITIES), ("part", PARTS), ("origin", ORIGINS)):
        if raw[key] not in allowed:
            raise _bad(f"{where}: {key} {raw[key]!r} is not one of {', '.join(allowed)}")
    ladder = raw["ladder"]
    if not isinstance(ladder, list) or not ladder:
        raise _bad(f"{where}: ladder is a non-empty list of {', '.join(STEPS)}")
    for step in ladder:
        if step not in STEPS:
            raise _bad(f"{where}: unknown ladder step {step!r} (known: {', '.join(STEPS)})")
    if len(set(ladder)) != len(ladder):
        raise _bad(f"{where}: a ladder names each step once")
    if not isinstance(raw["match"], list) or not raw["match"]:
        raise _bad(f"{where}: match is a non-empty list of rules")
    rules = tuple(_rule(r, f"{where} match[{j}]") for j, r in enumerate(raw["match"]))
    return Fault(code, str(raw["title"]), raw["severity"], raw["part"], raw["origin"], tuple(ladder),
                 str(raw["evidence"]), rules)


def parse(data: Any) -> tuple[Fault, ...]:
    """The catalogue of a loaded YAML document (pure); ConfigError for anything malformed."""
    if not isinstance(data, dict) or set(data) != {"faults"} or not isinstance(data["faults"], list):
        raise _bad("one key, faults: a list of entries")
    out = tuple(_entry(raw, i) for i, raw in enumerate(data["faults"]))
    seen: set[str] = set()
    for f in out:
        if f.code in seen:
            raise _bad(f"duplicate code {f.code}")
        seen.add(f.code)
    if FALLBACK not in seen:
        raise _bad(f"no {FALLBACK} (the code of a FAIL no other entry names)")
    return out


@functools.lru_cache(maxsize=1)
def load() -> tuple[Fault, ...]:
    """The package's catalogue (read once)."""
    import yaml

    text = resources.files("gpuaccept").joinpath("data", "faults.yaml").read_text(encoding="utf-8")
    return parse(yaml.safe_load(text))


def by_code(catalogue: tuple[Fault, ...] | None = None) -> dict[str, Fault]:
    return {f.code: f for f in (catalogue if catalogue is not None else load())}


def classify(result: CheckResult, catalogue: tuple[Fault, ...] | None = None) -> Fault | None:
    """The fault of a FAIL or ERROR (the first entry with a matching rule; :data:`FALLBACK` for a FAIL none
    names); None for any other status. A code the check set itself (``details.code``) wins."""
    if not result.status.is_failure:
        return None
    cat = catalogue if catalogue is not None else load()
    own = result.details.get("code") if isinstance(result.details, dict) else None
    if isinstance(own, str):
        named = by_code(cat).get(own)
        if named is not None:
            return named
    for fault in cat:
        if any(rule.matches(result) for rule in fault.rules):
            return fault
    return by_code(cat)[FALLBACK]


def next_step(fault: Fault, tries: int) -> str:
    """The rung to take after ``tries`` attempts of the ladder (0: its first); the last rung once all were tried."""
    return fault.ladder[min(max(tries, 0), len(fault.ladder) - 1)]


def nvml_step(actions: Mapping[str, int] | None) -> str | None:
    """The strongest rung NVML's recovery actions ask for (``{"cuda:0": 2}``: node reboot), None for none."""
    steps = [NVML_RECOVERY.get(v) for v in (actions or {}).values() if isinstance(v, int)]
    named = [s for s in steps if s is not None]
    return max(named, key=STEPS.index) if named else None


def recovery_actions(result: CheckResult) -> dict[str, int]:
    """``{"cuda:N": action}`` of the NVML snapshot the health check keeps in ``details.snapshot`` (non-zero ones)."""
    snap = result.details.get("snapshot") if isinstance(result.details, dict) else None
    gpus = snap.get("gpus") if isinstance(snap, dict) else None
    out: dict[str, int] = {}
    for g in gpus if isinstance(gpus, list) else []:
        action = g.get("gpu_recovery_action") if isinstance(g, dict) else None
        if isinstance(action, int) and not isinstance(action, bool) and action:
            ordinal = g.get("ordinal") if g.get("ordinal") is not None else g.get("index")
            out[f"cuda:{ordinal}"] = action
    return out


def first_step(fault: Fault, result: CheckResult | None = None) -> str:
    """The rung to take now: NVML's recovery action for a live GPU when the driver reports one, else the
    ladder's first."""
    nvml = nvml_step(recovery_actions(result)) if result is not None and fault.part in ("gpu", "nvlink") else None
    return nvml or fault.ladder[0]


def leaves_service(step: str) -> bool:
    """Whether ``step`` takes the node out of service (drain, taint): every rung but a re-run."""
    return step not in IN_SERVICE_STEPS


_DEVICE = re.compile(r"\bcuda:\d+\b")


def describe(result: CheckResult, catalogue: tuple[Fault, ...] | None = None) -> dict[str, Any] | None:
    """The ``fault`` block of a FAIL or ERROR in report.json: code, title, severity, part (and the devices the
    reason names), origin, ladder and the step to take now; None for any other status."""
    fault = classify(result, catalogue)
    if fault is None:
        return None
    d: dict[str, Any] = {"code": fault.code, "title": fault.title, "severity": fault.severity, "part": fault.part,
                         "origin": fault.origin, "ladder": list(fault.ladder), "action": first_step(fault, result)}
    devices = list(dict.fromkeys(_DEVICE.findall(result.reason)))
    if devices:
        d["devices"] = devices
    nvml = recovery_actions(result)
    if nvml and fault.part in ("gpu", "nvlink"):
        d["nvml_recovery_action"] = nvml
    return d


def with_fault(result: CheckResult) -> CheckResult:
    """``result`` with its :attr:`~gpuaccept.model.CheckResult.fault` set (a FAIL or ERROR) or cleared (any other
    status); the same object."""
    result.fault = describe(result)
    return result
