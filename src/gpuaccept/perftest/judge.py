"""Judge one parsed perftest output: a NIC's bandwidth against its port rate, and errors as ERROR naming both ends.

Bandwidth (``*_bw``): the average Gb/s at the largest size of the table (``BW average`` of the last row of ``-a``)
is held to a bound, in this order: ``min_gbps`` (a config bound or a baseline, named by ``min_source``), else
``fraction`` x the port rate (``rate_gbps``: what sysfs says the port runs at, ``cat
/sys/class/infiniband/mlx5_0/ports/1/rate``; x 2 for a bidirectional ``-b`` run, whose figure is both directions
added), else nothing: the figure is measured, not judged (so is an atomic test's, ``ib_atomic_bw``: 8 B
operations, whose bandwidth is a message rate, not a line rate). Latency (``*_lat``): ``t_typical`` at the smallest size
is reported, and judged only against ``max_lat_us``. An output with an error line (``Couldn't connect to
HOST:PORT``, ``Unable to init the socket connection``, ``Failed to modify QP``...) or a non-zero exit is an
ERROR naming both ends of the pair: ``client -> server``. Equivalent by hand: ``ib_write_bw -d mlx5_0
--report_gbits HOST`` and compare ``BW average[Gb/sec]`` with 0.95 x the port's rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuaccept.model import Metric, Status, Threshold
from gpuaccept.perftest.parse import PerftestResult

DEFAULT_FRACTION = 0.95
"""Of the port rate, the least a healthy NIC's ``ib_write_bw`` average reaches (NDR 400G: 380 Gb/s)."""
ENCODING = {None: 0.8, "SDR": 0.8, "DDR": 0.8, "QDR": 0.8, "FDR10": 64 / 66, "FDR": 64 / 66}
"""The data bits per signalled bit of the InfiniBand speeds whose sysfs ``rate`` is the signalling rate: 8b/10b
for SDR (printed without a name), DDR and QDR (``40 Gb/sec (4X QDR)`` carries 32 Gb/s), 64b/66b for FDR10 and FDR
(``56 Gb/sec (4X FDR)``: 54.5 Gb/s). EDR and later print the data rate (``400 Gb/sec (4X NDR)``); so does RoCE,
whose rate the kernel maps from the Ethernet speed (``40 Gb/sec (4X QDR)`` on 40GbE carries 40)."""


def data_rate_gbps(rate_gbps: float, speed: str | None, link_layer: str | None = "InfiniBand") -> float:
    """The Gb/s a port carries, from its sysfs rate (``cat /sys/class/infiniband/mlx5_0/ports/1/rate``), speed and
    ``link_layer`` (pure): x :data:`ENCODING` on InfiniBand, the rate itself otherwise (Ethernet, or a speed
    not in the table)."""
    if link_layer != "InfiniBand":
        return rate_gbps
    return rate_gbps * ENCODING.get(speed, 1.0)


@dataclass
class Judgement:
    status: Status
    reason: str
    metrics: list[Metric] = field(default_factory=list)


@dataclass(frozen=True)
class Ends:
    """The two ends of a pair test, as people name them (``node-a rail 3 (mlx5_3)``)."""

    client: str = "the client"
    server: str = "the server"

    def text(self) -> str:
        return f"{self.client} -> {self.server}"


def ends_of(result: PerftestResult, client: str | None = None, server: str | None = None) -> Ends:
    """Both ends of a saved output: those given, else this output's side and device and the host:port of its
    ``Couldn't connect to`` line."""
    here = f"this {result.side or 'side'}" + (f" ({result.device})" if result.device else "")
    if result.side == "server":
        return Ends(client or "its client", server or here)
    return Ends(client or here, server or result.connect_target or "the server")


def bw_bound(rate_gbps: float | None, *, bidirectional: bool = False, fraction: float = DEFAULT_FRACTION,
             min_gbps: float | None = None, min_source: str = "--min-gbps",
             rate_source: str = "port rate") -> tuple[float | None, Threshold | None]:
    """(expected, threshold) in Gb/s: ``min_gbps`` overrides ``fraction`` x the rate (x 2 both ways)."""
    expected = None if rate_gbps is None else rate_gbps * (2 if bidirectional else 1)
    if min_gbps is not None:
        return expected, Threshold(">=", min_gbps, Status.FAIL, min_source)
    if expected is None:
        return None, None
    both = " x 2 (bidirectional)" if bidirectional else ""
    return expected, Threshold(">=", round(fraction * expected, 3), Status.FAIL,
                               f"{fraction:g} x {rate_source} {rate_gbps:g} Gb/s{both}")


def judge(result: PerftestResult, *, rate_gbps: float | None = None, rate_source: str = "port rate",
          fraction: float = DEFAULT_FRACTION, min_gbps: float | None = None, min_source: str = "--min-gbps",
          max_lat_us: float | None = None, ends: Ends | None = None, returncode: int | None = 0) -> Judgement:
    """Status, reason and metrics of one parsed output (pure; see the module docstring).

    Metrics: ``rdma_<test>_gbps`` (Gb/s, ``BW average`` at the largest size; ``<test>``: ``write_bw``...) with
    its expectation and bound, ``rdma_<test>_peak_gbps``; ``rdma_<test>_typical_us`` and ``rdma_<test>_p99_us``
    (usec, at the smallest size) for latency.
    """
    pair = ends or ends_of(result)
    test = result.test
    where = f"{test if result.kind else 'perftest'} {pair.text()}"
    metrics: list[Metric] = []
    if result.errors or returncode != 0:
        said = "; ".join(result.errors) or "no error line"
        code = "" if returncode == 0 else (" (killed at the timeout)" if returncode is None
                                           else f" (exit {returncode})")
        return Judgement(Status.ERROR, f"{where}: {said}{code}", metrics)
    if result.kind == "bw" and result.bw_rows:
        row = max(result.bw_rows, key=lambda r: r.size_bytes)
        if result.verb == "Atomic" and min_gbps is None:  # 8 B operations: a message rate, not a line rate
            return Judgement(Status.PASS, f"{where}: {row.avg_gbps:.4g} Gb/s at {row.size_bytes} B, "
                             f"{row.msg_rate_mpps:g} Mpps (atomic operations: not judged against the port rate)",
                             [Metric(f"rdma_{test}_gbps", row.avg_gbps, "Gb/s", tags={"size_bytes": row.size_bytes,
                                                                                   "test": test})])
        expected, bound = bw_bound(rate_gbps, bidirectional=result.bidirectional, fraction=fraction,
                                   min_gbps=min_gbps, min_source=min_source, rate_source=rate_source)
        tags: dict[str, str | int | float] = {"size_bytes": row.size_bytes, "test": test}
        if result.device:
            tags["device"] = result.device
        metrics.append(Metric(f"rdma_{test}_gbps", row.avg_gbps, "Gb/s", expected=expected, threshold=bound,
                              tags=tags, expected_source=rate_source if expected is not None else None,
                              performance=True))
        metrics.append(Metric(f"rdma_{test}_peak_gbps", row.peak_gbps, "Gb/s", tags=dict(tags)))
        what = f"{where}: {row.avg_gbps:.4g} Gb/s at {row.size_bytes} B"
        if bound is None:
            return Judgement(Status.PASS, f"{what} (no port rate or bound: not judged)", metrics)
        if not bound.met_by(row.avg_gbps):
            return Judgement(Status.FAIL, f"{what}, expected >= {bound.value:g} ({bound.source})", metrics)
        return Judgement(Status.PASS, f"{what} >= {bound.value:g} ({bound.source})", metrics)
    if result.kind == "lat" and result.lat_rows:
        row_l = min(result.lat_rows, key=lambda r: r.size_bytes)
        typical = row_l.t_typical_us if row_l.t_typical_us is not None else row_l.t_avg_us
        if typical is None:
            return Judgement(Status.ERROR, f"{where}: the latency table has no t_typical or t_avg column", metrics)
        lat_bound = None if max_lat_us is None else Threshold("<=", max_lat_us, Status.FAIL, "--max-lat-us")
        tags_l: dict[str, str | int | float] = {"size_bytes": row_l.size_bytes, "test": test}
        metrics.append(Metric(f"rdma_{test}_typical_us", typical, "us", threshold=lat_bound, tags=tags_l,
                              performance=True))
        if row_l.p99_us is not None:
            metrics.append(Metric(f"rdma_{test}_p99_us", row_l.p99_us, "us", tags=dict(tags_l)))
        what = f"{where}: typical {typical:g} us at {row_l.size_bytes} B"
        if lat_bound is None:
            return Judgement(Status.PASS, f"{what} (no --max-lat-us: not judged)", metrics)
        if not lat_bound.met_by(typical):
            return Judgement(Status.FAIL, f"{what}, expected <= {max_lat_us:g} us", metrics)
        return Judgement(Status.PASS, f"{what} <= {max_lat_us:g} us", metrics)
    return Judgement(Status.ERROR, f"{where}: no result table (the output ends before the results)", metrics)
