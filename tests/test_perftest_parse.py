"""perftest's output parser, exact on each recorded output of tests/data/perftest (sources in its SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuaccept.errors import InputError
from gpuaccept.perftest.parse import MIB_PER_S_IN_GBPS, BwRow, LatRow, parse_text

DATA = Path(__file__).parent / "data" / "perftest"


def parse(name: str):
    return parse_text((DATA / name).read_text())


def test_every_recorded_output_has_a_test_and_a_source() -> None:
    sources = (DATA / "SOURCES.md").read_text()
    names = sorted(p.name for p in DATA.glob("*.txt"))
    assert names and all(n in sources for n in names)
    tested = Path(__file__).read_text()
    assert [n for n in names if f'"{n}"' not in tested] == []


def test_write_bw_gbits_cuda_client() -> None:
    r = parse("write_bw_cuda_ndr_client.txt")
    assert (r.test, r.side, r.device, r.unit, r.bidirectional, r.link_type, r.mtu_bytes, r.qps, r.connection) == (
        "write_bw", "client", "mlx5_0", "Gb/sec", False, "IB", 4096, 1, "RC")
    assert r.cuda_device == "NVIDIA H100 80GB HBM3"
    assert r.bw_rows == [BwRow(1048576, 5000, 399.83, 399.61, 0.047638)]
    assert r.errors == [] and r.lat_rows == []


def test_slow_nic_is_read_as_printed() -> None:
    r = parse("write_bw_cuda_slow_client.txt")
    assert r.device == "mlx5_3" and r.bw_rows == [BwRow(1048576, 5000, 212.47, 201.38, 0.024006)]


def test_mb_per_sec_server_of_old_versions_is_converted_to_gbps() -> None:
    r = parse("write_bw_mb_roce_server.txt")
    assert (r.side, r.unit, r.link_type, r.device) == ("server", "MB/sec", "Ethernet", "mlx5_0")
    (row,) = r.bw_rows
    assert (row.size_bytes, row.iterations, row.peak_gbps, row.msg_rate_mpps) == (65536, 664644, 0.0, 0.066464)
    assert row.avg_gbps == pytest.approx(4154.03 * 1048576 * 8 / 1e9)


def test_mib_per_sec_bidirectional() -> None:
    r = parse("write_bw_bidir_mib_client.txt")
    assert (r.unit, r.bidirectional, r.test) == ("MiB/sec", True, "write_bw")
    assert r.bw_rows[0].avg_gbps == pytest.approx(94210.55 * MIB_PER_S_IN_GBPS)
    assert r.bw_rows[0].avg_gbps == pytest.approx(790.29, abs=0.01)


def test_post_list_gbits_client_without_address_lines() -> None:
    r = parse("write_bw_gbits_postlist_client.txt")
    assert (r.test, r.post_list, r.device, r.side) == ("write_bw", True, "ib0", None)
    assert r.bw_rows == [BwRow(8, 224958464, 0.0, 0.48, 7.498617)]


def test_all_sizes_table() -> None:
    r = parse("write_bw_all_sizes_client.txt")
    assert [x.size_bytes for x in r.bw_rows] == [2 ** k for k in range(1, 24)]
    assert r.bw_rows[-1] == BwRow(8388608, 5000, 399.45, 395.5, 0.005893)


def test_read_bw_server_and_send_bw_client() -> None:
    read = parse("read_bw_gbits_server.txt")
    assert (read.test, read.side) == ("read_bw", "server")
    assert read.bw_rows == [BwRow(65536, 1000, 386.12, 385.9, 0.736046)]
    send = parse("send_bw_gbits_client.txt")
    assert (send.test, send.side) == ("send_bw", "client")
    assert send.bw_rows == [BwRow(65536, 1000, 0.0, 370.44, 0.706558)]


def test_latency_table_with_percentiles() -> None:
    r = parse("write_lat_client.txt")
    assert (r.test, r.kind, r.unit) == ("write_lat", "lat", None)
    assert r.lat_rows == [LatRow(2, 1000, 0.93, 4.21, 0.96, 0.97, 0.05, 1.10, 4.21)]


def test_recorded_read_lat_with_cpu_frequency_warnings_and_spaces_for_tabs() -> None:
    """Recorded (spiderpool's docs): libibverbs warnings first, two ``Conflicting CPU frequency`` lines between
    the header and the row (neither is an error), and the header's fields apart by spaces, not tabs."""
    r = parse("read_lat_cpufreq_client.txt")
    assert (r.test, r.side, r.device, r.link_type, r.mtu_bytes, r.qps, r.connection) == (
        "read_lat", "client", "mlx5_5", "Ethernet", 1024, 1, "RC")
    assert r.lat_rows == [LatRow(2, 1000, t_min_us=6.66, t_max_us=20.37, t_typical_us=6.74, t_avg_us=6.82,
                                 t_stdev_us=0.78, p99_us=7.15, p999_us=20.37)]
    assert r.errors == [] and r.bw_rows == [] and r.cuda_device is None


MLX4_BW_MIB = [  # BW peak, BW average [MB/sec] and MsgRate as printed, 2 B .. 8 MiB
    (9.88, 9.78, 5.128076), (30.52, 28.80, 7.549992), (58.01, 56.72, 7.434908), (115.16, 113.02, 7.406800),
    (242.18, 237.88, 7.794765), (319.54, 315.43, 5.168060), (910.94, 892.47, 7.311107),
    (1309.02, 1292.44, 5.293822), (2569.95, 2541.76, 5.205526), (3450.66, 3441.93, 3.524538),
    (3560.78, 3556.86, 1.821113), (3613.43, 3611.74, 0.924606), (3639.55, 3639.12, 0.465807),
    (3652.82, 3652.53, 0.233762), (3660.37, 3660.23, 0.117127), (3660.91, 3636.20, 0.058179),
    (3665.45, 3665.36, 0.029323), (3666.12, 3665.95, 0.014664), (3666.14, 3666.02, 0.007332),
    (3666.21, 3666.12, 0.003666), (3666.33, 3657.73, 0.001829), (3662.83, 3662.82, 0.000916),
    (3665.51, 3665.25, 0.000458)]


def test_recorded_all_sizes_mb_per_sec_of_an_old_mlx4() -> None:
    """Recorded: ``ib_write_bw -a --iter 20000`` on a ConnectX-3 (mlx4_0, QDR), fields apart by spaces."""
    r = parse("write_bw_all_sizes_mb_mlx4_client.txt")
    assert (r.test, r.side, r.device, r.unit, r.link_type, r.mtu_bytes, r.qps, r.connection) == (
        "write_bw", "client", "mlx4_0", "MB/sec", "IB", 2048, 1, "RC")
    assert [(row.size_bytes, row.iterations) for row in r.bw_rows] == [(2 ** i, 20000) for i in range(1, 24)]
    assert [(row.peak_gbps, row.avg_gbps, row.msg_rate_mpps) for row in r.bw_rows] == [
        (peak * MIB_PER_S_IN_GBPS, avg * MIB_PER_S_IN_GBPS, rate) for peak, avg, rate in MLX4_BW_MIB]
    assert r.errors == [] and r.lat_rows == []


MLX4_LAT = [  # t_min, t_max, t_typical, t_avg, t_stdev, 99%, 99.9% (usec) as printed, 2 B .. 8 MiB
    (0.88, 6.84, 0.98, 1.03, 0.20, 1.21, 5.42), (0.88, 6.89, 0.98, 1.03, 0.18, 1.21, 5.49),
    (0.89, 9.06, 0.99, 1.04, 0.25, 1.22, 6.05), (0.89, 6.82, 0.99, 1.04, 0.21, 1.21, 5.77),
    (0.93, 21.12, 1.04, 1.10, 0.23, 1.29, 5.50), (0.97, 7.07, 1.09, 1.11, 0.17, 1.21, 4.32),
    (1.07, 7.37, 1.22, 1.24, 0.21, 1.38, 5.63), (1.69, 8.78, 1.84, 1.86, 0.20, 2.02, 6.41),
    (1.89, 26.14, 2.04, 2.07, 0.27, 2.23, 6.95), (2.27, 8.43, 2.42, 2.45, 0.23, 2.60, 7.10),
    (3.00, 9.36, 3.18, 3.21, 0.28, 3.38, 8.29), (3.56, 49.03, 3.74, 3.80, 0.29, 4.16, 8.70),
    (4.62, 11.10, 4.82, 4.89, 0.27, 5.24, 9.58), (6.73, 14.85, 7.08, 7.07, 0.36, 7.39, 11.91),
    (11.06, 54.13, 11.33, 11.37, 0.49, 12.14, 16.26), (19.69, 69.60, 19.97, 20.04, 0.64, 23.79, 25.30),
    (36.55, 77.12, 36.95, 37.06, 0.77, 41.29, 44.42), (70.43, 117.97, 71.00, 71.17, 0.94, 75.59, 79.89),
    (138.27, 183.46, 139.16, 139.45, 1.32, 145.69, 148.75), (274.19, 325.08, 275.40, 275.84, 1.78, 283.82, 288.10),
    (545.79, 581.15, 548.06, 548.85, 2.64, 560.47, 566.56),
    (1089.68, 1136.78, 1092.97, 1094.48, 4.05, 1110.64, 1119.01),
    (2296.01, 2345.48, 2302.01, 2304.98, 6.43, 2327.01, 2335.48)]


def test_recorded_latency_all_sizes_with_trailing_blanks() -> None:
    """Recorded: ``ib_write_lat -a --iter 20000`` on the same mlx4; rows end in blanks, columns of every width."""
    r = parse("write_lat_all_sizes_mlx4_client.txt")
    assert (r.test, r.side, r.device, r.link_type, r.mtu_bytes, r.qps) == ("write_lat", "client", "mlx4_0", "IB",
                                                                          2048, 1)
    assert r.lat_rows == [LatRow(2 ** (i + 1), 20000, *row) for i, row in enumerate(MLX4_LAT)]
    assert r.errors == [] and r.bw_rows == []


def test_recorded_atomic_bw_with_a_cpu_frequency_line_inside_the_table() -> None:
    r = parse("atomic_bw_cpufreq_mlx4_client.txt")
    assert (r.test, r.verb, r.kind, r.side, r.device, r.unit, r.qps) == (
        "atomic_bw", "Atomic", "bw", "client", "mlx4_0", "MB/sec", 1)
    assert r.bw_rows == [BwRow(8, 20000, 18.79 * MIB_PER_S_IN_GBPS, 18.67 * MIB_PER_S_IN_GBPS, 2.446776)]
    assert r.errors == []


def test_latency_table_of_old_versions_has_three_columns() -> None:
    r = parse("read_lat_old_header.txt")
    assert (r.test, r.side, r.device) == ("read_lat", "server", "mlx4_0")
    assert [x.size_bytes for x in r.lat_rows] == [2, 4, 8, 16]
    assert r.lat_rows[3] == LatRow(16, 1000, 1.90, 7.85, 1.94)
    assert r.lat_rows[3].t_avg_us is None and r.lat_rows[3].p99_us is None


@pytest.mark.parametrize(("name", "errors", "target"), [
    ("err_connect.txt", ["Couldn't connect to node-a:18517", "Unable to open file descriptor for socket connection",
                         "Unable to init the socket connection"], "node-a:18517"),
    ("err_connect_old.txt", ["Couldn't connect to 192.168.125.211:18515", "Unable to open file descriptor for socket "
                             "connection Unable to init the socket connection"], "192.168.125.211:18515"),
    ("err_device_not_found.txt", ["IB device mlx5_9 not found", "Unable to find the Infiniband/RoCE device"], None),
    ("err_exchange.txt", ["Failed to exchange data between server and clients"], None),
    ("err_modify_qp.txt", ["Failed to modify QP 4660 to RTR", "Unable to Connect the HCA's through the link"], None),
    ("local_write_bw_no_device.txt", ["Did not detect devices", "Unable to find the Infiniband/RoCE device"], None),
    ("local_write_lat_no_device.txt", ["Did not detect devices", "Unable to find the Infiniband/RoCE device"], None),
])
def test_error_outputs(name: str, errors: list[str], target: str | None) -> None:
    r = parse(name)
    assert r.errors == errors and r.connect_target == target
    assert r.bw_rows == [] and r.lat_rows == []


def test_error_after_the_header_keeps_the_header() -> None:
    r = parse("err_modify_qp.txt")
    assert (r.test, r.side, r.device) == ("write_bw", "client", "mlx5_0")
    assert parse("err_exchange.txt").side == "server"


@pytest.mark.parametrize("name", ["local_version.txt", "local_write_bw_help.txt"])
def test_version_and_help_are_not_results(name: str) -> None:
    with pytest.raises(InputError, match="not perftest output"):
        parse(name)


def test_help_of_the_installed_binary_has_every_flag_the_plan_uses() -> None:
    from gpuaccept.perftest.plan import DEFAULT_ARGS

    text = (DATA / "local_write_bw_help.txt").read_text()
    for flag in ("--ib-dev", "--port", "--size", "--duration", "--CPU-freq", "--report_gbits"):
        assert flag in text
    assert set(DEFAULT_ARGS) - {"1048576", "5"} <= {"-s", "-D", "-F", "--report_gbits"}
    assert "Version: 6.06" in (DATA / "local_version.txt").read_text()


def test_rows_that_do_not_match_the_header_are_an_input_error() -> None:
    text = (DATA / "write_lat_client.txt").read_text().replace("0.05   \t\t1.10", "0.05")
    with pytest.raises(InputError, match="latency row with 6 figures under 7 columns"):
        parse_text(text)


def test_unknown_unit_is_an_input_error() -> None:
    text = (DATA / "send_bw_gbits_client.txt").read_text().replace("[Gb/sec]", "[KB/sec]")
    with pytest.raises(InputError, match="unknown bandwidth unit 'KB/sec'"):
        parse_text(text)


def test_to_dict_names_the_test() -> None:
    d = parse("write_lat_client.txt").to_dict()
    assert d["test"] == "write_lat" and d["lat_rows"][0]["p99_us"] == 1.10
