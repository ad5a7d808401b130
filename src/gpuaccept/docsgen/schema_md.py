"""report.json's fields as tables, read from the package's JSON Schema (``data/report.schema.json``; pure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuaccept.docsgen.markdown import GENERATED, cell, code, table


def _type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name})"
    if "const" in spec:
        return code(json.dumps(spec["const"]))
    if "enum" in spec:
        return " \\| ".join(code(json.dumps(v)) for v in spec["enum"])
    kind = spec.get("type", "")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    text = " or ".join(kinds) or "any"
    if "array" in kinds and isinstance(spec.get("items"), dict):
        text += " of " + _type(spec["items"])
    for key in ("oneOf", "anyOf"):
        if key in spec:
            text = " or ".join(_type(s) for s in spec[key])
    return text


def _rows(spec: dict[str, Any]) -> list[list[str]]:
    required = set(spec.get("required", []))
    return [[code(name), _type(sub), "yes" if name in required else "", cell(sub.get("description", ""))]
            for name, sub in spec.get("properties", {}).items()]


def page(schema_path: Path) -> str:
    """docs/reference/report-schema.md."""
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    header = ["field", "type", "required", "meaning"]
    out = [GENERATED, "", "# report.json schema", "", cell(schema.get("description", "")), "",
           f"The JSON Schema itself is `src/gpuaccept/data/{schema_path.name}` (`{schema.get('$id', '')}`);"
           " [report.json](report-json.md) describes the files of a run.", "",
           "## The report", "", table(header, _rows(schema)), ""]
    for name, spec in schema.get("$defs", {}).items():
        out += [f"## {name}", ""]
        if spec.get("description"):
            out += [cell(spec["description"]), ""]
        rows = _rows(spec)
        out += [table(header, rows) if rows else f"Type: {_type(spec)}", ""]
    return "\n".join(out).rstrip() + "\n"
