"""The conformance manifest: what a qualified node's configuration may be, as YAML data (load, judge, capture).

A manifest names items of :mod:`gpuaccept.hw.conformance` (``*`` stands for any GPU, NIC or port in one
dotted part) and a rule for each::

    conformance: 1
    items:
      driver_version: 550.54.15                          # this value
      gpu_count: 8
      gpu.*.pcie_width_max: 16                           # every GPU
      nic.*.fw_ver: [28.39.1002, 28.41.1000]             # one of these (a rollout)
      nic.*.port*.rate_gbps: {min: 400}                  # a range (min and/or max)
      nccl_env.NCCL_IB_HCA: {value: mlx5, advisory: true}  # a difference is a WARN, not a FAIL

:func:`load_manifest` refuses unknown keys (with a did-you-mean), wrong types and impossible ranges as a
:class:`~gpuaccept.errors.ConfigError` (exit 2, one line). :func:`judge` is pure: each difference is a
:class:`Finding` naming the item (``gpu.3.pcie_width_max: 8, manifest 16``).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gpuaccept.errors import ConfigError
from gpuaccept.hw.conformance import Value, item_kind, known_item_names
from gpuaccept.model import Status

VERSION: Final = 1
TOP_KEYS: Final = ("conformance", "description", "items")
RULE_KEYS: Final = ("value", "one_of", "min", "max", "advisory")
KIND_WORDS: Final = {"str": "text", "int": "an integer", "float": "a number", "bool": "true or false"}


@dataclass(frozen=True)
class Rule:
    """One item's rule: ``allowed`` values (None: any), a numeric range, and whether a difference is advisory."""

    pattern: str
    allowed: tuple[Value, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    advisory: bool = False

    def admits(self, value: Value) -> bool:
        if self.allowed is not None and not any(_same(value, a) for a in self.allowed):
            return False
        if self.minimum is not None or self.maximum is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return False
            if self.minimum is not None and value < self.minimum:
                return False
            if self.maximum is not None and value > self.maximum:
                return False
        return True

    def describe(self) -> str:
        """``16``, ``one of 28.39.1002, 28.41.1000``, ``at least 400``, ``200 to 400``."""
        if self.allowed is not None:
            shown = ", ".join(_text(a) for a in self.allowed)
            return shown if len(self.allowed) == 1 else f"one of {shown}"
        if self.minimum is not None and self.maximum is not None:
            return f"{_text(self.minimum)} to {_text(self.maximum)}"
        return f"at least {_text(self.minimum)}" if self.minimum is not None else f"at most {_text(self.maximum)}"


@dataclass(frozen=True)
class Manifest:
    rules: tuple[Rule, ...]
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"conformance": VERSION, "description": self.description, "items": {r.pattern: _rule_data(r)
                                                                                    for r in self.rules}}


@dataclass(frozen=True)
class Finding:
    """A difference from the manifest: FAIL, or WARN where the manifest marks the item advisory."""

    status: Status
    item: str
    message: str


def _text(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).lower() if isinstance(v, bool) else str(v)


def _same(a: Value, b: Value) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return str(a) == str(b)


def _rule_data(r: Rule) -> Any:
    if r.allowed is not None and r.minimum is None and r.maximum is None and not r.advisory:
        return r.allowed[0] if len(r.allowed) == 1 else list(r.allowed)
    out: dict[str, Any] = {}
    if r.allowed is not None:
        out["one_of"] = list(r.allowed)
    if r.minimum is not None:
        out["min"] = r.minimum
    if r.maximum is not None:
        out["max"] = r.maximum
    if r.advisory:
        out["advisory"] = True
    return out


def _starred(name: str) -> str:
    """``gpu.3.name`` -> ``gpu.*.name``, ``nic.mlx5_0.port1.state`` -> ``nic.*.port*.state``."""
    parts = name.split(".")
    if parts[0] in ("gpu", "nic") and len(parts) >= 3:
        parts[1] = "*"
        if len(parts) == 4:
            parts[2] = "port*"
    return ".".join(parts)


def _hint(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(choices)})"


def _typed(value: Any, kind: str, where: str, key: str) -> Value:
    """``value`` as an item of ``kind``: a number written for a text item keeps its text (``550.540``) when it
    came through :func:`load_manifest`; a float given as data for a text item is refused ("quote it")."""
    from gpuaccept.inputs import NumberText

    if isinstance(value, NumberText):
        if kind == "str":
            return str(value)
        value = value.number
    if kind == "str" and isinstance(value, float):
        raise ConfigError(where, key, f"{value!r} was read as a number, which loses a version's digits "
                                      f"(550.540, 12.10); quote it: '{value}'")
    ok = {"str": isinstance(value, str | int | float) and not isinstance(value, bool),
          "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, int | float) and not isinstance(value, bool),
          "bool": isinstance(value, bool)}[kind]
    if not ok:
        raise ConfigError(where, key, f"expected {KIND_WORDS[kind]}, got {value!r}")
    return str(value) if kind == "str" else value


def parse_rule(pattern: str, spec: Any, where: str) -> Rule:
    """One ``items`` entry as a :class:`Rule` (ConfigError naming ``where`` and the item otherwise)."""
    at = f"items.{pattern}"
    kind = item_kind(pattern)
    if kind is None:
        raise ConfigError(where, at, f"no such item{_hint(_starred(pattern), known_item_names())}")
    if isinstance(spec, list):
        spec = {"one_of": spec}
    elif not isinstance(spec, dict):
        spec = {"value": spec}
    for key in spec:
        if key not in RULE_KEYS:
            raise ConfigError(where, at, f"unknown key {key!r}{_hint(str(key), RULE_KEYS)}")
    advisory = spec.get("advisory", False)
    if not isinstance(advisory, bool):
        raise ConfigError(where, f"{at}.advisory", f"expected true or false, got {advisory!r}")
    if "value" in spec and "one_of" in spec:
        raise ConfigError(where, at, "give value or one_of, not both")
    allowed: tuple[Value, ...] | None = None
    if "value" in spec:
        allowed = (_typed(spec["value"], kind, where, f"{at}.value"),)
    elif "one_of" in spec:
        if not isinstance(spec["one_of"], list) or not spec["one_of"]:
            raise ConfigError(where, f"{at}.one_of", "expected a non-empty list of values")
        allowed = tuple(_typed(v, kind, where, f"{at}.one_of") for v in spec["one_of"])
    bounds: dict[str, float] = {}
    for key in ("min", "max"):
        if key in spec:
            if kind not in ("int", "float"):
                raise ConfigError(where, f"{at}.{key}",
                                  f"a range needs a numeric item; {pattern} is {KIND_WORDS[kind]}")
            bounds[key] = float(_typed(spec[key], "float", where, f"{at}.{key}"))
    if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
        raise ConfigError(where, at, f"impossible range, min {_text(bounds['min'])} > max {_text(bounds['max'])}")
    if allowed is None and not bounds:
        raise ConfigError(where, at, "the rule names no value, one_of, min or max")
    return Rule(pattern, allowed, bounds.get("min"), bounds.get("max"), advisory)


def parse_manifest(data: Any, where: str) -> Manifest:
    """A manifest from loaded YAML (ConfigError, one line naming ``where`` and the key, otherwise)."""
    from gpuaccept.inputs import NumberText

    if isinstance(data, dict):
        data = {str(k): v for k, v in data.items()}
        if isinstance(data.get("conformance"), NumberText):
            data["conformance"] = data["conformance"].number
    if not isinstance(data, dict):
        raise ConfigError(where, "", "a conformance manifest is a mapping with conformance: 1 and items")
    for key in data:
        if key not in TOP_KEYS:
            raise ConfigError(where, "", f"unknown key {key!r}{_hint(str(key), TOP_KEYS)}")
    if data.get("conformance") != VERSION:
        raise ConfigError(where, "", f"conformance: expected {VERSION} (the manifest format), "
                          f"got {data.get('conformance')!r}")
    items = data.get("items")
    if not isinstance(items, dict) or not items:
        raise ConfigError(where, "", "items: expected a mapping of item names to rules")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(where, "", "description: expected text")
    return Manifest(tuple(parse_rule(str(k), v, where) for k, v in items.items()), description)


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest file (ConfigError or InputError, exit 2)."""
    from gpuaccept.inputs import load_yaml_file

    return parse_manifest(load_yaml_file(path, "conformance manifest", number_text=True), str(path))


def _matches(pattern: str, name: str) -> bool:
    p, n = pattern.split("."), name.split(".")
    return len(p) == len(n) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, n, strict=True))


def judge(items: Mapping[str, Value], manifest: Manifest, absent: Mapping[str, str] | None = None) -> list[Finding]:
    """Every difference between a node's items and the manifest, one :class:`Finding` per item (pure).

    An item the manifest names that this node lacks is a finding too (with the reason from ``absent`` when
    the collection gave one); items the manifest does not name are not judged.
    """
    out: list[Finding] = []
    for rule in manifest.rules:
        status = Status.WARN if rule.advisory else Status.FAIL
        names = [n for n in items if _matches(rule.pattern, n)]
        if not names:
            why = (absent or {}).get(rule.pattern)
            out.append(Finding(status, rule.pattern, f"{rule.pattern}: not on this node"
                                                     f"{f' ({why})' if why else ''}, manifest {rule.describe()}"))
        for name in sorted(names, key=_natural):
            if not rule.admits(items[name]):
                out.append(Finding(status, name, f"{name}: {_text(items[name])}, manifest {rule.describe()}"))
    return out


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def capture(items: Mapping[str, Value], description: str = "") -> Manifest:
    """The manifest that this node's items pass exactly: per-part items equal on every part become one
    ``*`` rule (``gpu.*.pcie_width_max: 16``), the others stay per part (a NIC's NUMA node)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in items:
        parts = name.split(".")
        if parts[0] in ("gpu", "nic") and len(parts) >= 3:
            groups[_starred(name)].append(name)
        else:
            groups[name].append(name)
    rules: list[Rule] = []
    for pattern in sorted(groups, key=_natural):
        names = sorted(groups[pattern], key=_natural)
        values = [items[n] for n in names]
        if len(names) > 1 and all(_same(v, values[0]) for v in values):
            rules.append(Rule(pattern, (values[0],)))
        else:
            rules.extend(Rule(n, (items[n],)) for n in names)
    return Manifest(tuple(rules), description)


def dump_manifest(manifest: Manifest) -> str:
    """The manifest as YAML, in item order."""
    import yaml

    return yaml.safe_dump(manifest.to_dict(), sort_keys=False, default_flow_style=False, width=120)
