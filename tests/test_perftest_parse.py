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
