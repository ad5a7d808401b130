"""XID errors: the catalogue of common codes, and the kernel log reader (``dmesg | grep 'NVRM: Xid'``).

The driver logs each XID to the kernel ring buffer as::

    NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.

:func:`parse_kernel_xids` is the pure parser (``/dev/kmsg`` records and
``dmesg`` lines alike); :func:`read_kernel_log` reads the log where this
process may (``/dev/kmsg`` needs CAP_SYSLOG when ``kernel.dmesg_restrict=1``).
The log covers the time since boot (as far as the ring buffer reaches), so an
XID seen there may predate a GPU reset that cleared it.

Meanings follow NVIDIA's Xid catalogue
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html and the
older "Xid Errors" page); the severities are this tool's reading of its
resolution buckets: FAIL where the catalogue's action is a GPU reset, node
reboot or hardware service; WARN where a reset only activates a repair;
application-level XIDs (13, 31, 43, 45, 68, 69) are named but not judged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Final

from gpuaccept.model import Status

XID_MEANINGS: Final[dict[int, str]] = {
    8: "GPU stopped processing (channel idle timeout)",
    13: "graphics engine exception (usually an application fault)",
    31: "GPU memory page fault (usually an application fault)",
    43: "GPU stopped processing (application channel reset)",
    45: "preemptive cleanup after a previous error",
    46: "GPU stopped processing",
    48: "double-bit (uncorrectable) ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remap recorded (reset to activate)",
    64: "ECC page retirement or row remap recording failure",
    68: "video processor (NVDEC) exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

XID_SEVERITY: Final[dict[int, Status]] = {
    **{x: Status.FAIL for x in (46, 48, 61, 62, 64, 74, 79, 92, 95, 119, 120, 140)},
    63: Status.WARN,
    94: Status.WARN,
}
"""XIDs that mean the GPU needs attention; any other XID is named in details and not judged."""

_XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): "
    r"(?P<xid>\d{1,4})(?:,\s*(?P<text>.*))?$")


@dataclass(frozen=True)
class XidEvent:
    """One XID: the GPU's PCI id as logged (``0000:18:00``), the code, and the driver's text."""

    pci_bus_id: str
    xid: int
    text: str = ""


def xid_meaning(xid: int) -> str:
    """The catalogue meaning of ``xid``, or ``"see NVIDIA's Xid catalogue"`` for one not listed."""
    return XID_MEANINGS.get(xid, "see NVIDIA's Xid catalogue")


def parse_kernel_xids(text: str) -> list[XidEvent]:
    """Every ``NVRM: Xid (PCI:...): N, ...`` line of a kernel log, in order.

    Accepts ``/dev/kmsg`` records (``4,1234,5678,-;NVRM: ...``), ``dmesg``
    lines (``[ 12.3] NVRM: ...``) and ``journalctl -k`` lines. Pure.
    """
    events: list[XidEvent] = []
    for line in text.splitlines():
        at = line.find("NVRM: Xid (")
        if at < 0:
            continue
        m = _XID_LINE.match(line[at:].rstrip())
        if m is None:
            continue
        events.append(XidEvent(m["pci"].lower(), int(m["xid"]), (m["text"] or "").strip()))
    return events


def _read_kmsg(path: str = "/dev/kmsg") -> str:
    """All records now in the ring buffer, without blocking (``/dev/kmsg`` reads one record per read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[str] = []
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:  # EAGAIN: the end of the buffer
                break
            except BrokenPipeError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not rec:
                break
            chunks.append(rec.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return "".join(chunks)


def read_kernel_log(timeout_s: float = 10.0) -> tuple[str | None, str]:
    """The kernel log text and where it came from; ``(None, why)`` when this process may not read it.

    Tries ``/dev/kmsg`` then ``dmesg``; never raises for an unreadable log.
    """
    try:
        return _read_kmsg(), "/dev/kmsg"
    except OSError as exc:
        kmsg_err = f"/dev/kmsg: {exc.strerror or exc}"
    dmesg = shutil.which("dmesg")
    if dmesg is None:
        return None, f"{kmsg_err}; dmesg not installed"
    try:
        proc = subprocess.run([dmesg], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{kmsg_err}; dmesg: {exc}"
    if proc.returncode != 0:
        return None, f"{kmsg_err}; dmesg: {proc.stderr.strip() or f'exit {proc.returncode}'}"
    return proc.stdout, "dmesg"
