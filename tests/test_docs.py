"""The documentation site: generated pages are current, the generator reads the real registry and parser, and
the site builds with ``mkdocs build --strict``.

The generated pages (docs/reference/cli.md, docs/checks/*.md, ...) are regenerated into a copy of docs/ by the
real command, ``python -m gpuaccept.docsgen``, and compared with the checked-in files.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaccept.checks import registry
from gpuaccept.checks.base import PROFILES
from gpuaccept.docsgen import checks_md, generate
from gpuaccept.docsgen.markdown import GENERATED, cell, from_docstring

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HOW = "the generated documentation is stale: run `make docs-gen` (python -m gpuaccept.docsgen docs) and commit it"


def _copy_site(tmp_path: Path) -> Path:
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    return tmp_path / "docs"


def _docsgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuaccept.docsgen", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_the_generated_pages_are_current(tmp_path: Path) -> None:
    copy = _copy_site(tmp_path)
    for page in (copy / "checks").glob("*.md"):
        page.unlink()
    (copy / "reference" / "cli.md").unlink()
    proc = _docsgen(str(copy))
    assert proc.returncode == 0, proc.stderr
    regenerated = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*.md")
                         if p.read_text(encoding="utf-8").startswith(GENERATED))
    checked_in = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
                        if p.read_text(encoding="utf-8").startswith(GENERATED))
    assert regenerated == checked_in, HOW
    for rel in regenerated:
        assert (copy / rel).read_text(encoding="utf-8") == (DOCS / rel).read_text(encoding="utf-8"), f"{rel}: {HOW}"
    assert (tmp_path / "mkdocs.yml").read_text() == (ROOT / "mkdocs.yml").read_text(), f"mkdocs.yml nav: {HOW}"
    assert _docsgen(str(DOCS), "--check").returncode == 0, HOW


def test_check_mode_names_a_stale_page_and_says_how_to_regenerate(tmp_path: Path) -> None:
    copy = _copy_site(tmp_path)
    page = copy / "checks" / "compute.md"
    text = page.read_text()
    assert "\n# compute\n" in text
    page.write_text(text.replace("\n# compute\n", "\n# compute (edited by hand)\n"))
    (copy / "checks" / "retired.md").write_text(GENERATED + "\n\n# retired\n")
    (copy / "reference" / "cli.md").unlink()
    proc = _docsgen(str(copy), "--check")
    assert proc.returncode == 1
    assert "checks/compute.md differs" in proc.stderr
    assert "checks/retired.md is generated but no check makes it any more" in proc.stderr
    assert "reference/cli.md is missing" in proc.stderr
    assert "make docs-gen" in proc.stderr.splitlines()[-1]
    assert _docsgen(str(copy)).returncode == 0  # writing repairs it, and removes the page of no check
    assert not (copy / "checks" / "retired.md").exists()
    assert _docsgen(str(copy), "--check").returncode == 0


def test_every_check_and_command_has_its_page_and_section() -> None:
    checks = registry()
    for name, cls in checks.items():
        text = (DOCS / "checks" / f"{name}.md").read_text()
        assert f"# {name}\n" in text
        for param in cls.params:
            assert f"| `{param.name}` |" in text, (name, param.name)
        for metric in cls.metrics or ():
            assert f"| `{metric}` |" in text, (name, metric)
        assert f"- {name}: checks/{name}.md" in (ROOT / "mkdocs.yml").read_text()
    cli = (DOCS / "reference" / "cli.md").read_text()
    for command in ("run", "launch slurm", "launch k8s", "isolate", "healthcheck", "node-status", "image build",
                    "baseline create", "nccl-tests"):
        assert f"`gpuaccept {command}`" in cli, command
    assert "`--expect-gpus` `N`" in cli and "`--budget`" in cli


def test_the_config_page_lists_every_key_the_parser_accepts() -> None:
    from gpuaccept.node import config

    text = (DOCS / "reference" / "config.md").read_text()
    keys = {line.split("`")[1] for line in text.splitlines() if line.startswith("| `")}
    assert set(config._TOP_KEYS) | set(config._CHECK_KEYS) <= keys
    assert f"0 to {config.MAX_EXPECT_GPUS}" in text
    assert f"at most {config.MAX_TIMEOUT_SCALE:g}" in text


def test_a_parameter_row_shows_each_profile_value_and_the_bounds() -> None:
    compute = registry()["compute"]
    text = checks_md.check_page(compute, checks_md.metric_units(generate.PACKAGE))
    row = next(line for line in text.splitlines() if line.startswith("| `warmup_s` |"))
    profiles = [p for p in PROFILES if p in compute.profiles]
    header = next(line for line in text.splitlines() if line.startswith("| parameter |"))
    assert header == "| parameter | meaning | kind | " + " | ".join(f"`{p}`" for p in profiles) + " | bounds |"
    cells = row.split(" | ")
    assert cells[3:3 + len(profiles)] == [f"`{compute.defaults(p)['warmup_s']:g}`" for p in profiles]
    assert ">= 0; <= 3600" in row
    assert "| `gemm_bf16_tflops` | TFLOP/s |" in text


def test_metric_units_are_read_from_the_check_sources() -> None:
    units = dict(checks_md.metric_units(generate.PACKAGE))
    assert units["disk_seq_write_mbs"] == "MB/s"  # a (name, value, unit) tuple fed to Metric in a loop
    assert units["xid_fail_count"] == "count"  # a loop over names through the _count helper
    assert units["temperature_c"] == "C"  # a literal Metric(...) call
    assert checks_md.units_for("gemm_fp8_tflops_concurrent", checks_md.metric_units(generate.PACKAGE)) == "TFLOP/s"


def test_docstring_roles_and_literal_blocks_become_markdown() -> None:
    md = from_docstring("See :func:`~gpuaccept.checks.timing.warm_up_done`::\n\n    fio --x\n      --y\n\nAfter.\n"
                        "* a bullet")
    assert "``gpuaccept.checks.timing.warm_up_done``" in md
    assert "```text\nfio --x\n  --y\n```" in md
    assert "- a bullet" in md and ":func:" not in md


def test_the_generator_imports_no_torch() -> None:
    code = ("import sys; from gpuaccept.docsgen import generate; generate.pages(); "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "False"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.fail("mkdocs is not installed: install the docs extra (pip install -e '.[docs]')")
    proc = subprocess.run([mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env={"NO_MKDOCS_2_WARNING": "1",
                                                                                     "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "checks" / "compute" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_the_readme_is_a_front_door_whose_links_resolve() -> None:
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 10 * 1024
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["make", "run"], ["make", "test"]]
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) > 10
    for link in links:
        if not link.startswith(("http://", "https://")):
            assert (ROOT / link).exists(), f"README links to {link}, which does not exist"


def test_no_help_text_shows_an_escaped_percent() -> None:
    """argparse %-formats help strings but leaves a description without ``%(prog)`` as written, so a ``%%`` there
    reaches the reader (and the generated CLI page) doubled."""
    import argparse

    from gpuaccept.cli import build_parser

    seen: list[str] = []

    def walk(p: argparse.ArgumentParser) -> None:
        text = p.format_help()
        if "%%" in text:
            seen.append(p.prog)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in dict.fromkeys(a.choices.values()):
                    walk(sub)

    walk(build_parser())
    assert not seen, f"'%%' shown in the help of: {', '.join(seen)}"


def test_every_check_page_says_what_it_replaces() -> None:
    from gpuaccept.equivalents import CHECKS

    for name, eq in CHECKS.items():
        page = (DOCS / "checks" / f"{name}.md").read_text()
        assert "- Replaces: " in page and cell(eq.tool) in page, name
