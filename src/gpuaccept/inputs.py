"""Reading input files safely: bounded in size, strict UTF-8, finite numbers, bounded nesting.

Every command that reads a file (a config, a baseline, a report, results.jsonl,
a tool output) goes through here, so that a malformed, huge or hostile input is
an :class:`~gpuaccept.errors.InputError` naming the file and the reason in one
line, never an internal error: no ``MemoryError`` on ``/dev/zero``, no
``RecursionError`` on ``[[[[...]]]]``, no ``OverflowError`` on ``1e400`` or
``10**400``, and no NaN or infinity slipping into a number.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuaccept.errors import ConfigError, InputError

MAX_INPUT_BYTES = 16 * 1024 * 1024
"""The most bytes read from any one input file."""

MAX_DEPTH = 64
"""The deepest nesting of lists and mappings accepted in JSON or YAML input."""

MAX_INT_DIGITS = 30
"""Integers longer than this are not plausible measurements and do not fit a float."""


class BadInput(InputError):
    """An unreadable or malformed input file: ``source`` (the file), ``key`` (where in it, may be
    empty) and ``reason``, so that a caller can re-raise it as its own kind of error."""

    def __init__(self, source: str, key: str, reason: str) -> None:
        self.source, self.key, self.reason = source, key, reason
        super().__init__(f"{source}: {key}: {reason}" if key else f"{source}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:  # raised in a worker process, read back here
        return type(self), (self.source, self.key, self.reason)

    def as_config_error(self) -> ConfigError:
        return ConfigError(self.source, self.key, self.reason)


def one_line(text: str) -> str:
    """``text`` with control characters (newlines included) escaped, so an error message stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def did_you_mean(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """`` (did you mean a or b?)`` naming the candidates close to ``name`` (difflib); empty when none is close."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=n, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def shown_names(name: str, names: Sequence[str], limit: int = 15) -> str:
    """``a, b, c, ...``: at most ``limit`` of ``names``, those close to ``name`` first (a cut list still shows the
    near match); ``none`` when empty."""
    near = difflib.get_close_matches(name, sorted(set(names)), n=3, cutoff=0.6)
    ordered = near + [n for n in names if n not in near]
    return (", ".join(ordered[:limit]) + (", ..." if len(ordered) > limit else "")) or "none"


def read_bytes(path: str | Path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> bytes:
    """At most ``limit`` bytes of ``path``; InputError when unreadable or larger."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except IsADirectoryError:
        raise BadInput(str(p), "", f"cannot read: is a directory, not a {what}") from None
    except OSError as exc:
        raise BadInput(str(p), "", f"cannot read: {exc.strerror or type(exc).__name__}") from None
    if len(data) > limit:
        raise BadInput(str(p), "", f"larger than {limit // (1024 * 1024)} MiB; not a {what}")
    return data


def read_text(path: str | Path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of ``path`` (at most ``limit`` bytes); InputError otherwise."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(str(path), "", f"not UTF-8 text (byte {exc.start}); not a {what}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"the integer {text[:12]}... has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:24]} is out of the range of a finite number")
    return value


def check_depth(data: Any, where: str, limit: int = MAX_DEPTH, *, shared: bool = True) -> None:
    """InputError when ``data`` nests lists and mappings deeper than ``limit`` (checked without recursion).
    ``shared=False`` says no object appears twice (parsed JSON): then it is walked a level at a time, faster."""
    if not shared:
        level = [data] if isinstance(data, (dict, list)) else []
        for depth in range(limit + 1):
            if not level:
                return
            if depth >= limit:
                raise BadInput(where, "", f"nested deeper than {limit} levels")
            below: list[Any] = []
            keep = below.append
            for item in level:  # a plain loop: half the time of a list per container (issue 27)
                for c in (item.values() if type(item) is dict else item):
                    kind = type(c)
                    if kind is dict or kind is list:
                        keep(c)
            level = below
        return
    stack: list[tuple[Any, int]] = [(data, 0)]
    seen: set[int] = set()  # YAML aliases share objects: each is walked once
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if depth >= limit:
                raise BadInput(where, "", f"nested deeper than {limit} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children)


_SHAPE = bytes(ord("0") if chr(c).isdigit() and c < 128 else ord("e") if c in b"eE" else ord("s") if c in b"+-"
               else ord(" ") for c in range(256))
_RISKY = (b"0" * (MAX_INT_DIGITS + 1), b"e000", b"es000")


def _risky_numbers(text: str) -> bool:
    """Whether ``text`` may hold a JSON number that the strict hooks refuse: a run of more than MAX_INT_DIGITS
    digits, or an exponent of 3 digits or more. Without either, every integer is short enough and every number is
    below 10**(MAX_INT_DIGITS + 99), finite. Bytes mapped to digit/e/sign/other and searched (about 4 ns a byte)."""
    shape = text.encode("utf-8", "surrogatepass").translate(_SHAPE)
    return any(pattern in shape for pattern in _RISKY)


def loads_json(text: str, where: str) -> Any:
    """Parse JSON strictly: no NaN/Infinity, every number finite, nesting bounded. The per-number checks run only
    when the text holds a number that could fail them (:func:`_risky_numbers`; issue #27: they were half the
    parse time of a fleet's cluster report)."""
    hooks: dict[str, Any] = {"parse_int": _parse_int, "parse_float": _parse_float} if _risky_numbers(text) else {}
    try:
        data = json.loads(text, parse_constant=_reject_constant, **hooks)
    except json.JSONDecodeError as exc:
        raise BadInput(where, "", f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        msg = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise BadInput(where, "", f"not valid JSON ({one_line(msg)})") from None
    check_depth(data, where, shared=False)
    return data


def load_json_file(path: str | Path, what: str = "JSON file") -> Any:
    """``loads_json`` of a file read with ``read_text``."""
    return loads_json(read_text(path, what), str(path))


def _check_yaml_numbers(data: Any, where: str) -> None:
    stack: list[tuple[Any, str]] = [(data, "")]
    seen: set[int] = set()
    while stack:
        item, key = stack.pop()
        if isinstance(item, (dict, list)):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, NumberText):
            item = item.number
        if isinstance(item, float) and not math.isfinite(item):
            raise BadInput(where, key, f"expected a finite number, got {item!r}")
        if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > 100:
            raise BadInput(where, key, f"an integer with more than {MAX_INT_DIGITS} digits")
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise BadInput(where, key, f"a key must be a string, got {type(k).__name__} "
                                           f"{one_line(repr(k))[:60]}")
                stack.append((v, f"{key}.{k}" if key else str(k)))
        elif isinstance(item, list):
            stack.extend((v, f"{key}[{i}]") for i, v in enumerate(item))


def _unique_key_loader() -> Any:
    """A SafeLoader whose mappings refuse a key given twice (YAML says keys are unique; PyYAML keeps the last)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {one_line(repr(key))[:60]} (first on line {first})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


class NumberText(str):
    """A plain YAML scalar that would resolve to a number, kept as its text (``550.540``, ``12.10``);
    ``number`` is what YAML would have made of it (int or float)."""

    number: int | float

    def __new__(cls, text: str, number: int | float) -> NumberText:
        obj = super().__new__(cls, text)
        obj.number = number
        return obj


def _number_text_loader() -> Any:
    """The unique-key loader, but numbers stay :class:`NumberText` (versions keep their text)."""
    base = _unique_key_loader()

    class NumberTextLoader(base):  # type: ignore[misc,valid-type]
        pass

    def make(kind: str) -> Any:
        def construct(loader: Any, node: Any) -> NumberText:
            number = getattr(base, f"construct_yaml_{kind}")(loader, node)
            return NumberText(str(node.value), number)
        return construct

    NumberTextLoader.add_constructor("tag:yaml.org,2002:int", make("int"))
    NumberTextLoader.add_constructor("tag:yaml.org,2002:float", make("float"))
    return NumberTextLoader


def loads_yaml(text: str, where: str, number_text: bool = False) -> Any:
    """Parse YAML safely: errors of the YAML library and of its tag constructors
    (``!!int ""``, ``!!timestamp "x"``) become InputError; a key given twice in one mapping is an error naming
    it and its line; nesting is bounded; every number is finite (``.nan`` and ``.inf`` are refused).
    ``number_text``: numbers come back as :class:`NumberText` (their text, with the number beside it)."""
    import yaml

    try:
        data = yaml.load(text, Loader=_number_text_loader() if number_text else _unique_key_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadInput(where, line.rstrip(": "), f"invalid YAML: {one_line(str(problem))[:200]}") from None
    except RecursionError:
        raise BadInput(where, "", "invalid YAML: nested too deeply") from None
    except Exception as exc:  # the tag constructors raise anything on hostile input (IndexError for !!int "")
        raise BadInput(where, "", f"invalid YAML: a value cannot be read ({type(exc).__name__}: "
                                  f"{one_line(str(exc))[:120]})") from None
    check_depth(data, where)
    _check_yaml_numbers(data, where)
    return data


def load_yaml_file(path: str | Path, what: str = "YAML file", number_text: bool = False) -> Any:
    """``loads_yaml`` of a file read with ``read_text``."""
    return loads_yaml(read_text(path, what), str(path), number_text)
