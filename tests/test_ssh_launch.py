"""The ssh backend against a real sshd on a loopback port (see tests/sshd.py).

Two ssh config aliases, ``node-a`` and ``node-b``, reach the same server, so
this machine plays both hosts; each writes under its own label, and reports
come back with scp into a different local directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.errors import InputError
from gpuaccept.launch.base import JobState, Submission
from gpuaccept.launch.gather import merge_reports
from gpuaccept.launch.spec import JobSpec
from gpuaccept.launch.ssh.backend import SshBackend
from gpuaccept.model import NodeState, Status, Verdict
from tests.sshd import Sshd, free_port, start_sshd

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).parent / "data" / "ssh" / "plugins"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    yield from start_sshd(tmp_path_factory.mktemp("sshd"))


class Sink:
    """A thread-safe text stream collecting the prefixed output lines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text: list[str] = []

    def write(self, text: str) -> int:
        with self._lock:
            self._text.append(text)
        return len(text)

    def flush(self) -> None:
        return None

    @property
    def lines(self) -> list[str]:
        with self._lock:
            return "".join(self._text).splitlines()


def make_spec(sshd: Sshd, tmp: Path, **kw: Any) -> JobSpec:
    options = {"hosts": ["node-a", "node-b"], "ssh_config": str(sshd.ssh_config), "remote_python": PY,
               "remote_dir": str(tmp / "remote"), "master_addr": "127.0.0.1", "connect_timeout_s": 5}
    options.update(kw.pop("options", {}))
    base: dict[str, Any] = dict(name="ssh-test", nodes=2, run_id=f"run-{time.monotonic_ns()}",
                                results_dir=str(tmp / "local"), distributed=False, options=options,
                                procs_per_node=1)  # a CPU machine: one rank per host
    base.update(kw)
    return JobSpec(**base)


def launch(spec: JobSpec, sink: Sink, tmp: Path) -> tuple[SshBackend, Submission]:
    backend = SshBackend(stream=sink)  # type: ignore[arg-type]
    plan = backend.plan(spec)
    backend.check_ready(plan, spec)
    return backend, backend.submit(plan, spec, tmp / "launch")


def wait_done(backend: SshBackend, sub: Submission, timeout: float = 120) -> JobState:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state = backend.poll(sub)
        if state.done:
            return state
        time.sleep(0.2)
    backend.cancel(sub)
    raise AssertionError(f"the job did not finish within {timeout} s: {backend.poll(sub)}")


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def suite_env() -> dict[str, str]:
    return {"PYTHONPATH": f"{PLUGINS}:{ROOT}", "GPUACCEPT_PLUGINS": "ssh_hostfail_checks,tests.plugins.fake_checks"}


def test_suite_on_two_hosts_gathers_two_reports(sshd: Sshd, tmp_path: Path) -> None:
    spec = make_spec(sshd, tmp_path, suite_args=["--device", "cpu", "--profile", "quick", "--checks", "env"])
    sink = Sink()
    backend, sub = launch(spec, sink, tmp_path)
    state = wait_done(backend, sub)
    assert (state.state, state.ok) == ("COMPLETED", True), (state, sink.lines)
    # output streamed live with a host prefix, from both hosts
    for host in ("node-a", "node-b"):
        assert any(line.startswith(f"[{host}] ") and "env: PASS" in line for line in sink.lines), sink.lines
        assert "env: PASS" in (tmp_path / "launch" / f"{host}.log").read_text()
    reports = backend.gather(sub, spec)
    assert sorted(r.host for r in reports) == ["node-a", "node-b"]
    for r in reports:
        assert r.verdict is Verdict.SUCCESS and [c.name for c in r.checks] == ["env"]
        assert list((tmp_path / "local" / spec.run_id / r.host).glob("*/report.json"))  # fetched by scp
    cluster = merge_reports(reports, run_id=spec.run_id, backend="ssh", started="now",
                            expected_hosts=sub.hosts, expected_nodes=spec.nodes)
    assert [(n.host, n.state, n.verdict) for n in cluster.nodes] == [
        ("node-a", NodeState.REPORTED, Verdict.SUCCESS), ("node-b", NodeState.REPORTED, Verdict.SUCCESS)]
    assert cluster.verdict is Verdict.SUCCESS


def test_suite_failing_on_one_host_is_reported_failed(sshd: Sshd, tmp_path: Path) -> None:
    spec = make_spec(sshd, tmp_path, suite_args=["--device", "cpu", "--checks", "steady,hostfail"],
                     env={**suite_env(), "SSH_TEST_FAIL_HOST": "node-b"})
    sink = Sink()
    backend, sub = launch(spec, sink, tmp_path)
    state = wait_done(backend, sub)
    assert state.state == "FAILED" and not state.ok
    assert "node-b: exit 1" in state.detail and "node-a" not in state.detail
    assert "[node-b] " in backend.logs(sub) and "node-b is the host told to fail" in backend.logs(sub)
    reports = {r.host: r for r in backend.gather(sub, spec)}
    assert reports["node-a"].verdict is Verdict.SUCCESS  # independent hosts: node-a ran to the end
    assert reports["node-b"].verdict is Verdict.FAILURE
    assert {c.name: c.status for c in reports["node-b"].checks} == {"steady": Status.PASS, "hostfail": Status.FAIL}
    cluster = merge_reports(reports.values(), run_id=spec.run_id, backend="ssh", started="now",
                            expected_hosts=sub.hosts, expected_nodes=2)
    assert cluster.verdict is Verdict.FAILURE and cluster.failed_nodes() == ["node-b"]


def test_hostile_values_survive_ssh(sshd: Sshd, tmp_path: Path) -> None:
    workdir = tmp_path / "work dir" / "it's \"here\" $(x)"
    workdir.mkdir(parents=True)
    env = {"QUOTES": "it's \"quoted\" `and` $(not run) ${HOME} \\ back", "MULTI": "line one\nline two\n",
           "SPACES": "  both ends  ", "SEMI": "a; rm -rf /tmp/nothing &"}
    args = ["arg with space", "it's", "$(echo no)", "new\nline", "", "--", "*"]
    code = ("import json, os, sys; print('JSON ' + json.dumps([{k: os.environ[k] for k in sys.argv[1].split(',')},"
            " sys.argv[2:], os.getcwd(), os.environ['GPUACCEPT_HOSTNAME'], os.environ['NODE_RANK']]))")
    spec = make_spec(sshd, tmp_path, command=[PY, "-c", code, ",".join(env), *args], env=env, workdir=str(workdir))
    sink = Sink()
    backend, sub = launch(spec, sink, tmp_path)
    assert wait_done(backend, sub).ok, sink.lines
    seen = {}
    for line in sink.lines:
        host, _, rest = line.partition("] ")
        if rest.startswith("JSON "):
            seen[host.lstrip("[")] = json.loads(rest[5:])
    assert set(seen) == {"node-a", "node-b"}, sink.lines
    for rank, host in enumerate(("node-a", "node-b")):
        got_env, got_args, cwd, label, node_rank = seen[host]
        assert got_env == env
        assert got_args == args
        assert cwd == str(workdir)
        assert (label, node_rank) == (host, str(rank))


def test_unreachable_host_fails_before_anything_runs(sshd: Sshd, tmp_path: Path) -> None:
    closed = free_port()
    spec = make_spec(sshd, tmp_path, command=["true"],
                     options={"hosts": ["node-a", f"127.0.0.1:{closed}"], "identity": str(sshd.key),
                              "ssh_options": ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null"]})
    backend = SshBackend(stream=Sink())  # type: ignore[arg-type]
    plan = backend.plan(spec)
    t0 = time.monotonic()
    with pytest.raises(InputError) as info:
        backend.check_ready(plan, spec)
    message = str(info.value)
    assert "ssh preflight failed on 1 of 2 host(s), nothing was started" in message
    assert f"127.0.0.1: ssh: connect to host 127.0.0.1 port {closed}: Connection refused" in message
    assert "\n" not in message and "node-a" not in message
    assert time.monotonic() - t0 < 20
    # submit runs the same preflight when check_ready was not called
    with pytest.raises(InputError, match="Connection refused"):
        backend.submit(plan, spec, tmp_path / "launch")
    assert not (tmp_path / "remote").exists()  # nothing ran, not even on the reachable host


@pytest.mark.parametrize(("change", "why"), [
    ({"options": {"remote_python": "/nonexistent/python3"}},
     "node-a: the remote Python was not found ('/nonexistent/python3'; set --remote-python)"),
    ({"workdir": "/nonexistent/work dir"}, "node-a: the working directory does not exist ('/nonexistent/work dir')"),
    ({"options": {"remote_python": "PLAIN"}, "command": None, "suite_args": []},
     "node-a: the remote Python cannot import a module the job needs (gpuaccept)"),
])
def test_preflight_names_what_is_missing(sshd: Sshd, tmp_path: Path, change: dict[str, Any], why: str) -> None:
    kw: dict[str, Any] = {"command": ["true"], **change}
    spec = make_spec(sshd, tmp_path, **kw)
    if spec.options["remote_python"] == "PLAIN":  # a Python without site-packages, so without gpuaccept
        plain = tmp_path / "python-plain"
        plain.write_text(f'#!/bin/sh\nexec {PY} -S "$@"\n')
        plain.chmod(0o755)
        spec.options["remote_python"] = str(plain)
    backend = SshBackend(stream=Sink())  # type: ignore[arg-type]
    with pytest.raises(InputError) as info:
        backend.check_ready(backend.plan(spec), spec)
    assert why in str(info.value)
    assert "ssh preflight failed on 2 of 2 host(s)" in str(info.value)


def pid_job(tmp: Path, fail_host: str | None = None) -> list[str]:
    """A job of two processes, a shell and its child ``sleep``, that records both pids in ``tmp/pids/HOST.*``
    and waits; on ``fail_host`` it exits 3 after a second instead."""
    (tmp / "pids").mkdir(exist_ok=True)
    fail = f'if [ "$GPUACCEPT_HOSTNAME" = {fail_host} ]; then sleep 1; exit 3; fi; ' if fail_host else ""
    where = f'{tmp}/pids/"$GPUACCEPT_HOSTNAME"'
    return ["/bin/sh", "-c", fail + f"sleep 300 & echo $! > {where}.child; echo $$ > {where}.pid; wait"]


def pids(tmp: Path, *hosts: str) -> list[int]:
    """The pids of the job's shell and its child on each of ``hosts``, once written."""
    files = [tmp / "pids" / f"{h}.{kind}" for h in hosts for kind in ("pid", "child")]
    wait_for(lambda: all(f.is_file() and f.read_text().strip() for f in files), 30, f"pid files of {hosts}")
    return [int(f.read_text()) for f in files]


def test_failure_on_one_host_stops_the_others(sshd: Sshd, tmp_path: Path) -> None:
    spec = make_spec(sshd, tmp_path, command=pid_job(tmp_path, fail_host="node-b"), options={"fail_fast": True})
    sink = Sink()
    backend, sub = launch(spec, sink, tmp_path)
    node_a = pids(tmp_path, "node-a")
    assert all(alive(p) for p in node_a)
    t0 = time.monotonic()
    state = wait_done(backend, sub, timeout=60)
    assert time.monotonic() - t0 < 30  # not the 300 s of the sleep
    assert state.state == "FAILED" and not state.ok
    assert state.detail.startswith("node-b failed")
    assert "node-b: exit 3" in state.detail and "node-a: stopped" in state.detail
    wait_for(lambda: not any(alive(p) for p in node_a), 15, f"node-a's remote processes {node_a} to end")
    assert "[node-b] failed (exit 3); stopping the other hosts" in sink.lines
    assert not (tmp_path / "remote" / spec.run_id / "node-a" / "job.pid").exists()


def test_cancel_kills_remote_processes(sshd: Sshd, tmp_path: Path) -> None:
    spec = make_spec(sshd, tmp_path, command=pid_job(tmp_path))
    backend, sub = launch(spec, Sink(), tmp_path)
    running = pids(tmp_path, "node-a", "node-b")
    assert all(alive(p) for p in running)
    assert backend.poll(sub).state == "RUNNING"
    t0 = time.monotonic()
    backend.cancel(sub)
    assert time.monotonic() - t0 < 30
    state = backend.poll(sub)
    assert (state.state, state.done, state.ok) == ("CANCELLED", True, False)
    wait_for(lambda: not any(alive(p) for p in running), 15, "the remote processes to end")
    backend.cancel(sub)  # idempotent


def test_killed_launcher_leaves_no_remote_process(sshd: Sshd, tmp_path: Path) -> None:
    """SIGKILL the launcher itself: its end of ssh's standard input closes and the node script stops the job."""
    spec = make_spec(sshd, tmp_path, command=pid_job(tmp_path))
    launcher = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from gpuaccept.launch.spec import JobSpec\n"
        "from gpuaccept.launch.ssh.backend import SshBackend\n"
        "spec = JobSpec(**json.loads(sys.argv[1]))\n"
        "b = SshBackend()\n"
        "b.submit(b.plan(spec), spec, Path(sys.argv[2]))\n"
        "time.sleep(600)\n"
    )
    fields = dict(name=spec.name, nodes=2, run_id=spec.run_id, results_dir=spec.results_dir, command=spec.command,
                  distributed=False, options=spec.options)
    proc = subprocess.Popen([PY, "-c", launcher, json.dumps(fields), str(tmp_path / "launch")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        running = pids(tmp_path, "node-a", "node-b")
        assert all(alive(p) for p in running)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not any(alive(p) for p in running), 20, "the remote processes to end after the launcher died")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cancel_keeps_what_was_measured_and_lists_the_host_never_started(sshd: Sshd, tmp_path: Path) -> None:
    """One connection at a time: cancel while node-a runs; its partial report comes back, node-b is missing."""
    spec = make_spec(sshd, tmp_path, suite_args=["--device", "cpu", "--checks", "steady,nap"], env=suite_env(),
                     options={"max_connections": 1})
    sink = Sink()
    backend, sub = launch(spec, sink, tmp_path)
    wait_for(lambda: any(line.startswith("[node-a] ") and "nap: running" in line for line in sink.lines), 60,
             "node-a to start the nap check")
    assert not any(line.startswith("[node-b]") for line in sink.lines)
    backend.cancel(sub)
    state = backend.poll(sub)
    assert state.state == "CANCELLED" and "not started: node-b" in state.detail
    reports = backend.gather(sub, spec)
    assert [r.host for r in reports] == ["node-a"]
    assert reports[0].verdict is Verdict.INTERRUPTED
    assert [(c.name, c.status) for c in reports[0].checks] == [("steady", Status.PASS)]
    cluster = merge_reports(reports, run_id=spec.run_id, backend="ssh", started="now", expected_hosts=sub.hosts,
                            expected_nodes=2)
    assert [(n.host, n.state) for n in cluster.nodes] == [("node-a", NodeState.REPORTED),
                                                          ("node-b", NodeState.MISSING)]


def test_max_connections_runs_independent_hosts_in_turn(sshd: Sshd, tmp_path: Path) -> None:
    stamp = f"{PY} -c 'import time; print(time.time())'"
    cmd = ["/bin/sh", "-c", f'{stamp} > {tmp_path}/"$GPUACCEPT_HOSTNAME".start; sleep 1; '
                            f'{stamp} > {tmp_path}/"$GPUACCEPT_HOSTNAME".end']
    spec = make_spec(sshd, tmp_path, command=cmd, options={"max_connections": 1})
    backend, sub = launch(spec, Sink(), tmp_path)
    assert wait_done(backend, sub).ok

    def t(name: str) -> float:
        return float((tmp_path / name).read_text())

    assert t("node-a.start") < t("node-a.end") <= t("node-b.start") < t("node-b.end")


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_torchrun_two_nodes_all_reduce(sshd: Sshd, tmp_path: Path, rendezvous: str) -> None:
    """A real 2-node torch.distributed job (gloo on loopback): one torchrun per host, rendezvous on the first."""
    code = ("import os, torch, torch.distributed as dist; dist.init_process_group('gloo'); "
            "t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t); "
            "print(f'RESULT rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} "
            "host={os.environ[\"GPUACCEPT_HOSTNAME\"]}', flush=True); dist.destroy_process_group()")
    spec = make_spec(sshd, tmp_path, command=[PY, "-c", code], distributed=True, env={"GLOO_SOCKET_IFNAME": "lo"},
                     options={"rendezvous": rendezvous, "master_port": free_port()})
    sink = Sink()
    backend, sub = launch(spec, sink, tmp_path)
    state = wait_done(backend, sub, timeout=180)
    assert state.ok, "\n".join(sink.lines)
    results = sorted(line for line in sink.lines if "RESULT " in line)
    assert len(results) == 2, sink.lines
    assert all("world=2 sum=3" in line for line in results)
    if rendezvous == "static":  # ranks follow the host list
        assert any(line.startswith("[node-a] RESULT rank=0") and "host=node-a" in line for line in results)
        assert any(line.startswith("[node-b] RESULT rank=1") and "host=node-b" in line for line in results)
    else:
        assert {line.split("rank=")[1][0] for line in results} == {"0", "1"}


def test_time_limit_stops_the_job(sshd: Sshd, tmp_path: Path) -> None:
    spec = make_spec(sshd, tmp_path, command=pid_job(tmp_path), time_limit_min=1)
    backend, sub = launch(spec, Sink(), tmp_path)
    running = pids(tmp_path, "node-a", "node-b")
    sub.handle.time_limit_s = 0.5  # the limit is minutes; shortened so the test takes seconds
    state = wait_done(backend, sub, timeout=40)
    assert (state.state, state.ok) == ("TIMEOUT", False)
    assert state.detail.startswith("time limit of")
    wait_for(lambda: not any(alive(p) for p in running), 15, "the remote processes to end")


def test_a_users_control_master_does_not_hang_the_launch(sshd: Sshd, tmp_path: Path) -> None:
    """With the user's ``ControlMaster=auto``/``ControlPersist``, a master outlives the job; the launch still ends."""
    short = Path(tempfile.mkdtemp(prefix="gacm"))  # a socket path must fit in 108 bytes
    control = f"ControlPath={short}/%n"
    spec = make_spec(sshd, tmp_path, command=["/bin/echo", "hello"],
                     options={"ssh_options": ["ControlMaster=auto", "ControlPersist=60", control]})
    sink = Sink()
    try:
        backend, sub = launch(spec, sink, tmp_path)
        t0 = time.monotonic()
        state = wait_done(backend, sub, timeout=30)
        assert state.ok and time.monotonic() - t0 < 15
        assert {"[node-a] hello", "[node-b] hello"} <= set(sink.lines)
    finally:
        for host in ("node-a", "node-b"):
            subprocess.run(["ssh", "-F", str(sshd.ssh_config), "-o", control, "-O", "exit", host],
                           capture_output=True, timeout=10)
        shutil.rmtree(short, ignore_errors=True)


def test_torchrun_failure_stops_the_workers_on_the_other_host(sshd: Sshd, tmp_path: Path) -> None:
    """torchrun starts its workers in sessions of their own: stopping node-a must still reach its worker."""
    code = ("import os, sys, time; host = os.environ['GPUACCEPT_HOSTNAME']\n"
            "if host == 'node-b': sys.exit(3)\n"
            f"open({str(tmp_path / 'worker.pid')!r}, 'w').write(str(os.getpid())); time.sleep(300)")
    spec = make_spec(sshd, tmp_path, command=[PY, "-c", code], distributed=True,
                     options={"master_port": free_port()})
    sink = Sink()
    backend, sub = launch(spec, sink, tmp_path)
    pid_file = tmp_path / "worker.pid"
    wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip(), 60, "node-a's worker to start")
    worker = int(pid_file.read_text())
    state = wait_done(backend, sub, timeout=90)
    assert state.state == "FAILED" and "node-b: exit 1" in state.detail and "node-a: stopped" in state.detail, state
    wait_for(lambda: not alive(worker), 45, f"node-a's torchrun worker {worker} to end")
