"""Every generated page and where it goes; writing them, and finding the stale ones.

Generated pages carry the :data:`~gpuaccept.docsgen.markdown.GENERATED` line, so a check page left behind by
a check that no longer exists is found too. The check pages' entries in the site's navigation are generated as
well: the lines between :data:`NAV_BEGIN` and :data:`NAV_END` in ``mkdocs.yml`` (next to ``docs/``).
"""

from __future__ import annotations

import os
from pathlib import Path

import gpuaccept
from gpuaccept.docsgen import checks_md, cli_md, faults_md, man_roff, prometheus_md, schema_md
from gpuaccept.docsgen.markdown import GENERATED

PACKAGE = Path(gpuaccept.__file__).resolve().parent
#: variables that could leak into defaults or help texts while the parser is built
_ENV_CLEARED = ("COLUMNS", "LINES")
NAV_BEGIN = "# BEGIN generated check pages (make docs-gen)"
NAV_END = "# END generated check pages"
MKDOCS = "../mkdocs.yml"


def nav_text(current: str) -> str:
    """``current`` (mkdocs.yml) with the check pages' navigation between the markers regenerated."""
    head, sep, rest = current.partition(NAV_BEGIN)
    _, sep2, tail = rest.partition(NAV_END)
    if not sep or not sep2:
        raise ValueError(f"mkdocs.yml lacks the lines {NAV_BEGIN!r} and {NAV_END!r}")
    indent = head[head.rfind("\n") + 1:]
    entries = ["- Overview: checks/index.md"] + [f"- {c.name}: checks/{c.name}.md" for c in checks_md.builtin_checks()]
    return head + NAV_BEGIN + "".join(f"\n{indent}{e}" for e in entries) + f"\n{indent}" + NAV_END + tail


def pages() -> dict[str, str]:
    """Relative path under docs/ -> content of every generated page."""
    for name in _ENV_CLEARED + tuple(n for n in os.environ if n.startswith("GPUACCEPT_")):
        os.environ.pop(name, None)
    out = {"reference/cli.md": cli_md.page(), "reference/gpuaccept.1": man_roff.page(),
           "reference/report-schema.md": schema_md.page(PACKAGE / "data" / "report.schema.json"),
           "reference/prometheus.md": prometheus_md.page(),
           "reference/fault-codes.md": faults_md.page()}
    out.update(checks_md.pages(PACKAGE))
    return out


def _wanted(docs: Path) -> dict[str, str]:
    want = pages()
    mkdocs = docs / MKDOCS
    if mkdocs.is_file():
        want[MKDOCS] = nav_text(mkdocs.read_text(encoding="utf-8"))
    return want


def _generated_files(docs: Path) -> set[str]:
    """Relative paths of the files under ``docs/checks`` that say they are generated."""
    found = set()
    for path in sorted((docs / "checks").glob("*.md")):
        if path.read_text(encoding="utf-8").startswith(GENERATED):
            found.add(path.relative_to(docs).as_posix())
    return found


def stale(docs: Path) -> list[str]:
    """One line per generated file that is missing, differs, or is no longer generated."""
    want = _wanted(docs)
    lines = []
    for rel, text in want.items():
        path = docs / rel
        if not path.is_file():
            lines.append(f"{rel} is missing")
        elif path.read_text(encoding="utf-8") != text:
            lines.append(f"{rel} differs from what the code declares")
    gone = sorted(_generated_files(docs) - set(want))
    lines += [f"{rel} is generated but no check makes it any more" for rel in gone]
    return lines


def write(docs: Path) -> list[str]:
    """Write every generated page that changed and remove stale generated check pages; the paths touched."""
    want = _wanted(docs)
    touched = []
    for rel, text in want.items():
        path = docs / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            touched.append(rel)
    for rel in sorted(_generated_files(docs) - set(want)):
        (docs / rel).unlink()
        touched.append(rel)
    return touched
