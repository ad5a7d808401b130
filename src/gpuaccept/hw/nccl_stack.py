"""Which NCCL and which NCCL network plugin a job on this node would load (for fleet conformance).

NCCL ``dlopen``\\ s its network plugin by name: ``NCCL_NET_PLUGIN=<name>`` means ``libnccl-net-<name>.so``
(a value ending in ``.so`` is the file itself), unset means ``libnccl-net.so``; the loader looks in
``LD_LIBRARY_PATH``, the directories of ``/etc/ld.so.conf.d/*.conf`` and the standard library directories.
:func:`find_plugin` looks in the same places below ``root`` and names the file (and, for a link, the file
it names, read with ``readlink``, never followed). Found nowhere: ``none`` (NCCL uses its internal IB and
socket transports). The equivalent by hand: ``NCCL_DEBUG=INFO`` and the ``NET/Plugin`` line of a job.

The NCCL version, with where it came from (:func:`nccl_version`): ``torch.cuda.nccl.version()`` only when
torch is already imported (the check never imports it); else the ``nvidia-nccl-cu*`` pip package that a
pip-installed torch loads (``pip show nvidia-nccl-cu12``); else the version in a ``libnccl.so.2.x.y`` file
name in the library directories; else ``NCCL_MAJOR``/``NCCL_MINOR``/``NCCL_PATCH`` of an ``nccl.h``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

STANDARD_LIB_DIRS: Final = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                            "/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/local/lib")
INCLUDE_DIRS: Final = ("/usr/include", "/usr/local/include", "/usr/local/cuda/include")
LIB_RE: Final = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")
PLUGIN_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.+-]{1,100}")
DEFINE_RE: Final = re.compile(r"^#define\s+NCCL_(MAJOR|MINOR|PATCH)\s+(\d+)\s*$", re.M)


def _under(root: str | Path, absolute: str) -> Path | None:
    """``absolute`` below ``root``; None for a relative path or one with ``..`` (not a place the loader looks)."""
    if not absolute.startswith("/") or ".." in absolute.split("/"):
        return None
    return Path(root) / absolute.lstrip("/")


def library_dirs(env: Mapping[str, str], root: str | Path = "/") -> list[str]:
    """The directories the loader searches, in order: LD_LIBRARY_PATH, ld.so.conf.d entries, the standard ones."""
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    conf = _under(root, "/etc/ld.so.conf.d")
    try:
        confs = sorted(p for p in conf.iterdir() if p.name.endswith(".conf")) if conf else []
    except OSError:
        confs = []
    for path in confs:
        try:
            text = path.read_text(errors="replace")[:10000] if not path.is_symlink() else ""
        except OSError:
            continue
        dirs += [line.strip() for line in text.splitlines() if line.strip().startswith("/")]
    dirs += STANDARD_LIB_DIRS
    return list(dict.fromkeys(dirs))


def _names(folder: Path | None) -> list[str]:
    try:
        return sorted(os.listdir(folder)) if folder is not None else []
    except OSError:
        return []


def plugin_file_name(env: Mapping[str, str]) -> str | None:
    """The file NCCL will ``dlopen`` for its network plugin (None: NCCL_NET_PLUGIN is not a valid name)."""
    value = env.get("NCCL_NET_PLUGIN", "")
    if not value:
        return "libnccl-net.so"
    if not PLUGIN_NAME_RE.fullmatch(value):
        return None
    return value if value.endswith(".so") else f"libnccl-net-{value}.so"


def find_plugin(env: Mapping[str, str], root: str | Path = "/") -> tuple[str, str]:
    """The plugin as a value (``libnccl-net.so -> libnccl-net-ofi.so.1.9.1``, or ``none``) and where it was found
    (or why it is ``none``)."""
    wanted = plugin_file_name(env)
    if wanted is None:
        return "none", f"NCCL_NET_PLUGIN={env.get('NCCL_NET_PLUGIN', '')!r} is not a file name"
    for d in library_dirs(env, root):
        folder = _under(root, d)
        if folder is None or wanted not in _names(folder):
            continue
        path = folder / wanted
        try:
            target = os.readlink(path) if path.is_symlink() else ""
        except OSError:
            target = ""
        return (f"{wanted} -> {Path(target).name}" if target else wanted), f"{d}/{wanted}"
    return "none", f"no {wanted} in LD_LIBRARY_PATH, /etc/ld.so.conf.d or the standard library directories"


def wheel_version(paths: Sequence[str]) -> tuple[str, str] | None:
    """The version of an ``nvidia-nccl-cu*`` pip package installed on ``paths`` (its dist-info), and its name."""
    from importlib.metadata import distributions

    for dist in distributions(path=list(paths)):
        name = str(dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-nccl-cu") and dist.version:
            return dist.version, f"pip package {name}"
    return None


def nccl_version(env: Mapping[str, str], root: str | Path = "/", modules: Mapping[str, Any] = sys.modules,
                 paths: Sequence[str] | None = None) -> tuple[str | None, str]:
    """The NCCL version (``2.21.5``) and its source; (None, why) when none is found. ``modules``: the imported
    modules (torch is asked only when it is among them); ``paths``: where pip packages are looked for
    (default: ``sys.path`` when ``root`` is ``/``, else nowhere)."""
    torch = modules.get("torch")
    if torch is not None:
        try:
            v = torch.cuda.nccl.version()
            return ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v), "torch.cuda.nccl.version()"
        except Exception:  # a CPU-only torch has no NCCL; fall back to the files
            pass
    wheel = wheel_version(paths if paths is not None else (sys.path if str(root) == "/" else []))
    if wheel is not None:
        return wheel
    for d in library_dirs(env, root):
        for name in _names(_under(root, d)):
            m = LIB_RE.fullmatch(name)
            if m:
                return m.group(1), f"library file name {d}/{name}"
    for d in INCLUDE_DIRS:
        header = _under(root, f"{d}/nccl.h")
        try:
            text = header.read_text(errors="replace")[:200000] if header and not header.is_symlink() else ""
        except OSError:
            continue
        parts = dict(DEFINE_RE.findall(text))
        if {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
            return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}", f"header {d}/nccl.h"
    return None, "no libnccl.so.<version> in the library directories and no nccl.h"
