"""The pure parts of ``isolate --rail-test rdma`` (:mod:`gpuaccept.isolate.rdma`): the launch flags per backend,
the ports of pair jobs run at once, and where each backend leaves the job's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuaccept.errors import UsageError
from gpuaccept.isolate.pairs import job_text
from gpuaccept.isolate.rdma import base_ports, launch_flags


def test_pair_jobs_at_once_get_disjoint_port_blocks() -> None:
    assert base_ports([4, 2, 8]) == [18515, 18519, 18521]
    blocks = [set(range(b, b + n)) for b, n in zip(base_ports([4, 2, 8]), [4, 2, 8], strict=True)]
    assert not (blocks[0] & blocks[1]) and not (blocks[1] & blocks[2]) and not (blocks[0] & blocks[2])
    assert base_ports([8], first=65528) == [65528]
    with pytest.raises(UsageError, match="past 65535"):
        base_ports([8, 8], first=65528)


def test_launch_flags_per_backend_and_base_port() -> None:
    mpi = launch_flags("mpi", "b", "a", ["mlx5_0"], python="py")
    assert mpi == ["--procs-per-node", "1", "--", "py", "-m", "gpuaccept", "rdma", "pair-node", "--nodes", "a,b",
                   "--nics", "mlx5_0"]
    ssh = launch_flags("ssh", "b", "a", ["mlx5_0", "mlx5_1"], python="py", base_port=18517)
    assert ssh[:2] == ["--no-torchrun", "--"] and ssh[-2:] == ["--base-port", "18517"]
    with pytest.raises(UsageError, match="runs over mpi, slurm, ssh; not local"):
        launch_flags("local", "b", "a", ["mlx5_0"])


def test_job_text_reads_each_ssh_hosts_log_and_only_those(tmp_path: Path) -> None:
    (tmp_path / "node-a.log").write_text("@rdma 0 server node-a mlx5_0 18515| a\n")
    (tmp_path / "node-b.log").write_text("@rdma 0 client node-b mlx5_0 18515| b")
    (tmp_path / "other.log").write_text("@rdma 0 client other mlx5_0 18515| not this launch's\n")
    (tmp_path / "__1.log").write_text("v6\n")
    text = job_text("ssh", tmp_path, "run-1", ["node-a", "node-b", "::1", "node-gone"])
    assert text == "@rdma 0 server node-a mlx5_0 18515| a\n\n@rdma 0 client node-b mlx5_0 18515| b\nv6\n"
    (tmp_path / "mpirun.log").write_text("one log\n")
    assert job_text("mpi", tmp_path, "run-1", ["node-a"]) == "one log\n"
    assert job_text("slurm", tmp_path, "77", ["node-a"]) == ""


def test_the_pair_node_command_runs_under_the_launchs_remote_python() -> None:
    import shlex

    from gpuaccept.isolate.rdma import remote_python
    from tests.helpers import gpuaccept

    assert remote_python(["--partition=gpu", "--remote-python=/opt/venv/bin/python"]) == "/opt/venv/bin/python"
    assert remote_python(["--remote-python", "/a/python", "--remote-python=/b/python"]) == "/b/python"
    assert remote_python(["--remote-python"]) is None and remote_python([]) is None
    r = gpuaccept("isolate", "--backend", "ssh", "--rails-of", "node-b=node-a",
                  "--rail-test", "rdma", "--rail-ports", "mlx5_0:1,mlx5_1:1", "--results-dir", "/r",
                  "--launch-arg=--remote-python=/opt/venv/bin/python", "--dry-run")
    assert r.returncode == 0, r.stderr
    argv = shlex.split(next(line for line in r.stdout.splitlines() if line.startswith("gpuaccept launch")))
    cmd = argv[argv.index("--") + 1:]
    assert cmd[:5] == ["/opt/venv/bin/python", "-m", "gpuaccept", "rdma", "pair-node"]
