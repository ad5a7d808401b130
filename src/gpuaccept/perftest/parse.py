"""Parse the text perftest prints (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``, ``ib_write_lat``, ``ib_read_lat``).

Pure: text in, :class:`PerftestResult` out. What is read (formats of perftest's ``src/perftest_parameters.h``):

- the title line, ``RDMA_Write BW Test`` / ``RDMA_Write Bidirectional BW Test`` / ``RDMA_Read Latency Test``
  / ``Send Post List BW Test``: the verb, bandwidth or latency, bidirectional (``-b``);
- ``Device : mlx5_0``, ``Link type``, ``Mtu``, ``Number of qps``, ``Connection type``;
- the side: a server prints ``* Waiting for client to connect... *``; the CUDA preamble (``--use_cuda``)
  names the GPU (``device name = [...]``, ``Picking device No. N``);
- the bandwidth table, headed ``#bytes #iterations BW peak[U] BW average[U] MsgRate[Mpps]`` with ``U`` one of
  ``Gb/sec`` (``--report_gbits``: 10^9 bit/s), ``MB/sec`` (perftest before 4.5-0.20: 2^20 B/s) or
  ``MiB/sec`` (later: the same 2^20 B/s); one row per size (``-a``: 2 B .. 8 MiB); figures kept in Gb/s;
- the latency table, headed by its columns (``t_min``, ``t_max``, ``t_typical``, and in later versions
  ``t_avg``, ``t_stdev``, ``99% percentile``, ``99.9% percentile``; ``-D``: ``t_avg`` and ``tps average``), usec;
- error lines: ``Couldn't connect to HOST:PORT``, ``Unable to init the socket connection``, ``Failed to
  modify QP ...``, ``IB device X not found``, ``Did not detect devices``, ``Couldn't get context for the
  device``, ``Failed to exchange data between server and clients``, ... (any line naming one of
  :data:`ERROR_MARKERS`).

InputError for text with neither a result table nor an error line (not perftest output).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuaccept.errors import InputError

MIB_PER_S_IN_GBPS = 1048576 * 8 / 1e9
"""1 MiB/s (perftest's ``MB/sec`` and ``MiB/sec``, 0x100000 B/s) in Gb/s."""
UNITS = {"Gb/sec": 1.0, "MB/sec": MIB_PER_S_IN_GBPS, "MiB/sec": MIB_PER_S_IN_GBPS}
ERROR_MARKERS = ("Couldn't", "Unable to", "Failed to", "not found", "Did not detect", "Problems with",
                 "Found Incompatibility", "No such device", "error=", "Error")
"""Substrings of perftest's error lines (its ``fprintf(stderr, ...)`` messages)."""
LAT_COLUMNS = {"t_min[usec]": "t_min_us", "t_max[usec]": "t_max_us", "t_typical[usec]": "t_typical_us",
               "t_avg[usec]": "t_avg_us", "t_stdev[usec]": "t_stdev_us", "99% percentile[usec]": "p99_us",
               "99.9% percentile[usec]": "p999_us", "tps average": "tps"}

_TITLE = re.compile(r"^\s*(Send|Send_imm|RDMA_Write|RDMA_Write_imm|RDMA_Read|Atomic)\b(.*?)\b(BW|Latency)\b"
                    r"(.*)\bTest\s*$")
_FIELD_GAP = re.compile(r"\t+|\s{2,}(?=[A-Za-z][A-Za-z .*_-]*?\s*:)")
"""What separates two header fields on one line: perftest prints tabs (``Dual-port : OFF\t\tDevice : mlx5_0``);
outputs copied into documents often have spaces instead (``OFF    Device : mlx5_0``): two or more, then a key."""
_BW_HEAD = re.compile(r"^\s*#bytes\s+#iterations\s+BW peak\[([A-Za-z/]+)\]\s+BW average\[([A-Za-z/]+)\]"
                      r"\s+MsgRate\[Mpps\]")
_LAT_HEAD = re.compile(r"^\s*#bytes\s+#iterations\s+t_")
_CONNECT = re.compile(r"Couldn't connect to (\S+?):(\d+)")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf"


@dataclass(frozen=True)
class BwRow:
    """One size of a bandwidth table: peak and average in Gb/s, message rate in Mpps."""

    size_bytes: int
    iterations: int
    peak_gbps: float
    avg_gbps: float
    msg_rate_mpps: float


@dataclass(frozen=True)
class LatRow:
    """One size of a latency table, usec (None where the version prints no such column)."""

    size_bytes: int
    iterations: int
    t_min_us: float | None = None
    t_max_us: float | None = None
    t_typical_us: float | None = None
    t_avg_us: float | None = None
    t_stdev_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    tps: float | None = None


@dataclass
class PerftestResult:
    """What one perftest run printed (one side: the server's or the client's output)."""

    verb: str | None = None
    kind: str | None = None
    """``bw`` or ``lat``."""
    bidirectional: bool = False
    post_list: bool = False
    side: str | None = None
    """``server`` (it waited for a client), ``client`` (it printed a remote address and no wait), None: unknown."""
    device: str | None = None
    link_type: str | None = None
    mtu_bytes: int | None = None
    qps: int | None = None
    connection: str | None = None
    unit: str | None = None
    """The bandwidth unit as printed (``Gb/sec``, ``MB/sec``, ``MiB/sec``); rows are in Gb/s whatever it was."""
    cuda_device: str | None = None
    bw_rows: list[BwRow] = field(default_factory=list)
    lat_rows: list[LatRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connect_target: str | None = None
    """``HOST:PORT`` of a ``Couldn't connect to HOST:PORT`` line: the server end the client could not reach."""

    @property
    def test(self) -> str:
        """``write_bw``, ``read_lat``, ``send_bw``... (the binary's name without ``ib_``); ``unknown``."""
        verb = {"RDMA_Write": "write", "RDMA_Write_imm": "write_imm", "RDMA_Read": "read", "Send": "send",
                "Send_imm": "send_imm", "Atomic": "atomic"}.get(self.verb or "", "unknown")
        return f"{verb}_{self.kind}" if self.kind else verb

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["test"] = self.test
        return d


def _number(text: str) -> float:
    return float(text)


def _header_fields(line: str, res: PerftestResult) -> None:
    for part in _FIELD_GAP.split(line.strip()):
        key, sep, value = part.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "Device":
            res.device = value or None
        elif key == "Link type":
            res.link_type = value or None
        elif key == "Mtu":
            m = re.match(r"(\d+)", value)
            res.mtu_bytes = int(m.group(1)) if m else None
        elif key == "Number of qps" and value.isdigit():
            res.qps = int(value)
        elif key == "Connection type":
            res.connection = value or None


def _lat_columns(line: str) -> list[str]:
    """The latency header's columns in order, as :class:`LatRow` field names."""
    rest = line.split("#iterations", 1)[1]
    found = sorted((rest.find(name), attr) for name, attr in LAT_COLUMNS.items() if name in rest)
    return [attr for _pos, attr in found]


def _row_values(line: str) -> list[str] | None:
    parts = line.split()
    if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    if not all(re.fullmatch(_NUM, p) for p in parts[2:]):
        return None
    return parts


def parse_text(text: str) -> PerftestResult:
    """Parse one side's perftest output (stdout and stderr together); see the module docstring."""
    res = PerftestResult()
    table: str | None = None
    scale = 1.0
    lat_cols: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        title = _TITLE.match(line)
        if title and not stripped.startswith("#"):
            res.verb = title.group(1)
            res.kind = "bw" if title.group(3) == "BW" else "lat"
            res.bidirectional = "Bidirectional" in title.group(2)
            res.post_list = "Post List" in title.group(2)
            continue
        if "Waiting for client" in stripped:
            res.side = "server"
            continue
        if stripped.startswith("remote address:") and res.side is None:
            res.side = "client"
        m = re.search(r"device name = \[(.*)\]", stripped)
        if m:
            res.cuda_device = m.group(1)
            continue
        head = _BW_HEAD.match(line)
        if head:
            unit = head.group(2)
            if unit not in UNITS:
                raise InputError(f"perftest output: unknown bandwidth unit {unit!r} (known: {', '.join(UNITS)})")
            res.unit, scale, table = unit, UNITS[unit], "bw"
            continue
        if _LAT_HEAD.match(line):
            lat_cols, table = _lat_columns(line), "lat"
            continue
        if stripped.startswith("---"):
            table = None if (res.bw_rows or res.lat_rows) else table
            continue
        if table is not None:
            values = _row_values(line)
            if values is not None:
                _add_row(res, table, values, scale, lat_cols, line)
                continue
        if ":" in line and table is None and not any(k in line for k in ERROR_MARKERS):
            _header_fields(line, res)
        if any(k in stripped for k in ERROR_MARKERS) and "doesn't supports CUDA" not in stripped:
            res.errors.append(stripped)
            c = _CONNECT.search(stripped)
            if c and res.connect_target is None:
                res.connect_target = f"{c.group(1)}:{c.group(2)}"
    if not (res.bw_rows or res.lat_rows or res.errors):
        raise InputError("not perftest output: no bandwidth or latency table and no error line")
    return res


def _add_row(res: PerftestResult, table: str, values: list[str], scale: float, lat_cols: list[str],
             line: str) -> None:
    size, iters = int(values[0]), int(values[1])
    nums = [_number(v) for v in values[2:]]
    if table == "bw":
        if len(nums) < 3:
            raise InputError(f"perftest bandwidth row with {len(nums)} figures, expected 3 or more: {line.strip()!r}")
        res.bw_rows.append(BwRow(size, iters, nums[0] * scale, nums[1] * scale, nums[2]))
        return
    if len(nums) != len(lat_cols):
        raise InputError(f"perftest latency row with {len(nums)} figures under {len(lat_cols)} columns: "
                         f"{line.strip()!r}")
    res.lat_rows.append(LatRow(size, iters, **dict(zip(lat_cols, nums, strict=True))))
