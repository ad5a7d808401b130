"""The RDMA pair test's plan: golden argv, ports for pairs run at once, GPUDirect only where it can be used."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuaccept.errors import UsageError
from gpuaccept.hw.rdma import read_inventory
from gpuaccept.perftest.plan import gpudirect, pair_plan, port_of, rail_nics

SYSFS = Path(__file__).parent / "data" / "sysfs"


def test_golden_argv_of_two_rails_with_gpus() -> None:
    rails = pair_plan("node-a", "node-b", ["mlx5_0", "mlx5_1"], ["mlx5_0", "mlx5_1"], gpus=[0, 1])
    assert [r.server_argv for r in rails] == [
        ("ib_write_bw", "-d", "mlx5_0", "-p", "18515", "-s", "1048576", "-D", "5", "-F", "--report_gbits",
         "--use_cuda=0"),
        ("ib_write_bw", "-d", "mlx5_1", "-p", "18516", "-s", "1048576", "-D", "5", "-F", "--report_gbits",
         "--use_cuda=1")]
    assert rails[1].client_argv == ("ib_write_bw", "-d", "mlx5_1", "-p", "18516", "-s", "1048576", "-D", "5", "-F",
                                    "--report_gbits", "--use_cuda=1", "node-a")
    assert rails[1].label() == "node-b rail 1 (mlx5_1) -> node-a rail 1 (mlx5_1)"


def test_host_memory_and_latency_tests_have_no_use_cuda() -> None:
    host = pair_plan("a", "b", ["mlx5_0"], ["mlx5_0"], test="read_bw", args=("--report_gbits",))
    assert host[0].client_argv == ("ib_read_bw", "-d", "mlx5_0", "-p", "18515", "--report_gbits", "a")
    lat = pair_plan("a", "b", ["mlx5_0"], ["mlx5_0"], test="write_lat", gpus=[0], args=())
    assert lat[0].gpu is None and lat[0].server_argv == ("ib_write_lat", "-d", "mlx5_0", "-p", "18515")


def test_pairs_run_at_once_never_share_a_port() -> None:
    nics = [f"mlx5_{i}" for i in range(8)]
    ports = [r.port for k in range(4) for r in pair_plan("a", "b", nics, nics, pair_index=k)]
    assert len(set(ports)) == 32 and min(ports) == 18515 and max(ports) == 18515 + 31
    assert port_of(18515, 3, 2, 8) == 18515 + 3 + 16
    with pytest.raises(UsageError, match=r"outside 1\.\.65535"):
        port_of(65530, 7, 0, 8)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"server_node": "a", "client_node": "a"}, "two nodes"),
    ({"server_nics": ["mlx5_0"], "client_nics": ["mlx5_0", "mlx5_1"]}, "as many NICs"),
    ({"server_nics": ["../x"], "client_nics": ["mlx5_0"]}, "not an RDMA device name"),
    ({"test": "atomic_bw"}, "not one of"),
    ({"args": ("-p", "1")}, "set by the plan"),
    ({"args": ("--use_cuda=3",)}, "set by the plan"),
    ({"gpus": [0, 1]}, "2 GPUs for 1 rails"),
    ({"server_node": "-oProxyCommand=x"}, "not a node name"),
])
def test_bad_plans_are_usage_errors(kwargs: dict, match: str) -> None:
    base: dict = {"server_node": "a", "client_node": "b", "server_nics": ["mlx5_0"], "client_nics": ["mlx5_0"]}
    base.update(kwargs)
    with pytest.raises(UsageError, match=match):
        pair_plan(base.pop("server_node"), base.pop("client_node"), base.pop("server_nics"),
                  base.pop("client_nics"), **base)


def test_gpudirect_and_rails_from_recorded_sysfs() -> None:
    ndr = read_inventory(SYSFS / "ndr_4x")
    assert gpudirect(ndr) is (bool(ndr.gpus) and ndr.peermem is not None)
    assert rail_nics(ndr) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    down = read_inventory(SYSFS / "ndr_4x_port_down")
    assert len(rail_nics(down)) == len([p for p in down.ports if p.up]) < 4
    assert gpudirect(read_inventory(SYSFS / "no_gpu")) is False


def test_a_rail_test_is_estimated_from_its_duration_sizes_and_connection_setup() -> None:
    from gpuaccept.perftest.plan import ALL_SIZES, CONNECT_S, estimate_s

    assert estimate_s() == (5.0 + CONNECT_S, f"-D 5 s x 1 size + {CONNECT_S:g} s connection setup = 8 s")
    seconds, how = estimate_s(["-a", "--duration=2", "--report_gbits"], connect_s=1.0)
    assert seconds == 2.0 * ALL_SIZES + 1.0 == 47.0 and how.startswith("-D 2 s x 23 sizes")
    assert estimate_s(["-n", "1000"]) == (None, "no -D: perftest runs a count of iterations, whose time depends "
                                                "on the bandwidth")
    assert estimate_s(["-D", "x"])[0] is None


def test_each_node_picks_its_own_ends_gpu_by_numa_and_pci_address() -> None:
    from gpuaccept.perftest.loopback import nic_gpus
    from gpuaccept.perftest.node import own_gpus

    old = "      --use_cuda=<cuda device id> Use CUDA specific device for GPUDirect RDMA testing\n"
    new = old + "      --use_cuda_bus_id=<cuda full BUS id> Use CUDA specific device, based on its full PCIe address\n"
    inv = read_inventory(SYSFS / "ndr_4x")
    nics = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    local = nic_gpus(inv, nics)
    gpus, bus, why = own_gpus(inv, nics, "auto", new, {"CUDA_VISIBLE_DEVICES": "GPU-1a2b"})
    assert bus == [local[n].pci_address for n in nics] and why.endswith("by PCI address (--use_cuda_bus_id)")
    rails = pair_plan("a", "b", nics, nics, gpus=gpus, bus_ids=bus)
    assert rails[2].client_argv[-2:] == (f"--use_cuda_bus_id={local['mlx5_2'].pci_address}", "a")
    # an older perftest: the ordinal as this process's CUDA_VISIBLE_DEVICES numbers it
    visible = ",".join(str(local[n].index) for n in reversed(nics))
    gpus, bus, why = own_gpus(inv, nics, "auto", old, {"CUDA_VISIBLE_DEVICES": visible})
    assert bus is None and gpus == [3, 2, 1, 0] and why.endswith("by CUDA ordinal (--use_cuda)")
    assert pair_plan("a", "b", nics, nics, gpus=gpus)[0].server_argv[-1] == "--use_cuda=3"
    gpus, bus, why = own_gpus(inv, nics, "auto", old, {"CUDA_VISIBLE_DEVICES": "0"})
    assert gpus is None and why.startswith("host memory: CUDA_VISIBLE_DEVICES=0 hides mlx5_1's GPU")
    assert own_gpus(inv, nics, "auto", "usage: ib_write_bw\n", {})[2] == (
        "host memory: this perftest is built without CUDA (no --use_cuda in its --help)")
    assert own_gpus(inv, nics, "host", new, {}) == (None, None, "host memory (--memory host)")
    assert own_gpus(read_inventory(SYSFS / "roce_2x"), ["mlx5_0"], "auto", new, {})[2] == (
        "host memory: nvidia_peermem is not loaded (no GPUDirect RDMA)")  # the rdma check's words
    assert own_gpus(read_inventory(SYSFS / "no_gpu"), ["mlx5_0"], "auto", new, {})[2] == (
        "host memory: no NVIDIA GPU on this node")
    with pytest.raises(UsageError, match="no NVIDIA GPU"):
        own_gpus(read_inventory(SYSFS / "no_gpu"), ["mlx5_0"], "cuda", new, {})
    with pytest.raises(UsageError, match="need a GPU for each rail"):
        pair_plan("a", "b", nics, nics, bus_ids=bus or ["x"] * 4)
