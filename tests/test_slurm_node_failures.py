"""``launch slurm --runtime``: a node that cannot start its container writes why to ``failed.<node>`` (a new
file renamed into place), and the launcher reads every such file (:func:`node_failures`, the backend's logs),
so that a failure line is never lost when srun's ``--kill-on-bad-exit`` drops a task's last output.

The node script is the generated ``container-node.sh``, run for real with bash (no Slurm needed for its
preflight: srun's variables are set by hand, and its PATH has no container runtime).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuaccept.launch.base import Submission
from gpuaccept.launch.slurm.backend import SlurmBackend, _Watch
from gpuaccept.launch.slurm.options import SlurmOptions
from gpuaccept.launch.slurm.runtime_check import node_failures
from gpuaccept.launch.slurm.runtime_script import STATE_DIR, render_node_script
from gpuaccept.launch.spec import JobSpec


def _node_script(results: Path) -> tuple[Path, Path]:
    """(container-node.sh of a docker job writing under ``results``, its state directory, made as the job does)."""
    spec = JobSpec(name="t", nodes=8, gpus_per_node=1, run_id="r1", results_dir=str(results), command=["true"],
                   image="img:1", options={"runtime": "docker"})
    opts = SlurmOptions.from_dict(spec.options)
    launch = results / "r1" / "launch"
    state = launch / STATE_DIR
    state.mkdir(parents=True, mode=0o700)
    script = launch / "container-node.sh"
    script.write_text(render_node_script(spec, opts))
    return script, state


def _no_runtime_path(tmp_path: Path) -> str:
    """A PATH with the tools the script's preflight uses, and no docker."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mv", "head", "tail"):
        for d in ("/usr/bin", "/bin"):
            if os.path.exists(f"{d}/{tool}"):
                (bin_dir / tool).symlink_to(f"{d}/{tool}")
                break
    return str(bin_dir)


def _start_node(script: Path, index: int, node: str, path: str) -> subprocess.Popen[str]:
    env = {"PATH": path, "SLURM_NODEID": str(index), "SLURMD_NODENAME": node, "SLURM_JOB_ID": "42"}
    return subprocess.Popen(["/bin/bash", str(script), "true"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def test_every_node_that_fails_at_once_is_named_by_its_own_file(tmp_path: Path) -> None:
    script, state = _node_script(tmp_path / "results")
    path = _no_runtime_path(tmp_path)
    procs = [_start_node(script, i, f"node{i + 1}", path) for i in range(8)]  # all at once, as srun starts them
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2, err
        assert "docker is not installed on this node" in err
    assert node_failures(state) == [f"[LAUNCH] node{i} failed: docker is not installed on this node"
                                    for i in range(1, 9)]
    assert sorted(p.name for p in state.iterdir()) == [f"failed.node{i}" for i in range(1, 9)]  # no temporary left


def test_a_node_name_that_is_not_a_host_name_never_becomes_a_path(tmp_path: Path) -> None:
    script, state = _node_script(tmp_path / "results")
    p = _start_node(script, 3, "../../escaped", _no_runtime_path(tmp_path))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2, err
    assert [x.name for x in state.iterdir()] == ["failed.task3"]
    assert not list((tmp_path / "results").rglob("*escaped*"))
    assert node_failures(state) == ["[LAUNCH] task3 failed: docker is not installed on this node"]


def test_node_failures_reads_only_plain_files_with_host_names(tmp_path: Path) -> None:
    state = tmp_path / "container"
    state.mkdir()
    (state / "failed.node-b").write_text("sshd did not start on port 2223: Address already in use\nmore\n")
    (state / "failed.node-a").write_text("image img:1 is not on this node and could not be pulled: " + "x" * 5000)
    (state / "failed.empty").write_text("")
    (state / ".failed.node-c.123").write_text("half a line")  # a writer's temporary file
    secret = tmp_path / "secret"
    secret.write_text("not the job's\n")
    (state / "failed.link").symlink_to(secret)
    (state / "failed.dir").mkdir()
    os.mkfifo(state / "failed.fifo")  # never opened for a blocking read
    (state / "failed.bad name").write_text("x\n")
    (state / "done").write_text("2\n")
    lines = node_failures(state)
    assert lines[0] == "[LAUNCH] empty failed: no reason written"
    assert lines[1].startswith("[LAUNCH] node-a failed: image img:1 is not on this node") and len(lines[1]) < 1100
    assert lines[2] == "[LAUNCH] node-b failed: sshd did not start on port 2223: Address already in use"
    assert len(lines) == 3
    linked = tmp_path / "linked"
    linked.symlink_to(state)
    assert node_failures(linked) == [] and node_failures(tmp_path / "absent") == []


def test_the_launcher_shows_each_failed_node_once(tmp_path: Path) -> None:
    """The tail of slurm-<id>.out, then the failure files' lines it does not already hold."""
    state = tmp_path / STATE_DIR
    state.mkdir()
    (state / "failed.node1").write_text("docker is not installed on this node\n")
    (state / "failed.node2").write_text("docker does not answer on this node: Cannot connect\n")
    (tmp_path / "slurm-42.out").write_text("[LAUNCH] job 42 on node[1-2]: docker containers\n"
                                          "[LAUNCH] node2 failed: docker does not answer on this node: Cannot "
                                          "connect\n")
    logs = SlurmBackend().logs(Submission("slurm", "42", handle=_Watch(log_dir=str(tmp_path))))
    assert logs.splitlines() == ["[LAUNCH] job 42 on node[1-2]: docker containers",
                                 "[LAUNCH] node2 failed: docker does not answer on this node: Cannot connect",
                                 "[LAUNCH] node1 failed: docker is not installed on this node"]
