"""``launch slurm --runtime docker|podman``: golden plans (shellchecked), bad input, the in-container
handshake against a real sshd, and the whole pattern for real: the private two-node Slurm cluster of
tests/slurm_cluster.py, rootless podman run by an ordinary user (tests/unprivileged.py), and the
multinode image built on a Debian base (tests/podman_support.py).

Two "nodes" share this host's network, so each node's sshd listens on --ssh-port + its index, and the
job's ssh_config reaches each by its Slurm name. Two things of this machine are worked around, each
by an option the launcher has for sites like it: no /dev/mqueue (so ``--no-ipc-host``), and no NVIDIA
device (``--container-gpus auto`` passes none, and says so).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.containers.sshd import SshHost, ssh_config_text, sshd_config_text
from gpuaccept.errors import ConfigError
from gpuaccept.launch.slurm.backend import SlurmBackend
from gpuaccept.launch.slurm.incontainer import IN_CONTAINER_SCRIPT
from gpuaccept.launch.slurm.options import SlurmOptions
from gpuaccept.launch.slurm.runtime_script import render_runtime_script
from gpuaccept.launch.spec import JobSpec, Mount
from tests.helpers import gpuaccept
from tests.launch_support import check_golden, launch_env, one_error_line, require, shellcheck
from tests.podman_support import multinode_image, shared_podman
from tests.slurm_cluster import DAEMONS, LocalSlurm
from tests.sshd import SSHD, free_port, need_binary
from tests.unprivileged import Account, UserPodman, account_dir, account_python, ordinary_account, user_podman

# ------------------------------------------------------------------ plans (pure, golden, shellcheck)


def _spec(**over: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "allreduce", "nodes": 2, "gpus_per_node": 8, "run_id": "20260101T000000Z-allreduce-0000",
        "results_dir": "/shared/gpuaccept", "command": ["./allreduce.sh", "--size", "1G"],
        "image": "registry.example.com/ml/multinode:26.01", "env": {"NCCL_DEBUG": "INFO"},
        "mounts": [Mount("/datasets", "/datasets"), Mount("/scratch", "/scratch", True)],
        "workdir": "/home/alice/job", "options": {"runtime": "podman"}}
    base.update(over)
    return JobSpec(**base)  # type: ignore[arg-type]


GOLDEN_SPECS: dict[str, JobSpec] = {
    "podman-mpi": _spec(options={"runtime": "podman", "ssh_port": 2400, "shm_size": "16g", "partition": "gpu",
                                 "runtime_args": ["--ulimit=memlock=-1"], "container_env": ["HF_TOKEN"],
                                 "handshake_timeout_s": 90}),
    "docker-mpi": _spec(options={"runtime": "docker", "privileged": True, "container_gpus": "all"}),
    "docker-suite-distributed": _spec(command=None, suite_args=["--profile", "quick", "--distributed"],
                                      distributed=True, env={}, mounts=[], workdir=None,
                                      options={"runtime": "docker", "ipc_host": False}),
    "podman-suite-per-node": _spec(command=None, suite_args=["--profile", "quick"], distributed=False, env={},
                                   mounts=[], workdir=None, gpus_per_node=0,
                                   options={"runtime": "podman", "network": "hostnet"}),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_SPECS))
def test_plans_match_golden_files_and_pass_shellcheck(name: str, tmp_path: Path) -> None:
    spec = GOLDEN_SPECS[name]
    plan = SlurmBackend().plan(spec)
    assert SlurmBackend().plan(spec).files == plan.files  # deterministic
    expected = {"job.sbatch", "container-node.sh", "in-container.sh"} | (
        {"sshd_config"} if spec.command is not None else set())
    assert set(plan.files) == expected
    assert plan.commands == [["sbatch", "--parsable", "job.sbatch"]]
    for file in ("job.sbatch", "container-node.sh", "sshd_config"):
        if file in plan.files:
            check_golden(f"slurm-runtime/{name}/{file}", plan.files[file])
    assert plan.files["in-container.sh"] == IN_CONTAINER_SCRIPT  # the same for every job
    for file in ("job.sbatch", "container-node.sh"):
        (tmp_path / file).write_text(plan.files[file])
        shellcheck(tmp_path / file)


def test_in_container_script_is_posix_sh() -> None:
    checker = need_binary("shellcheck", "generated scripts are checked; apt-get install shellcheck")
    proc = subprocess.run([checker, "-s", "sh", "-"], input=IN_CONTAINER_SCRIPT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_container_command_line_runs_as_the_user_with_the_gpus_of_the_runtime() -> None:
    podman = SlurmBackend().plan(GOLDEN_SPECS["podman-mpi"]).files["container-node.sh"]
    assert '--user "$uid:$gid"' in podman and "--userns=keep-id" in podman
    assert '--device "nvidia.com/gpu=$i"' in podman and "--gpus" not in podman
    assert "options=(--network=host --ipc=host --shm-size=16g --ulimit=memlock=-1)" in podman
    assert "env_names=(NCCL_DEBUG HF_TOKEN)" in podman and "INFO" not in podman  # names only, never values
    assert "mounts=(/datasets:/datasets /scratch:/scratch:ro /shared/gpuaccept:/shared/gpuaccept " \
           "/home/alice/job:/home/alice/job)" in podman
    docker = SlurmBackend().plan(GOLDEN_SPECS["docker-mpi"]).files["container-node.sh"]
    assert "--userns" not in docker and '--group-add "$g"' in docker
    assert '--gpus "\\"device=$ids\\""' in docker and "--privileged" in docker
    script = SlurmBackend().plan(GOLDEN_SPECS["podman-mpi"]).files["job.sbatch"]
    assert "--kill-on-bad-exit=1" in script and "#SBATCH --partition=gpu" in script
    assert "printf '%s slots=8\\n'" in script and "GPUACCEPT_NP=$(( ${#hosts[@]} * 8 ))" in script
    assert "ssh_port=2400" in script and '"    Port $((ssh_port + i))"' in script
    suite = SlurmBackend().plan(GOLDEN_SPECS["docker-suite-distributed"]).files["job.sbatch"]
    assert "--rdzv-endpoint=\"$head_addr:$rdzv_port\"" in suite and "ssh_config" not in suite


@pytest.mark.parametrize(("spec_over", "options", "words"), [
    ({"image": None}, {"runtime": "podman"}, "--runtime: podman: needs --image"),
    ({}, {"runtime": "lxc"}, "not a valid --runtime value"),
    ({}, {"runtime": "podman", "ssh_port": 65535}, "past 65535"),
    ({"results_dir": "/shared/with space"}, {"runtime": "podman"}, "the ssh configuration of the job"),
    ({}, {"runtime": "docker", "shm_size": "lots"}, "not a size"),
    ({}, {"runtime": "docker", "runtime_args": ["privileged"]}, "starts with '-'"),
    ({}, {"runtime": "docker", "container_gpus": "some"}, "not a valid --container-gpus value"),
])
def test_bad_runtime_options_raise_config_errors(spec_over: dict[str, object], options: dict[str, object],
                                                 words: str) -> None:
    with pytest.raises(ConfigError) as info:
        spec = _spec(options=options, **spec_over)
        render_runtime_script(spec, SlurmOptions.from_dict(spec.options))
    assert words in str(info.value)


@pytest.mark.parametrize("flag", [["--privileged"], ["--ssh-port", "2400"], ["--no-ipc-host"],
                                  ["--shm-size", "8g"], ["--container-gpus", "none"]])
def test_runtime_options_without_runtime_exit_2(flag: list[str], tmp_path: Path) -> None:
    r = gpuaccept("launch", "slurm", "--nodes", "2", "--image", "img", "--results-dir", str(tmp_path), *flag,
                  "--dry-run", "--", "true", **launch_env())
    assert r.returncode == 2
    assert "is an option of --runtime docker|podman" in one_error_line(r)


def test_dry_run_prints_every_file_and_the_risks(tmp_path: Path) -> None:
    r = gpuaccept("launch", "slurm", "--runtime", "docker", "--image", "img:1", "--nodes", "2", "--privileged",
                  "--mounts", f"{tmp_path},/scratch:/s:ro", "--results-dir", str(tmp_path / "res"), "--run-id", "d1",
                  "--dry-run", "--", "./job.sh", **launch_env())
    assert r.returncode == 0, r.stderr
    for name in ("job.sbatch", "container-node.sh", "in-container.sh", "sshd_config"):
        assert f"# ---- {name} ----" in r.stdout
    assert "--privileged: the containers run privileged" in r.stderr
    assert f"mounts=({tmp_path}:{tmp_path} /scratch:/s:ro " in r.stdout
    assert "# note: the command runs on the first node once every node's sshd answers (ports 2222-2223" in r.stdout
    assert not (tmp_path / "res").exists()


def _fake_slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """sbatch, squeue and scancel that only record that they were called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for tool in ("sbatch", "squeue", "scancel"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho {tool} >> {calls}\necho 1\n")
        (bin_dir / tool).chmod(0o755)
    return launch_env(PATH=f"{bin_dir}:{os.environ['PATH']}"), calls


def test_missing_mount_source_exits_2_before_anything_is_submitted(tmp_path: Path) -> None:
    env, calls = _fake_slurm(tmp_path)
    r = gpuaccept("launch", "slurm", "--runtime", "podman", "--image", "img:1", "--nodes", "2",
                  "--mounts", str(tmp_path / "nope"), "--results-dir", str(tmp_path / "res"), "--", "true", **env)
    errors = [line for line in r.stderr.splitlines() if not line.startswith("[LAUNCH] warning:")]
    assert r.returncode == 2 and len(errors) == 1 and f"{tmp_path / 'nope'} does not exist" in errors[0]
    assert not calls.exists() and not (tmp_path / "res").exists()


def test_a_local_image_that_does_not_exist_exits_2(tmp_path: Path) -> None:
    need_binary("podman", "apt-get install podman")
    env, calls = _fake_slurm(tmp_path)
    storage = tmp_path / "storage.conf"  # an empty private store: nothing of this machine's is read or made
    storage.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp_path}/g"\nrunroot = "{tmp_path}/r"\n'
                       f'rootless_storage_path = "{tmp_path}/g"\n')
    env.update(CONTAINERS_STORAGE_CONF=str(storage), XDG_RUNTIME_DIR=str(tmp_path))
    r = gpuaccept("launch", "slurm", "--runtime", "podman", "--image", "localhost/gpuaccept/none:1", "--nodes", "2",
                  "--results-dir", str(tmp_path / "res"), "--", "true", **env)
    assert r.returncode == 2 and "localhost/gpuaccept/none:1: no such image in podman" in one_error_line(r)
    assert not calls.exists()


def test_a_user_without_a_passwd_entry_exits_2(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can run a process as a uid that has no passwd entry")
    env, calls = _fake_slurm(tmp_path)
    uid = 54321
    while True:
        try:
            __import__("pwd").getpwuid(uid)
            uid += 1
        except KeyError:
            break
    nobody = Account("nobody-here", uid, uid, tmp_path)
    python, extra = account_python(nobody)
    res = account_dir(nobody, "gpuaccept-nopasswd-")
    try:
        r = nobody.run([*python, "-m", "gpuaccept", "launch", "slurm", "--runtime", "docker", "--image", "img:1",
                        "--nodes", "2", "--results-dir", str(res), "--", "true"],
                       **{**extra, "PATH": env["PATH"]})
    finally:
        shutil.rmtree(res, ignore_errors=True)
    assert r.returncode == 2, r.stderr
    assert f"uid {uid} has no passwd entry here" in one_error_line(r)
    assert not calls.exists()


# ------------------------------------------------------------------ the handshake, against a real sshd


@pytest.fixture
def handshake_dir(tmp_path: Path) -> Path:
    need_binary(SSHD, "the handshake is tested against a real sshd; apt-get install openssh-server")
    need_binary("ssh-keygen", "apt-get install openssh-client")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


def _master(state: Path, hosts: dict[str, int], bound: int, *command: str) -> tuple[subprocess.CompletedProcess[str],
                                                                                      float]:
    """in-container.sh as the first node of a job whose nodes are ``hosts`` (name -> port on 127.0.0.1)."""
    (state / "ssh_config").write_text(ssh_config_text([SshHost(h, "127.0.0.1", p) for h, p in hosts.items()],
                                                      state / "ssh"))
    (state / "sshd_config.base").write_text(sshd_config_text(state / "ssh", 22, key_types=("ed25519",)))
    (state / "in-container.sh").write_text(IN_CONTAINER_SCRIPT)
    first = next(iter(hosts))
    env = {"PATH": os.environ["PATH"] + ":/usr/sbin", "HOME": str(state), "GPUACCEPT_HOSTNAME": first,
           "GPUACCEPT_CT_MODE": "mpi", "GPUACCEPT_CT_DIR": str(state), "GPUACCEPT_CT_INDEX": "0",
           "GPUACCEPT_CT_PORT": str(hosts[first]), "GPUACCEPT_CT_HANDSHAKE_S": str(bound),
           "GPUACCEPT_CT_SSHD_CONFIG": str(state / "sshd_config.base"), "GPUACCEPT_HOSTLIST": ",".join(hosts),
           "GPUACCEPT_SSH_CONFIG": str(state / "ssh_config"), "GPUACCEPT_HOSTFILE": str(state / "hostfile")}
    start = time.monotonic()
    proc = subprocess.run(["sh", str(state / "in-container.sh"), *command], capture_output=True, text=True,
                          env=env, timeout=bound + 60, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - start


def _silent_listener() -> tuple[socket.socket, int]:
    """A port that accepts TCP connections and never says a word (a hung sshd)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock, sock.getsockname()[1]


def test_master_gives_up_within_the_bound_and_names_the_silent_node(handshake_dir: Path) -> None:
    sock, silent = _silent_listener()
    try:
        proc, took = _master(handshake_dir, {"node-a": free_port(), "node-b": silent}, 8, "touch", "ran")
    finally:
        sock.close()
    assert proc.returncode == 2, proc.stderr
    assert "[LAUNCH] node-a: gave up after 8 s: the sshd of node-b never answered" in proc.stderr
    assert took < 8 + 5 + 10, f"the bound is 8 s (5 s per ssh attempt), it took {took:.0f} s"
    assert (handshake_dir / "done").read_text().strip() == "2"
    assert not (handshake_dir / "ran").exists()
    assert not _processes_mentioning(str(handshake_dir))  # its own sshd is stopped


def test_master_names_a_node_whose_sshd_reported_a_failure_at_once(handshake_dir: Path) -> None:
    (handshake_dir / "failed.node-b").write_text("sshd did not start on port 1: Address already in use\n")
    sock, silent = _silent_listener()
    try:
        proc, took = _master(handshake_dir, {"node-a": free_port(), "node-b": silent}, 60, "true")
    finally:
        sock.close()
    assert proc.returncode == 2
    assert "gave up: node-b: sshd did not start on port 1: Address already in use" in proc.stderr
    assert took < 30


def test_master_runs_the_command_with_the_host_list_and_returns_its_exit_code(handshake_dir: Path) -> None:
    ports = {"node-a": free_port(), "node-b": free_port()}
    script = ('echo "$GPUACCEPT_HOSTLIST $OMPI_MCA_plm_rsh_agent"; '
              'ssh -F "$GPUACCEPT_SSH_CONFIG" node-a "echo over ssh on \\$GPUACCEPT_HOSTNAME"; exit 7')
    (handshake_dir / "ssh").mkdir(mode=0o700)
    # node-b's sshd is the master's own (same host, its port): the test has one machine
    proc, _ = _master(handshake_dir, {"node-a": ports["node-a"], "node-b": ports["node-a"]}, 30, "sh", "-c", script)
    assert proc.returncode == 7, proc.stderr
    assert f"node-a,node-b ssh -F {handshake_dir}/ssh_config" in proc.stdout
    assert "over ssh on node-a" in proc.stdout  # the node's variables reach an ssh session (SetEnv)
    assert (handshake_dir / "done").read_text().strip() == "7"
    assert "sshd answers on every node (node-a,node-b); running the job" in proc.stderr


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


# ------------------------------------------------------------------ for real: Slurm + rootless podman

HANDSHAKE_S = 40
MPI_JOB = """#!/bin/sh
# every rank prints the node it runs on; then the job writes on the mounted directory
set -e
mpirun --np "$GPUACCEPT_NP" --hostfile "$GPUACCEPT_HOSTFILE" --mca btl self,tcp --mca btl_tcp_if_include lo \\
  --mca oob_tcp_if_include lo sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $GPUACCEPT_HOSTNAME as $(id -un)"'
touch "$DATA/written-by-the-job"
case "${1:-}" in
  fail) exit 3 ;;
  sleep) touch "$DATA/sleeping"; sleep 300 ;;
esac
"""


class Site:
    """The account, its podman store, the cluster, and where a job's files go."""

    def __init__(self, account: Account, podman: UserPodman, slurm: LocalSlurm, python: list[str],
                 env: dict[str, str], image: str) -> None:
        self.account, self.podman, self.slurm, self.python, self.env, self.image = (
            account, podman, slurm, python, env, image)

    def launch(self, workdir: Path, results: Path, *args: str, runtime: str = "podman", image: str | None = None,
               timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
        """``gpuaccept launch slurm --runtime RUNTIME`` on both nodes as the account; ``env`` overrides its
        environment (the job's tasks get the launcher's)."""
        return self.account.run([*self.python, "-m", "gpuaccept", "launch", "slurm", "--runtime", runtime,
                                 "--image", image or self.image, "--nodes", "2", "--results-dir", str(results),
                                 "--poll-interval", "0.5", "--no-ipc-host", "--handshake-timeout", str(HANDSHAKE_S),
                                 "--procs-per-node", "1", *args], timeout=timeout, cwd=workdir, **{**self.env, **env})

    def assert_clean(self, results: Path, deadline_s: float = 30) -> None:
        """No container of the job, no sshd of the job, no private key: now or within ``deadline_s``."""
        end = time.monotonic() + deadline_s
        while True:
            left = self.podman.containers()
            procs = _processes_mentioning(str(results))
            keys = sorted(str(p) for p in results.rglob("id_ed25519*")) + sorted(
                str(p) for p in results.rglob("ssh_host_*"))
            if not left and not procs and not keys:
                return
            if time.monotonic() > end:
                pytest.fail(f"left behind: containers {left}, processes {procs}, keys {keys}")
            time.sleep(0.5)


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    require(*DAEMONS, "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
    need_binary("podman", "the containers are podman's; apt-get install podman")
    root_store = shared_podman()
    image = multinode_image(root_store)
    with ordinary_account() as account:
        python, extra = account_python(account)
        store_dir = account_dir(account, "gpuaccept-user-podman-")
        try:
            podman = user_podman(account, store_dir, root_store, image)
            with LocalSlurm(own_addresses=True) as slurm:
                env = {**extra, **podman.env(), "SLURM_CONF": str(slurm.conf)}
                yield Site(account, podman, slurm, python, env, image)
        finally:
            for args in (["rm", "--all", "--force"], ["system", "reset", "--force"]):
                try:
                    account.run(["podman", *args], timeout=600, **podman_env(store_dir))
                except subprocess.TimeoutExpired:
                    pass
            shutil.rmtree(store_dir, ignore_errors=True)


def podman_env(store_dir: Path) -> dict[str, str]:
    return {"CONTAINERS_CONF": str(store_dir / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(store_dir / "storage.conf"), "XDG_RUNTIME_DIR": str(store_dir / "xdg")}


@pytest.fixture
def job_dirs(site: Site) -> Iterator[tuple[Path, Path, Path]]:
    """(working directory with job.sh, results directory, data directory to mount), all the account's."""
    work = account_dir(site.account, "gpuaccept-job-work-")
    results = account_dir(site.account, "gpuaccept-job-results-")
    data = account_dir(site.account, "gpuaccept-job-data-")
    script = work / "job.sh"
    script.write_text(MPI_JOB)
    script.chmod(0o755)
    site.account.chown(script)
    yield work, results, data
    for d in (work, results, data):
        shutil.rmtree(d, ignore_errors=True)


def _slurm_log(results: Path) -> str:
    logs = list(results.rglob("slurm-*.out"))
    return logs[0].read_text(errors="replace") if logs else ""


def _failure_lines(log: str) -> list[str]:
    """The job's ``[LAUNCH] <node> failed: <why>`` lines (one per node that wrote its failed.<node> file)."""
    return [line for line in log.splitlines() if line.startswith(("[LAUNCH] node1 failed:", "[LAUNCH] node2 failed:"))]


def _job(results: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(next(results.rglob("job.json")).read_text())
    return data


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mpirun_across_two_nodes_as_the_calling_user(site: Site, job_dirs: tuple[Path, Path, Path]) -> None:
    work, results, data = job_dirs
    port = free_port()
    r = site.launch(work, results, "--run-id", "mpi-ok", "--ssh-port", str(port), "--mounts", str(data),
                    "--env", f"DATA={data}", "--", "./job.sh")
    log = _slurm_log(results)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:] + log[-3000:]
    assert f"rank 0 on node1 as {site.account.name}" in log and f"rank 1 on node2 as {site.account.name}" in log
    assert "sshd answers on every node (node1,node2)" in log
    assert f"--ssh-port {port}" not in log and f"-e GPUACCEPT_CT_PORT={port + 1}" in log  # a port per node
    written = data / "written-by-the-job"
    assert written.exists(), log[-3000:]
    assert (written.stat().st_uid, written.stat().st_gid) == (site.account.uid, site.account.gid)
    assert site.slurm.wait_job(str(_job(results)["job_id"])) == "COMPLETED"
    site.assert_clean(results)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_failing_script_gives_its_exit_code_and_leaves_nothing(site: Site,
                                                                 job_dirs: tuple[Path, Path, Path]) -> None:
    work, results, data = job_dirs
    r = site.launch(work, results, "--run-id", "mpi-fail", "--ssh-port", str(free_port()), "--mounts", str(data),
                    "--env", f"DATA={data}", "--", "./job.sh", "fail")
    assert r.returncode == 1, r.stdout[-3000:]
    assert "FAILED exit 3:0" in r.stdout
    assert (data / "written-by-the-job").exists()  # the script ran, then failed
    site.assert_clean(results)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_scancel_in_the_middle_of_the_script_leaves_nothing(site: Site, job_dirs: tuple[Path, Path, Path]) -> None:
    work, results, data = job_dirs
    r = site.launch(work, results, "--run-id", "mpi-cancel", "--ssh-port", str(free_port()), "--mounts", str(data),
                    "--env", f"DATA={data}", "--detach", "--", "./job.sh", "sleep")
    assert r.returncode == 0, r.stderr
    job_id = str(_job(results)["job_id"])
    end = time.monotonic() + 180
    while not (data / "sleeping").exists():
        assert time.monotonic() < end, _slurm_log(results)[-3000:]
        time.sleep(0.5)
    assert len(site.podman.containers()) == 2  # both nodes' containers are up
    cancelled = site.slurm.run("scancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert site.slurm.wait_job(job_id) == "CANCELLED"
    site.assert_clean(results)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_whose_sshd_never_comes_up_is_named_within_the_bound(site: Site,
                                                                     job_dirs: tuple[Path, Path, Path]) -> None:
    work, results, data = job_dirs
    while True:  # node2's port is taken by something that never speaks ssh
        port = free_port()
        blocker = socket.socket()
        try:
            blocker.bind(("0.0.0.0", port + 1))
            break
        except OSError:
            blocker.close()
    blocker.listen(4)
    try:
        start = time.monotonic()
        r = site.launch(work, results, "--run-id", "mpi-noport", "--ssh-port", str(port), "--mounts", str(data),
                        "--env", f"DATA={data}", "--", "./job.sh")
        took = time.monotonic() - start
    finally:
        blocker.close()
    log = _slurm_log(results)
    assert r.returncode == 1, r.stdout[-2000:]
    # node2's sshd either fails to bind (and says so) or binds only IPv6 ([::]) and is never reached at its
    # address: the master names node2 at once, or when the bound runs out
    gave_up = [line for line in log.splitlines() if line.startswith("[LAUNCH] node1: gave up")]
    assert gave_up and "node2" in gave_up[0], log[-3000:]
    assert took < HANDSHAKE_S + 60
    assert not (data / "written-by-the-job").exists()  # the script never ran
    site.assert_clean(results)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_suite_in_each_nodes_container_gives_a_cluster_report(site: Site,
                                                                  job_dirs: tuple[Path, Path, Path]) -> None:
    work, results, _ = job_dirs
    r = site.launch(work, results, "--run-id", "suite", "--per-node-only", "--device", "cpu", "--checks", "env")
    assert r.returncode == 0, r.stdout[-3000:] + _slurm_log(results)[-3000:]
    report = json.loads((results / "suite" / "cluster-report.json").read_text())
    assert report["verdict"] == "success" and [n["host"] for n in report["nodes"]] == ["node1", "node2"]
    for node in report["nodes"]:
        assert node["state"] == "reported" and node["report"]["checks"][0]["host"] == node["host"]
    node_report = next((results / "suite").rglob("report.json"))
    assert node_report.stat().st_uid == site.account.uid
    site.assert_clean(results)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_image_no_node_can_pull_fails_the_job_naming_the_node(site: Site,
                                                                 job_dirs: tuple[Path, Path, Path]) -> None:
    work, results, _ = job_dirs
    r = site.launch(work, results, "--run-id", "noimage", "--", "true", image="registry.invalid/gpuaccept/none:1")
    assert r.returncode == 1
    log = _slurm_log(results)
    failed = _failure_lines(log)
    assert failed, log
    assert all("image registry.invalid/gpuaccept/none:1 is not on this node and could not be pulled" in line
               for line in failed), log
    site.assert_clean(results)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_runtime_missing_on_the_nodes_fails_the_job_naming_the_node(site: Site,
                                                                       job_dirs: tuple[Path, Path, Path]) -> None:
    work, results, _ = job_dirs
    # the job's tasks get the launcher's PATH: one without a docker engine (a docker CLI alone may be there)
    r = site.launch(work, results, "--run-id", "nodocker", "--", "true", runtime="docker", image="img:1",
                    PATH="/usr/bin:/bin:/usr/sbin:/sbin")
    assert r.returncode == 1
    log = _slurm_log(results)
    # each failed node's line comes from its own failed.<node> file, read by the job after srun (srun may drop a
    # task's own last line when --kill-on-bad-exit ends the other task) and by the launcher
    failed = _failure_lines(log)
    assert failed, log
    for line in failed:
        assert ("docker is not installed on this node" in line or "docker does not answer on this node" in line), log
        assert line in r.stderr, r.stderr
    assert not list(results.rglob("id_ed25519*"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_suite_across_nodes_under_torchrun_in_containers(site: Site, job_dirs: tuple[Path, Path, Path]) -> None:
    """The default for 2+ nodes: torchrun in every node's container, one rendezvous across them (each
    "node" has its own loopback address, as nodes of a real cluster have), one merged report."""
    work, results, _ = job_dirs
    r = site.launch(work, results, "--run-id", "dist", "--device", "cpu", "--checks", "env,collectives")
    assert r.returncode == 0, r.stdout[-3000:] + _slurm_log(results)[-6000:]
    report = json.loads((results / "dist" / "cluster-report.json").read_text())
    assert report["verdict"] == "success" and [n["host"] for n in report["nodes"]] == ["node1", "node2"]
    for node in report["nodes"]:  # per node: env once, and this node's rank of the collectives
        assert sorted((c["name"], c["status"], c["host"]) for c in node["report"]["checks"]) == [
            ("collectives", "pass", node["host"]), ("env", "pass", node["host"])], node
    fabric = report["analysis"]["cross_node"]
    assert (fabric["verdict"], fabric["ranks"], fabric["hosts"]) == ("success", 2, ["node1", "node2"]), fabric
    node_reports = list((results / "dist").rglob("report.json"))
    assert node_reports and all(p.stat().st_uid == site.account.uid for p in node_reports)
    site.assert_clean(results)
