"""The RDMA pair test run for real: ``gpuaccept rdma pair-node`` on both "nodes" (two processes here, then two ranks
of ``gpuaccept launch mpi`` over the loopback sshd), its tagged log read back and judged rail by rail.

No RDMA device exists here, so ``ib_write_bw`` is a stand-in on PATH (:func:`stand_in`), at that boundary only: a
server marks its port as listening and waits for its client; a client whose server does not listen yet prints
perftest's ``Couldn't connect to HOST:PORT`` and exits 1 (the pair-node retries it), else it prints the recorded
client output of tests/data/perftest with its ``-d`` device, and the slow one (``$RDMA_TEST_SLOW``) the recorded
201 Gb/s output, after adding 7 to its port's ``symbol_error`` in the copied sysfs tree (``$RDMA_TEST_SYSFS``).
Everything else is real: the plan, the processes, the ports, the counter reads before and after, mpirun.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.hw.rdma import read_inventory
from gpuaccept.model import Status
from gpuaccept.perftest.loopback import nic_gpus
from gpuaccept.perftest.pairrun import judge_rails, rail_line, read_log
from tests.launch_support import gpuaccept, launch_env, require
from tests.slurm_cluster import DAEMONS, LocalSlurm
from tests.sshd import Sshd, start_sshd

DATA = Path(__file__).parent / "data" / "perftest"
SYSFS = Path(__file__).parent / "data" / "sysfs" / "ndr_4x"
NICS = "mlx5_0,mlx5_1,mlx5_2,mlx5_3"


def stand_in(bin_dir: Path, state: Path) -> None:
    bin_dir.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    script = bin_dir / "ib_write_bw"
    script.write_text(f"""#!/bin/sh
# Stand-in for perftest's ib_write_bw (no RDMA device here): see tests/test_perftest_pair.py.
case "$1" in --help) echo "      --use_cuda=<cuda device id> Use CUDA specific device for GPUDirect RDMA testing"
  echo "      --use_cuda_bus_id=<cuda full BUS id> Use CUDA specific device, based on its full PCIe address"; exit 0;;
esac
dev=""; port=18515; last=""
while [ $# -gt 0 ]; do
  case "$1" in -d) dev=$2; shift;; -p) port=$2; shift;; esac
  last=$1; shift
done
case "$last" in
  node*)
    if [ ! -e {state}/listen-$port ]; then echo "Couldn't connect to $last:$port"; \
echo " Unable to init the socket connection"; exit 1; fi
    if [ "$dev" = "${{RDMA_TEST_SLOW:-}}" ]; then
      f=$RDMA_TEST_SYSFS/sys/class/infiniband/$dev/ports/1/counters/symbol_error
      echo $(( $(cat $f) + 7 )) > $f.new && mv $f.new $f
      sed "s/mlx5_3/$dev/" {DATA}/write_bw_cuda_slow_client.txt
    else
      sed "s/mlx5_0/$dev/" {DATA}/write_bw_cuda_ndr_client.txt
    fi
    touch {state}/done-$port;;
  *)
    touch {state}/listen-$port
    i=0; while [ ! -e {state}/done-$port ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
    sed "s/mlx5_0/$dev/" {DATA}/read_bw_gbits_server.txt | sed "s/RDMA_Read/RDMA_Write/";;
esac
""")
    script.chmod(0o755)


def _env(tmp_path: Path, sysfs: Path) -> dict[str, str]:
    env = launch_env(RDMA_TEST_SLOW="mlx5_3", RDMA_TEST_SYSFS=str(sysfs))
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), env["PATH"]])
    return env


def test_two_node_processes_run_every_rail_at_once_and_name_the_slow_one(tmp_path: Path) -> None:
    stand_in(tmp_path / "bin", tmp_path / "state")
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    env = _env(tmp_path, sysfs)
    argv = [sys.executable, "-m", "gpuaccept", "rdma", "pair-node", "--nodes", "node-a,node-b", "--nics", NICS,
            "--sysfs-root", str(sysfs), "--timeout", "60", "--client-delay", "0.3"]
    # the client first: its first tries find no server listening, and the pair-node tries again
    client = subprocess.Popen([*argv, "--rank", "1"], stdout=subprocess.PIPE, text=True, env=env)
    server = subprocess.Popen([*argv, "--rank", "0"], stdout=subprocess.PIPE, text=True, env=env)
    out_c, _ = client.communicate(timeout=120)
    out_s, _ = server.communicate(timeout=120)
    assert (client.returncode, server.returncode) == (0, 0), out_c + out_s
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == sorted(
        f"{k}-{18515 + i}" for k in ("done", "listen") for i in range(4))
    log = tmp_path / "job.log"
    log.write_text("mpirun: some line of the launcher\n" + "".join(a + b for a, b in zip_longest(
        out_s.splitlines(True), out_c.splitlines(True), fillvalue="")))  # interleaved as a launcher may
    rails = judge_rails(read_log(log.read_text()), rate_gbps=400.0)
    assert [r.judgement.status for r in rails] == [Status.PASS] * 3 + [Status.FAIL], [r.judgement.reason for r in rails]
    assert rail_line(rails[3]) == "node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380: FAIL"
    assert rails[3].counters == {"client": {"rose": {"symbol_error": 7}}, "server": {"rose": {"symbol_error": 7}}}
    # memory auto: GPUs and nvidia_peermem in sysfs, a perftest that takes --use_cuda_bus_id: each NIC's own GPU
    gpu = nic_gpus(read_inventory(sysfs), NICS.split(","))["mlx5_3"]
    assert (f"$ ib_write_bw -d mlx5_3 -p 18518 -s 1048576 -D 5 -F --report_gbits --use_cuda_bus_id={gpu.pci_address} "
            "node-a") in out_c
    r = gpuaccept("rdma", "parse", str(log), "--rate-gbps", "400", f"--json={tmp_path / 'v.json'}", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "FAIL: 4 rails: node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380: FAIL"
    doc = json.loads((tmp_path / "v.json").read_text())
    assert [x["status"] for x in doc["rails"]] == ["pass", "pass", "pass", "fail"]


def test_a_server_that_never_listens_is_an_error_naming_both_ends(tmp_path: Path) -> None:
    stand_in(tmp_path / "bin", tmp_path / "state")
    env = _env(tmp_path, SYSFS)
    r = subprocess.run([sys.executable, "-m", "gpuaccept", "rdma", "pair-node", "--nodes", "node-a,node-b",
                        "--nics", "mlx5_0", "--rank", "1", "--sysfs-root", str(SYSFS), "--timeout", "5",
                        "--client-delay", "0.1"], capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 1
    (res,) = judge_rails(read_log(r.stdout + "@rdma 0 server node-a mlx5_0 18515# {\"exit\": 0}\n"))
    assert res.judgement.status is Status.ERROR
    assert res.judgement.reason.startswith("perftest node-b rail 0 (mlx5_0) -> node-a rail 0 (mlx5_0): Couldn't "
                                           "connect to node-a:18515")
    (missing,) = judge_rails(read_log(r.stdout))
    assert missing.judgement.reason.endswith("no output from the server (its task did not run)")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from start_sshd(tmp_path_factory.mktemp("sshd"), aliases=("node-a", "node-b"))


def test_the_pair_runs_as_two_ranks_of_launch_mpi(sshd: Sshd, tmp_path: Path) -> None:
    require("mpirun")
    stand_in(tmp_path / "bin", tmp_path / "state")
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    env = _env(tmp_path, sysfs)
    r = gpuaccept("launch", "mpi", "--nodes", "2", "--hosts", "node-a,node-b", "--procs-per-node", "1",
                  "--report-dir", str(tmp_path / "runs"), "--run-id", "rdma-pair",
                  f"--mca=plm_rsh_agent=ssh -F {sshd.ssh_config}", "--oversubscribe",
                  "--forward-env=RDMA_TEST_SLOW", "--forward-env=RDMA_TEST_SYSFS", "--forward-env=PATH", "--",
                  sys.executable, "-m", "gpuaccept", "rdma", "pair-node", "--nodes", "node-a,node-b", "--nics", NICS,
                  "--sysfs-root", str(sysfs), "--timeout", "60", "--client-delay", "0.3", env=env, timeout=300)
    logs = list((tmp_path / "runs").rglob("mpirun.log"))
    assert logs, r.stdout + r.stderr
    rails = judge_rails(read_log(logs[0].read_text()))  # each client's port rate as its sysfs says
    assert [r.judgement.status for r in rails] == [Status.PASS] * 3 + [Status.FAIL], logs[0].read_text()[-3000:]
    assert "(0.95 x mlx5_3:1 rate on node-b 400 Gb/s)" in rails[3].judgement.reason
    assert rail_line(rails[3]) == "node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380: FAIL"


def test_isolate_names_the_slow_rail_of_the_bad_node_with_its_counters(sshd: Sshd, tmp_path: Path) -> None:
    """``isolate --rails-of node-b=node-a --rail-test rdma`` over launch mpi: node-a serves, node-b's NICs are the
    clients; the rates come from the nodes' sysfs (400 Gb/s), the slow rail is named with node, rail and NIC."""
    require("mpirun")
    stand_in(tmp_path / "bin", tmp_path / "state")
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    env = _env(tmp_path, sysfs)
    env["GPUACCEPT_SYSFS_ROOT"] = str(sysfs)
    r = gpuaccept("isolate", "--backend", "mpi", "--rails-of", "node-b=node-a", "--rail-test", "rdma",
                  "--rail-ports", "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1", "--report-dir", str(tmp_path / "runs"),
                  f"--json={tmp_path / 'v.json'}", f"--html={tmp_path / 'rails.html'}", "--test-timeout", "120",
                  f"--launch-arg=--mca=plm_rsh_agent=ssh -F {sshd.ssh_config}", "--launch-arg=--oversubscribe",
                  "--launch-arg=--forward-env=RDMA_TEST_SLOW", "--launch-arg=--forward-env=RDMA_TEST_SYSFS",
                  "--launch-arg=--forward-env=GPUACCEPT_SYSFS_ROOT", "--launch-arg=--forward-env=PATH",
                  env=env, timeout=300)
    data = _slow_rail_verdict(r, tmp_path / "v.json")
    assert data["rails"][0]["evidence"] == ["node-b rail 0 (mlx5_0): 400 Gb/s, expected >= 380"]
    assert "node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380" in r.stdout
    assert [(x["node"], x["rail"], x["port"], x["gpu"], x["verdict"]) for x in data["rail_table"]] == [
        ("node-b", i, f"mlx5_{i}:1", i, "bad" if i == 3 else "ok") for i in range(4)]
    assert [line.split()[:3] for line in r.stdout.splitlines() if " BAD " in line] == [["node-b", "3", "mlx5_3:1"]]
    html = (tmp_path / "rails.html").read_text()
    assert "<tr><th>rail 3 &middot; mlx5_3:1</th><td class=\"bad\"" in html and "201.4 Gb/s &lt; 380" in html


def _slow_rail_verdict(r: subprocess.CompletedProcess[str], verdict: Path) -> dict[str, Any]:
    """The isolate verdict of the stand-in fabric whose rail 3 is slow with symbol errors (exit 1, that rail
    alone named bad, with its rate, its bound and the counters), read from ``verdict`` (--json)."""
    assert r.returncode == 1, r.stdout + r.stderr
    data: dict[str, Any] = json.loads(verdict.read_text())
    assert data["bad_rails"] == ["GPU 3 / mlx5_3:1"], data
    bad = data["rails"][3]["evidence"]
    assert bad[0] == "node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380: FAIL"
    assert "(0.95 x mlx5_3:1 rate on node-b 400 Gb/s)" in bad[1]
    assert "client error counters rose: symbol_error +7" in bad
    assert [x["bad"] for x in data["rails"]] == [False, False, False, True]
    return data


def test_isolate_rdma_dry_run_is_one_launch_per_node_pair() -> None:
    r = gpuaccept("isolate", "--backend", "mpi", "--rails-of", "node-b=node-a", "--rail-test", "rdma",
                  "--rail-ports", "mlx5_0:1,mlx5_1:1", "--report-dir", "/shared/iso", "--dry-run")
    assert r.returncode == 0, r.stderr
    line = r.stdout.splitlines()[1]
    assert line.startswith("gpuaccept launch mpi --nodes 2 --hosts node-a,node-b --report-dir /shared/iso")
    assert line.endswith(f"--procs-per-node 1 -- {sys.executable} -m gpuaccept rdma pair-node --nodes node-a,node-b "
                         "--nics mlx5_0,mlx5_1")
    assert r.stdout.splitlines()[2] == ("# estimate: each rail test (ib_write_bw -s 1048576 -D 5 -F --report_gbits) "
                                        "about 8 s (-D 5 s x 1 size + 3 s connection setup = 8 s); the 2 rails run "
                                        "at once: about 8 s for the job, plus the launcher's start")
    per_rail = gpuaccept("isolate", "--backend", "mpi", "--nodes", "node-a,node-b", "--per-rail", "--rail-test",
                         "rdma", "--rail-ports", "mlx5_0:1,mlx5_1:1,mlx5_2:1", "--dry-run")
    assert per_rail.returncode == 0, per_rail.stderr
    assert "about 8 s (-D 5 s x 1 size" in per_rail.stdout and "the 3 rails run at once" in per_rail.stdout
    bad = gpuaccept("isolate", "--backend", "local", "--rails-of", "node-b=node-a", "--rail-test", "rdma",
                    "--rail-ports", "mlx5_0:1", "--dry-run")
    assert bad.returncode == 2 and "--rail-test rdma runs over mpi, slurm, ssh; not local" in bad.stderr
    ssh = gpuaccept("isolate", "--backend", "ssh", "--rails-of", "node-b=node-a", "--rail-test", "rdma",
                    "--rail-ports", "mlx5_0:1,mlx5_1:1", "--report-dir", "/shared/iso", "--dry-run")
    assert ssh.returncode == 0, ssh.stderr
    assert ssh.stdout.splitlines()[1].endswith(f"--no-torchrun -- {sys.executable} -m gpuaccept rdma pair-node "
                                               "--nodes node-a,node-b --nics mlx5_0,mlx5_1")
    none = gpuaccept("isolate", "--backend", "mpi", "--rails-of", "node-b=node-a", "--rail-test", "rdma", "--dry-run")
    assert none.returncode == 2 and "needs the NICs of the rails: --rail-ports" in none.stderr


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    require(*DAEMONS, "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
    with LocalSlurm(nodes=2) as cluster:
        yield cluster


def test_isolate_rdma_rails_over_a_real_slurm(slurm: LocalSlurm, tmp_path: Path) -> None:
    """One sbatch job, srun one task per node (``--no-torchrun``); each task finds its side by
    ``SLURMD_NODENAME`` (Slurm numbers tasks in its own node order), node1 serving, node2's NICs the clients."""
    stand_in(tmp_path / "bin", tmp_path / "state")
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    env = _env(tmp_path, sysfs)
    env.update(SLURM_CONF=str(slurm.conf), GPUACCEPT_SYSFS_ROOT=str(sysfs))
    r = gpuaccept("isolate", "--backend", "slurm", "--rails-of", "node2=node1", "--rail-test", "rdma",
                  "--rail-ports", "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1", "--report-dir", str(tmp_path / "runs"),
                  f"--json={tmp_path / 'v.json'}", "--test-timeout", "120", env=env, timeout=400)
    assert r.returncode == 1, r.stdout + r.stderr + slurm.log_tail()
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["bad_rails"] == ["GPU 3 / mlx5_3:1"], data
    assert data["rails"][3]["evidence"][0] == "node2 rail 3 (mlx5_3): 201 Gb/s, expected >= 380: FAIL"
    assert [x["bad"] for x in data["rails"]] == [False, False, False, True]
    [log] = Path(next(iter(data["cluster_reports"].values()))).glob("slurm-*.out")
    text = log.read_text()
    assert "@rdma 0 server node1 mlx5_0 18515| $ ib_write_bw -d mlx5_0 -p 18515" in text
    assert "@rdma 3 client node2 mlx5_3 18518| $ ib_write_bw -d mlx5_3 -p 18518" in text


def _ssh_args(sshd: Sshd, tmp_path: Path, sysfs: Path) -> list[str]:
    """The ssh launch flags of the stand-in runs: the loopback sshd's aliases, and the stand-in's environment
    (PATH first: ``ib_write_bw`` is the stand-in) passed to the remote side with ``--env``."""
    path = os.pathsep.join([str(tmp_path / "bin"), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return [f"--ssh-config={sshd.ssh_config}", f"--remote-python={sys.executable}",
            f"--remote-dir={tmp_path / 'remote'}", "--connect-timeout=5", f"--env=PATH={path}",
            "--env=RDMA_TEST_SLOW=mlx5_3", f"--env=RDMA_TEST_SYSFS={sysfs}", f"--env=GPUACCEPT_SYSFS_ROOT={sysfs}"]


def test_isolate_rdma_rails_over_ssh_read_both_hosts_logs(sshd: Sshd, tmp_path: Path) -> None:
    """``isolate --backend ssh --rails-of node-b=node-a --rail-test rdma``: one ssh launch, one process per host
    (``--no-torchrun``); each host finds its side by its label (``GPUACCEPT_HOSTNAME``); the ssh launch keeps each
    host's output in its own ``LABEL.log``, and the judge reads both."""
    stand_in(tmp_path / "bin", tmp_path / "state")
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    env = _env(tmp_path, sysfs)
    r = gpuaccept("isolate", "--backend", "ssh", "--rails-of", "node-b=node-a", "--rail-test", "rdma",
                  "--rail-ports", "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1", "--report-dir", str(tmp_path / "runs"),
                  f"--json={tmp_path / 'v.json'}", "--test-timeout", "120",
                  *(f"--launch-arg={a}" for a in _ssh_args(sshd, tmp_path, sysfs)), env=env, timeout=300)
    data = _slow_rail_verdict(r, tmp_path / "v.json")
    where = Path(next(iter(data["cluster_reports"].values())))
    logs = {p.name: p.read_text() for p in where.glob("*.log")}
    assert sorted(logs) == ["node-a.log", "node-b.log"], sorted(logs)
    assert "@rdma 0 server node-a mlx5_0 18515| $ ib_write_bw -d mlx5_0 -p 18515" in logs["node-a.log"]
    assert "@rdma 3 client node-b mlx5_3 18518| $ ib_write_bw -d mlx5_3 -p 18518" in logs["node-b.log"]
    for name, side in (("node-a.log", " server node-a "), ("node-b.log", " client node-b ")):  # its own side only
        tagged = [ln for ln in logs[name].splitlines() if ln.startswith("@rdma ")]
        assert tagged and all(side in ln for ln in tagged), name


@pytest.fixture(scope="module")
def sshd3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from start_sshd(tmp_path_factory.mktemp("sshd3"), aliases=("node-a", "node-b", "node-c"))


def test_two_pair_jobs_at_once_over_ssh_use_different_ports(sshd3: Sshd, tmp_path: Path) -> None:
    """Two bad nodes whose rails are tested with the same good partner, both pair jobs at once
    (:func:`gpuaccept.isolate.rdma.run_many`): node-a serves both, on 18515..18518 for node-b and 18519..18522 for
    node-c. The stand-in's state files are per port: had two servers shared a port, there would be fewer than 8."""
    from gpuaccept.isolate.pairs import PairRunner
    from gpuaccept.isolate.rdma import run_many

    stand_in(tmp_path / "bin", tmp_path / "state")
    sysfs = tmp_path / "sysfs"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    nics = NICS.split(",")
    runner = PairRunner("ssh", tmp_path / "runs", _ssh_args(sshd3, tmp_path, sysfs), timeout_s=120, poll_s=0.2)
    b, c = run_many(runner, [("node-b", "node-a", nics, "--rail-ports"), ("node-c", "node-a", nics, "--rail-ports")],
                    "t")
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == sorted(
        f"{k}-{18515 + i}" for k in ("done", "listen") for i in range(8))
    assert [v.bad for v in b.verdicts] == [False, False, False, True]
    assert [v.bad for v in c.verdicts] == [False, False, False, True]
    assert b.verdicts[3].evidence[0] == "node-b rail 3 (mlx5_3): 201 Gb/s, expected >= 380: FAIL"
    assert c.verdicts[3].evidence[0] == "node-c rail 3 (mlx5_3): 201 Gb/s, expected >= 380: FAIL"
    assert "@rdma 0 client node-b mlx5_0 18515| $ ib_write_bw -d mlx5_0 -p 18515" in runner.rdma_logs["t-rdma-node-b"]
    assert "@rdma 0 client node-c mlx5_0 18519| $ ib_write_bw -d mlx5_0 -p 18519" in runner.rdma_logs["t-rdma-node-c"]
    assert "@rdma 3 server node-a mlx5_3 18522|" in runner.rdma_logs["t-rdma-node-c"]
