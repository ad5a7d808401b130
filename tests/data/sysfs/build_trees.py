"""Writes the recorded sysfs trees next to this file: ``python tests/data/sysfs/build_trees.py``.

The layout is the kernel's (Documentation/ABI/stable/sysfs-class-infiniband, and the PCI and net
class layouts): each RDMA device lives under its PCI function in ``sys/devices/pci.../<bdf>/
infiniband/<dev>``, ``sys/class/infiniband/<dev>`` links there and ``<dev>/device`` links back
to the PCI function; ``sys/bus/pci/devices/<bdf>`` and ``sys/class/net/<if>`` are links into
``sys/devices`` too. File contents are in the kernel's formats (``"4: ACTIVE"``,
``"5: LinkUp"``, ``"400 Gb/sec (4X NDR)"``). The trees are committed; this script documents how
they were made and remakes them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent

COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
            "port_rcv_remote_physical_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
            "port_xmit_discards", "port_xmit_data", "port_rcv_data")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") or not text else text + "\n")


def link(at: Path, target: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(os.path.relpath(target, at.parent))


def pci_dir(root: Path, bdf: str, numa: str, vendor: str, cls: str, device: str) -> Path:
    bus = int(bdf.split(":")[1], 16)
    d = root / "sys/devices" / f"pci0000:{bus:02x}" / f"0000:{bus:02x}:01.0" / bdf
    write(d / "numa_node", numa)
    write(d / "vendor", vendor)
    write(d / "class", cls)
    write(d / "device", device)
    link(root / "sys/bus/pci/devices" / bdf, d)
    return d


def gpu(root: Path, bdf: str, numa: str, device: str = "0x2330", *, vendor: str = "0x10de", cls: str = "0x030200",
        driver: str | None = None) -> None:
    """A GPU function; ``driver`` binds it (``<bdf>/driver`` links to ``sys/bus/pci/drivers/<driver>``)."""
    d = pci_dir(root, bdf, numa, vendor, cls, device)
    if driver:
        write(root / "sys/bus/pci/drivers" / driver / "uevent", f"DRIVER={driver}")  # git keeps no empty folder
        link(d / "driver", root / "sys/bus/pci/drivers" / driver)


def not_gpus(root: Path) -> None:
    """What is on a GPU server's bus but is no GPU: the BMC's VGA (ASPEED), NVSwitches (an NVIDIA bridge),
    an NVIDIA audio function, an emulated display adapter (QEMU's), a virtio device."""
    pci_dir(root, "0000:03:00.0", "0", "0x1a03", "0x030000", "0x2000")
    for i, bus in enumerate(("c1", "c2", "c3", "c4")):
        pci_dir(root, f"0000:{bus}:00.0", str(i // 2), "0x10de", "0x068000", "0x22a3")
    pci_dir(root, "0000:05:00.1", "0", "0x10de", "0x040300", "0x22ba")
    pci_dir(root, "0000:06:00.0", "0", "0x1234", "0x030000", "0x1111")
    pci_dir(root, "0000:07:00.0", "0", "0x1af4", "0x010000", "0x1042")


def gpu_node(name: str, *, driver: str | None, n: int = 8, vendor: str = "0x10de", cls: str = "0x030200",
             device: str = "0x2330", unbound: tuple[int, ...] = ()) -> None:
    """n GPUs (bound to ``driver``, except those at ``unbound``) among the devices of :func:`not_gpus`."""
    root = HERE / name
    shutil.rmtree(root, ignore_errors=True)
    for i, bus in enumerate(GPU_BUSES[:n]):
        gpu(root, f"0000:{bus}:00.0", "0" if i < n // 2 else "1", device, vendor=vendor, cls=cls,
            driver=None if i in unbound else driver)
    not_gpus(root)


def hca(root: Path, name: str, bdf: str, numa: str, *, rate: str, layer: str = "InfiniBand",
        state: str = "4: ACTIVE", phys: str = "5: LinkUp", netdev: str | None = None,
        counters: dict[str, str] | None = None, gid0: str | None = None) -> None:
    """One single-port HCA. Its node GUID is made from the bus number; GID 0 (whose low 64 bits are
    the port GUID) is the link-local prefix and that GUID on InfiniBand, the EUI-64 of the MAC on RoCE."""
    eth = layer == "Ethernet"
    bus = bdf.split(":")[1]
    d = pci_dir(root, bdf, numa, "0x15b3", "0x020000" if eth else "0x020700", "0x1021")
    dev = d / "infiniband" / name
    link(root / "sys/class/infiniband" / name, dev)
    link(dev / "device", d)
    write(dev / "fw_ver", "28.39.1002")
    write(dev / "hca_type", "MT4129")
    write(dev / "node_type", "1: CA")
    node_guid = f"b859:9f03:00{bus}:a7f6"
    write(dev / "node_guid", node_guid)
    port = dev / "ports" / "1"
    if gid0 is None:
        gid0 = f"fe80:0000:0000:0000:ba59:9fff:fe{bus}:a7f6" if eth else f"fe80:0000:0000:0000:{node_guid}"
    write(port / "gids" / "0", gid0)
    write(port / "state", state)
    write(port / "phys_state", phys)
    write(port / "rate", rate)
    write(port / "link_layer", layer)
    values = {c: "0" for c in COUNTERS}
    values.update({"port_xmit_data": "81234567890", "port_rcv_data": "80987654321"})
    values.update(counters or {})
    for c, v in values.items():
        if eth and c == "symbol_error":
            continue  # RoCE ports have no symbol_error counter
        write(port / "counters" / c, v)
    if netdev:
        nd = d / "net" / netdev
        write(nd / "mtu", "4092" if not eth else "9000")
        link(root / "sys/class/net" / netdev, nd)
    if eth and netdev:
        for i, t in enumerate(("IB/RoCE v1", "RoCE v2")):
            write(port / "gid_attrs/types" / str(i), t)
            write(port / "gid_attrs/ndevs" / str(i), netdev)


def base(name: str, *, peermem: str | None = "nvidia_peermem") -> Path:
    root = HERE / name
    shutil.rmtree(root, ignore_errors=True)
    write(root / "sys/class/net/lo/mtu", "65536")
    write(root / "sys/class/net/eth0/mtu", "1500")
    if peermem:
        write(root / "sys/module" / peermem / "refcnt", "0")
    write(root / "sys/module/mlx5_ib/refcnt", "0")
    return root


GPU_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
NIC_BUSES = ("0c", "1c", "2c", "4c", "8c", "9c", "ac", "cc")


def n_way(name: str, rate: str, *, gpu_id: str, per_port: dict[int, dict[str, object]] | None = None,
          n: int = 8) -> None:
    """n GPUs and n single-port HCAs, the first half of each on NUMA node 0, the rest on node 1."""
    root = base(name)
    for i, bus in enumerate(GPU_BUSES[:n]):
        gpu(root, f"0000:{bus}:00.0", "0" if i < n // 2 else "1", gpu_id)
    write(root / "sys/bus/pci/devices/0000:00:00.0/vendor", "0x8086")  # a host bridge, not a GPU
    write(root / "sys/bus/pci/devices/0000:00:00.0/class", "0x060000")
    for i, bus in enumerate(NIC_BUSES[:n]):
        kw: dict[str, object] = {"rate": rate}
        kw.update((per_port or {}).get(i, {}))
        hca(root, f"mlx5_{i}", f"0000:{bus}:00.0", "0" if i < n // 2 else "1", netdev=f"ibp{int(bus, 16)}s0",
            **kw)  # type: ignore[arg-type]


def main() -> None:
    boot = {1: {"counters": {"link_downed": "1", "symbol_error": "12"}}}  # a flap at boot, old symbol errors
    n_way("hdr_8x", "200 Gb/sec (4X HDR)", gpu_id="0x20b2", per_port=boot)
    n_way("ndr_8x", "400 Gb/sec (4X NDR)", gpu_id="0x2330", per_port=boot)
    # four-way variants of ndr_8x: counters read later under load, a port down, a degraded port
    n_way("ndr_4x", "400 Gb/sec (4X NDR)", gpu_id="0x2330", per_port=boot, n=4)
    n_way("ndr_4x_later", "400 Gb/sec (4X NDR)", gpu_id="0x2330", n=4,
          per_port={1: {"counters": {"link_downed": "1", "symbol_error": "12"}},
                    2: {"counters": {"symbol_error": "4031", "port_rcv_errors": "17", "link_downed": "2"}}})
    n_way("ndr_4x_port_down", "400 Gb/sec (4X NDR)", gpu_id="0x2330", n=4,
          per_port={3: {"state": "1: DOWN", "phys": "3: Disabled", "rate": "10 Gb/sec (4X)"}})
    n_way("ndr_4x_degraded", "400 Gb/sec (4X NDR)", gpu_id="0x2330", n=4,
          per_port={1: {"rate": "200 Gb/sec (2X NDR)"}})
    root = base("roce_2x", peermem=None)
    for i, bus in enumerate(("18", "9a")):
        gpu(root, f"0000:{bus}:00.0", str(i), "0x26b9")
    hca(root, "mlx5_0", "0000:0c:00.0", "0", rate="200 Gb/sec (4X HDR)", layer="Ethernet", netdev="ens1f0np0")
    hca(root, "mlx5_1", "0000:8c:00.0", "1", rate="200 Gb/sec (4X HDR)", layer="Ethernet", netdev="ens2f0np0")
    root = base("malformed")
    gpu(root, "0000:18:00.0", "0")
    hca(root, "mlx5_0", "0000:0c:00.0", "0", rate="fast", netdev="ibp12s0",
        counters={"symbol_error": "-3", "port_rcv_errors": "lots"})
    hca(root, "mlx5_1", "0000:1c:00.0", "x", rate="400 Gb/sec (4X NDR)", state="ACTIVE", netdev="ibp28s0",
        gid0="0000:0000:0000:0000:0000:0000:0000:0000")  # no GID assigned: no port GUID
    base("no_rdma")
    # GPUs on the bus, whatever the driver says (the env check)
    gpu_node("gpu_8x", driver="nvidia")  # bound: usable if NVML and CUDA see them
    gpu_node("gpu_8x_unbound", driver="nvidia", unbound=(0, 1, 2, 3, 4, 5, 6, 7))  # the module did not load
    gpu_node("gpu_8x_one_unbound", driver="nvidia", unbound=(5,))  # one GPU lost its driver
    gpu_node("amd_8x", driver="amdgpu", vendor="0x1002", cls="0x038000", device="0x740c")  # MI250X
    root = HERE / "no_gpu"
    shutil.rmtree(root, ignore_errors=True)
    not_gpus(root)


if __name__ == "__main__":
    main()
