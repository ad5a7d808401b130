"""A fast validator for the report JSON Schemas: the schema compiled once into plain Python checks.

``jsonschema`` interprets a schema generically and spent ~0.45 s per 8-GPU node report
(87 % of every command that loads reports, issue #27). The report schemas use a small
set of keywords (``type``, ``const``, ``enum``, ``required``, ``properties``,
``additionalProperties``, ``items``, ``minItems``, ``minLength``, ``maxLength``, ``minimum``,
``exclusiveMinimum``, ``maximum``, ``pattern``, ``anyOf``, ``$ref`` to ``#/$defs/...``;
``format`` is an annotation, as in jsonschema without a format checker), so
:func:`compile_schema` turns each sub-schema into a closure that checks just those,
with Draft 2020-12 semantics (an integer is a number without a fractional part, a
boolean is not a number, ``const``/``enum`` tell ``true`` from ``1``). Any other
keyword is refused at compile time, so the schema cannot silently outgrow this
validator. The published schema stays the contract; the tests check that this
validator and jsonschema agree on recorded and broken reports.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Path = tuple[str | int, ...]
Problem = tuple[Path, str]
Validator = Callable[[Any, Path], Problem | None]

ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "format", "$defs", "default", "examples"})
KEYWORDS = frozenset({"type", "const", "enum", "required", "properties", "additionalProperties", "items",
                      "minItems", "minLength", "maxLength", "minimum", "exclusiveMinimum", "maximum", "pattern",
                      "anyOf", "$ref"})


_PY_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,),
                                          "null": (type(None),), "boolean": (bool,), "number": (int, float),
                                          "integer": (int,)}


def _is_type(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if name == "number":
        return isinstance(value, (int, float))
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    raise ValueError(f"unknown JSON type {name!r}")


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Compiler:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.refs: dict[str, Validator] = {}

    def ref(self, ref: str) -> Validator:
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"unsupported $ref {ref!r}")
        if ref not in self.refs:
            box: list[Validator] = []
            self.refs[ref] = lambda v, p: box[0](v, p)  # recursion-safe forward reference
            box.append(self.compile(self.root["$defs"][ref[len("#/$defs/"):]]))
            self.refs[ref] = box[0]
        return self.refs[ref]

    def compile(self, schema: dict[str, Any]) -> Validator:
        unknown = set(schema) - KEYWORDS - ANNOTATIONS
        if unknown:
            raise ValueError(f"keyword(s) {sorted(unknown)} not supported by the fast validator")
        steps: list[Validator] = []
        if "$ref" in schema:
            steps.append(self.ref(schema["$ref"]))
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            shown = repr(types[0]) if len(types) == 1 else repr(types)
            exact = frozenset(t for name in types for t in _PY_TYPES[name])  # parsed JSON holds these exact types
            integral = "integer" in types and "number" not in types

            def check_type(v: Any, p: Path) -> Problem | None:
                if type(v) in exact or (integral and type(v) is float and v.is_integer()):
                    return None
                return None if any(_is_type(v, t) for t in types) else (p, f"{_show(v)} is not of type {shown}")
            steps.append(check_type)
        if "const" in schema:
            const = schema["const"]
            steps.append(lambda v, p: None if _equal(v, const) else (p, f"{_show(const)} was expected"))
        if "enum" in schema:
            options = schema["enum"]
            steps.append(lambda v, p: None if any(_equal(v, o) for o in options)
                         else (p, f"{_show(v)} is not one of {options!r}"))
        if "minLength" in schema:
            n = schema["minLength"]
            steps.append(lambda v, p: (p, f"{_show(v)} is too short") if isinstance(v, str) and len(v) < n else None)
        for key, test, word in (("minimum", lambda v, b: v < b, "less than the minimum of"),
                                ("exclusiveMinimum", lambda v, b: v <= b, "less than or equal to the minimum of"),
                                ("maximum", lambda v, b: v > b, "greater than the maximum of")):
            if key in schema:
                steps.append(self._bound(schema[key], test, word))
        if "maxLength" in schema:
            m = schema["maxLength"]
            steps.append(lambda v, p: (p, f"{_show(v)} is too long") if isinstance(v, str) and len(v) > m else None)
        if "pattern" in schema:
            rx = re.compile(schema["pattern"])
            steps.append(lambda v, p: (p, f"{_show(v)} does not match {rx.pattern!r}")
                         if isinstance(v, str) and not rx.search(v) else None)
        if "anyOf" in schema:
            options_v = [self.compile(s) for s in schema["anyOf"]]
            steps.append(lambda v, p: None if any(o(v, p) is None for o in options_v)
                         else (p, f"{_show(v)} is not valid under any of the given schemas"))
        if any(k in schema for k in ("required", "properties", "additionalProperties")):
            steps.append(self._object(schema))
        if "items" in schema or "minItems" in schema:
            steps.append(self._array(schema))
        if len(steps) == 1:
            return steps[0]

        def all_of(v: Any, p: Path) -> Problem | None:
            for step in steps:
                problem = step(v, p)
                if problem is not None:
                    return problem
            return None
        return all_of

    @staticmethod
    def _bound(bound: float, test: Callable[[Any, float], bool], word: str) -> Validator:
        def check(v: Any, p: Path) -> Problem | None:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and test(v, bound):
                return p, f"{_show(v)} is {word} {bound!r}"
            return None
        return check

    def _object(self, schema: dict[str, Any]) -> Validator:
        required = list(schema.get("required", []))
        props = {k: self.compile(s) for k, s in schema.get("properties", {}).items()}
        # a property whose schema is a type alone is checked inline when its value has one of the exact types
        # (any other value goes through its validator, which decides and words the problem)
        plain = {k: t for k, s in schema.get("properties", {}).items() if (t := _plain_types(s)) is not None}
        sure = {k: f for k, s in schema.get("properties", {}).items() if (f := _sure(s)) is not None}
        extra = schema.get("additionalProperties", True)
        extra_v = self.compile(extra) if isinstance(extra, dict) else None
        extra_plain = _plain_types(extra) if isinstance(extra, dict) else None

        def check(v: Any, p: Path) -> Problem | None:
            if not isinstance(v, dict):
                return None
            for key in required:
                if key not in v:
                    return p, f"{key!r} is a required property"
            if extra_plain is not None and not props:  # a map of plain values (tags)
                for value in v.values():
                    if type(value) not in extra_plain:
                        break
                else:
                    return None
            for key, value in v.items():
                exact = plain.get(key)
                if exact is not None and type(value) in exact:
                    continue
                accept = sure.get(key)
                if accept is not None and accept(value):
                    continue
                sub = props.get(key)
                if sub is not None:
                    problem = sub(value, (*p, key))
                elif extra is False:
                    return p, f"Additional properties are not allowed ({key!r} was unexpected)"
                elif extra_v is not None:
                    problem = extra_v(value, (*p, key))
                else:
                    continue
                if problem is not None:
                    return problem
            return None
        return check

    def _array(self, schema: dict[str, Any]) -> Validator:
        items = self.compile(schema["items"]) if "items" in schema else None
        least = int(schema.get("minItems", 0))

        def check(v: Any, p: Path) -> Problem | None:
            if not isinstance(v, list):
                return None
            if len(v) < least:
                return p, f"{_show(v)} should be non-empty" if least == 1 else f"{_show(v)} is too short"
            if items is not None:
                for i, item in enumerate(v):
                    problem = items(item, (*p, i))
                    if problem is not None:
                        return problem
            return None
        return check


def _plain_types(schema: dict[str, Any]) -> frozenset[type] | None:
    """The exact Python types that a schema of ``type`` alone (annotations aside) accepts without further
    checks, or None for any other schema. An integer-only schema's integral float is left to the validator."""
    if "type" not in schema or set(schema) - {"type"} - ANNOTATIONS:
        return None
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return frozenset(t for name in types for t in _PY_TYPES[name])


def _sure(schema: dict[str, Any]) -> Callable[[Any], bool] | None:
    """For a string with a pattern alone, or a map of plain values alone (``tags``): one call that says True when
    a value certainly meets the schema (False: let its validator decide and word the problem); else None."""
    keys = set(schema) - ANNOTATIONS
    if keys == {"type", "pattern"} and schema["type"] == "string":
        search = re.compile(schema["pattern"]).search
        return lambda v: type(v) is str and search(v) is not None
    extra = schema.get("additionalProperties")
    values = _plain_types(extra) if keys == {"type", "additionalProperties"} and schema["type"] == "object" and \
        isinstance(extra, dict) else None
    if values is None:
        return None

    def plain_map(v: Any) -> bool:
        if type(v) is not dict:
            return False
        for x in v.values():
            if type(x) not in values:
                return False
        return True
    return plain_map


def compile_schema(schema: dict[str, Any], ref: str | None = None) -> Callable[[Any], Problem | None]:
    """A function of a parsed JSON value: None when ``schema`` (or its ``#/$defs/...`` ``ref``) accepts it,
    else the first problem as (path in the value, message)."""
    compiler = _Compiler(schema)
    check = compiler.ref(ref) if ref else compiler.compile(schema)
    return lambda value: check(value, ())
