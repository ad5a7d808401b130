"""The manual page docs/reference/gpuaccept.1: generated from the same parser as docs/reference/cli.md (its
currency is checked with the other generated pages, tests/test_docs.py), well-formed roff that groff and man
render without a warning, and installed by pip as data (share/man/man1)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from gpuaccept.docsgen import man_roff
from gpuaccept.docsgen.cli_md import _walk
from tests.launch_support import require

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "gpuaccept.1"
MACROS = {"TH", "SH", "SS", "TP", "PP", "RS", "RE", "nf", "fi", "br"}


def _commands() -> list[str]:
    from gpuaccept.cli import build_parser

    return [" ".join(words) for words, _, _ in _walk(build_parser(), ["gpuaccept"], "")][1:]


def test_the_checked_in_page_is_the_generated_one() -> None:
    assert PAGE.read_text(encoding="utf-8") == man_roff.page(), "run `make docs-gen` and commit the result"


def test_every_line_is_text_or_a_known_macro_and_every_command_has_a_section() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for line in text.splitlines()[1:]:  # the first line is a comment
        if line[:1] in (".", "'"):
            assert line[1:].split()[0] in MACROS, line  # text that starts with '.' is protected by \&
    sections = re.findall(r'^\.SS "(.*)"$', text, re.M)
    assert [s.replace("\\-", "-") for s in sections] == _commands()
    for name in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXIT STATUS"):
        assert f".SH {name}\n" in text


@pytest.mark.parametrize(("raw", "roff"), [
    ("--json", "\\-\\-json"), (".hidden", "\\&.hidden"), ("'quoted'", "\\&'quoted'"), ("a\\b", "a\\eb"),
    ("x\n.y", "x\n\\&.y")])
def test_text_is_escaped_for_roff(raw: str, roff: str) -> None:
    assert man_roff.text(raw) == roff


def test_groff_renders_it_without_a_warning() -> None:
    require("groff")
    proc = subprocess.run(["groff", "-man", "-Tutf8", "-ww", str(PAGE)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    plain = re.sub(r".\x08", "", proc.stdout).replace("\u2010", "-")  # overstrike (bold) and hyphens as typed
    for line in ("gpuaccept node-status label", "gpuaccept node-status daemonset --image", "--report-dir DIR",
                 "gpuaccept run --budget 10m --plan"):
        assert line in plain, line


def test_man_shows_it() -> None:
    require("man")
    proc = subprocess.run(["man", "-l", str(PAGE)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "100", "LC_ALL": "C.UTF-8"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("GPUACCEPT(1)") and "EXIT STATUS" in proc.stdout


def test_pip_installs_it_as_data() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files = config["tool"]["setuptools"]["data-files"]["share/man/man1"]
    assert files == ["docs/reference/gpuaccept.1"] and all((ROOT / f).is_file() for f in files)
