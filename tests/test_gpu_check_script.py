"""bench/gpu_check.sh, the GPU check a lent H100/H200 runs: it must keep up with the code it drives, since nothing
here can run it (no GPU). Its imports resolve, its test list is every file with a gpu mark, its checks and
profiles exist, and shellcheck passes it."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from pathlib import Path

from gpuaccept.checks import registry
from gpuaccept.checks.base import PROFILES
from tests.k8s_support import need_binary

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _has_gpu_mark(path: Path) -> bool:
    """Whether a test module marks anything ``gpu`` (a decorator or ``pytestmark``), read from its syntax tree."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "gpu" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "mark":
            return True
    return False


def test_its_test_list_is_every_file_with_a_gpu_mark() -> None:
    text = SCRIPT.read_text()
    pattern = re.search(r"grep -lE '([^']+)' tests/test_\*\.py", text)
    assert pattern, "the script no longer derives its test list from the marks"
    by_grep = {p.name for p in (ROOT / "tests").glob("test_*.py") if re.search(pattern.group(1), p.read_text())}
    by_ast = {p.name for p in (ROOT / "tests").glob("test_*.py") if _has_gpu_mark(p)}
    assert by_ast and by_grep == by_ast
    assert {"test_zygote_cuda.py", "test_conformance_readers.py", "test_stress.py"} <= by_ast


def test_what_it_imports_and_runs_exists() -> None:
    text = SCRIPT.read_text()
    imports = re.findall(r"^from (gpuaccept[\w.]*) import (\w+)", text, flags=re.M)
    assert imports, "the fork check imports the warm process's preload"
    for module, name in imports:
        assert hasattr(importlib.import_module(module), name), (module, name)
    runs = re.findall(r"python3 -m gpuaccept run (.*?)(?:>|$)", text.replace("\\\n", " "), flags=re.M)
    assert len(runs) == 3
    named_runs = 0
    for args in runs:
        profile = re.search(r"--profile (\w+)", args)
        assert profile and profile.group(1) in PROFILES, args
        named = re.search(r"--checks ([\w,]+)", args)
        if named:
            named_runs += 1
            assert set(named.group(1).split(",")) <= set(registry()), args
    assert named_runs == 2


def test_shellcheck_passes_it() -> None:
    shellcheck = need_binary("shellcheck")
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
