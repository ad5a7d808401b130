"""The RDMA pair test's plan (pure): one perftest server and one client per rail, NIC i of one node to NIC i of
the other.

For rail ``i`` of pair ``k`` (of pairs run at once, each with ``R`` rails), the server listens on port
``base_port + i + k x R`` (perftest's ``-p``; default base 18515, perftest's own default), so that every server of
every pair run at once has its own port. The server runs ``ib_<test> -d <nic> -p <port> ARGS``, the client the
same and the server's node name last. With ``gpus`` (GPUDirect RDMA: GPUs present and ``nvidia_peermem`` loaded,
:func:`gpudirect`), rail ``i`` adds ``--use_cuda=<gpu of rail i>`` on both ends, or ``--use_cuda_bus_id=<PCI
address>`` where ``bus_ids`` names it (bandwidth tests only: perftest's latency tests take host memory). Each node
of ``rdma pair-node`` plans its own end's GPUs: the GPU on each NIC's NUMA node
(:func:`gpuaccept.perftest.loopback.nic_gpus`). Equivalent by hand:
``ib_write_bw -d mlx5_0 -p 18515 --use_cuda=0 --report_gbits`` on node A, the same with ``A`` last on node B.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuaccept.errors import UsageError

TESTS = ("write_bw", "read_bw", "send_bw", "write_lat", "read_lat", "send_lat")
DEFAULT_ARGS = ("-s", "1048576", "-D", "5", "-F", "--report_gbits")
"""1 MiB messages for 5 s, no CPU-frequency warning, Gb/s (what :mod:`gpuaccept.perftest.judge` compares)."""
DEFAULT_BASE_PORT = 18515
_NIC = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}$")
_OWN = ("-d", "--ib-dev", "-p", "--port", "--use_cuda", "--use_cuda_bus_id")


@dataclass(frozen=True)
class RailPair:
    """One rail's server and client: who runs what, on which port."""

    rail: int
    server_node: str
    client_node: str
    server_nic: str
    client_nic: str
    port: int
    gpu: int | None
    server_argv: tuple[str, ...]
    client_argv: tuple[str, ...]

    def label(self) -> str:
        """``node-b rail 3 (mlx5_3) -> node-a rail 3 (mlx5_3)``: the client end first, as the judge names it."""
        return (f"{self.client_node} rail {self.rail} ({self.client_nic}) -> {self.server_node} rail {self.rail} "
                f"({self.server_nic})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["server_argv"], d["client_argv"] = list(self.server_argv), list(self.client_argv)
        return d


def port_of(base_port: int, rail: int, pair_index: int, rails: int) -> int:
    """``base_port + rail + pair_index x rails``; UsageError past 65535."""
    port = base_port + rail + pair_index * rails
    if not 1 <= port <= 65535:
        raise UsageError(f"perftest port {port} (base {base_port} + rail {rail} + pair {pair_index} x {rails} rails) "
                         "is outside 1..65535: lower --base-port")
    return port


def pair_plan(server_node: str, client_node: str, server_nics: Sequence[str], client_nics: Sequence[str], *,
              test: str = "write_bw", gpus: Sequence[int] | None = None, base_port: int = DEFAULT_BASE_PORT,
              pair_index: int = 0, args: Sequence[str] = DEFAULT_ARGS,
              bus_ids: Sequence[str | None] | None = None) -> list[RailPair]:
    """Every rail of one pair (pure). ``gpus``: the CUDA ordinal of each rail's GPU (GPUDirect), or None for host
    memory; ``bus_ids``: each rail's GPU by PCI address (``--use_cuda_bus_id``, where the binary takes it)."""
    if test not in TESTS:
        raise UsageError(f"perftest test {test!r} is not one of {', '.join(TESTS)}")
    if server_node == client_node:
        raise UsageError(f"a pair test needs two nodes; got {server_node} twice")
    for node in (server_node, client_node):
        if not _HOST.match(node):
            raise UsageError(f"{node!r} is not a node name")
    if len(server_nics) != len(client_nics) or not server_nics:
        raise UsageError(f"rail by rail needs as many NICs on each node: {len(server_nics)} on {server_node}, "
                         f"{len(client_nics)} on {client_node}")
    bad = [n for n in (*server_nics, *client_nics) if not _NIC.match(n)]
    if bad:
        raise UsageError(f"{bad[0]!r} is not an RDMA device name (e.g. mlx5_0)")
    if gpus is not None and len(gpus) != len(server_nics):
        raise UsageError(f"{len(gpus)} GPUs for {len(server_nics)} rails")
    if bus_ids is not None and (gpus is None or len(bus_ids) != len(gpus)):
        raise UsageError("GPU PCI addresses need a GPU for each rail")
    own = [a for a in args if a.split("=", 1)[0] in _OWN]
    if own:
        raise UsageError(f"perftest argument {own[0]} is set by the plan (device, port, GPU)")
    binary = f"ib_{test}"
    cuda = gpus is not None and test.endswith("_bw")
    out = []
    for i, (snic, cnic) in enumerate(zip(server_nics, client_nics, strict=True)):
        port = port_of(base_port, i, pair_index, len(server_nics))
        gpu = gpus[i] if gpus is not None and cuda else None
        bus = bus_ids[i] if bus_ids is not None and gpu is not None else None
        flag = f"--use_cuda_bus_id={bus}" if bus else f"--use_cuda={gpu}" if gpu is not None else None
        tail = [*args, *([flag] if flag else [])]
        server = (binary, "-d", snic, "-p", str(port), *tail)
        client = (binary, "-d", cnic, "-p", str(port), *tail, server_node)
        out.append(RailPair(i, server_node, client_node, snic, cnic, port, gpu, server, client))
    return out


def gpudirect(inv: Any) -> bool:
    """Whether GPU memory can be used (``--use_cuda``): the node has NVIDIA GPUs and ``nvidia_peermem`` (or
    ``nv_peer_mem``) is loaded (an :class:`gpuaccept.hw.rdma.Inventory`)."""
    return bool(inv.gpus) and inv.peermem is not None


def rail_nics(inv: Any) -> list[str]:
    """The devices with an active port, by name (``mlx5_0``, ``mlx5_1``, ...): rail ``i`` is the ``i``-th."""
    return sorted({p.device for p in inv.ports if p.up}, key=_natural)


def _natural(name: str) -> tuple[str, int]:
    m = re.match(r"^(.*?)(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


ALL_SIZES = 23
"""Message sizes of perftest's ``-a``: 2 B to 8 MiB, each power of two (2^1..2^23)."""
CONNECT_S = 3.0
"""Seconds of a rail's run that are not traffic (an assumption, not measured here): the client's 1 s
``--client-delay``, then about 2 s of CUDA and device init and the QP exchange over the socket."""


def estimate_s(args: Sequence[str] = DEFAULT_ARGS, connect_s: float = CONNECT_S) -> tuple[float | None, str]:
    """One rail's estimated run time in seconds and how it was reckoned (pure): ``-D`` seconds x the sizes (1,
    or :data:`ALL_SIZES` with ``-a``) + ``connect_s``. Without ``-D`` perftest counts iterations (``-n``), whose
    time depends on the bandwidth: (None, why)."""
    sizes = ALL_SIZES if "-a" in args or "--all" in args else 1
    duration = None
    for i, a in enumerate(args):
        if a in ("-D", "--duration") and i + 1 < len(args):
            duration = args[i + 1]
        elif a.startswith("--duration="):
            duration = a.split("=", 1)[1]
    if duration is None:
        return None, "no -D: perftest runs a count of iterations, whose time depends on the bandwidth"
    try:
        seconds = float(duration)
    except ValueError:
        return None, f"-D {duration} is not a number of seconds"
    total = seconds * sizes + connect_s
    return total, (f"-D {seconds:g} s x {sizes} size{'s' if sizes > 1 else ''} + {connect_s:g} s connection "
                   f"setup = {total:g} s")
