"""One node's RDMA loopback test, NIC by NIC: perftest's server and client on the same device, the client
connecting to ``localhost`` (the way Azure's node health checks measure each NIC alone).

For the NIC of rail ``i`` (:func:`gpuaccept.perftest.plan.rail_nics`: the devices with an ACTIVE port, in
natural order) the server runs ``ib_write_bw -d mlx5_0 -p <base_port + i> ARGS`` in the background and the
client ``ib_write_bw -d mlx5_0 -p <base_port + i> ARGS localhost``; with GPU memory both add
``--use_cuda=<GPU>``, the GPU of that NIC's NUMA node (:func:`nic_gpus`). The plan is pure
(:func:`loopback_plan`); :func:`run_loopback` runs one NIC's pair of processes and ends the server when its
client is done or failed.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuaccept.errors import UsageError
from gpuaccept.perftest.plan import (
    _NIC,
    _OWN,
    DEFAULT_ARGS,
    DEFAULT_BASE_PORT,
    RailPair,
    _natural,
    gpudirect,
    port_of,
)

LOOPBACK_HOST = "localhost"
CUDA_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
"""Set for perftest's processes: ``--use_cuda=N`` then counts GPUs in PCI bus order, the order of
:func:`gpuaccept.hw.rdma.read_gpus` (``nvidia-smi``'s), not CUDA's default fastest-first order."""


@dataclass(frozen=True)
class NicGpu:
    """The GPU a NIC's loopback run uses (``--use_cuda=index``) and why that one."""

    index: int
    pci_address: str
    why: str


def nic_gpus(inv: Any, nics: Sequence[str]) -> dict[str, NicGpu]:
    """The GPU of each NIC (pure, from an :class:`gpuaccept.hw.rdma.Inventory`): the GPUs on the NIC's NUMA
    node in PCI order, the ``j``-th NIC of a NUMA node taking its ``j``-th GPU (round robin), so that NICs
    on one socket use different GPUs; a NIC whose NUMA node is unknown or has no GPU takes GPU
    ``rail mod GPUs`` (said in ``why``). GPU indexes count every NVIDIA GPU in PCI order
    (:data:`CUDA_ORDER`). Empty without GPUs."""
    gpus = list(inv.gpus)
    if not gpus:
        return {}
    numa_of = {d.name: d.numa_node for d in inv.devices}
    seen: dict[int, int] = {}
    out: dict[str, NicGpu] = {}
    for rail, nic in enumerate(nics):
        numa = numa_of.get(nic)
        local = [i for i, g in enumerate(gpus) if numa is not None and numa >= 0 and g.numa_node == numa]
        if local:
            j = seen.get(numa, 0)  # type: ignore[arg-type]
            seen[numa] = j + 1  # type: ignore[index]
            i = local[j % len(local)]
            out[nic] = NicGpu(i, gpus[i].pci_address, f"on {nic}'s NUMA node {numa}")
        else:
            i = rail % len(gpus)
            where = "unknown" if numa is None or numa < 0 else f"{numa}, which has no GPU"
            out[nic] = NicGpu(i, gpus[i].pci_address, f"not local: {nic}'s NUMA node is {where}")
    return out


def cuda_built(help_text: str) -> bool:
    """Whether a perftest binary takes ``--use_cuda`` (its ``--help`` names it; Debian's package is built
    without CUDA and does not)."""
    return "--use_cuda" in help_text


def memory_choice(inv: Any, mode: str, device: str, help_text: str | None, asked: str | None = None
                  ) -> tuple[bool, str]:
    """(GPU memory?, why) (pure; ``inv``: a :class:`gpuaccept.hw.rdma.Inventory`): ``mode`` ``cuda``/``host`` as
    asked (``asked``: how, default ``memory=MODE``); ``auto``: GPU memory when this is no CPU run, the node has
    NVIDIA GPUs, ``nvidia_peermem`` is loaded and perftest's ``--help`` names ``--use_cuda``. The rdma check's
    and ``rdma pair-node``'s choice, in the same words."""
    if mode != "auto":
        return mode == "cuda", f"{'GPU' if mode == 'cuda' else 'host'} memory ({asked or f'memory={mode}'})"
    if device == "cpu":
        return False, "host memory: a CPU run (--device cpu)"
    if not inv.gpus:
        return False, "host memory: no NVIDIA GPU on this node"
    if not gpudirect(inv):
        return False, "host memory: nvidia_peermem is not loaded (no GPUDirect RDMA)"
    if help_text is not None and not cuda_built(help_text):
        return False, "host memory: this perftest is built without CUDA (no --use_cuda in its --help)"
    return True, "GPU memory (--use_cuda, GPUDirect RDMA)"


def takes_bus_id(help_text: str | None) -> bool:
    """Whether a perftest binary takes ``--use_cuda_bus_id=<PCI address>`` (perftest prints it in ``--help`` beside
    ``--use_cuda`` in CUDA builds since 2022): the GPU named by its PCI address, whatever CUDA's numbering."""
    return help_text is not None and "--use_cuda_bus_id" in help_text


def cuda_index(pci_order_index: int, visible: str | None) -> int | None:
    """CUDA's ordinal of the GPU that is ``pci_order_index``-th of all NVIDIA GPUs in PCI order, for a process
    started with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (:data:`CUDA_ORDER`) and ``CUDA_VISIBLE_DEVICES=visible``
    (pure): the index itself when nothing is hidden (unset), its place in the list when the list is of
    ordinals, None when the GPU is hidden or the list names GPUs by UUID or MIG instance (no ordinal is
    knowable here: use ``--use_cuda_bus_id``)."""
    if visible is None:
        return pci_order_index
    items = [v.strip() for v in visible.split(",") if v.strip()]
    ordinals: list[int] = []
    for item in items:
        if not item.isdigit():
            return None
        ordinals.append(int(item))
    return ordinals.index(pci_order_index) if pci_order_index in ordinals else None


def cuda_choice(gpus: Mapping[str, NicGpu], binary: str | None, help_text: str | None, env: Mapping[str, str]
                ) -> tuple[dict[str, int], dict[str, str], str]:
    """(each NIC's CUDA ordinal, each NIC's GPU PCI address for ``--use_cuda_bus_id``, why host memory instead or
    ""): the PCI address where perftest takes it (immune to ``CUDA_VISIBLE_DEVICES`` and CUDA's numbering);
    else the ordinal under ``CUDA_VISIBLE_DEVICES`` (:func:`cuda_index`), and host memory, said why, when a
    NIC's GPU has no ordinal there. ``help_text`` None: read from ``binary --help``."""
    if not gpus:
        return {}, {}, ""
    if help_text is None and binary is not None:
        help_text = help_of(binary)
    if takes_bus_id(help_text):
        return {n: g.index for n, g in gpus.items()}, {n: g.pci_address for n, g in gpus.items()}, ""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ordinals: dict[str, int] = {}
    for nic, gpu in gpus.items():
        ordinal = cuda_index(gpu.index, visible)
        if ordinal is None:
            return {}, {}, (f"host memory: CUDA_VISIBLE_DEVICES={visible} hides {nic}'s GPU {gpu.pci_address} or "
                            "names GPUs without ordinals, and this perftest has no --use_cuda_bus_id")
        ordinals[nic] = ordinal
    return ordinals, {}, ""


def help_of(binary: str) -> str | None:
    """What ``binary --help`` prints (stdout and stderr), or None when it cannot be run within 10 s."""
    try:
        done = subprocess.run([binary, "--help"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=10, check=False)
        return done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired):
        return None


def device_rails(inv: Any) -> dict[str, int]:
    """Each RDMA device's rail: its index among all of the node's devices in natural order (``mlx5_0`` 0,
    ``mlx5_10`` after ``mlx5_9``), active or not, so that a port down does not renumber the others."""
    return {name: i for i, name in enumerate(sorted((d.name for d in inv.devices), key=_natural))}


def loopback_plan(nics: Sequence[str], *, test: str = "write_bw", gpus: Mapping[str, int] | None = None,
                  base_port: int = DEFAULT_BASE_PORT, args: Sequence[str] = DEFAULT_ARGS,
                  host: str = LOOPBACK_HOST, rails: Mapping[str, int] | None = None,
                  ib_ports: Mapping[str, int] | None = None, bus_ids: Mapping[str, str] | None = None
                  ) -> list[RailPair]:
    """Each NIC's server and client on this node (pure): the NIC of rail ``r`` (``rails``, default its place in
    ``nics``) on port ``base_port + r``, ``--use_cuda`` with the NIC's GPU in ``gpus`` (None or a NIC not in
    it: host memory; ``--use_cuda_bus_id`` with its PCI address instead when ``bus_ids`` has one), ``-i N`` for
    a NIC whose port in ``ib_ports`` is not 1 (perftest's default)."""
    if not test.endswith("_bw"):
        raise UsageError(f"the loopback test measures bandwidth: {test!r} is not one of write_bw, read_bw, send_bw")
    bad = [n for n in nics if not _NIC.match(n)]
    if bad:
        raise UsageError(f"{bad[0]!r} is not an RDMA device name (e.g. mlx5_0)")
    own = [a for a in args if a.split("=", 1)[0] in (*_OWN, "-i", "--ib-port")]
    if own:
        raise UsageError(f"perftest argument {own[0]} is set by the plan (device, ports, GPU)")
    out = []
    for i, nic in enumerate(nics):
        i = rails.get(nic, i) if rails is not None else i
        port = port_of(base_port, i, 0, 1)
        gpu = None if gpus is None else gpus.get(nic)
        ib_port = 1 if ib_ports is None else ib_ports.get(nic, 1)
        bus = None if bus_ids is None or gpu is None else bus_ids.get(nic)
        cuda = [f"--use_cuda_bus_id={bus}"] if bus else [f"--use_cuda={gpu}"] if gpu is not None else []
        tail = (*(("-i", str(ib_port)) if ib_port != 1 else ()), *args, *cuda)
        server = (f"ib_{test}", "-d", nic, "-p", str(port), *tail)
        out.append(RailPair(i, host, host, nic, nic, port, gpu, server, (*server, host)))
    return out


@dataclass
class LoopbackRun:
    """What one NIC's two processes printed and how they ended (exit None: killed at the timeout)."""

    pair: RailPair
    server_exit: int | None
    server_output: str
    client_exit: int | None
    client_output: str
    seconds: float


def _popen(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str] | str:
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", env=dict(env),
                                start_new_session=True)
    except OSError as exc:
        return f"Couldn't start {argv[0]}: {exc}\n"


def _finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[int | None, str]:
    try:
        out, _ = proc.communicate(timeout=max(0.1, timeout_s))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return None, out


def run_loopback(pair: RailPair, *, timeout_s: float, env: Mapping[str, str] | None = None,
                 client_delay_s: float = 0.5, connect_tries: int = 5, linger_s: float = 5.0) -> LoopbackRun:
    """Run one NIC's server, then its client (again while it prints ``Couldn't connect``: the server may not
    listen yet), both within ``timeout_s``; the server gets ``linger_s`` after its client ends, then is
    killed (it would wait for a client forever)."""
    env = {**(os.environ if env is None else env), **CUDA_ORDER}
    start = time.monotonic()
    deadline = start + timeout_s
    server = _popen(pair.server_argv, env)
    if isinstance(server, str):
        return LoopbackRun(pair, 127, server, None, "", time.monotonic() - start)
    drained: dict[str, Any] = {}

    def drain() -> None:
        drained["code"], drained["out"] = _finish(server, timeout_s)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    code: int | None = None
    out = ""
    for attempt in range(max(1, connect_tries)):
        time.sleep(client_delay_s * (attempt + 1))
        if not reader.is_alive():
            break  # the server ended before any client: its output says why
        client = _popen(pair.client_argv, env)
        if isinstance(client, str):
            code, out = 127, client
            break
        code, out = _finish(client, deadline - time.monotonic())
        if "Couldn't connect" not in out or time.monotonic() >= deadline:
            break
    reader.join(max(0.1, min(linger_s, deadline - time.monotonic())))
    killed = reader.is_alive()
    if killed:
        server.kill()
        reader.join(5.0)
    return LoopbackRun(pair, None if killed else drained.get("code"), str(drained.get("out", "")), code, out,
                       time.monotonic() - start)
