"""What identifies a piece of hardware: GPU UUIDs, RDMA port GUIDs, the node's board serial.

The history keeps results under these identities beside the host name, so a GPU moved to another
host keeps its history and a replaced part starts a new one (:mod:`gpuaccept.results.hwid`).

- A GPU is named by its NVML UUID, ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (``nvidia-smi -L``),
  and carries its board serial where NVML gives one (``nvidia-smi --query-gpu=serial``).
- An RDMA port is named by its port GUID, the interface identifier (low 64 bits) of GID 0,
  ``/sys/class/infiniband/<dev>/ports/<n>/gids/0`` (``ibstat``'s "Port GUID"), written
  ``0x`` and 16 hex digits; the device's ``node_guid`` is recorded beside it.
- A node is named by its mainboard serial, ``/sys/class/dmi/id/board_serial`` (else the system's
  ``product_serial``; ``dmidecode -s baseboard-serial-number``). Both are often readable by root
  only: the value is then ``"unreadable"``, ``"absent"`` where the platform has no DMI (many Arm
  servers), and firmware placeholders ("To be filled by O.E.M.", "Default string") name nothing.

Everything is read below a root directory (``/`` on a node, a recorded tree in tests) and never
raises for a missing or unreadable file. The parsers are pure.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuaccept.errors import InputError

DMI_DIR = "sys/class/dmi/id"
IB_CLASS = "sys/class/infiniband"
DMI_FIELDS = ("sys_vendor", "product_name", "product_serial", "board_vendor", "board_name", "board_serial")
"""The DMI files the env check records (``dmidecode -t system -t baseboard``)."""
UNREADABLE = "unreadable"
ABSENT = "absent"
MAX_ID_LEN = 128

_UUID_RE = re.compile(r"^(?:GPU-)?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.IGNORECASE)
_HEX16_RE = re.compile(r"^(?:0x)?([0-9a-f]{16})$", re.IGNORECASE)
_GROUPED_RE = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{4}):([0-9a-f]{4}):([0-9a-f]{4})$", re.IGNORECASE)
_PLACEHOLDERS = frozenset({
    "", "0", "00000000", "0000000000", "0123456789", "1234567890", "none", "null", "n/a", "na", "not specified",
    "not applicable", "not available", "default string", "to be filled by o.e.m.", "to be filled by oem",
    "system serial number", "base board serial number", "chassis serial number", "serial", "unknown",
    "invalid", "empty", "oem", "o.e.m.", UNREADABLE, ABSENT, "unsupported",
})


def normalize_gpu_uuid(text: str) -> str:
    """``GPU-<uuid>`` as NVML writes it (lowercase hex) from a UUID with or without the ``GPU-`` prefix.

    InputError naming the expected form when ``text`` is not one.
    """
    m = _UUID_RE.match(text.strip())
    if not m:
        raise InputError(f"{text!r} is not a GPU UUID: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx "
                         "(hex digits, as 'nvidia-smi -L' prints it)")
    return "GPU-" + m.group(1).lower()


def normalize_guid(text: str) -> str:
    """A 64-bit GUID as ``0x`` + 16 lowercase hex digits, from ``0xb8599f0300d4a7f6``,
    ``b8599f0300d4a7f6`` or sysfs's ``b859:9f03:00d4:a7f6``. InputError when it is none of these
    or all zero (no GUID assigned)."""
    raw = text.strip()
    m = _HEX16_RE.match(raw)
    g = _GROUPED_RE.match(raw)
    if m:
        digits = m.group(1)
    elif g:
        digits = "".join(g.groups())
    else:
        raise InputError(f"{text!r} is not a port GUID: expected 0x and 16 hex digits (as ibstat's 'Port GUID' "
                         "prints it) or xxxx:xxxx:xxxx:xxxx")
    if int(digits, 16) == 0:
        raise InputError(f"{text!r} is not a port GUID: all zero (no GUID assigned)")
    return "0x" + digits.lower()


def guid_of_gid(text: str) -> str | None:
    """The port GUID in a GID (``fe80:0000:0000:0000:b859:9f03:00d4:a7f6`` -> ``0xb8599f0300d4a7f6``):
    its low 64 bits. None for an unset (all-zero) or malformed GID."""
    groups = text.strip().split(":")
    if len(groups) != 8 or not all(len(g) == 4 for g in groups):
        return None
    try:
        return normalize_guid(":".join(groups[4:]))
    except InputError:
        return None


def plausible_serial(value: Any) -> str | None:
    """``value`` stripped when it can name one piece of hardware; None for firmware placeholders
    ("To be filled by O.E.M.", "Default string", all zeros), "unreadable", "unsupported" and non-strings."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.lower() in _PLACEHOLDERS or not text.strip("0") or len(text) > MAX_ID_LEN:
        return None
    return text


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return ABSENT
    except OSError:  # PermissionError for root-only files, EIO on a broken firmware table
        return UNREADABLE


def read_node_identity(root: str | Path = "/") -> dict[str, str]:
    """The DMI fields of :data:`DMI_FIELDS` under ``root`` (``dmidecode -s``): each its text,
    ``"unreadable"`` (not permitted) or ``"absent"``."""
    base = Path(root) / DMI_DIR
    return {name: _read(base / name) for name in DMI_FIELDS}


def node_hw_id(identity: dict[str, Any]) -> tuple[str | None, str | None]:
    """(id, serial) of a node from :func:`read_node_identity`'s fields: the board serial, else the
    product serial, as the id; the product serial as the serial. None where nothing is usable."""
    board = plausible_serial(identity.get("board_serial"))
    product = plausible_serial(identity.get("product_serial"))
    return board or product, product


def read_nic_identities(root: str | Path = "/") -> list[dict[str, Any]]:
    """Every RDMA port under ``root`` with its GUIDs: ``{"port": "mlx5_0:1", "guid": "0x...",
    "node_guid": "0x..."}`` (``ibstat``); a GUID that cannot be read is None."""
    base = Path(root) / IB_CLASS
    out: list[dict[str, Any]] = []
    try:
        devices = sorted(p.name for p in base.iterdir())
    except OSError:
        return out
    for dev in devices:
        node_text = _read(base / dev / "node_guid")
        try:
            node_guid: str | None = normalize_guid(node_text)
        except InputError:
            node_guid = None
        try:
            ports = sorted((p.name for p in (base / dev / "ports").iterdir() if p.name.isdigit()), key=int)
        except OSError:
            ports = []
        for port in ports:
            gid = _read(base / dev / "ports" / port / "gids" / "0")
            out.append({"port": f"{dev}:{port}", "guid": guid_of_gid(gid), "node_guid": node_guid})
    return out
