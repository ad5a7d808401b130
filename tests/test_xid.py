"""The XID kernel-log parser on samples written to the driver's documented format, and the catalogue."""

from __future__ import annotations

from pathlib import Path

from gpuaccept.hw.xid import XID_MEANINGS, XID_SEVERITY, XidEvent, parse_kernel_xids, read_kernel_log, xid_meaning
from gpuaccept.model import Status

DATA = Path(__file__).parent / "data" / "kmsg"


def test_parse_kmsg_records() -> None:
    events = parse_kernel_xids((DATA / "kmsg_h100.txt").read_text())
    assert [(e.pci_bus_id, e.xid) for e in events] == [
        ("0000:2a:00", 13), ("0000:2a:00", 13), ("0000:ab:00", 94), ("0000:ab:00", 63)]
    assert events[0].text.startswith("pid=48121, name=python, Graphics SM Warp Exception")


def test_parse_dmesg_lines() -> None:
    events = parse_kernel_xids((DATA / "dmesg_h100.txt").read_text())
    # the malformed code and the line without "NVRM: Xid (" are skipped
    assert events == [
        XidEvent("0000:db:00", 79, "pid=1873, name=nvidia-smi, GPU has fallen off the bus."),
        XidEvent("0000:5d:00", 74, "pid=61001, name=python, NVLink: fatal error detected on link 7"
                                   "(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
    ]


def test_parse_journalctl_and_no_text() -> None:
    line = "May 18 19:02:39 node1 kernel: NVRM: Xid (PCI:0000:2B:00): 79, GPU has fallen off the bus."
    assert parse_kernel_xids(line) == [XidEvent("0000:2b:00", 79, "GPU has fallen off the bus.")]
    assert parse_kernel_xids("NVRM: Xid (PCI:0000:18:00): 48") == [XidEvent("0000:18:00", 48, "")]
    assert parse_kernel_xids("") == []


def test_catalogue_names_the_common_xids() -> None:
    for xid in (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120):
        assert xid in XID_MEANINGS, xid
    assert xid_meaning(79) == "GPU has fallen off the bus"
    assert "catalogue" in xid_meaning(4242)
    assert {x for x, s in XID_SEVERITY.items() if s == Status.FAIL} >= {48, 64, 74, 79, 95, 119, 120}
    assert all(XID_SEVERITY.get(x) is None for x in (13, 31, 43, 45, 68, 69))  # application-level


def test_read_kernel_log_never_raises() -> None:
    text, where = read_kernel_log(timeout_s=10)
    assert (text is None) == (where not in ("/dev/kmsg", "dmesg"))
    if text is not None:
        assert isinstance(parse_kernel_xids(text), list)
