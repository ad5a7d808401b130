"""The package's layering, read from the source with an AST walk (no import runs).

- ``model`` and ``errors`` import nothing of ours; ``hw`` only those two; ``results`` only the
  model, the errors and the argparse converters; the launch side never reaches the checks, the
  runner or the suite at import time.
- Only ``checks/``, ``hw/`` and ``distributed/`` import torch at module level; everything else
  imports it inside the function that needs it.
- No import circle between modules, counting the imports inside functions too (a circle that only
  closes at call time is still two modules that cannot be read apart). ``if TYPE_CHECKING:``
  imports are for the type checker and are left out.

Each rule is also run on a small planted tree, so a walker that sees nothing cannot pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
TORCH_ALLOWED = ("checks", "hw", "distributed")

# package (first component below gpuaccept) -> what its modules may import at module level, besides itself
ALLOWED: dict[str, frozenset[str]] = {
    "model": frozenset(),
    "errors": frozenset(),
    "nextsteps": frozenset(),  # the FAIL next-steps table: model's report writes it, so it imports nothing of ours
    "trainspeed": frozenset(),  # training TFLOP/s over the GEMM's: model's report writes it, so it imports nothing
    "faults": frozenset({"errors", "model"}),  # the fault catalogue's loader and pure functions
    "equivalents": frozenset(),  # DCGM/nccl-tests/gpu-burn counterparts and profile durations, as data
    "argtypes": frozenset({"errors"}),
    "safefs": frozenset({"errors"}),
    "outputs": frozenset({"errors"}),
    "inputs": frozenset({"errors"}),
    "exitcodes": frozenset(),
    "cliargs": frozenset({"errors", "argtypes", "exitcodes"}),
    "suiteplan": frozenset(),
    "cliexamples": frozenset(),
    "completion": frozenset({"errors"}),
    "hw": frozenset({"errors", "model"}),
    "checks": frozenset({"errors", "model", "argtypes", "inputs", "hw", "distributed", "nccltests", "perftest"}),
    "distributed": frozenset({"errors", "model", "hw", "checks"}),
    "node": frozenset({"errors", "model", "argtypes", "inputs", "checks", "hw", "distributed", "results",
                       "__init__", "faults"}),
    "results": frozenset({"errors", "model", "argtypes", "inputs", "cliargs"}),
    "report": frozenset({"errors", "model", "argtypes", "inputs", "results", "nextsteps", "__init__", "cliargs",
                         "trainspeed"}),
    "nccltests": frozenset({"errors", "model", "argtypes", "inputs", "hw", "cliargs", "outputs"}),
    "perftest": frozenset({"errors", "model", "argtypes", "inputs", "hw", "cliargs", "outputs"}),
    "launch": frozenset({"errors", "model", "argtypes", "inputs", "results", "cliargs", "exitcodes", "suiteplan",
                         "distributed.hostlist", "containers.sshd"}),
    "isolate": frozenset({"errors", "model", "argtypes", "inputs", "results", "cliargs", "exitcodes", "launch",
                          "nccltests", "perftest", "distributed.hostlist"}),
    "health": frozenset({"errors", "model", "argtypes", "inputs", "checks", "node", "cliargs", "exitcodes", "suiteplan",
                         "launch.k8s", "faults"}),
    "containers": frozenset({"errors", "model", "argtypes", "cliargs", "exitcodes", "safefs", "outputs"}),
    # continuous validation of idle nodes: plans over the Slurm clients and Kubernetes manifests, like launch
    "sweep": frozenset({"errors", "argtypes", "safefs"}),
    # the documentation's generated pages (python -m gpuaccept.docsgen): the registry at import, the parser and
    # the exporters inside functions; nothing imports it
    "docsgen": frozenset({"errors", "model", "checks", "equivalents", "__init__", "faults"}),
}

# package -> the packages its modules never import, not even inside a function: the engine stays below
# the commands that drive it, and the renderers read reports, never the engine that writes them
NEVER: dict[str, frozenset[str]] = {
    "exitcodes": frozenset({"cli", "cliargs", "node", "launch", "isolate", "health", "report", "results"}),
    "model": frozenset({"node", "launch", "isolate", "health", "report", "results", "cli", "checks"}),
    "nextsteps": frozenset({"node", "launch", "isolate", "health", "report", "results", "cli", "checks"}),
    "trainspeed": frozenset({"node", "launch", "isolate", "health", "report", "results", "cli", "checks"}),
    "equivalents": frozenset({"node", "launch", "isolate", "health", "report", "results", "cli", "checks"}),
    "faults": frozenset({"node", "launch", "isolate", "health", "report", "results", "cli", "checks", "hw"}),
    "hw": frozenset({"node", "launch", "isolate", "health", "report", "results", "cli", "checks", "distributed"}),
    "checks": frozenset({"node", "launch", "isolate", "health", "report", "cli"}),
    "distributed": frozenset({"node", "launch", "isolate", "health", "report", "cli"}),
    "node": frozenset({"launch", "isolate", "health", "report", "cli", "cliargs", "containers"}),
    "results": frozenset({"node", "launch", "isolate", "health", "report", "cli"}),
    "report": frozenset({"node", "launch", "isolate", "health", "cli"}),
    "launch": frozenset({"isolate", "health"}),
    "sweep": frozenset({"node", "checks", "distributed", "hw", "report"}),
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted
    line: int
    top: bool  # at import time (not inside a function)


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(src: Path, package: str = "gpuaccept") -> Iterator[Import]:
    """Every import statement under ``src/package``, resolved to absolute dotted names."""
    for path in sorted((src / package).rglob("*.py")):
        name = _module_name(path, src)
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))

        def walk(node: ast.AST, top: bool, name: str = name, is_pkg: bool = is_pkg) -> Iterator[Import]:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    yield from (i for c in child.orelse for i in walk(c, top))
                    continue
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        yield Import(name, alias.name, child.lineno, top)
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                        anchor = anchor[:len(anchor) - child.level + 1]
                        base = ".".join([*anchor, *([base] if base else [])])
                    yield Import(name, base, child.lineno, top)
                    for alias in child.names:  # `from gpuaccept.x import y` may name the module x.y
                        yield Import(name, f"{base}.{alias.name}", child.lineno, top)
                inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                yield from walk(child, inner)

        yield from walk(tree, True)


def _ours(src: Path, package: str, dotted: str) -> str | None:
    """The module of ours that ``dotted`` names (a module or a package), or None."""
    parts = dotted.split(".")
    if parts[0] != package:
        return None
    while parts:
        base = src.joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return None


def _graph(src: Path, package: str) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for imp in imports(src, package):
        graph.setdefault(imp.module, set())
        target = _ours(src, package, imp.target)
        if target is not None and target != imp.module:
            graph[imp.module].add(target)
    # importing a.b.c runs a/__init__ and a/b/__init__ first
    for module in list(graph):
        for target in list(graph[module]):
            parts = target.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent != module and parent in graph:
                    graph[module].add(parent)
    return graph


def layer_violations(src: Path, package: str = "gpuaccept") -> list[str]:
    out = []
    for imp in imports(src, package):
        target = _ours(src, package, imp.target)
        if not imp.top or target is None:
            continue
        own = imp.module.split(".")[1] if "." in imp.module else "__init__"
        rel = target[len(package) + 1:] or "__init__"
        if own not in ALLOWED or rel.split(".")[0] == own:
            continue
        allowed = ALLOWED[own]
        if not any(rel == a or rel.startswith(a + ".") for a in allowed):
            out.append(f"{imp.module}:{imp.line} imports {target} ({own} may import: {sorted(allowed) or 'nothing'})")
    return sorted(set(out))


def never_violations(src: Path, package: str = "gpuaccept") -> list[str]:
    """Imports at any level (inside functions too) that :data:`NEVER` rules out."""
    out = []
    for imp in imports(src, package):
        target = _ours(src, package, imp.target)
        if target is None:
            continue
        own = imp.module.split(".")[1] if "." in imp.module else "__init__"
        rel = (target[len(package) + 1:] or "__init__").split(".")[0]
        if rel in NEVER.get(own, frozenset()):
            out.append(f"{imp.module}:{imp.line} imports {target} ({own} never imports {rel})")
    return sorted(set(out))


def torch_violations(src: Path, package: str = "gpuaccept") -> list[str]:
    out = []
    for imp in imports(src, package):
        if not imp.top or imp.target.split(".")[0] != "torch":
            continue
        own = imp.module.split(".")[1] if "." in imp.module else "__init__"
        if own not in TORCH_ALLOWED:
            out.append(f"{imp.module}:{imp.line} imports {imp.target} at module level")
    return sorted(set(out))


def cycles(src: Path, package: str = "gpuaccept") -> list[list[str]]:
    """Strongly connected groups of more than one module in the import graph (Tarjan)."""
    graph = _graph(src, package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# ---- the rules on the real tree


def test_lower_layers_do_not_import_upward() -> None:
    assert layer_violations(SRC) == []


def test_no_package_imports_what_it_never_may() -> None:
    assert never_violations(SRC) == []


def test_every_package_and_ground_floor_module_has_rules() -> None:
    top = SRC / "gpuaccept"
    packages = {p.name for p in top.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in top.glob("*.py")} - {"__init__", "__main__", "cli"}  # cli may import anything
    assert (packages | modules) - set(ALLOWED) == set(), "a new package or module needs its rules in ALLOWED"


def test_only_checks_hw_and_distributed_import_torch_at_module_level() -> None:
    assert torch_violations(SRC) == []


def test_no_import_circle() -> None:
    assert cycles(SRC) == []


def test_the_walker_sees_the_real_tree() -> None:
    found = list(imports(SRC))
    assert len({i.module for i in found}) > 60
    assert any(i.module == "gpuaccept.launch.ssh.backend" and i.target == "gpuaccept.launch.ssh.plan" for i in found)
    # torch is imported lazily in the checks' run functions, which the walker sees as not top-level
    assert any(i.target == "torch" and not i.top and i.module.startswith("gpuaccept.checks") for i in found)


# ---- the rules on a planted tree: each one catches what it is for


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "gpuaccept" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    return _plant(tmp_path, {
        "__init__.py": "",
        "model.py": "from gpuaccept.launch.spec import JobSpec\n",
        "errors.py": "",
        "hw/__init__.py": "",
        "hw/nvml.py": "import torch\nfrom . import sku\n",
        "hw/sku.py": "",
        "launch/__init__.py": "",
        "launch/spec.py": "import torch.distributed\nfrom gpuaccept.model import X\n",
        "launch/cli.py": "def f():\n    import torch\n    from gpuaccept.checks import registry\n",
        "launch/types.py": ("from typing import TYPE_CHECKING\n"
                            "if TYPE_CHECKING:\n    from gpuaccept.results import store\n"),
        "results/__init__.py": "",
        "results/store.py": "def open_store():\n    from gpuaccept.results.store_sqlite import S\n",
        "results/store_sqlite.py": "from gpuaccept.results.store import Store\nfrom gpuaccept.launch import types\n",
        "report/__init__.py": "",
        "report/a.py": "from gpuaccept.report import b\n",
        "report/b.py": "from .a import thing\n",
    })


def test_planted_upward_import_is_found(planted: Path) -> None:
    found = layer_violations(planted)
    assert any(v.startswith("gpuaccept.model:1 imports gpuaccept.launch.spec") for v in found), found
    assert not any("launch.cli" in v for v in found)  # imports inside a function are allowed


def test_planted_import_that_is_never_allowed_is_found_inside_a_function(tmp_path: Path) -> None:
    tree = _plant(tmp_path, {"__init__.py": "", "report/__init__.py": "",
                             "report/console.py": "def f():\n    from gpuaccept.node.runner import Runner\n",
                             "node/__init__.py": "", "node/runner.py": ""})
    assert never_violations(tree) == [
        "gpuaccept.report.console:2 imports gpuaccept.node.runner (report never imports node)"]


def test_planted_module_level_torch_outside_the_allowed_packages_is_found(planted: Path) -> None:
    found = torch_violations(planted)
    assert found == ["gpuaccept.launch.spec:1 imports torch.distributed at module level"]


def test_planted_circle_is_found_through_a_relative_import(planted: Path) -> None:
    found = cycles(planted)
    assert ["gpuaccept.report.a", "gpuaccept.report.b"] in found
    assert ["gpuaccept.launch.spec", "gpuaccept.model"] in found  # model -> spec -> model


def test_planted_circle_through_a_function_level_import_is_found(planted: Path) -> None:
    # the shape the history store had: the interface's factory imported its implementation, which imports it
    assert ["gpuaccept.results.store", "gpuaccept.results.store_sqlite"] in cycles(planted)


def test_type_checking_imports_are_left_out(planted: Path) -> None:
    # launch.types -> results.store only for the type checker: no circle with store_sqlite -> launch.types
    assert not any("gpuaccept.launch.types" in group for group in cycles(planted))
    assert not any(i.module == "gpuaccept.launch.types" and "results" in i.target for i in imports(planted))


MAX_LINES = 600


def test_no_module_over_600_lines() -> None:
    sizes = {p.relative_to(SRC).as_posix(): len(p.read_text().splitlines()) for p in (SRC / "gpuaccept").rglob("*.py")}
    assert len(sizes) > 60
    assert {k: v for k, v in sizes.items() if v > MAX_LINES} == {}
