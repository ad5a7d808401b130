"""RDMA port partition keys and GIDs from sysfs, for fleet conformance (``ibv_devinfo -v``, ``show_gids``).

``/sys/class/infiniband/<dev>/ports/<n>/pkeys/<i>`` holds the port's P_Key table (``0xffff`` the default
full-membership key; ``0x0000`` an empty slot) and ``gids/<i>`` its GID table (``fe80:0000:0000:0000:...``:
the subnet prefix, then the port GUID; all zeros an empty slot). A site's partition is configuration
(``pkeys``: the non-empty keys in table order, comma-joined); the GID's subnet prefix too (``gid_prefix``);
the whole GID 0 names the port, so it is an identity, not an item. Only numbered entries are read;
nothing below a port is followed out of sysfs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpuaccept.hw.rdma import IB_CLASS

PKEY_RE: Final = re.compile(r"0x[0-9a-fA-F]{1,4}")
GID_RE: Final = re.compile(r"(?:[0-9a-fA-F]{4}:){7}[0-9a-fA-F]{4}")
MAX_ENTRIES: Final = 256
"""Table entries read per port at most (mlx5 has 128 P_Keys and 255 GIDs for RoCE)."""


@dataclass(frozen=True)
class PortKeys:
    """One port's non-empty P_Keys (``0x8001``, lower case, in table order) and its GID 0 (None: none)."""

    device: str
    port: int
    pkeys: tuple[str, ...]
    gid0: str | None

    @property
    def gid_prefix(self) -> str | None:
        """The subnet prefix, the first four groups of GID 0 (``fe80:0000:0000:0000``)."""
        return ":".join(self.gid0.split(":")[:4]) if self.gid0 else None


def parse_pkey(text: str) -> str | None:
    """``0xffff`` -> ``0xffff``; an empty slot (``0x0000``) or anything else -> None (pure)."""
    t = text.strip()
    if not PKEY_RE.fullmatch(t) or int(t, 16) & 0x7FFF == 0:
        return None
    return f"0x{int(t, 16):04x}"


def parse_gid(text: str) -> str | None:
    """A GID in sysfs form, lower case; all zeros or malformed -> None (pure)."""
    t = text.strip().lower()
    if not GID_RE.fullmatch(t) or set(t) <= {"0", ":"}:
        return None
    return t


def _numbered(folder: Path) -> list[Path]:
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return []
    return [folder / n for n in sorted((n for n in names if n.isdigit()), key=int)[:MAX_ENTRIES]]


def _read(path: Path) -> str:
    try:
        if path.is_symlink() or not path.is_file():
            return ""
        return path.read_text(errors="replace")[:100]
    except OSError:
        return ""


def read_port_keys(root: str | Path = "/") -> list[PortKeys]:
    """Every RDMA port's partition keys and GID 0 under ``root`` (device names as sysfs lists them)."""
    out: list[PortKeys] = []
    base = Path(root) / IB_CLASS
    try:
        devices = sorted(p.name for p in base.iterdir())
    except OSError:
        return out
    for dev in devices:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", dev):
            continue
        for pdir in _numbered(base / dev / "ports"):
            pkeys = tuple(k for k in (parse_pkey(_read(f)) for f in _numbered(pdir / "pkeys")) if k)
            gids = [g for g in (parse_gid(_read(f)) for f in _numbered(pdir / "gids")[:1]) if g]
            out.append(PortKeys(dev, int(pdir.name), pkeys, gids[0] if gids else None))
    return out
