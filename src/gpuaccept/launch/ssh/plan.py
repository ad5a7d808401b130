"""The pure parts of an ssh launch: which host is which node, and the ssh/scp command lines."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpuaccept.errors import ConfigError
from gpuaccept.launch.hosts import Host, host_labels, safe_dirname
from gpuaccept.launch.jobargv import port_from
from gpuaccept.launch.spec import JobSpec
from gpuaccept.launch.ssh.options import SshOptions

SCRIPT_NAME = "ssh-node.sh"
KILL_GRACE_S = 45
"""Seconds between TERM and KILL of a job's process group on a host. torchrun gives its workers (each in
its own session, out of reach of our group kill) 30 s after TERM; KILLing it sooner would orphan them."""
SETUP_FAILED = 97
"""Exit code of the node script when it cannot create its directory or enter the working directory."""

@dataclass(frozen=True)
class NodeSlot:
    """One host's place in the job: rank, label (report attribution), directory name and process count (None:
    one per GPU of the host, counted there)."""

    rank: int
    host: Host
    label: str
    dirname: str
    nproc: int | None


def uses_torchrun(spec: JobSpec) -> bool:
    """torchrun when ``spec.distributed`` (the rule of :mod:`gpuaccept.launch.jobargv`)."""
    return spec.distributed


def layout(spec: JobSpec, opts: SshOptions) -> list[NodeSlot]:
    """The nodes of the job: the first ``spec.nodes`` hosts, in list order (as the mpi backend).

    Raises ConfigError when there are fewer hosts than nodes.
    """
    if spec.nodes > len(opts.hosts):
        shown = ", ".join(h.name for h in opts.hosts[:4]) + (", ..." if len(opts.hosts) > 4 else "")
        raise ConfigError("--nodes", str(spec.nodes),
                          f"the ssh backend runs one node per host and only {len(opts.hosts)} host(s) were given "
                          f"({shown})")
    hosts = list(opts.hosts[:spec.nodes])
    labels = host_labels(hosts)
    dirs = [safe_dirname(lb) for lb in labels]
    if len(set(dirs)) != len(dirs):
        raise ConfigError("hosts", ", ".join(labels), "two host labels map to the same directory name")
    per_node = spec.nproc or (None if uses_torchrun(spec) else 1)
    return [NodeSlot(i, h, lb, d, h.slots or per_node)
            for i, (h, lb, d) in enumerate(zip(hosts, labels, dirs, strict=True))]


def master_port(spec: JobSpec, opts: SshOptions) -> int:
    """``--master-port``, or one derived from the run id (29500-49499), so concurrent runs rarely collide."""
    return opts.master_port or port_from(spec.run_id, 29500, 20000)


def master_addr(opts: SshOptions) -> str:
    """Where the other hosts reach the first: ``--master-addr`` or the first host's name."""
    return opts.master_addr or opts.hosts[0].name


def remote_run_dir(spec: JobSpec, opts: SshOptions) -> str:
    """``REMOTE_DIR/RUN_ID`` on every host (may start with ``~/``)."""
    return f"{opts.remote_dir.rstrip('/') or '/'}/{spec.run_id}".replace("//", "/")


def sh_path(path: str) -> str:
    """A remote path as a shell word: quoted, with a leading ``~/`` as ``"$HOME"/``."""
    return '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def scp_path(path: str) -> str:
    """A remote path for scp: ``~/x`` becomes ``x`` (scp starts in the home directory)."""
    return path[2:] if path.startswith("~/") else path


def _connection_args(opts: SshOptions, host: Host, *, scp: bool = False) -> list[str]:
    """Options shared by ssh and scp. The user's ``-o`` come first: ssh keeps the first value it sees.

    ``ControlMaster=no`` reuses a multiplexed connection the user already has
    but never leaves a ``ControlPersist`` master behind holding our pipes open.
    """
    args: list[str] = []
    if opts.ssh_config:
        args += ["-F", opts.ssh_config]
    for opt in opts.ssh_options:
        args += ["-o", opt]
    args += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={opts.connect_timeout_s}",
             "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-o", "ControlMaster=no"]
    identity = host.identity or opts.identity
    port = host.port or opts.port
    user = host.user or opts.user
    if identity:
        args += ["-i", identity]
    if port:
        args += ["-P" if scp else "-p", str(port)]
    if user:
        args += ["-o", f"User={user}"] if scp else ["-l", user]
    return args


def ssh_argv(opts: SshOptions, host: Host, remote_command: str) -> list[str]:
    """``ssh`` argv that runs ``remote_command`` (a shell command line) on ``host``, without a tty."""
    return ["ssh", *_connection_args(opts, host), "-T", "--", host.name, remote_command]


def run_argv(opts: SshOptions, slot: NodeSlot) -> list[str]:
    """The per-host launch: the node script arrives on standard input."""
    return ssh_argv(opts, slot.host, "exec /bin/sh -s -- " + shlex.join(
        [str(slot.rank), slot.label, slot.dirname, str(slot.nproc or "gpu")]))


def scp_argv(opts: SshOptions, host: Host, remote_path: str, local_path: str) -> list[str]:
    name = f"[{host.name}]" if host.is_ipv6 else host.name
    return ["scp", "-r", "-q", *_connection_args(opts, host, scp=True), "--", f"{name}:{remote_path}", local_path]


def kill_command(run_dir: str, dirname: str) -> str:
    """Remote: TERM the job's process group named in ``job.pid`` and return at once.

    A detached helper KILLs the group after the grace period if ``job.pid``
    (removed when the job ends) still names it. ``kill -SIG -PGID``, not
    ``kill -SIG -- -PGID``: dash's kill takes no ``--``.
    """
    script = (
        f"f={sh_path(f'{run_dir}/{dirname}/job.pid')}; "
        '[ -r "$f" ] || exit 0; p=$(cat "$f"); '
        'case "$p" in ""|*[!0-9]*) exit 0;; esac; '
        'kill -TERM "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || exit 0; '
        f'( sleep {KILL_GRACE_S}; [ "$(cat "$f" 2>/dev/null)" = "$p" ] && kill -KILL "-$p" ) '
        '</dev/null >/dev/null 2>&1 & exit 0'
    )
    return "exec /bin/sh -c " + shlex.quote(script)
