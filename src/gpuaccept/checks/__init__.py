"""The checks, one module per family, and their registry in suite order.

``base`` is the interface (declared parameters with per-profile defaults, default thresholds,
timeouts). Built-in checks live here; third-party checks register through the ``gpuaccept.checks``
entry-point group or ``GPUACCEPT_PLUGINS`` (comma-separated module names; a plugin module lists its
classes in a module-level ``CHECKS`` tuple). May import ``model``, ``errors``, ``hw`` and
``distributed``; torch is imported inside the functions that measure.
"""

from __future__ import annotations

import importlib
import os
from functools import lru_cache
from importlib.metadata import entry_points

from gpuaccept.checks.base import Check
from gpuaccept.errors import UsageError

BUILTIN_MODULES = (
    "gpuaccept.checks.env",
    "gpuaccept.checks.conformance",
    "gpuaccept.checks.health",
    "gpuaccept.checks.disk_space",
    "gpuaccept.checks.fabric",
    "gpuaccept.checks.compute",
    "gpuaccept.checks.memory",
    "gpuaccept.checks.p2p",
    "gpuaccept.checks.memtest",
    "gpuaccept.checks.train",
    "gpuaccept.checks.nbody",
    "gpuaccept.checks.stress",
    "gpuaccept.checks.agreement",
    "gpuaccept.checks.reference_train",
    "gpuaccept.checks.throughput",
    "gpuaccept.checks.disk",
    "gpuaccept.checks.rdma",
    "gpuaccept.checks.collectives",
    "gpuaccept.checks.ddp",
    "gpuaccept.checks.reference_train_ddp",
    "gpuaccept.checks.nccl_tests",
)


def _checks_of(module_name: str) -> tuple[type[Check], ...]:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import check module {module_name!r}: {exc}") from exc
    except SyntaxError as exc:
        raise UsageError(f"cannot import check module {module_name!r}: SyntaxError: {exc.msg} "
                         f"({exc.filename}, line {exc.lineno})") from None
    except SystemExit as exc:  # a plugin that calls sys.exit while it is imported must not end gpuaccept
        raise UsageError(f"cannot import check module {module_name!r}: it called sys.exit({exc.code!r}) "
                         "when imported") from None
    except Exception as exc:  # whatever a plugin raises at import is its author's error, said in one line
        raise UsageError(f"cannot import check module {module_name!r}: {type(exc).__name__}: {exc}") from None
    checks = getattr(module, "CHECKS", None)
    if not isinstance(checks, tuple) or not all(isinstance(c, type) and issubclass(c, Check) for c in checks):
        raise UsageError(f"check module {module_name!r} has no CHECKS tuple of Check classes")
    return checks


def plugin_modules() -> list[str]:
    """Module names of plugin checks, from entry points and GPUACCEPT_PLUGINS."""
    names = [ep.value for ep in entry_points(group="gpuaccept.checks")]
    names += [m.strip() for m in os.environ.get("GPUACCEPT_PLUGINS", "").split(",") if m.strip()]
    return names


@lru_cache(maxsize=1)
def registry() -> dict[str, type[Check]]:
    """Every known check by name, in the order the suite runs them."""
    found: dict[str, type[Check]] = {}
    for module_name in (*BUILTIN_MODULES, *plugin_modules()):
        for cls in _checks_of(module_name):
            if cls.name in found and found[cls.name] is not cls:
                raise UsageError(f"two checks are named {cls.name!r}: {found[cls.name].__module__} "
                                 f"and {cls.__module__}")
            found[cls.name] = cls
    return found


def check_path(cls: type[Check]) -> str:
    """``module:qualname`` of a check class, for the child process to import."""
    return f"{cls.__module__}:{cls.__qualname__}"


def load_check(path: str) -> type[Check]:
    module_name, _, qualname = path.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    assert isinstance(obj, type) and issubclass(obj, Check)
    return obj
