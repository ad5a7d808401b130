"""The perftest judge: a NIC's Gb/s against its port rate x a fraction, errors as ERROR naming both ends."""

from __future__ import annotations

from pathlib import Path

from gpuaccept.model import Status
from gpuaccept.perftest.judge import Ends, bw_bound, data_rate_gbps, ends_of, judge
from gpuaccept.perftest.parse import parse_text

DATA = Path(__file__).parent / "data" / "perftest"


def parse(name: str):
    return parse_text((DATA / name).read_text())


def test_healthy_ndr_nic_passes_at_095_of_its_rate() -> None:
    j = judge(parse("write_bw_cuda_ndr_client.txt"), rate_gbps=400.0, rate_source="mlx5_0:1 rate")
    assert j.status is Status.PASS
    m = j.metrics[0]
    assert (m.name, m.value, m.unit, m.expected) == ("rdma_write_bw_gbps", 399.61, "Gb/s", 400.0)
    assert m.threshold is not None and m.threshold.value == 380.0
    assert m.threshold.source == "0.95 x mlx5_0:1 rate 400 Gb/s"


def test_slow_nic_fails_naming_both_ends_and_the_bound() -> None:
    ends = Ends("node-b rail 3 (mlx5_3)", "node-a rail 3 (mlx5_3)")
    j = judge(parse("write_bw_cuda_slow_client.txt"), rate_gbps=400.0, ends=ends)
    assert j.status is Status.FAIL
    assert j.reason == ("write_bw node-b rail 3 (mlx5_3) -> node-a rail 3 (mlx5_3): 201.4 Gb/s at 1048576 B, "
                        "expected >= 380 (0.95 x port rate 400 Gb/s)")


def test_a_bound_overrides_the_fraction() -> None:
    r = parse("write_bw_cuda_ndr_client.txt")
    assert judge(r, rate_gbps=400.0, min_gbps=399.7, min_source="baseline:fleet.json").status is Status.FAIL
    assert judge(r, rate_gbps=400.0, fraction=0.9995).status is Status.FAIL  # 399.8
    assert judge(r, rate_gbps=400.0, fraction=0.99).status is Status.PASS


def test_bidirectional_is_held_to_twice_the_rate() -> None:
    expected, bound = bw_bound(400.0, bidirectional=True)
    assert expected == 800.0 and bound is not None and bound.value == 760.0
    j = judge(parse("write_bw_bidir_mib_client.txt"), rate_gbps=400.0)
    assert j.status is Status.PASS and "x 2 (bidirectional)" in j.reason
    assert judge(parse("write_bw_bidir_mib_client.txt"), rate_gbps=420.0).status is Status.FAIL


def test_no_rate_is_measured_not_judged() -> None:
    j = judge(parse("write_bw_all_sizes_client.txt"))
    assert j.status is Status.PASS and "not judged" in j.reason
    assert j.metrics[0].threshold is None and j.metrics[0].value == 395.5  # the largest size's average


def test_connection_error_is_an_error_naming_both_ends() -> None:
    r = parse("err_connect.txt")
    j = judge(r, rate_gbps=400.0, ends=ends_of(r, client="node-b"))
    assert j.status is Status.ERROR
    assert j.reason.startswith("perftest node-b -> node-a:18517: Couldn't connect to node-a:18517")
    assert "Unable to init the socket connection" in j.reason


def test_server_side_error_names_the_server_as_this_side() -> None:
    j = judge(parse("err_exchange.txt"))
    assert j.status is Status.ERROR
    assert j.reason == "perftest its client -> this server: Failed to exchange data between server and clients"


def test_a_table_with_a_nonzero_exit_is_an_error() -> None:
    j = judge(parse("write_bw_cuda_ndr_client.txt"), rate_gbps=400.0, returncode=1)
    assert j.status is Status.ERROR and j.reason.endswith("(exit 1)")
    assert judge(parse("write_bw_cuda_ndr_client.txt"), returncode=None).reason.endswith("(killed at the timeout)")


def test_latency_is_judged_only_against_a_given_bound() -> None:
    r = parse("write_lat_client.txt")
    j = judge(r, rate_gbps=400.0)
    assert j.status is Status.PASS and "not judged" in j.reason
    assert [(m.name, m.value) for m in j.metrics] == [("rdma_write_lat_typical_us", 0.96), ("rdma_write_lat_p99_us",
                                                                                            1.10)]
    assert judge(r, max_lat_us=0.9).status is Status.FAIL
    assert judge(r, max_lat_us=1.0).status is Status.PASS
    old = judge(parse("read_lat_old_header.txt"))
    assert [m.name for m in old.metrics] == ["rdma_read_lat_typical_us"] and old.metrics[0].value == 1.89


def test_data_rate_takes_the_line_encoding_off_the_speeds_that_print_the_signalling_rate() -> None:
    assert data_rate_gbps(40.0, "QDR") == 32.0
    assert data_rate_gbps(10.0, None) == 8.0  # SDR: the kernel prints "10 Gb/sec (4X)"
    assert data_rate_gbps(56.0, "FDR") == 56.0 * 64 / 66
    assert data_rate_gbps(400.0, "NDR") == 400.0 and data_rate_gbps(100.0, "EDR") == 100.0
    assert data_rate_gbps(40.0, "QDR", "Ethernet") == 40.0  # RoCE: the Ethernet speed, mapped


def test_recorded_healthy_qdr_link_passes_against_its_data_rate() -> None:
    """The recorded mlx4 run (``ibstat`` says Rate: 40, QDR) carries 3665 MiB/s = 30.7 Gb/s: healthy against
    0.95 x 32 Gb/s of data; against the signalling rate (0.95 x 40 = 38) it would read as a slow NIC."""
    result = parse("write_bw_all_sizes_mb_mlx4_client.txt")
    good = judge(result, rate_gbps=data_rate_gbps(40.0, "QDR"), rate_source="mlx4_0:1 rate")
    assert good.status is Status.PASS, good.reason
    assert good.metrics[0].threshold is not None and good.metrics[0].threshold.value == 0.95 * 32.0
    assert judge(result, rate_gbps=40.0).status is Status.FAIL


def test_port_rate_from_sysfs_is_the_data_rate(tmp_path: Path) -> None:
    import shutil

    from gpuaccept.perftest.cli import port_rate

    root = tmp_path / "sysfs"
    shutil.copytree(Path(__file__).parent / "data" / "sysfs" / "ndr_4x", root, symlinks=True)
    assert port_rate("mlx5_0:1", str(root)) == 400.0
    (root / "sys/class/infiniband/mlx5_0/ports/1/rate").write_text("40 Gb/sec (4X QDR)\n")
    assert port_rate("mlx5_0:1", str(root)) == 32.0


def test_recorded_atomic_bw_is_not_judged_against_the_port_rate() -> None:
    """Recorded ``ib_atomic_bw`` (8 B fetch-and-add): 0.157 Gb/s is its message rate at work, not a slow NIC."""
    result = parse("atomic_bw_cpufreq_mlx4_client.txt")
    j = judge(result, rate_gbps=32.0)
    assert j.status is Status.PASS
    assert j.reason == ("atomic_bw this client (mlx4_0) -> the server: 0.1566 Gb/s at 8 B, 2.44678 Mpps (atomic "
                        "operations: not judged against the port rate)")
    assert [m.threshold for m in j.metrics] == [None]
    assert judge(result, min_gbps=1.0).status is Status.FAIL  # a bound someone set still holds
