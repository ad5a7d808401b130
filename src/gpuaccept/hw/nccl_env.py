"""NCCL's interface and HCA selection lists (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``), parsed and matched.

The syntax, as NCCL documents it: a comma-separated list of name prefixes (``eth,ens``); a
leading ``^`` excludes what the list matches instead (``^docker,lo``); a ``=`` (after the ``^``
when both) makes the names exact (``=eth0``, ``^=mlx5_3``); an HCA may carry a ``:port`` suffix
(``mlx5_0:1``). The equivalent check by hand is ``NCCL_DEBUG=INFO`` and reading the ``NET/IB``
and ``NET/Socket`` lines of a job.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One list item: a name (prefix unless the list is exact) and an optional port."""

    name: str
    port: int | None = None

    def text(self) -> str:
        return self.name if self.port is None else f"{self.name}:{self.port}"


@dataclass(frozen=True)
class SelectionList:
    """A parsed NCCL selection list."""

    exclude: bool
    exact: bool
    entries: tuple[Entry, ...]

    def entry_matches(self, entry: Entry, name: str, port: int | None = None) -> bool:
        hit = name == entry.name if self.exact else name.startswith(entry.name)
        return hit and (entry.port is None or port is None or entry.port == port)

    def selects(self, name: str, port: int | None = None) -> bool:
        """Would NCCL use the interface/HCA ``name`` (port ``port``)?"""
        hit = any(self.entry_matches(e, name, port) for e in self.entries)
        return hit != self.exclude


def parse_list(value: str, *, ports: bool) -> SelectionList:
    """Parse an NCCL list; ``ports``: whether ``:port`` suffixes are allowed (NCCL_IB_HCA).

    Raises ValueError with the offending item for an empty item or a non-numeric port.
    """
    s = value.strip()
    exclude = s.startswith("^")
    s = s[1:] if exclude else s
    exact = s.startswith("=")
    s = s[1:] if exact else s
    entries = []
    for raw in s.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"empty item in {value!r}")
        name, sep, port_text = item.partition(":")
        port = None
        if sep:
            if not ports or not port_text.isdigit():
                raise ValueError(f"bad port suffix in {item!r} (expected <name>:<port number>)")
            port = int(port_text)
        if not name:
            raise ValueError(f"no name in {item!r}")
        entries.append(Entry(name, port))
    return SelectionList(exclude, exact, tuple(entries))
