"""The ``rdma`` node check: each NIC's perftest loopback bandwidth, judged against its port's data rate.

(a) the pure parts on recorded sysfs trees and perftest outputs (tests/data/sysfs, tests/data/perftest);
(b) the whole check through ``gpuaccept run --checks rdma``, with a copied sysfs tree (``GPUACCEPT_SYSFS_ROOT``) and a
stand-in ``ib_write_bw`` on PATH (no RDMA device here: that boundary only) printing recorded outputs;
(c) the real perftest binary (Debian's ``perftest``), which finds no device here: an ERROR naming the NIC and
perftest's own message.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.checks import estimates, registry
from gpuaccept.checks.base import CheckContext
from gpuaccept.checks.rdma import RdmaCheck, judge_nic
from gpuaccept.errors import UsageError
from gpuaccept.hw.rdma import read_inventory
from gpuaccept.model import Status
from gpuaccept.perftest.loopback import (
    LoopbackRun,
    cuda_built,
    device_rails,
    loopback_plan,
    memory_choice,
    nic_gpus,
    run_loopback,
)
from gpuaccept.perftest.plan import rail_nics
from tests.chromium import require_binary
from tests.helpers import gpuaccept, only_run_dir, validate_report

DATA = Path(__file__).parent / "data"
PERF = DATA / "perftest"
SYSFS = DATA / "sysfs"
ARGS = ["-s", "1048576", "-D", "5", "-F", "--report_gbits"]


# ---- (a) the pure parts

def test_the_nics_are_the_devices_with_an_active_port_and_each_takes_a_gpu_of_its_numa_node() -> None:
    inv = read_inventory(SYSFS / "ndr_4x")
    nics = rail_nics(inv)
    assert nics == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    gpus = nic_gpus(inv, nics)  # NUMA 0: GPUs 18, 2a and NICs 0, 1; NUMA 1: GPUs 3a, 5d and NICs 2, 3
    assert {n: (g.index, g.pci_address) for n, g in gpus.items()} == {
        "mlx5_0": (0, "0000:18:00.0"), "mlx5_1": (1, "0000:2a:00.0"),
        "mlx5_2": (2, "0000:3a:00.0"), "mlx5_3": (3, "0000:5d:00.0")}
    assert gpus["mlx5_2"].why == "on mlx5_2's NUMA node 1"
    assert rail_nics(read_inventory(SYSFS / "ndr_4x_port_down")) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert nic_gpus(read_inventory(SYSFS / "no_gpu"), ["mlx5_0"]) == {}


def test_a_nic_whose_numa_node_has_no_gpu_takes_one_by_rail_and_says_so() -> None:
    inv = read_inventory(SYSFS / "malformed")  # mlx5_1's numa_node is "x": unknown
    gpus = nic_gpus(inv, ["mlx5_0", "mlx5_1"])
    assert gpus["mlx5_0"].why == "on mlx5_0's NUMA node 0"
    assert gpus["mlx5_1"].index == 0 and gpus["mlx5_1"].why == "not local: mlx5_1's NUMA node is unknown"


def test_loopback_argv_per_nic_with_and_without_gpu_memory() -> None:
    cuda = loopback_plan(["mlx5_0", "mlx5_1"], gpus={"mlx5_0": 0, "mlx5_1": 1}, args=ARGS)
    assert [p.server_argv for p in cuda] == [
        ("ib_write_bw", "-d", "mlx5_0", "-p", "18515", *ARGS, "--use_cuda=0"),
        ("ib_write_bw", "-d", "mlx5_1", "-p", "18516", *ARGS, "--use_cuda=1")]
    assert cuda[1].client_argv == ("ib_write_bw", "-d", "mlx5_1", "-p", "18516", *ARGS, "--use_cuda=1", "localhost")
    host = loopback_plan(["mlx5_0"], args=ARGS, base_port=20000, test="read_bw")
    assert host[0].client_argv == ("ib_read_bw", "-d", "mlx5_0", "-p", "20000", *ARGS, "localhost")
    assert host[0].gpu is None and host[0].rail == 0
    down = read_inventory(SYSFS / "ndr_4x_port_down")  # mlx5_3 down: the others keep their rails
    assert device_rails(down) == {"mlx5_0": 0, "mlx5_1": 1, "mlx5_2": 2, "mlx5_3": 3}
    gap = loopback_plan(["mlx5_0", "mlx5_3"], args=ARGS, rails={"mlx5_0": 0, "mlx5_3": 3})
    assert [(p.rail, p.port) for p in gap] == [(0, 18515), (3, 18518)]
    two = loopback_plan(["mlx5_0"], args=ARGS, ib_ports={"mlx5_0": 2})  # the HCA's active port is 2: -i 2
    assert two[0].server_argv == ("ib_write_bw", "-d", "mlx5_0", "-p", "18515", "-i", "2", *ARGS)
    with pytest.raises(UsageError, match="set by the plan"):
        loopback_plan(["mlx5_0"], args=["-i", "2"])
    with pytest.raises(UsageError, match="set by the plan"):
        loopback_plan(["mlx5_0"], args=["-d", "mlx5_1"])
    with pytest.raises(UsageError, match="measures bandwidth"):
        loopback_plan(["mlx5_0"], test="write_lat")
    with pytest.raises(UsageError, match="not an RDMA device name"):
        loopback_plan(["../x"])


def test_gpu_memory_only_where_gpus_peermem_and_a_cuda_build_are_all_there() -> None:
    ndr = read_inventory(SYSFS / "ndr_4x")
    cuda_help = "  --use_cuda=<cuda device id>  Use CUDA specific device for GPUDirect RDMA testing\n"
    local_help = (PERF / "local_write_bw_help.txt").read_text()
    assert cuda_built(cuda_help) and not cuda_built(local_help)
    assert memory_choice(ndr, "auto", "cuda", cuda_help) == (True, "GPU memory (--use_cuda, GPUDirect RDMA)")
    assert memory_choice(ndr, "auto", "cuda", local_help)[1] == (
        "host memory: this perftest is built without CUDA (no --use_cuda in its --help)")
    assert memory_choice(ndr, "auto", "cpu", cuda_help) == (False, "host memory: a CPU run (--device cpu)")
    roce = read_inventory(SYSFS / "roce_2x")  # GPUs, no nvidia_peermem
    assert memory_choice(roce, "auto", "cuda", cuda_help)[1] == (
        "host memory: nvidia_peermem is not loaded (no GPUDirect RDMA)")
    assert memory_choice(read_inventory(SYSFS / "no_gpu"), "auto", "cuda", None)[1] == (
        "host memory: no NVIDIA GPU on this node")
    assert memory_choice(roce, "cuda", "cpu", None) == (True, "GPU memory (memory=cuda)")


def _run(nic: str, rail: int, client: str, *, server: str = "", client_exit: int | None = 0,
         server_exit: int | None = 0, gpu: int | None = 0) -> LoopbackRun:
    pair = loopback_plan([f"x{i}" for i in range(rail)] + [nic], gpus={nic: gpu} if gpu is not None else None)[rail]
    return LoopbackRun(pair, server_exit, server, client_exit, client, 6.0)


def test_judging_each_nic_against_its_port_data_rate() -> None:
    params = RdmaCheck.defaults("standard")
    ok = judge_nic(_run("mlx5_0", 0, (PERF / "write_bw_cuda_ndr_client.txt").read_text()), 400.0, 1, params)
    assert ok.status is Status.PASS, ok.reason
    bw = ok.metrics[0]
    assert (bw.name, bw.value, bw.device, bw.threshold.value if bw.threshold else None) == (
        "rdma_write_bw_gbps", 399.61, "mlx5_0:1", 380.0)
    assert bw.tags == {"size_bytes": 1048576, "test": "write_bw", "nic": "mlx5_0", "port": 1, "rail": 0,
                       "memory": "cuda:0"}
    slow = judge_nic(_run("mlx5_3", 3, (PERF / "write_bw_cuda_slow_client.txt").read_text(), gpu=None), 400.0, 1,
                     params)
    assert slow.status is Status.FAIL
    assert slow.reason == ("write_bw rail 3 (mlx5_3) -> itself (loopback): 201.4 Gb/s at 1048576 B, expected >= 380 "
                           "(0.95 x mlx5_3:1 data rate 400 Gb/s)")
    assert slow.metrics[0].tags["memory"] == "host"
    with_min = judge_nic(_run("mlx5_3", 3, (PERF / "write_bw_cuda_slow_client.txt").read_text()), 400.0, 1,
                         {**params, "min_gbps": 200.0})
    assert with_min.status is Status.PASS and "min_gbps" in with_min.reason


@pytest.mark.parametrize(("name", "test"), [("write_bw_cuda_ndr_client.txt", "write_bw"),
                                            ("send_bw_gbits_client.txt", "send_bw"),
                                            ("read_bw_gbits_server.txt", "read_bw")])
def test_the_metrics_judged_from_recorded_outputs_are_declared_and_flagged(name: str, test: str) -> None:
    from tests.test_metric_names import misflagged

    j = judge_nic(_run("mlx5_0", 0, (PERF / name).read_text()), 400.0, 1, RdmaCheck.defaults("standard"))
    names = {m.name for m in j.metrics}
    assert names == {f"rdma_{test}_gbps", f"rdma_{test}_peak_gbps"}
    assert names <= set(RdmaCheck.metrics or ()) and misflagged(j.metrics) == []


def test_a_connection_error_or_a_missing_device_is_an_error_naming_the_nic() -> None:
    params = RdmaCheck.defaults("standard")
    conn = judge_nic(_run("mlx5_1", 1, (PERF / "err_connect.txt").read_text(), client_exit=1, server_exit=None),
                     400.0, 1, params)
    assert conn.status is Status.ERROR
    assert conn.reason.startswith("ib_write_bw rail 1 (mlx5_1) -> itself (loopback): Couldn't connect to node-a:18517")
    text = (PERF / "local_write_bw_no_device.txt").read_text().replace("[exit 1]\n", "")
    gone = judge_nic(_run("mlx5_2", 2, "", server=text, client_exit=None, server_exit=1), 400.0, 1, params)
    assert gone.status is Status.ERROR and "rail 2 (mlx5_2)" in gone.reason
    assert "Unable to find the Infiniband/RoCE device" in gone.reason and "(exit 1)" in gone.reason
    silent = judge_nic(_run("mlx5_0", 0, "", server="", client_exit=None, server_exit=None), 400.0, 1, params)
    assert silent.status is Status.ERROR
    assert silent.reason.startswith("ib_write_bw rail 0 (mlx5_0): not perftest output")
    assert "killed at the timeout" in silent.reason


def test_the_estimate_counts_nics_in_waves_of_parallel_runs() -> None:
    params = RdmaCheck.defaults("standard")
    assert estimates.rdma(params, "cuda", 8, 4) == 1.0 + 4 * 8.0  # -D 5 + 3 s of set-up each
    assert estimates.rdma({**params, "parallel": 2}, "cuda", 8, 4) == 1.0 + 2 * 8.0
    assert estimates.rdma(params, "cuda", 8, None) == 1.0 + 8 * 8.0  # no RDMA class here: one NIC per GPU
    assert estimates.rdma(params, "cpu", 0, None) == 0.5 and estimates.rdma(params, "cuda", 8, 0) == 0.5
    assert estimates.rdma(RdmaCheck.defaults("full"), "cuda", 8, 1) == 1.0 + 13.0
    assert "rdma" in registry() and registry()["rdma"].profiles == ("standard", "full", "burnin")


# ---- (b) the whole check through `gpuaccept run`, a stand-in ib_write_bw on PATH

def stand_in(bin_dir: Path, state: Path) -> None:
    """ib_write_bw as a shell script: a server marks its port listening and waits for its client, then prints the
    recorded server output; a client prints the recorded 399.6 Gb/s output with its -d device, or the 201 Gb/s one for
    ``$RDMA_TEST_SLOW`` (after adding 7 to that port's symbol_error in the copied sysfs tree; on node
    ``$RDMA_TEST_SLOW_NODE`` only and without the counter when that is set: the nodes share one tree), or
    perftest's connection error for ``$RDMA_TEST_BROKEN`` (exit 1). Each invocation's
    argv goes to ``state/argv``; the ports' marks to ``state/<$GPUACCEPT_HOSTNAME>/``."""
    bin_dir.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    script = bin_dir / "ib_write_bw"
    script.write_text(f"""#!/bin/sh
node=${{GPUACCEPT_HOSTNAME:-here}}; mkdir -p {state}/$node
echo "$*" >> {state}/argv
dev=""; port=18515; last=""
for a in "$@"; do case "$a" in --help) cat {PERF}/local_write_bw_help.txt; exit 0;; esac; done
while [ $# -gt 0 ]; do
  case "$1" in -d) dev=$2; shift;; -p) port=$2; shift;; esac
  last=$1; shift
done
if [ "$last" = localhost ]; then
  [ -e {state}/$node/listen-$port ] || {{ echo "Couldn't connect to localhost:$port"; exit 1; }}
  if [ "$dev" = "${{RDMA_TEST_BROKEN:-}}" ]; then
    sed "s/node-a:18517/localhost:$port/" {PERF}/err_connect.txt; touch {state}/$node/done-$port; exit 1
  elif [ "$dev" = "${{RDMA_TEST_SLOW:-}}" ] && [ "${{RDMA_TEST_SLOW_NODE:-$node}}" = "$node" ]; then
    f=$GPUACCEPT_SYSFS_ROOT/sys/class/infiniband/$dev/ports/1/counters/symbol_error
    [ -n "${{RDMA_TEST_SLOW_NODE:-}}" ] || {{ echo $(( $(cat $f) + 7 )) > $f.new && mv $f.new $f; }}
    sed "s/mlx5_3/$dev/" {PERF}/write_bw_cuda_slow_client.txt
  else
    sed "s/mlx5_0/$dev/" {PERF}/write_bw_cuda_ndr_client.txt
  fi
  touch {state}/$node/done-$port
else
  touch {state}/$node/listen-$port
  i=0; while [ ! -e {state}/$node/done-$port ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  sed "s/mlx5_0/$dev/" {PERF}/read_bw_gbits_server.txt | sed "s/RDMA_Read/RDMA_Write/"
fi
""")
    script.chmod(0o755)


def _suite(tmp_path: Path, sysfs: Path | None, path_dirs: list[str], params: str = "", **env: str) -> dict[str, Any]:
    args = ["run", "--checks", "rdma", "--device", "cpu", "--profile", "standard", "--report-dir",
            str(tmp_path / "rep"), "--no-history"]
    cfg = tmp_path / "site.yaml"
    cfg.write_text(f"checks:\n  rdma:\n    params: {{args: [-s, '1048576', -D, '1', -F, --report_gbits]{params}}}\n")
    args += ["--config", str(cfg)]
    extra = {"PATH": os.pathsep.join([*path_dirs, os.environ["PATH"]]), **env}
    if sysfs is not None:
        extra["GPUACCEPT_SYSFS_ROOT"] = str(sysfs)
    r = gpuaccept(*args, **extra)
    report = validate_report(only_run_dir(tmp_path / "rep") / "report.json")
    report["_rc"], report["_stdout"] = r.returncode, r.stdout
    return report


def _check(report: dict[str, Any]) -> dict[str, Any]:
    (check,) = [c for c in report["checks"] if c["name"] == "rdma"]
    return check


def test_suite_run_names_the_slow_nic_and_its_rail_and_the_counter_that_rose(tmp_path: Path) -> None:
    stand_in(tmp_path / "bin", tmp_path / "state")
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS / "ndr_4x", sysfs, symlinks=True)
    report = _suite(tmp_path, sysfs, [str(tmp_path / "bin")], RDMA_TEST_SLOW="mlx5_2")
    check = _check(report)
    assert report["_rc"] == 1 and check["status"] == "fail", check["reason"]
    assert check["reason"].startswith("rdma_write_bw_gbps on mlx5_2:1 201.4 < 380 Gb/s; ")  # the engine's summary
    assert ("write_bw rail 2 (mlx5_2) -> itself (loopback): 201.4 Gb/s at 1048576 B, expected >= 380 (0.95 x mlx5_2:1 "
            "data rate 400 Gb/s); 4 NIC(s) by loopback, host memory: a CPU run (--device cpu)") in check["reason"]
    assert "RDMA counters during the run: mlx5_2:1 (symbol_error +7)" in check["reason"]
    assert check["fault"]["code"] == "GA-NET-021"
    bw = {m["tags"]["nic"]: m for m in check["metrics"] if m["name"] == "rdma_write_bw_gbps"}
    assert sorted(bw) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert bw["mlx5_2"]["value"] == 201.38 and bw["mlx5_2"]["tags"]["rail"] == 2 and bw["mlx5_0"]["value"] == 399.61
    rose = [m for m in check["metrics"] if m["name"] == "rdma_symbol_error_delta" and m["value"] > 0]
    assert [m["device"] for m in rose] == ["mlx5_2:1"]
    argv = (tmp_path / "state" / "argv").read_text().splitlines()
    assert "-d mlx5_3 -p 18518 -s 1048576 -D 1 -F --report_gbits localhost" in argv
    assert not any("--use_cuda" in a for a in argv)


def test_suite_run_a_connection_error_is_an_error_naming_the_nic(tmp_path: Path) -> None:
    stand_in(tmp_path / "bin", tmp_path / "state")
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS / "ndr_4x", sysfs, symlinks=True)
    report = _suite(tmp_path, sysfs, [str(tmp_path / "bin")], ", parallel: 2, nic_timeout_s: 20",
                    RDMA_TEST_BROKEN="mlx5_1")
    check = _check(report)
    assert check["status"] == "error" and report["_rc"] == 1, check["reason"]
    assert check["reason"].startswith("ib_write_bw rail 1 (mlx5_1) -> itself (loopback): Couldn't connect to "
                                      "localhost:18516; Unable to open file descriptor for socket connection; "
                                      "Unable to init the socket connection (exit 1)")
    assert check["fault"]["code"] == "GA-NET-020"
    assert check["next_steps"]["causes"][0].startswith("perftest could not open or reach a NIC")
    assert {m["tags"]["nic"] for m in check["metrics"] if m["name"] == "rdma_write_bw_gbps"} == {
        "mlx5_0", "mlx5_2", "mlx5_3"}


def test_a_cluster_report_names_the_slow_nic_by_node_and_rail(tmp_path: Path) -> None:
    """Two nodes (``launch local``), local-1's mlx5_2 slow: the Markdown names node, rail and NIC; the HTML's NIC x
    node table marks that one cell."""
    stand_in(tmp_path / "bin", tmp_path / "state")
    cfg = tmp_path / "site.yaml"
    cfg.write_text("checks:\n  rdma:\n    params: {args: [-s, '1048576', -D, '1', -F, --report_gbits]}\n")
    r = gpuaccept("launch", "local", "--nodes", "2", "--checks", "rdma", "--device", "cpu", "--config", str(cfg),
                  "--report-dir", str(tmp_path / "rep"), "--no-history", timeout=300,
                  PATH=os.pathsep.join([str(tmp_path / "bin"), os.environ["PATH"]]),
                  GPUACCEPT_SYSFS_ROOT=str(SYSFS / "ndr_4x"), RDMA_TEST_SLOW="mlx5_2", RDMA_TEST_SLOW_NODE="local-1")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    run = only_run_dir(tmp_path / "rep")
    md = gpuaccept("report", str(run), "--format", "md", "-o", "-").stdout
    (line,) = [x for x in md.splitlines() if x.startswith("| `local-1` | **FAIL** | `rdma`")]
    assert "write\\_bw rail 2 (mlx5\\_2) -&gt; itself (loopback): 201.4 Gb/s" in line
    assert not any(x.startswith("| `local-0` | **FAIL**") for x in md.splitlines())
    out = tmp_path / "c.html"
    assert gpuaccept("report", str(run), "--format", "html", "-o", str(out)).returncode == 0
    html = out.read_text()
    table = html[html.index('<section id="rdma-nics">'):]
    table = table[:table.index("</section>")]
    assert "1 of 8 NIC run(s) bad" in table
    assert "<th>local-0</th><th>local-1</th>" in table
    assert ("<tr><th>rail 2 &middot; mlx5_2</th><td>399.6 Gb/s</td><td class=\"bad\" title=\"write_bw rail 2 (mlx5_2) "
            "-&gt; itself (loopback): 201.4 Gb/s at 1048576 B, expected &gt;= 380") in table
    assert table.count('class="bad"') == 1


def test_a_root_that_is_no_directory_is_a_config_error_before_anything_runs(tmp_path: Path) -> None:
    cfg = tmp_path / "site.yaml"
    cfg.write_text(f"checks:\n  rdma:\n    params: {{root: '{tmp_path / 'nowhere'}'}}\n")
    r = gpuaccept("run", "--checks", "rdma", "--device", "cpu", "--config", str(cfg), "--report-dir",
                  str(tmp_path / "rep"), "--no-history")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith(f"checks.rdma.params.root: '{tmp_path / 'nowhere'}' is not a "
                                                      "directory (the root of a sysfs tree)")
    assert "Traceback" not in r.stderr
    cfg.write_text("checks:\n  rdma:\n    params: {args: [-d, mlx5_3]}\n")
    r = gpuaccept("run", "--checks", "rdma", "--device", "cpu", "--config", str(cfg), "--report-dir",
                  str(tmp_path / "rep"), "--no-history")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith("checks.rdma.params.args: perftest argument -d is set by the "
                                                      "plan (device, ports, GPU)")


def test_without_perftest_on_path_it_is_a_skip_naming_the_package(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    out = RdmaCheck().run(_ctx(str(SYSFS / "ndr_4x")))
    assert out.status is Status.SKIP
    assert out.reason == ("perftest not found: no ib_write_bw on PATH; install perftest (Debian/Ubuntu: apt-get "
                          "install perftest; RHEL: dnf install perftest)")


def test_no_active_port_is_a_skip_naming_the_ports(tmp_path: Path) -> None:
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS / "roce_2x", sysfs, symlinks=True)
    for dev in ("mlx5_0", "mlx5_1"):
        (sysfs / "sys/class/infiniband" / dev / "ports/1/state").write_text("1: DOWN\n")
    out = RdmaCheck().run(_ctx(str(sysfs)))
    assert out.status is Status.SKIP
    assert out.reason == "no ACTIVE RDMA port: mlx5_0:1 DOWN/LinkUp, mlx5_1:1 DOWN/LinkUp"


def _ctx(root: str) -> CheckContext:
    params = {**RdmaCheck.defaults("standard"), "root": root, "args": ["-s", "1048576", "-D", "1", "-F",
                                                                      "--report_gbits"]}
    return CheckContext(device="cpu", params=params, timeout_s=60.0)


# ---- (c) the real perftest binary

def test_real_perftest_finds_no_device_here_and_the_check_is_an_error_naming_the_nic() -> None:
    require_binary("ib_write_bw", why="Debian's perftest package (apt-get install perftest)")
    out = RdmaCheck().run(_ctx(str(SYSFS / "ndr_4x")))
    assert out.status is Status.ERROR, out.reason
    assert out.reason.startswith("ib_write_bw rail 0 (mlx5_0) -> itself (loopback): Did not detect devices; Unable "
                                 "to find the Infiniband/RoCE device (exit 1); ib_write_bw rail 1 (mlx5_1) -> ")
    assert [n["nic"] for n in out.details["nics"]] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert all(n["status"] == "error" and n["server_exit"] == 1 for n in out.details["nics"])


def test_real_perftest_one_nic_run_ends_when_the_server_fails() -> None:
    require_binary("ib_write_bw", why="Debian's perftest package (apt-get install perftest)")
    (pair,) = loopback_plan(["mlx5_0"], args=ARGS)
    run = run_loopback(pair, timeout_s=30.0, client_delay_s=0.2)
    assert run.server_exit == 1 and "Unable to find the Infiniband/RoCE device" in run.server_output
    assert run.seconds < 10.0


@pytest.mark.skipif(Path("/sys/class/infiniband").exists(), reason="this machine has RDMA devices")
def test_without_a_sysfs_tree_the_check_is_a_skip_no_rdma_device() -> None:
    out = RdmaCheck().run(CheckContext(device="cpu", params={**RdmaCheck.defaults("standard"), "root": "/"}))
    assert out.status is Status.SKIP
    assert out.reason == ("no RDMA device under /sys/class/infiniband (not an RDMA node, or its drivers are not "
                          "loaded)")
    empty = RdmaCheck().run(CheckContext(device="cpu", params={**RdmaCheck.defaults("standard"),
                                                               "root": str(SYSFS / "no_rdma")}))
    assert empty.status is Status.SKIP and empty.reason.startswith("no RDMA device under ")


def test_the_html_nic_table_marks_an_error_nic_by_its_status() -> None:
    from gpuaccept.model import CheckResult, Metric, NodeReport, Threshold, Verdict
    from gpuaccept.report.html_rdma import section
    from gpuaccept.report.views import NodeView

    ok = Metric("rdma_write_bw_gbps", 399.61, "Gb/s", device="mlx5_0:1", threshold=Threshold(">=", 380.0),
                tags={"nic": "mlx5_0", "port": 1, "rail": 0})
    reason = ("ib_write_bw rail 1 (mlx5_1) -> itself (loopback): Couldn't connect to localhost:18516 (exit 1); "
              "2 NIC(s) by loopback, host memory: a CPU run (--device cpu)")
    check = CheckResult("rdma", Status.ERROR, reason, metrics=[ok], details={"nics": [
        {"rail": 0, "nic": "mlx5_0", "status": "pass"}, {"rail": 1, "nic": "mlx5_1", "status": "error"}]})
    report = NodeReport("20260101T000000Z-node-a-abcd", "node-a", "standard", "2026-01-01T00:00:00Z",
                        verdict=Verdict.FAILURE, checks=[check])
    html = section([NodeView("node-a", report)])
    assert "1 of 2 NIC run(s) bad" in html
    assert "<tr><th>rail 0 &middot; mlx5_0</th><td>399.6 Gb/s</td></tr>" in html
    assert ('<tr><th>rail 1 &middot; mlx5_1</th><td class="bad" title="ib_write_bw rail 1 (mlx5_1) -&gt; itself '
            "(loopback): Couldn&#x27;t connect to localhost:18516 (exit 1)\">no figure ERROR</td></tr>") in html
    assert section([NodeView("node-a", None, "no report")]) == ""


def test_the_gpu_is_named_by_pci_address_where_perftest_takes_it_else_by_its_visible_ordinal() -> None:
    from gpuaccept.checks.rdma import cuda_choice
    from gpuaccept.perftest.loopback import cuda_index, takes_bus_id

    assert [cuda_index(2, v) for v in (None, "0,1,2,3", "2", "3,2", "0,1", "GPU-1a2b", "MIG-3c,1", "")] == \
        [2, 2, 0, 1, None, None, None, None]
    cuda_help = ("      --use_cuda=<cuda device id> Use CUDA specific device for GPUDirect RDMA testing\n"
                 "      --use_cuda_bus_id=<cuda full BUS id> Use CUDA specific device, based on its full PCIe address, "
                 "for GPUDirect RDMA testing\n")
    old_help = cuda_help.splitlines()[0]
    assert takes_bus_id(cuda_help) and not takes_bus_id(old_help) and not takes_bus_id(None)
    inv = read_inventory(SYSFS / "ndr_4x")
    gpus = nic_gpus(inv, ["mlx5_0", "mlx5_2"])
    ordinals, bus, why = cuda_choice(gpus, None, cuda_help, {"CUDA_VISIBLE_DEVICES": "GPU-1a2b"})
    assert why == "" and bus == {n: g.pci_address for n, g in gpus.items()}
    plan = loopback_plan(["mlx5_0", "mlx5_2"], gpus=ordinals, bus_ids=bus, args=ARGS)
    assert plan[1].server_argv[-1] == f"--use_cuda_bus_id={gpus['mlx5_2'].pci_address}"
    assert not any(a.startswith("--use_cuda=") for a in plan[1].client_argv)
    visible = ",".join(str(g.index) for g in reversed(list(gpus.values())))
    ordinals, bus, why = cuda_choice(gpus, None, old_help, {"CUDA_VISIBLE_DEVICES": visible})
    assert bus == {} and why == "" and ordinals == {"mlx5_0": 1, "mlx5_2": 0}
    assert loopback_plan(["mlx5_0"], gpus=ordinals, args=ARGS)[0].server_argv[-1] == "--use_cuda=1"
    ordinals, bus, why = cuda_choice(gpus, None, old_help, {"CUDA_VISIBLE_DEVICES": "GPU-1a2b"})
    assert ordinals == {} and why.startswith("host memory: CUDA_VISIBLE_DEVICES=GPU-1a2b hides mlx5_0's GPU")
    assert cuda_choice(gpus, None, old_help, {}) == ({n: g.index for n, g in gpus.items()}, {}, "")
