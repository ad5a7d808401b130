"""``gpuaccept rdma parse`` and ``gpuaccept rdma plan``: exit codes 0/1/2, the verdict line, JSON, sysfs rates."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaccept.cli import main

DATA = Path(__file__).parent / "data" / "perftest"
SYSFS = Path(__file__).parent / "data" / "sysfs"


def test_healthy_output_passes_against_the_sysfs_rate(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["rdma", "parse", str(DATA / "write_bw_cuda_ndr_client.txt"), "--port", "mlx5_0:1",
                 "--sysfs-root", str(SYSFS / "ndr_4x")])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[-1] == ("PASS: write_bw this client (mlx5_0) -> the server: 399.6 Gb/s at 1048576 B "
                                    ">= 380 (0.95 x mlx5_0:1 rate 400 Gb/s)")
    assert "write_bw (client; device mlx5_0, GPU NVIDIA H100 80GB HBM3, printed in Gb/sec)" in out


def test_degraded_port_rate_lowers_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    """mlx5_1 of ndr_4x_degraded runs at 200 Gb/s (2X): a 201 Gb/s NIC passes against it, fails against 400."""
    slow = str(DATA / "write_bw_cuda_slow_client.txt")
    assert main(["rdma", "parse", slow, "--port", "mlx5_1:1", "--sysfs-root", str(SYSFS / "ndr_4x_degraded")]) == 0
    assert main(["rdma", "parse", slow, "--port", "mlx5_3:1", "--sysfs-root", str(SYSFS / "ndr_4x_degraded"),
                 "--client", "node-b rail 3", "--server", "node-a rail 3"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "FAIL: write_bw node-b rail 3 -> node-a rail 3: 201.4 Gb/s at 1048576 B, expected >= 380 "
        "(0.95 x mlx5_3:1 rate 400 Gb/s)")


def test_connection_error_exits_1_naming_both_ends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rdma", "parse", str(DATA / "err_connect.txt"), "--rate-gbps", "400", "--client", "node-b"]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("ERROR: perftest node-b -> node-a:18517: Couldn't connect to node-a:18517")


def test_json_to_stdout_has_rows_metrics_and_not_judged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rdma", "parse", str(DATA / "write_bw_all_sizes_client.txt"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "pass" and doc["test"] == "write_bw" and len(doc["bw_rows"]) == 23
    assert doc["not_judged"] == ["rdma_write_bw_gbps"]
    assert doc["metrics"][0]["value"] == 395.5


def test_not_judged_is_shown_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rdma", "parse", str(DATA / "write_lat_client.txt")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("NOT JUDGED: write_lat")
    assert main(["rdma", "parse", str(DATA / "write_lat_client.txt"), "--max-lat-us", "0.5"]) == 1


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO((DATA / "read_bw_gbits_server.txt").read_text()))
    assert main(["rdma", "parse", "-", "--min-gbps", "390"]) == 1
    assert "385.9 Gb/s" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["rdma", "parse", str(DATA / "local_version.txt")], "not perftest output"),
    (["rdma", "parse", str(DATA / "nope.txt")], "nope.txt"),
    (["rdma", "parse", str(DATA / "err_connect.txt"), "--port", "mlx5_9:1", "--sysfs-root", str(SYSFS / "ndr_4x")],
     "no such RDMA port"),
    (["rdma", "parse", str(DATA / "err_connect.txt"), "--port", "mlx5_0"], "not DEV:PORT"),
    (["rdma", "parse", str(DATA / "err_connect.txt"), "--fraction", "0.9"], "--fraction needs a port rate"),
    (["rdma", "plan", "--nodes", "a", "--nics", "mlx5_0"], "name two"),
    (["rdma"], "name an action"),
])
def test_bad_input_is_exit_2_with_one_line(argv: list[str], message: str) -> None:
    p = subprocess.run([sys.executable, "-m", "gpuaccept", *argv], capture_output=True, text=True, check=False)
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_fraction_outside_0_1_is_refused() -> None:
    p = subprocess.run([sys.executable, "-m", "gpuaccept", "rdma", "parse", "x", "--rate-gbps", "400",
                        "--fraction", "1.5"], capture_output=True, text=True, check=False)
    assert p.returncode == 2 and "not a fraction" in p.stderr


def test_plan_prints_each_rail(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rdma", "plan", "--nodes", "node-a,node-b", "--nics", "mlx5_0,mlx5_1", "--gpus",
                 "--pair-index", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# rail 0: node-a mlx5_0 <- node-b mlx5_0, port 18517"
    assert lines[5] == ("node-b$ ib_write_bw -d mlx5_1 -p 18518 -s 1048576 -D 5 -F --report_gbits --use_cuda=1 "
                        "node-a")
