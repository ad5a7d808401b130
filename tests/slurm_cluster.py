"""A real, private Slurm cluster on this host: munged, slurmctld and N slurmd (node1, node2 by default; node[1-N]).

Everything lives in one temporary directory: the munge key and socket, a
generated ``slurm.conf`` (free ports, state and spool directories, no
accounting, ``proctrack/pgid``, ``task/none``) and the daemons' logs. The
daemons run in the foreground as children of this process and are stopped
by their pids. With ``gpus_per_node=N`` every node also has N GPUs to schedule
(``GresTypes=gpu``, ``Gres=gpu:N``, a ``gres.conf`` with ``AutoDetect=off``);
Slurm 22.05 drops a GPU without a device file ("Removing file-less GPU"), so
each is a link to /dev/null. Clients reach the cluster through ``SLURM_CONF`` (see
:meth:`LocalSlurm.env`); nothing under /etc is read or changed.

Used by ``tests/test_launch_slurm.py``; ``python -m tests.slurm_cluster record DIR``
re-records the outputs under ``tests/data/slurm/`` (see the README there).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "sacct")
NODES = ("node1", "node2")


def missing_binaries() -> list[str]:
    return [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(count: int, consecutive: bool = False) -> list[int]:
    """``count`` free TCP ports on 127.0.0.1 (consecutive when asked: slurmd ports are a range)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        ports = [first + i for i in range(count)] if consecutive else [first]
        ok = True
        for p in ports[1:]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok and all(p < 65536 for p in ports):
            if not consecutive and count > 1:
                return ports + _free_ports(count - 1)
            return ports
    raise RuntimeError("no free ports")


class LocalSlurm:
    """Start with :meth:`start` (or as a context manager); :meth:`stop` ends every daemon it started."""

    def __init__(self, base: Path | None = None, nodes: int = len(NODES), extra_conf: Sequence[str] = (),
                 own_addresses: bool = False, gpus_per_node: int = 0) -> None:
        """``nodes``: how many slurmd (node1..nodeN). ``extra_conf``: more ``slurm.conf`` lines
        (``HealthCheckProgram=...``), written after the defaults and before the node and partition lines;
        ``{base}`` in them becomes the cluster's directory. ``own_addresses``: each node gets its own
        loopback address (node1 127.0.0.1, node2 127.0.0.2, ...), as nodes of a real cluster have, instead
        of all sharing 127.0.0.1. ``gpus_per_node``: give each node that many GPUs to schedule (``GresTypes=gpu``,
        ``Gres=gpu:N``, a ``gres.conf`` of ``Name=gpu Count=N File=...`` whose device files are links to
        /dev/null), so that jobs asking ``--gpus-per-node`` are accepted, scheduled and given
        ``CUDA_VISIBLE_DEVICES``; 0 (the default): no GRES at all."""
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, not {nodes}")
        self.nodes = tuple(f"node{i}" for i in range(1, nodes + 1))
        self.owns_base = base is None
        self.extra_conf = list(extra_conf)
        self.own_addresses = own_addresses
        if gpus_per_node < 0:
            raise ValueError(f"gpus_per_node is a count, not {gpus_per_node}")
        self.gpus_per_node = gpus_per_node
        self.base = Path(base or tempfile.mkdtemp(prefix="gpuaccept-slurm-"))
        self.base.chmod(0o755)
        self.conf = self.base / "slurm.conf"
        self.socket = self.base / "munge-run" / "munge.socket"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[IO[bytes]] = []
        self.user = getpass.getuser()

    # ------------------------------------------------------------------ set-up
    def env(self) -> dict[str, str]:
        """Environment for client commands (sbatch, squeue...) and for gpuaccept launching on this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def _write_config(self) -> None:
        ctl_port, = _free_ports(1)
        node_ports = _free_ports(len(self.nodes), consecutive=True)
        host = socket.gethostname().split(".")[0]
        cpus = os.cpu_count() or 1
        b = self.base
        for d in ("state", "log", *(f"spool/{n}" for n in self.nodes)):
            (b / d).mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join([
            f"# Generated by tests/slurm_cluster.py: a private {len(self.nodes)}-node cluster on one host.",
            "ClusterName=gpuaccept-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctl_port}",
            f"SlurmUser={self.user}",
            f"SlurmdUser={self.user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={b}/state",
            f"SlurmdSpoolDir={b}/spool/%n",
            f"SlurmctldPidFile={b}/slurmctld.pid",
            f"SlurmdPidFile={b}/slurmd-%n.pid",
            f"SlurmctldLogFile={b}/log/slurmctld.log",
            f"SlurmdLogFile={b}/log/slurmd-%n.log",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=300",
            *(["GresTypes=gpu"] if self.gpus_per_node else []),
            *(line.replace("{base}", str(b)) for line in self.extra_conf),
            *self._node_lines(host, node_ports, cpus),
            f"PartitionName=debug Nodes=node[1-{len(self.nodes)}] Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        if self.gpus_per_node:  # read by slurmctld and every slurmd from slurm.conf's directory
            (b / "dev").mkdir(exist_ok=True)
            for i in range(self.gpus_per_node):  # Slurm wants a device file per GPU: each is /dev/null
                link = b / "dev" / f"gpu{i}"
                if not link.is_symlink():
                    link.symlink_to("/dev/null")
            last = self.gpus_per_node - 1
            files = f"{b}/dev/gpu[0-{last}]" if last else f"{b}/dev/gpu0"
            (b / "gres.conf").write_text("\n".join([
                "# Generated by tests/slurm_cluster.py: GPUs that are links to /dev/null, nothing detected.",
                "AutoDetect=off",
                f"Name=gpu Count={self.gpus_per_node} File={files}",
                "",
            ]))

    def _node_lines(self, host: str, ports: list[int], cpus: int) -> list[str]:
        gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
        if not self.own_addresses:
            return [f"NodeName=node[1-{len(self.nodes)}] NodeHostname={host} NodeAddr=127.0.0.1 "
                    f"Port=[{ports[0]}-{ports[-1]}] CPUs={cpus}{gres} State=UNKNOWN"]
        return [f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.{i} Port={port} CPUs={cpus}{gres} State=UNKNOWN"
                for i, (n, port) in enumerate(zip(self.nodes, ports, strict=True), start=1)]

    def _err(self, name: str) -> IO[bytes]:
        fh = open(self.base / "log" / f"{name}.err", "wb")  # closed by stop()
        self.files.append(fh)
        return fh

    def _start_munge(self) -> None:
        keydir = self.base / "munge-etc"
        keydir.mkdir(mode=0o700, exist_ok=True)
        key = keydir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.socket.parent.mkdir(mode=0o755, exist_ok=True)
        self.socket.parent.chmod(0o755)
        self.procs.append(subprocess.Popen(
            [_which("munged"), "-F", f"--socket={self.socket}", f"--key-file={key}",
             f"--pid-file={self.socket.parent}/munged.pid", f"--log-file={self.base}/log/munged.log",
             f"--seed-file={keydir}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=self._err("munged")))
        self._wait(lambda: self.socket.exists(), 15, "munged did not create its socket")

    def start(self) -> LocalSlurm:
        self._write_config()
        try:
            self._start_munge()
            conf = ["-f", str(self.conf)]
            # Slurm finds gres.conf beside $SLURM_CONF (or under /etc/slurm), whatever -f says.
            env = self.env() if self.gpus_per_node else None
            self.procs.append(subprocess.Popen([_which("slurmctld"), "-D", *conf], stdout=subprocess.DEVNULL,
                                               stderr=self._err("slurmctld"), env=env))
            self._wait(lambda: self._run("sinfo", "-h").returncode == 0, 30, "slurmctld did not answer")
            for node in self.nodes:
                self.procs.append(subprocess.Popen([_which("slurmd"), "-D", "-N", node, *conf],
                                                   stdout=subprocess.DEVNULL,
                                                   stderr=self._err(f"slurmd-{node}"), env=env))
            self._wait(self._nodes_idle, 60, f"the {len(self.nodes)} slurmd did not become idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _nodes_idle(self) -> bool:
        r = self._run("sinfo", "-h", "-N", "-o", "%N %t")
        states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(n) == "idle" for n in self.nodes)

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{what}: {p.args[0]} exited with {p.returncode}; {self.log_tail()}")
            time.sleep(0.3)
        raise RuntimeError(f"{what} in {timeout:g} s; {self.log_tail()}")

    def log_tail(self) -> str:
        out = []
        for path in sorted((self.base / "log").glob("*")):
            try:
                lines = path.read_text(errors="replace").splitlines()[-5:]
            except OSError:
                continue
            out.append(f"{path.name}: " + " | ".join(lines))
        return "; ".join(out)

    # ------------------------------------------------------------------ use
    def _run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env(), timeout=timeout,
                              check=False, cwd=self.base)

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return self._run(*argv, timeout=timeout)

    def wait_job(self, job_id: str, timeout: float = 120) -> str:
        """Wait until the job left the queue; its final JobState from ``scontrol show job``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._run("squeue", "-h", "-j", job_id).stdout.strip():
                out = self._run("scontrol", "show", "job", "-o", job_id).stdout
                for word in out.split():
                    if word.startswith("JobState="):
                        return word.split("=", 1)[1]
                return "UNKNOWN"
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} still queued after {timeout:g} s")

    def queued_jobs(self) -> list[str]:
        return [x for x in self._run("squeue", "-h", "-o", "%i").stdout.split() if x]

    def stop(self) -> None:
        """scancel what is left, then SIGTERM (SIGKILL after 10 s) to each daemon started here, newest first.

        The temporary directory is removed when this object created it.
        """
        if self.conf.exists() and any(p.poll() is None for p in self.procs):
            try:
                self._run("scancel", "--user", self.user, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
        for fh in self.files:
            fh.close()
        self.files.clear()
        if self.owns_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


# ---------------------------------------------------------------------- recording

def record(out: Path) -> None:
    """Record the outputs the parsers are tested on (see tests/data/slurm/README.md)."""
    out.mkdir(parents=True, exist_ok=True)
    with LocalSlurm() as c:
        def save(name: str, text: str) -> None:
            (out / name).write_text(text)
            print(f"recorded {name}")

        r = c.run("sbatch", "--parsable", "--hold", "-N2", "--wrap", "sleep 30")
        save("sbatch_parsable.txt", r.stdout)
        held = r.stdout.strip()
        save("squeue_pending.txt", c.run("squeue", "-h", "-j", held, "-o", "%i|%T|%N|%r").stdout)
        save("scontrol_job_pending.txt", c.run("scontrol", "show", "job", "-o", held).stdout)
        c.run("scontrol", "release", held)
        deadline = time.monotonic() + 30
        while "RUNNING" not in c.run("squeue", "-h", "-j", held, "-o", "%T").stdout and time.monotonic() < deadline:
            time.sleep(0.3)
        save("squeue_running.txt", c.run("squeue", "-h", "-j", held, "-o", "%i|%T|%N|%r").stdout)
        save("scontrol_job_running.txt", c.run("scontrol", "show", "job", held).stdout)
        c.run("scancel", held)
        c.wait_job(held)
        save("scontrol_job_cancelled.txt", c.run("scontrol", "show", "job", "-o", held).stdout)

        r = c.run("sbatch", "-N2", "--wrap", "srun hostname")
        save("sbatch_plain.txt", r.stdout)
        ok = r.stdout.split()[-1]
        c.wait_job(ok)
        save("squeue_left.txt", c.run("squeue", "-h", "-j", ok, "-o", "%i|%T|%N|%r").stdout)
        save("scontrol_job_completed.txt", c.run("scontrol", "show", "job", "-o", ok).stdout)

        bad = c.run("sbatch", "--parsable", "-N2", "--wrap", "srun sh -c 'exit 3'").stdout.strip()
        c.wait_job(bad)
        save("scontrol_job_failed.txt", c.run("scontrol", "show", "job", "-o", bad).stdout)

        save("squeue_invalid_job.stderr.txt", c.run("squeue", "-h", "-j", "999999").stderr)
        save("sacct_no_accounting.stderr.txt", c.run("sacct", "-j", ok, "-X", "-n", "-P", "-o",
                                                     "JobID,State,ExitCode,NodeList").stderr)
        save("sbatch_invalid_partition.stderr.txt", c.run("sbatch", "-p", "nosuch", "--wrap", "true").stderr)
        save("scontrol_hostnames.txt", c.run("scontrol", "show", "hostnames", "node[1-2]").stdout)


def record_nodes(out: Path) -> None:
    """Record what ``scontrol show node`` prints in the states healthcheck reads (``scontrol_node_*.txt``)."""
    out.mkdir(parents=True, exist_ok=True)
    with LocalSlurm() as c:
        def save(name: str, text: str) -> None:
            (out / name).write_text(text)
            print(f"recorded {name}")

        save("scontrol_node_idle.txt", c.run("scontrol", "show", "node", "-o", "node1").stdout)
        c.run("scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=gpuaccept: compute: injected fault")
        save("scontrol_node_drained_ours.txt", c.run("scontrol", "show", "node", "-o", "node1").stdout)
        save("scontrol_node_drained_multiline.txt", c.run("scontrol", "show", "node", "node1").stdout)
        c.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=bad DIMM, ticket 4711")
        save("scontrol_node_drained_admin.txt", c.run("scontrol", "show", "node", "-o", "node2").stdout)
        c.run("scontrol", "update", "NodeName=node2", "State=RESUME")
        job = c.run("sbatch", "--parsable", "-w", "node2", "-n1", "--wrap", "sleep 60").stdout.strip()
        deadline = time.monotonic() + 30
        while "RUNNING" not in c.run("squeue", "-h", "-j", job, "-o", "%T").stdout and time.monotonic() < deadline:
            time.sleep(0.3)
        c.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=gpuaccept: health: XID 79 on GPU 3")
        save("scontrol_node_draining_job.txt", c.run("scontrol", "show", "node", "-o", "node2").stdout)
        c.run("scancel", job)
        save("scontrol_node_unknown.txt", c.run("scontrol", "show", "node", "-o", "nosuch").stdout)
        save("scontrol_update_unknown.stderr.txt",
             c.run("scontrol", "update", "NodeName=nosuch", "State=RESUME").stderr)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    r = subprocess.run(["scontrol", "show", "node", "-o", "node1"], capture_output=True, text=True, env=env,
                       check=False, cwd="/")
    save_plain = out / "scontrol_no_cluster.stderr.txt"
    save_plain.write_text(r.stderr)
    print(f"recorded {save_plain.name} (exit {r.returncode})")


def record_sweep(out: Path) -> None:
    """Record what ``gpuaccept sweep slurm`` reads: ``sinfo --Node`` with nodes idle, allocated, drained and
    draining, and ``squeue`` of a pending and a running sweep job (``sinfo_sweep_*.txt``, ``squeue_sweep_*.txt``)."""
    from gpuaccept.sweep.plan import JOB_NAME, SINFO_FORMAT, SQUEUE_FORMAT

    out.mkdir(parents=True, exist_ok=True)
    with LocalSlurm(nodes=4) as c:
        def save(name: str, text: str) -> None:
            (out / name).write_text(text)
            print(f"recorded {name}")

        sinfo = ("sinfo", "--Node", "--noheader", f"--format={SINFO_FORMAT}")
        squeue = ("squeue", "--noheader", f"--name={JOB_NAME}", f"--format={SQUEUE_FORMAT}")
        save("sinfo_sweep_all_idle.txt", c.run(*sinfo).stdout)
        busy = c.run("sbatch", "--parsable", "-w", "node2", "--exclusive", "--wrap", "sleep 120").stdout.strip()
        draining = c.run("sbatch", "--parsable", "-w", "node4", "--exclusive", "--wrap", "sleep 120").stdout.strip()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and c.run("squeue", "-h", "-t", "R", "-o", "%i").stdout.split() != [busy,
                                                                                                        draining]:
            time.sleep(0.3)
        c.run("scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=bad DIMM")
        c.run("scontrol", "update", "NodeName=node4", "State=DRAIN", "Reason=gpuaccept: memory: injected")
        save("sinfo_sweep_mixed.txt", c.run(*sinfo).stdout)
        held = c.run("sbatch", "--parsable", f"--job-name={JOB_NAME}", "-w", "node1", "--hold", "--wrap",
                     "true").stdout.strip()
        running = c.run("sbatch", "--parsable", f"--job-name={JOB_NAME}", "-w", "node2", "--wrap",
                        "sleep 60").stdout.strip()
        save("squeue_sweep.txt", c.run(*squeue).stdout)
        for job in (busy, draining, held, running):
            c.run("scancel", job)


if __name__ == "__main__":
    recorders = {"record": record, "record-nodes": record_nodes, "record-sweep": record_sweep}
    if len(sys.argv) != 3 or sys.argv[1] not in recorders:
        sys.exit("usage: python -m tests.slurm_cluster record|record-nodes|record-sweep DIR")
    recorders[sys.argv[1]](Path(sys.argv[2]))
