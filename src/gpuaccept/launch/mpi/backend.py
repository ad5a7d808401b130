"""The mpi backend: ``mpirun`` (Open MPI) with a hostfile, ``-x`` environment and MCA transport options.

Used for nccl-tests and MPI programs, and for the suite on hosts reached
by mpirun's own ssh. Ranks per host: ``spec.nproc`` when the job is
distributed (a user command by default), else one (the suite). Ranks fill
hosts in hostfile order (``--map-by ppr:P:node``), so rank ``r`` runs on
host ``r // P``; each rank gets ``GPUACCEPT_HOSTNAME`` = that host's name as
listed, so reports are attributed to the names the operator gave.

A distributed job (the suite on 2+ hosts, a command under mpirun) gets
``MASTER_ADDR`` = the first host (``--master-addr`` when the hosts are ssh aliases
that the ranks cannot resolve) and ``MASTER_PORT`` (derived from the run id, or
``--master-port``) with ``-x``, so that the ranks can meet; ``PATH`` and ``LD_LIBRARY_PATH`` are
always forwarded (as mpi-operator's examples do).

Transport: ``--transport tcp`` selects ``pml ob1`` with ``btl tcp,self,vader``
(``tcp,self,sm`` under Open MPI 5, where ``vader`` is a deprecated alias; the
version is read from ``mpirun --version`` when the plan is made),
``--transport ucx`` (InfiniBand/RoCE) selects ``pml ucx``; ``--net-if`` sets
``btl_tcp_if_include`` and ``oob_tcp_if_include``; ``--ib-devices`` sets
``UCX_NET_DEVICES``; ``--mca KEY=VALUE`` passes anything else.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from gpuaccept.errors import ConfigError, UsageError
from gpuaccept.launch.base import Backend, JobState, Plan, Submission
from gpuaccept.launch.hosts import Host, check_unique, parse_host_list, parse_hostfile
from gpuaccept.launch.jobargv import launch_dir, node_argv, port_from
from gpuaccept.launch.spec import JobSpec, env_names

HOSTFILE = "hostfile"
KILL_GRACE_S = 10.0
_MCA_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
_IFACES = re.compile(r"^[A-Za-z0-9_.:/,-]+$")
_ADDR = re.compile(r"^[A-Za-z0-9_.:-]+$")
TRANSPORTS = ("auto", "tcp", "ucx")
#: Forwarded to every rank with ``-x`` besides the job's environment, as mpi-operator's examples do.
ALWAYS_FORWARD = ("PATH", "LD_LIBRARY_PATH")
_VERSION = re.compile(r"\(Open MPI\)\s+(\d+)\.")


def open_mpi_major(version_text: str) -> int | None:
    """The major version from ``mpirun --version`` output (``mpirun (Open MPI) 4.1.4``); None if not Open MPI."""
    m = _VERSION.search(version_text)
    return int(m.group(1)) if m else None


def shared_memory_btl(major: int | None) -> str:
    """The shared-memory BTL's name: ``sm`` from Open MPI 5 on, ``vader`` before (and when unknown: 5.x still
    takes it as a deprecated alias)."""
    return "sm" if major is not None and major >= 5 else "vader"

# Set GPUACCEPT_HOSTNAME from the rank: rank r runs on host r // ranks-per-host.
_NAME_RANK = ('i=$(( ${OMPI_COMM_WORLD_RANK:-0} / ${GPUACCEPT_MPI_RANKS_PER_HOST:-1} + 1 )); '
              'GPUACCEPT_HOSTNAME=$(printf %s "$GPUACCEPT_MPI_HOSTS" | cut -d, -f"$i"); '
              'export GPUACCEPT_HOSTNAME; exec "$@"')


def _mca(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not _MCA_KEY.match(key) or not value or "\n" in value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an MCA parameter KEY=VALUE, e.g. btl_tcp_if_include=eth0")
    return key, value


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def _addr(text: str) -> str:
    if not _ADDR.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name or address")
    return text


def _ifaces(text: str) -> str:
    if not _IFACES.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of interfaces or subnets (eth0,ib0 or 10.0.0.0/8)")
    return text



@dataclass(frozen=True)
class MpiOptions:
    """Validated mpi backend options. ``hosts`` are names as mpirun should reach them."""

    hosts: tuple[str, ...] = ("localhost",)
    slots: tuple[int | None, ...] = (None,)
    mpirun: str = "mpirun"
    transport: str = "auto"
    net_if: str | None = None
    ib_devices: str | None = None
    mca: tuple[tuple[str, str], ...] = ()
    forward_env: tuple[str, ...] = ()
    oversubscribe: bool = False
    allow_run_as_root: bool = False
    bind_to: str = "none"
    mpi_args: tuple[str, ...] = ()
    ompi_major: int | None = None
    master_addr: str | None = None
    master_port: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MpiOptions:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError("mpi options", unknown[0], f"unknown option; known: {', '.join(sorted(known))}")
        v: dict[str, Any] = {k: d[k] for k in d if d[k] is not None}
        try:
            if "hosts" in v:
                v["hosts"] = tuple(str(h) for h in v["hosts"])
                v["slots"] = tuple(v.get("slots") or [None] * len(v["hosts"]))
                if not v["hosts"] or len(v["slots"]) != len(v["hosts"]):
                    raise argparse.ArgumentTypeError("hosts and slots must be non-empty lists of equal length")
                for h in v["hosts"]:
                    parse_host_list(h, "hosts")
            if v.get("transport", "auto") not in TRANSPORTS:
                raise argparse.ArgumentTypeError(f"transport must be one of {', '.join(TRANSPORTS)}")
            if "net_if" in v:
                _ifaces(str(v["net_if"]))
            if "ib_devices" in v:
                _ifaces(str(v["ib_devices"]))
            v["mca"] = tuple(tuple(kv) if not isinstance(kv, str) else _mca(kv) for kv in v.get("mca", ()))
            v["forward_env"] = tuple(n for x in v.get("forward_env", ()) for n in env_names(str(x)))
            v["mpi_args"] = tuple(str(a) for a in v.get("mpi_args", ()))
            for a in v["mpi_args"]:
                if not a.startswith("-"):
                    raise argparse.ArgumentTypeError(f"extra mpirun argument {a!r} must start with '-'")
            if v.get("ompi_major") is not None and (isinstance(v["ompi_major"], bool)
                                                    or not isinstance(v["ompi_major"], int)):
                raise argparse.ArgumentTypeError(f"ompi_major must be an integer, got {v['ompi_major']!r}")
            if "master_addr" in v and not _ADDR.match(str(v["master_addr"])):
                raise argparse.ArgumentTypeError(f"master_addr {v['master_addr']!r} is not a host name or address")
            if "master_port" in v:
                v["master_port"] = _port(str(v["master_port"]))
            if v.get("bind_to", "none") not in ("none", "core", "socket", "numa", "hwthread"):
                raise argparse.ArgumentTypeError("bind_to must be none, core, socket, numa or hwthread")
        except argparse.ArgumentTypeError as exc:
            raise ConfigError("mpi options", "", str(exc)) from None
        return cls(**v)


def _mpi_hosts(hosts: list[Host], source: str) -> tuple[list[str], list[int | None]]:
    check_unique(hosts, source)
    for h in hosts:
        if h.port is not None or h.identity is not None or h.user is not None:
            raise ConfigError(source, str(h).split()[0], "mpirun reaches hosts with ssh: set User, Port and "
                                                         "IdentityFile in ~/.ssh/config, not in the host list")
    return [h.name for h in hosts], [h.slots for h in hosts]


def _slots_per_host(slots: tuple[int | None, ...]) -> int:
    """Ranks per host when the launch gave no count: the hostfile's ``slots=N``, the same on every host
    (mpirun needs the count before it starts; the hosts' GPUs cannot be counted here)."""
    if slots and None not in slots and len(set(slots)) == 1:
        return int(slots[0] or 1)
    from gpuaccept.launch.gpucount import HINT

    raise ConfigError("--gpus-per-node", "", "mpirun starts a fixed number of ranks per host and the hosts do not "
                                             f"all list the same slots=N (their GPUs): {HINT}")


class MpiBackend(Backend):
    name: ClassVar[str] = "mpi"
    help: ClassVar[str] = "mpirun (Open MPI) with a hostfile: MPI programs, nccl-tests"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("mpi options")
        src = g.add_mutually_exclusive_group()
        src.add_argument("--hosts", default=None, metavar="H1,H2", help="hosts (default: localhost)")
        src.add_argument("--hostfile", default=None, metavar="FILE",
                         help="one host per line, optional slots=N (Open MPI format)")
        g.add_argument("--mpirun", default=None, metavar="PATH", help="the mpirun to use (default: mpirun)")
        g.add_argument("--transport", choices=TRANSPORTS, default=None,
                       help="tcp: pml ob1 + btl tcp; ucx: pml ucx (InfiniBand/RoCE); auto: Open MPI decides")
        g.add_argument("--net-if", type=_ifaces, default=None, metavar="IFACES",
                       help="TCP interfaces or subnets (btl_tcp_if_include, oob_tcp_if_include)")
        g.add_argument("--ib-devices", type=_ifaces, default=None, metavar="DEVS",
                       help="UCX_NET_DEVICES, e.g. mlx5_0:1,mlx5_1:1")
        g.add_argument("--mca", action="append", type=_mca, default=None, metavar="KEY=VALUE",
                       help="an MCA parameter (repeatable)")
        g.add_argument("--forward-env", action="append", type=env_names, default=None, metavar="A,B",
                       help="forward these variables of this shell to every rank (-x NAME)")
        g.add_argument("--oversubscribe", action="store_true", default=None,
                       help="allow more ranks than slots (e.g. 2 ranks on a 1-core test machine)")
        g.add_argument("--bind-to", choices=("none", "core", "socket", "numa", "hwthread"), default=None,
                       help="process binding (default: none; the suite uses all cores of its node)")
        g.add_argument("--master-addr", type=_addr, default=None, metavar="ADDR",
                       help="MASTER_ADDR of a distributed job (default: the first host as listed; give an "
                            "address when the hosts are ssh aliases the ranks cannot resolve)")
        g.add_argument("--master-port", type=_port, default=None, metavar="PORT",
                       help="MASTER_PORT (default: derived from the run id, 29500-49499)")
        g.add_argument("--mpi-arg", dest="mpi_args", action="append", default=None, metavar="ARG",
                       help="an extra mpirun argument (repeatable)")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if getattr(args, "hostfile", None):
            path = Path(args.hostfile).expanduser()
            try:
                text = path.read_text()
            except OSError as exc:
                raise ConfigError("--hostfile", str(path), f"cannot read: {exc.strerror}") from None
            hosts, slots = _mpi_hosts(parse_hostfile(text, str(path)), str(path))
            d["hosts"], d["slots"] = hosts, slots
        elif getattr(args, "hosts", None):
            hosts, slots = _mpi_hosts(parse_host_list(args.hosts), "--hosts")
            d["hosts"], d["slots"] = hosts, slots
        for key in ("mpirun", "transport", "net_if", "ib_devices", "oversubscribe", "bind_to", "master_addr",
                    "master_port"):
            if getattr(args, key, None) is not None:
                d[key] = getattr(args, key)
        if getattr(args, "mca", None):
            d["mca"] = [list(kv) for kv in args.mca]
        if getattr(args, "forward_env", None):
            d["forward_env"] = [n for group in args.forward_env for n in group]
        if getattr(args, "mpi_args", None):
            d["mpi_args"] = list(args.mpi_args)
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            d["allow_run_as_root"] = True
        if d.get("transport") == "tcp":  # the shared-memory BTL was renamed in Open MPI 5
            d["ompi_major"] = _installed_major(str(d.get("mpirun", "mpirun")))
        MpiOptions.from_dict(d)
        return d

    def plan(self, spec: JobSpec) -> Plan:
        opts = MpiOptions.from_dict(spec.options)
        if spec.image or spec.mounts:
            raise ConfigError("--image" if spec.image else "--mount", "",
                              "the mpi backend runs no containers; use slurm (Pyxis) or k8s (MPIJob)")
        if spec.nodes > len(opts.hosts):
            raise ConfigError("--nodes", str(spec.nodes), f"only {len(opts.hosts)} host(s) given "
                                                          f"({', '.join(opts.hosts)}); list more with --hosts")
        hosts = list(opts.hosts[:spec.nodes])
        per_host = (spec.nproc or _slots_per_host(opts.slots[:spec.nodes])) if spec.distributed else 1
        lines = []
        for h, slots in zip(hosts, opts.slots[:spec.nodes], strict=True):
            if slots is not None and slots < per_host and not opts.oversubscribe:
                raise ConfigError("hostfile", h, f"has slots={slots} but the job runs {per_host} rank(s) per host "
                                                 "(lower --procs-per-node or add --oversubscribe)")
            lines.append(f"{h} slots={max(slots or 0, per_host)}")
        hostfile = "# gpuaccept launch mpi: ranks fill hosts in this order\n" + "\n".join(lines) + "\n"

        argv = [opts.mpirun, "--hostfile", f"{launch_dir(spec)}/{HOSTFILE}", "-np", str(per_host * spec.nodes),
                "--map-by", f"ppr:{per_host}:node", "--bind-to", opts.bind_to]
        if opts.allow_run_as_root:
            argv.append("--allow-run-as-root")
        if opts.oversubscribe:
            argv.append("--oversubscribe")
        if spec.workdir:
            argv += ["--wdir", spec.workdir]
        mca: list[tuple[str, str]] = []
        if opts.transport == "tcp":
            mca += [("pml", "ob1"), ("btl", f"tcp,self,{shared_memory_btl(opts.ompi_major)}")]
        elif opts.transport == "ucx":
            mca += [("pml", "ucx"), ("btl", "^openib")]
        if opts.net_if:
            mca += [("btl_tcp_if_include", opts.net_if), ("oob_tcp_if_include", opts.net_if)]
        mca += list(opts.mca)
        for key, value in mca:
            argv += ["--mca", key, value]
        env = {"GPUACCEPT_MPI_HOSTS": ",".join(hosts), "GPUACCEPT_MPI_RANKS_PER_HOST": str(per_host)}
        if opts.ib_devices:
            env["UCX_NET_DEVICES"] = opts.ib_devices
        if spec.distributed:  # rank 0 runs on the first host; the ranks meet there
            env["MASTER_ADDR"] = opts.master_addr or hosts[0]
            env["MASTER_PORT"] = str(opts.master_port or port_from(spec.run_id, 29500, 20000))
        env.update(spec.env)
        for name, value in env.items():
            argv += ["-x", f"{name}={value}"]
        for name in dict.fromkeys([*ALWAYS_FORWARD, *opts.forward_env]):
            if name not in env:
                argv += ["-x", name]
        argv += list(opts.mpi_args)
        argv += ["sh", "-c", _NAME_RANK, "gpuaccept-rank", *node_argv(spec)]
        notes = [f"{per_host * spec.nodes} rank(s): {per_host} per host on {', '.join(hosts)}"]
        if spec.command is None:
            notes.append(f"every host writes under {spec.run_results_dir}: it must be shared (or local to one host)")
        return Plan(backend=self.name, files={HOSTFILE: hostfile}, commands=[argv], expected_hosts=hosts,
                    notes=notes)

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        mpirun = plan.commands[0][0]
        if shutil.which(mpirun) is None:
            raise UsageError(f"{mpirun} not found: install Open MPI (openmpi-bin) or pass --mpirun PATH")

    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        log = workdir / "mpirun.log"
        fh = open(log, "wb")  # kept open while mpirun runs
        try:
            proc = subprocess.Popen(plan.commands[0], stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    cwd=workdir, start_new_session=True)
        except OSError as exc:
            fh.close()
            raise UsageError(f"cannot start {plan.commands[0][0]}: {exc.strerror}") from None
        return Submission(backend=self.name, job_id=f"pid{proc.pid}", handle=_Mpirun(proc, log, fh),
                          hosts=list(plan.expected_hosts))

    def poll(self, submission: Submission) -> JobState:
        h: _Mpirun = submission.handle
        code = h.proc.poll()
        if code is None:
            return JobState("RUNNING", done=False)
        h.close()
        if code == 0:
            return JobState("COMPLETED", done=True, ok=True)
        return JobState("FAILED", done=True, ok=False, detail=f"mpirun exit {code}")

    def cancel(self, submission: Submission) -> None:
        """SIGTERM to mpirun (it forwards to every rank), SIGKILL to its process group after 10 s."""
        h: _Mpirun = submission.handle
        if h.proc.poll() is None:
            try:
                os.kill(h.proc.pid, signal.SIGTERM)
                h.proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(h.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                h.proc.wait()
            except ProcessLookupError:
                pass
        h.close()

    def logs(self, submission: Submission) -> str:
        h: _Mpirun = submission.handle
        try:
            return "\n".join(h.log.read_text(errors="replace").splitlines()[-40:])
        except OSError:
            return ""


def _installed_major(mpirun: str) -> int | None:
    """Open MPI's major version from ``mpirun --version``; None when it cannot be run or is not Open MPI."""
    try:
        r = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return open_mpi_major(r.stdout + r.stderr)


@dataclass
class _Mpirun:
    proc: subprocess.Popen[bytes]
    log: Path
    fh: IO[bytes]
    closed: bool = field(default=False)

    def close(self) -> None:
        if not self.closed:
            self.fh.close()
            self.closed = True
