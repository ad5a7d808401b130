"""One Markdown page per built-in check, from the registry's declarations (pure but for reading the sources).

Parameters with their per-profile values and bounds, default thresholds, timeouts, the declared metrics with
the units the check's source gives them (``Metric(name, value, unit)`` calls, read with an AST walk), and the
module's docstring: how the check measures, and the equivalent command where it names one.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

from gpuaccept.checks import BUILTIN_MODULES, _checks_of
from gpuaccept.checks.base import PROFILES, Check, Param, format_bound
from gpuaccept.checks.metricnames import globs_overlap
from gpuaccept.docsgen.markdown import GENERATED, cell, code, from_docstring, table
from gpuaccept.equivalents import CHECKS as EQUIVALENTS

_UNIT_SOURCES = ("checks", "nccltests", "perftest")


def builtin_checks() -> list[type[Check]]:
    """The built-in checks in suite order (plugins left out: the site documents this package)."""
    return [cls for module in BUILTIN_MODULES for cls in _checks_of(module)]


def _name_glob(node: ast.expr) -> str | None:
    """The metric name a ``Metric(...)`` call's first argument makes, as a glob (f-string parts become ``*``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "*"
                       for v in node.values)
    return None


def _str(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _metric_calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == "Metric" and n.args]


def _unit_arg(call: ast.Call) -> ast.expr | None:
    return call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "unit"), None)


def _units_in(tree: ast.AST, known: set[str]) -> set[tuple[str, str]]:
    """``(name glob, unit)`` pairs of one module: literal ``Metric(name, value, unit)`` calls; helpers that pass
    their arguments on to ``Metric`` (``_count(name, ...)``), called with literals; and ``(name, ..., unit)``
    tuples that a loop feeds to ``Metric``."""
    found: set[tuple[str, str]] = set()
    for call in _metric_calls(tree):
        name, unit = _name_glob(call.args[0]), _str(_unit_arg(call))
        if name and unit:
            found.add((name, unit))
    helpers: dict[str, tuple[int, int | str]] = {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        params = [a.arg for a in fn.args.args]
        offset = 1 if params[:1] == ["self"] else 0
        for call in _metric_calls(fn):
            first, unit_node = call.args[0], _unit_arg(call)
            if not (isinstance(first, ast.Name) and first.id in params):
                continue
            unit = _str(unit_node)
            if unit is not None:
                helpers[fn.name] = (params.index(first.id) - offset, unit)
            elif isinstance(unit_node, ast.Name) and unit_node.id in params:
                helpers[fn.name] = (params.index(first.id) - offset, params.index(unit_node.id) - offset)
    loops = _loop_values(tree)
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        fname = call.func.id if isinstance(call.func, ast.Name) else \
            call.func.attr if isinstance(call.func, ast.Attribute) else None
        if fname not in helpers:
            continue
        i, u = helpers[fname]
        arg = call.args[i] if 0 <= i < len(call.args) else None
        names = [_str(arg)] if _str(arg) else loops.get(arg.id, []) if isinstance(arg, ast.Name) else []
        unit = u if isinstance(u, str) else _str(call.args[u]) if 0 <= u < len(call.args) else None
        found.update((name, unit) for name in names if name and unit)
    for tup in (n for n in ast.walk(tree) if isinstance(n, ast.Tuple)):
        texts = [_str(e) for e in tup.elts]
        if len(texts) >= 2 and texts[0] and texts[0].isidentifier():
            unit = next((s for s in texts[1:] if s in known), None)
            if unit:
                found.add((texts[0], unit))
    return found


def _loop_values(tree: ast.AST) -> dict[str, list[str]]:
    """Loop variables bound to string literals: ``for name in ("a", "b")`` and ``for x, name in ((.., "a"),)``."""
    values: dict[str, list[str]] = {}
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
        if not isinstance(loop.iter, (ast.Tuple, ast.List)):
            continue
        targets = loop.target.elts if isinstance(loop.target, ast.Tuple) else [loop.target]
        for item in loop.iter.elts:
            parts = item.elts if isinstance(item, ast.Tuple) and isinstance(loop.target, ast.Tuple) else [item]
            for target, part in zip(targets, parts, strict=False):
                if isinstance(target, ast.Name) and _str(part):
                    values.setdefault(target.id, []).append(_str(part) or "")
    return values


def metric_units(package_dir: Path) -> list[tuple[str, str]]:
    """``(name glob, unit)`` for the metrics the check sources make (:func:`_units_in` over every module)."""
    trees = [ast.parse(path.read_text(encoding="utf-8"))
             for sub in _UNIT_SOURCES for path in sorted((package_dir / sub).glob("*.py"))]
    known = {u for tree in trees for call in _metric_calls(tree) if (u := _str(_unit_arg(call)))}
    known |= {"MB/s", "IO/s", "GB/s", "MHz", "C", "W", "count", "fraction", "s", "ms"}
    return sorted(set().union(*(_units_in(tree, known) for tree in trees)))


def units_for(pattern: str, units: list[tuple[str, str]]) -> str:
    """The units of the metric calls that can produce a name matching ``pattern`` (exact matches first)."""
    exact = sorted({u for n, u in units if n == pattern})
    if exact:
        return ", ".join(exact)
    return ", ".join(sorted({u for n, u in units if globs_overlap(n, pattern)}))


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return format_bound(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _bounds(p: Param) -> str:
    parts = []
    if p.choices is not None:
        parts.append("one of " + ", ".join(_value(c) for c in p.choices))
    if p.minimum is not None:
        parts.append(f">= {format_bound(p.minimum)}")
    if p.maximum is not None:
        parts.append(f"<= {format_bound(p.maximum)}")
    if p.kind == "list":
        parts.append(f"at most {p.max_items} items")
    return cell("; ".join(parts))


def check_page(cls: type[Check], units: list[tuple[str, str]]) -> str:
    """The page of one check."""
    profiles = [p for p in PROFILES if p in cls.profiles]
    out = [GENERATED, "", f"# {cls.name}", "", cell(cls.summary), ""]
    facts = [f"- Log tag: `[{cls.tag}]`",
             "- Profiles: " + (", ".join(f"`{p}`" for p in profiles) if profiles else
                               f"none (select it with `--checks {cls.name}`)"),
             "- " + ("Measures: its pass counts towards the verdict" if cls.measures else
                     "Takes stock: it measures nothing, so its pass alone does not make a run a pass")]
    if cls.key_metric:
        facts.append(f"- Headline metric: `{cls.key_metric}`")
    eq = EQUIVALENTS.get(cls.name)
    if eq is not None:
        what = "; ".join(x for x in (f"DCGM diag plugin {eq.dcgm}" if eq.dcgm else "", eq.tool) if x)
        facts.append(f"- Replaces: {cell(what)}" + (f" ({cell(eq.note)})" if eq.note else ""))
    out += [*facts, "", f"Its parameters are set in a config file under `checks.{cls.name}.params`"
            " ([Configuration](../reference/config.md)); `gpuaccept checks --profile PROFILE` prints these"
            " declarations.", ""]
    out += ["## Parameters", ""]
    if cls.params:
        header = ["parameter", "meaning", "kind", *[f"`{p}`" for p in profiles], "bounds"]
        rows = []
        for prm in cls.params:
            kind = f"list of {prm.item}" if prm.kind == "list" else prm.kind
            per = [code(_value(cls.defaults(p)[prm.name])) for p in profiles]
            rows.append([f"`{prm.name}`", cell(prm.help), kind, *per, _bounds(prm)])
        out += [table(header, rows), ""]
    else:
        out += ["None.", ""]
    out += ["## Default thresholds", ""]
    if cls.thresholds:
        out += [f"- `{cell(r.describe())}`" for r in cls.thresholds] + [""]
    else:
        out += ["No rule declared here; bounds may still come from the check itself, the per-SKU table, a config "
                "file or a baseline ([Concepts](../concepts/index.md#thresholds)).", ""]
    out += ["## Timeout", "", table(["profile", "seconds"],
                                    [[f"`{p}`", _value(cls.timeout_for(p, cls.defaults(p)))] for p in profiles]
                                    or [["(any)", _value(max(cls.timeout_s.values()))]]), "",
            "Scaled by `--timeout-scale`; under `--budget` the planner may give less.", ""]
    out += ["## Metrics", ""]
    if cls.metrics:
        rows = [[code(m), cell(units_for(m, units) or "(not found in the source)")] for m in cls.metrics]
        out += [table(["metric (name or glob)", "unit"], rows), ""]
    else:
        out += ["None declared.", ""]
    module = inspect.getmodule(cls)
    doc = inspect.getdoc(module) if module is not None else None
    if doc:
        out += ["## How it measures", "", f"From `{cls.__module__}`:", "", from_docstring(doc)]
    return "\n".join(out).rstrip() + "\n"


def index_page(checks: list[type[Check]]) -> str:
    """The checks' overview: which profile runs which check."""
    rows = [[f"[`{c.name}`]({c.name}.md)", f"`[{c.tag}]`", *["yes" if p in c.profiles else "" for p in PROFILES],
             cell(c.summary)] for c in checks]
    return "\n".join([
        GENERATED, "", "# Checks", "",
        "Every built-in check in the order the suite runs them, and the profiles that include it. A check in no "
        "profile runs only when named (`--checks NAME`). Each page lists the check's parameters with their value "
        "in each profile, its bounds, default thresholds, timeouts and metrics; "
        "[How the checks measure](../concepts/measuring.md) explains them in prose.", "",
        table(["check", "tag", *[f"`{p}`" for p in PROFILES], "what it does"], rows), ""])


def pages(package_dir: Path) -> dict[str, str]:
    """Relative path under docs/ -> content, for every generated check page."""
    checks = builtin_checks()
    units = metric_units(package_dir)
    out = {"checks/index.md": index_page(checks)}
    out.update({f"checks/{c.name}.md": check_page(c, units) for c in checks})
    return out
