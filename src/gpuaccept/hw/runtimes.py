"""Container runtime versions where visible (for fleet conformance): NVIDIA Container Toolkit, enroot, pyxis,
podman, docker.

Each tool's own ``--version`` (found on ``PATH``, run with a bounded timeout, no daemon contacted), else its
Debian package version in ``/var/lib/dpkg/status`` below ``root``. A tool neither installed nor packaged is
absent with the reason (the check records it; a manifest that names it then fails saying why).
The parsers are pure (:func:`parse_version`, :func:`parse_dpkg_status`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final


@dataclass(frozen=True)
class Runtime:
    """An item ``runtime.<item>``: the commands that print its version, its packages, the version pattern."""

    item: str
    commands: tuple[tuple[str, ...], ...]
    packages: tuple[str, ...]
    pattern: str


RUNTIMES: Final = (
    Runtime("nvidia_container_toolkit", (("nvidia-ctk", "--version"), ("nvidia-container-cli", "--version")),
            ("nvidia-container-toolkit", "libnvidia-container-tools"),
            r"(?:Toolkit CLI version|cli-version:)\s*v?(\d+\.\d+\.\d+\S*)"),
    Runtime("enroot", (("enroot", "version"),), ("enroot",), r"^v?(\d+\.\d+\.\d+\S*)"),
    Runtime("pyxis", (), ("nvslurm-plugin-pyxis", "pyxis"), r"$^"),
    Runtime("podman", (("podman", "--version"),), ("podman",), r"podman version\s+(\d+\.\d+\.\d+\S*)"),
    Runtime("docker", (("docker", "--version"),), ("docker-ce", "docker.io", "moby-engine"),
            r"Docker version\s+(\d+\.\d+\.\d+[^,\s]*)"),
)
"""The runtimes, in the order they are reported (``nvidia-ctk --version``, ``enroot version``, ...)."""
TIMEOUT_S: Final = 3.0
DPKG_STATUS: Final = "var/lib/dpkg/status"
MAX_STATUS_BYTES: Final = 32 * 1024 * 1024

Runner = Callable[[list[str], float], str | None]
"""Runs a command with a timeout (s); its output, or None when it could not run, failed or timed out."""


def parse_version(runtime: Runtime, output: str) -> str | None:
    """The version in a tool's ``--version`` output (pure); None when it has none."""
    m = re.search(runtime.pattern, output, re.M)
    return m.group(1) if m else None


def parse_dpkg_status(text: str, packages: tuple[str, ...]) -> dict[str, str]:
    """Installed version of each of ``packages`` in a dpkg ``status`` file (pure)."""
    out: dict[str, str] = {}
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
        name = fields.get("Package")
        if name in packages and "installed" in fields.get("Status", "").split() and fields.get("Version"):
            out[name] = fields["Version"]
    return out


def run_bounded(argv: list[str], timeout_s: float) -> str | None:
    """``argv``'s stdout and stderr, or None when it fails or runs past ``timeout_s`` (then it is killed)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                              errors="replace", check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout + done.stderr)[:10000] if done.returncode == 0 else None


def _dpkg(root: str | Path) -> str:
    path = Path(root) / DPKG_STATUS
    try:
        if path.is_symlink() or not path.is_file():
            return ""
        with path.open("rb") as f:
            return f.read(MAX_STATUS_BYTES).decode(errors="replace")
    except OSError:
        return ""


def read_runtimes(env: Mapping[str, str], root: str | Path = "/", run: Runner = run_bounded,
                  timeout_s: float = TIMEOUT_S) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """``(versions, sources, absent)`` keyed ``runtime.<item>``: the version, where it was read, or why not."""
    versions: dict[str, str] = {}
    sources: dict[str, str] = {}
    absent: dict[str, str] = {}
    status: str | None = None
    for rt in RUNTIMES:
        key = f"runtime.{rt.item}"
        tried: list[str] = []
        for cmd in rt.commands:
            exe = shutil.which(cmd[0], path=env.get("PATH", ""))
            if exe is None:
                continue
            out = run([exe, *cmd[1:]], timeout_s)
            version = parse_version(rt, out) if out is not None else None
            if version:
                versions[key], sources[key] = version, f"{' '.join(cmd)} ({exe})"
                break
            tried.append(f"{' '.join(cmd)} gave no version" + ("" if out is not None else
                                                               f" (failed or ran past {timeout_s:g} s)"))
        if key in versions:
            continue
        if status is None:
            status = _dpkg(root)
        packaged = parse_dpkg_status(status, rt.packages)
        if packaged:
            name = next(p for p in rt.packages if p in packaged)
            versions[key], sources[key] = packaged[name], f"dpkg package {name}"
            continue
        where = " or ".join(c[0] for c in rt.commands)
        absent[key] = "; ".join(tried) if tried else (
            f"not installed ({where + ' not on PATH, ' if where else ''}no {'/'.join(rt.packages)} package)")
    return versions, sources, absent
