"""The ssh backend: one process per host over OpenSSH, output streamed with a ``[host]`` prefix, reports fetched by scp.

What runs on each host (the rule of :mod:`gpuaccept.launch.jobargv`)
    * ``spec.distributed`` False (the default for the suite): the job once per
      host, the suite as ``PYTHON -m gpuaccept run ...``, which drives every
      GPU of its node itself; ``NODE_RANK``, ``NNODES``, ``MASTER_ADDR`` and
      ``MASTER_PORT`` are exported for commands that start their own ranks;
    * ``spec.distributed`` True (the default for a command): one torchrun per
      host (``PYTHON -m torch.distributed.run ... [--no-python] JOB``) with
      static rendezvous on the first host (``--node-rank`` = position in the
      host list, so ranks are reproducible) or, with ``--rendezvous c10d``, a
      c10d store there (ranks in arrival order). The port is
      ``--master-port`` or derived from the run id; the address is
      ``--master-addr`` or the first host's ``HostName`` in the ssh config.

    ``PYTHON`` is ``--remote-python`` or ``spec.python``.

How
    The plan holds one POSIX sh script, ``ssh-node.sh``, the same for every
    host, and one ``ssh ... HOST exec /bin/sh -s -- RANK LABEL DIR NPROC``
    argv per host, whose standard input is the script. The script creates the
    remote node directory ``REMOTE_DIR/RUN_ID/LABEL``, changes to the working
    directory, exports the environment, starts the job in a new session
    (its own process group, pid in ``job.pid``) and keeps reading its
    standard input: when that ends (Ctrl-C, cancel, a lost connection, even
    a SIGKILLed launcher) it stops the job's process group: TERM, then KILL
    after 45 s (torchrun needs up to 30 s to stop its workers, which run in
    sessions of their own). Cancel also sends the TERM through a second ssh.

    Before anything starts (``check_ready``), a preflight connects to every host
    (``BatchMode``, ``ConnectTimeout``) and checks the working directory,
    the remote Python and the module the job needs; any failure is an
    InputError (exit 2) naming each host, and nothing is started.

    Fan-out is bounded by ``--max-connections``: independent jobs (the suite,
    non-distributed commands) run in a sliding window; a distributed job needs
    every host at once, so more hosts than the bound is a ConfigError. A
    distributed job stops the other hosts when one fails (``--no-fail-fast``
    keeps them).

    Reports come back with ``scp -r`` from ``REMOTE_DIR/RUN_ID/LABEL`` into
    ``RESULTS_DIR/RUN_ID/LABEL`` (no shared file system assumed) and are
    attributed to the host label (``GPUACCEPT_HOSTNAME`` is exported too).
    Each host's output is also kept in ``LABEL.log`` in the launch directory.

The remote login shell must be a POSIX shell (sh, bash, dash, ksh, zsh).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, TextIO

from gpuaccept.errors import ConfigError, InputError, UsageError
from gpuaccept.launch.base import Backend, JobState, Plan, Submission, read_reports
from gpuaccept.launch.hosts import (
    Host,
    check_unique,
    host_labels,
    parse_host_list,
    parse_hostfile,
    parse_ssh_config,
    resolve_alias,
    safe_dirname,
    select_aliases,
)
from gpuaccept.launch.jobargv import port_from
from gpuaccept.launch.spec import JobSpec
from gpuaccept.model import NodeReport

SCRIPT_NAME = "ssh-node.sh"
DEFAULT_REMOTE_DIR = "/tmp/gpuaccept"
DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_CONNECT_TIMEOUT_S = 10
KILL_GRACE_S = 45
"""Seconds between TERM and KILL of a job's process group on a host. torchrun gives its workers (each in
its own session, out of reach of our group kill) 30 s after TERM; KILLing it sooner would orphan them."""
LOCAL_GRACE_S = 15
"""Seconds a stop waits for the ssh sessions to end before terminating the local ssh clients
(the remote clean-up goes on without them)."""
SETUP_FAILED = 97
"""Exit code of the node script when it cannot create its directory or enter the working directory."""
TAIL_LINES = 20

_SAFE_PATH = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/+=@,-"
_FLAGS = {
    "hosts": "--hosts", "ssh_config": "--ssh-config", "user": "--user", "port": "--port", "identity": "--identity",
    "ssh_options": "--ssh-option", "connect_timeout_s": "--connect-timeout", "max_connections": "--max-connections",
    "remote_python": "--remote-python", "remote_dir": "--remote-dir", "rendezvous": "--rendezvous",
    "master_addr": "--master-addr", "master_port": "--master-port", "fail_fast": "--fail-fast",
}
"""Option key -> the flag that sets it (error messages name the flag)."""
_OPTION_KEYS = frozenset(_FLAGS)


# ------------------------------------------------------------------ options


@dataclass(frozen=True)
class SshOptions:
    """Validated ssh backend options (``spec.options``).

    ``user``/``port``/``identity`` apply to hosts that do not set their own;
    ``connect_timeout_s`` is in seconds; ``remote_python`` None means
    ``spec.python``; ``fail_fast`` None means on for distributed jobs.
    """

    hosts: tuple[Host, ...]
    ssh_config: str | None = None
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    ssh_options: tuple[str, ...] = ()
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    remote_python: str | None = None
    remote_dir: str = DEFAULT_REMOTE_DIR
    rendezvous: str = "static"
    master_addr: str | None = None
    master_port: int | None = None
    fail_fast: bool | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "ssh options") -> SshOptions:
        """Validate a dict from flags or YAML; hosts may be Host objects or host-file lines."""
        unknown = sorted(set(d) - _OPTION_KEYS)
        if unknown:
            raise ConfigError(source, unknown[0], f"unknown ssh option; known: {', '.join(sorted(_OPTION_KEYS))}")
        raw_hosts = d.get("hosts") or []
        if isinstance(raw_hosts, str):
            raw_hosts = [raw_hosts]
        hosts: list[Host] = []
        for item in raw_hosts:
            if isinstance(item, Host):
                hosts.append(item)
            elif isinstance(item, str):
                hosts.extend(parse_hostfile(item, f"{source}: hosts"))
            else:
                raise ConfigError("--hosts", repr(item), "expected host entries (strings)")
        if not hosts:
            raise ConfigError(source, "", "no hosts: give --hosts, --hostfile or --ssh-config-hosts")
        check_unique(hosts, "--hosts")

        def integer(key: str, low: int, high: int, default: int | None) -> int | None:
            value = d.get(key, default)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(_FLAGS[key], repr(value), f"must be a whole number from {low} to {high}")
            return value

        def text(key: str, default: str | None = None) -> str | None:
            value = d.get(key, default)
            if value is None:
                return None
            if not isinstance(value, str) or not value or any(c in value for c in "\0\n\r"):
                raise ConfigError(_FLAGS[key], repr(value), "must be a non-empty single-line string")
            return value

        ssh_options = d.get("ssh_options") or ()
        if isinstance(ssh_options, str) or not all(isinstance(o, str) for o in ssh_options):
            raise ConfigError(_FLAGS["ssh_options"], repr(ssh_options), "must be a list of KEY=VALUE strings")
        for opt in ssh_options:
            key, sep, value = opt.partition("=")
            if not sep or not key.isalnum() or not value or any(c in value for c in "\0\n\r"):
                raise ConfigError("--ssh-option", opt,
                                  "expected KEY=VALUE, as ssh -o takes it (e.g. ProxyJump=bastion)")
        remote_dir = text("remote_dir", DEFAULT_REMOTE_DIR) or DEFAULT_REMOTE_DIR
        body = remote_dir[2:] if remote_dir.startswith("~/") else remote_dir
        if not remote_dir.startswith(("/", "~/")) or any(c not in _SAFE_PATH for c in body):
            raise ConfigError("--remote-dir", remote_dir,
                              "must be absolute or start with ~/, and use letters, digits and . _ / + = @ , - only "
                              "(scp reads remote paths through a shell or a glob, depending on the OpenSSH version)")
        rendezvous = d.get("rendezvous", "static")
        if rendezvous not in ("static", "c10d"):
            raise ConfigError("--rendezvous", str(rendezvous), "must be static or c10d")
        fail_fast = d.get("fail_fast")
        if fail_fast is not None and not isinstance(fail_fast, bool):
            raise ConfigError(_FLAGS["fail_fast"], repr(fail_fast), "must be true or false")
        user = text("user")
        if user is not None and (user.startswith("-") or any(c.isspace() for c in user)):
            raise ConfigError("--user", user, "not a user name")
        return cls(
            hosts=tuple(hosts),
            ssh_config=text("ssh_config"),
            user=user,
            port=integer("port", 1, 65535, None),
            identity=text("identity"),
            ssh_options=tuple(ssh_options),
            connect_timeout_s=integer("connect_timeout_s", 1, 3600, DEFAULT_CONNECT_TIMEOUT_S)
            or DEFAULT_CONNECT_TIMEOUT_S,
            max_connections=integer("max_connections", 1, 100000, DEFAULT_MAX_CONNECTIONS)
            or DEFAULT_MAX_CONNECTIONS,
            remote_python=text("remote_python"),
            remote_dir=remote_dir,
            rendezvous=str(rendezvous),
            master_addr=text("master_addr"),
            master_port=integer("master_port", 1, 65535, None),
            fail_fast=fail_fast,
        )


# ------------------------------------------------------------------ pure parts: layout, argv, script


@dataclass(frozen=True)
class NodeSlot:
    """One host's place in the job: rank, label (report attribution), directory name and process count."""

    rank: int
    host: Host
    label: str
    dirname: str
    nproc: int


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
    return [NodeSlot(i, h, lb, d, h.slots or spec.nproc)
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
        [str(slot.rank), slot.label, slot.dirname, str(slot.nproc)]))


def scp_argv(opts: SshOptions, host: Host, remote_path: str, local_path: str) -> list[str]:
    name = f"[{host.name}]" if host.is_ipv6 else host.name
    return ["scp", "-r", "-q", *_connection_args(opts, host, scp=True), "--", f"{name}:{remote_path}", local_path]


def preflight_command(spec: JobSpec, python: str) -> str:
    """Remote check before launch: exit 4 no working directory, 5 no Python, 6 a module the job needs is missing."""
    modules = ["gpuaccept"] if spec.command is None else ["torch"] if uses_torchrun(spec) else []
    lines = []
    if spec.workdir:
        lines.append(f"cd -- {shlex.quote(spec.workdir)} || exit 4")
    lines.append(f"command -v {shlex.quote(python)} >/dev/null 2>&1 || exit 5")
    if modules:
        code = ("import importlib.util as u, sys; "
                "sys.exit(0 if all(u.find_spec(m) for m in sys.argv[1:]) else 6)")
        lines.append(shlex.join([python, "-c", code, *modules]))
    else:
        lines.append("exit 0")
    return "exec /bin/sh -c " + shlex.quote("; ".join(lines))


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


class _Var(str):
    """A shell variable reference in an argv (written as ``"$name"``, not quoted literally)."""


def _sh_word(word: str) -> str:
    if isinstance(word, _Var):
        return f'"${word}"' if word.isidentifier() else f'"{word}"'
    return shlex.quote(word)


def _sh_words(words: list[str], indent: str = "        ") -> str:
    """``set --`` arguments, several per line, continued with backslashes."""
    lines: list[str] = []
    current = ""
    for w in words:
        piece = _sh_word(w)
        if current and len(current) + len(piece) > 88:
            lines.append(current)
            current = piece
        else:
            current = f"{current} {piece}" if current else piece
    lines.append(current)
    return (" \\\n" + indent).join(lines)


def job_words(spec: JobSpec, opts: SshOptions) -> list[str]:
    """The argv each host starts (shell variables: ``py``, ``node_rank``, ``nproc``, ``node_dir``)."""
    py = _Var("py")
    if spec.command is None:
        suite = spec.suite_argv()
        job: list[str] = [py, "-m", "gpuaccept", *suite[1:]]
        idx = len(job) - 1 - job[::-1].index("--report-dir")
        job[idx + 1] = _Var("node_dir")
    else:
        job = list(spec.command)
    if not uses_torchrun(spec):
        return job
    words = [py, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}", _Var("--nproc-per-node=${nproc}")]
    endpoint = f"{master_addr(opts)}:{master_port(spec, opts)}"
    if opts.rendezvous == "static":
        words += [_Var("--node-rank=${node_rank}"), f"--master-addr={master_addr(opts)}",
                  f"--master-port={master_port(spec, opts)}"]
    else:
        words += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={spec.run_id}"]
    words.append("--max-restarts=0")
    # as torchrun_job: a .py script runs with the remote Python, anything else as a program
    return [*words, *(job if job[0].endswith(".py") else ["--no-python", *job])]


_SCRIPT = """\
#!/bin/sh
# gpuaccept ssh launcher: node script of job {name}, run {run_id}. Generated; do not edit.
# The launcher runs, for each host:  ssh HOST exec /bin/sh -s -- RANK LABEL DIR NPROC < {script}
# and keeps standard input open. When it ends (Ctrl-C, cancel, a lost connection), the job's
# process group gets TERM, then KILL after {grace} s.
{literal}
main() {{
    node_rank=$1
    host_label=$2
    node_dir={run_dir}/$3
    nproc=$4
    py={python}

    mkdir -p -- "$node_dir" || {{ echo "gpuaccept: cannot create $node_dir on $host_label" >&2; exit {setup}; }}
{prelude}
    export GPUACCEPT_HOSTNAME="$host_label"
    export GPUACCEPT_RUN_ID={run_id_q}
    export NODE_RANK="$node_rank"
    export NPROC_PER_NODE="$nproc"
    export NNODES={nodes}
    export MASTER_ADDR={master_addr}
    export MASTER_PORT={master_port}

    set -- {words}

    exec 3<&0 </dev/null
    "$py" -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' "$@" 3<&- &
    job=$!
    echo "$job" > "$node_dir/job.pid"
    (
        while IFS= read -r _; do :; done
        stop_group "$job" "$job"
    ) <&3 >/dev/null 2>&1 &
    watchdog=$!
    exec 3<&-
    wait "$job"
    rc=$?
    kill "$watchdog" 2>/dev/null
    rm -f -- "$node_dir/job.pid"
    stop_group "$job"
    exit "$rc"
}}

# TERM the process group $1 (with $2 = pid: that process too, in case it had not yet left ours),
# then KILL what is left of the group after {grace} s. (kill -SIG -PGID: dash's kill takes no --.)
stop_group() {{
    kill -TERM "-$1" 2>/dev/null || {{ [ -n "${{2-}}" ] && kill -TERM "$2" 2>/dev/null; }} || return 0
    i=0
    while [ "$i" -lt {grace} ] && kill -0 "-$1" 2>/dev/null; do
        sleep 1
        i=$((i + 1))
    done
    kill -KILL "-$1" 2>/dev/null
    return 0
}}

main "$@"
"""


def node_script(spec: JobSpec, opts: SshOptions) -> str:
    """The POSIX sh script every host runs (pure, shellcheck-clean).

    Values are single-quoted, so any byte but NUL survives.
    """
    python = opts.remote_python or spec.python
    cd = ""
    if spec.workdir:
        wd = shlex.quote(spec.workdir)
        cd = f'    cd -- {wd} || {{ echo "gpuaccept: no working directory {_dq(spec.workdir)} on $host_label" >&2; ' \
             f"exit {SETUP_FAILED}; }}"
    env = "\n".join(f"    export {k}={shlex.quote(v)}" for k, v in spec.env.items())
    words = job_words(spec, opts)
    literals = [*spec.env.values(), *(w for w in words if not isinstance(w, _Var)), spec.workdir or ""]
    literal = ("# shellcheck disable=SC2016  # $ and ` in single quotes are meant literally\n"
               if any(c in v for v in literals for c in "$`") else "")
    return _SCRIPT.format(
        literal=literal,
        name=_comment(spec.name), run_id=_comment(spec.run_id), script=SCRIPT_NAME, grace=KILL_GRACE_S,
        run_dir=sh_path(remote_run_dir(spec, opts)), python=shlex.quote(python), setup=SETUP_FAILED,
        prelude="".join(f"{block}\n\n" for block in (cd, env) if block), run_id_q=shlex.quote(spec.run_id),
        nodes=spec.nodes,
        master_addr=shlex.quote(master_addr(opts)), master_port=master_port(spec, opts),
        words=_sh_words(words),
    ).replace("\n\n\n", "\n\n")


def _comment(text: str) -> str:
    return " ".join(text.split())


def _dq(text: str) -> str:
    """``text`` inside a double-quoted shell string, printed literally."""
    return "".join("\\" + c if c in '"$`\\' else c for c in text.replace("\n", " "))


# ------------------------------------------------------------------ running


@dataclass
class _Node:
    slot: NodeSlot
    argv: list[str]
    state: str = "pending"  # pending, running, done, skipped
    proc: subprocess.Popen[bytes] | None = None
    rc: int | None = None
    open_fds: int = 0
    partial: dict[int, bytes] = field(default_factory=dict)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    log: IO[bytes] | None = None
    stopped: bool = False
    exited_at: float | None = None


class SshJob:
    """The running job: ssh processes, a reader thread that streams output, and the stop logic.

    Thread-safe: ``poll``-side reads and ``cancel`` may come from another
    thread than the reader loop.
    """

    def __init__(self, nodes: list[_Node], script: bytes, opts: SshOptions, *, kill_argvs: dict[str, list[str]],
                 stream: TextIO, log_dir: Path | None, fail_fast: bool, time_limit_s: float | None) -> None:
        self.nodes = nodes
        self.script = script
        self.opts = opts
        self.kill_argvs = kill_argvs
        self.stream = stream
        self.log_dir = log_dir
        self.fail_fast = fail_fast
        self.time_limit_s = time_limit_s
        self.lock = threading.RLock()
        self.stop_reason: str | None = None
        self.timed_out = False
        self.cancelled = False
        self.started_at = time.monotonic()
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._loop, name="gpuaccept-ssh", daemon=True)
        self._stopper: threading.Thread | None = None
        self.finished = threading.Event()

    # -- life cycle

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)

    def _emit(self, node: _Node, line: str) -> None:
        node.tail.append(line)
        with contextlib.suppress(ValueError, OSError):
            self.stream.write(f"[{node.slot.label}] {line}\n")
            self.stream.flush()

    def _launch(self, node: _Node) -> None:
        if self.log_dir is not None:
            try:
                node.log = open(self.log_dir / f"{node.slot.dirname}.log", "ab")  # closed in _reap
            except OSError as exc:
                self._emit(node, f"cannot keep a log of this host: {exc}")
        try:
            proc = subprocess.Popen(node.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            node.state, node.rc = "done", 127
            self._emit(node, f"cannot start ssh: {exc}")
            return
        node.proc, node.state = proc, "running"
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            proc.stdin.write(self.script)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # ssh died at once; its stderr says why
        for pipe in (proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ, node)
            node.open_fds += 1

    def _read(self, pipe: IO[bytes], node: _Node) -> None:
        fd = pipe.fileno()
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if node.log is not None and data:
            node.log.write(data)
            node.log.flush()
        buf = node.partial.get(fd, b"") + data
        *lines, rest = buf.split(b"\n")
        for raw in lines:
            self._emit(node, raw.decode(errors="replace").rstrip("\r"))
        if data:
            node.partial[fd] = rest
            return
        if rest:
            self._emit(node, rest.decode(errors="replace"))
        node.partial.pop(fd, None)
        self._selector.unregister(pipe)
        pipe.close()
        node.open_fds -= 1

    def _reap(self, node: _Node) -> None:
        """Record the exit of ``node``'s ssh once its output is drained (or 2 s after it exited:
        a process it left behind may hold the pipes)."""
        assert node.proc is not None
        if node.open_fds > 0:
            if node.proc.poll() is None:
                return
            node.exited_at = node.exited_at or time.monotonic()
            if time.monotonic() - node.exited_at < 2.0:
                return
            for key in [k for k in self._selector.get_map().values() if k.data is node]:
                self._selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
            for rest in node.partial.values():
                if rest:
                    self._emit(node, rest.decode(errors="replace"))
            node.partial.clear()
            node.open_fds = 0
        rc = node.proc.wait()
        node.rc, node.state = rc, "done"
        if node.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                node.proc.stdin.close()
        if node.log is not None:
            node.log.close()
            node.log = None
        if rc != 0 and self.fail_fast and self.stop_reason is None:
            others = [n for n in self.nodes if n.state in ("running", "pending")]
            if others:
                self._emit(node, f"failed ({_describe_rc(rc)}); stopping the other hosts")
                self.stop(f"{node.slot.label} failed", internal=True)

    def _loop(self) -> None:
        try:
            while True:
                with self.lock:
                    if self.stop_reason is None:
                        running = sum(n.state == "running" for n in self.nodes)
                        for node in self.nodes:
                            if running >= self.opts.max_connections:
                                break
                            if node.state == "pending":
                                self._launch(node)
                                running += 1
                    if all(n.state in ("done", "skipped") for n in self.nodes):
                        return
                    if (self.time_limit_s is not None and self.stop_reason is None
                            and time.monotonic() - self.started_at > self.time_limit_s):
                        self.timed_out = True
                        self.stop(f"time limit of {self.time_limit_s / 60:g} min reached", internal=True)
                for key, _ in self._selector.select(timeout=0.2) if self._selector.get_map() else []:
                    self._read(key.fileobj, key.data)  # type: ignore[arg-type]
                if not self._selector.get_map():
                    time.sleep(0.05)
                with self.lock:
                    for node in self.nodes:
                        if node.state == "running":
                            self._reap(node)
        except Exception as exc:  # a bug here must not leave remote jobs running unseen
            with contextlib.suppress(ValueError, OSError):
                self.stream.write(f"[ssh] internal error: {type(exc).__name__}: {exc}; stopping every host\n")
            self.stop(f"internal error: {exc}", internal=True)
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is None:
                    node.proc.terminate()
                if node.state == "running":
                    node.state, node.rc = "done", node.proc.wait() if node.proc is not None else -1
        finally:
            self._selector.close()
            self.finished.set()

    # -- stopping

    def stop(self, reason: str, *, internal: bool = False) -> None:
        """Stop every host (idempotent): skip pending ones, end running ones' input, kill through a second ssh."""
        with self.lock:
            if self.stop_reason is not None:
                return
            self.stop_reason = reason
            self.cancelled = not internal
            victims = []
            for node in self.nodes:
                if node.state == "pending":
                    node.state = "skipped"
                elif node.state == "running":
                    node.stopped = True
                    victims.append(node)
                    if node.proc is not None and node.proc.stdin is not None:
                        with contextlib.suppress(OSError, ValueError):
                            node.proc.stdin.close()
        self._stopper = threading.Thread(target=self._kill, args=(victims,), name="gpuaccept-ssh-stop", daemon=True)
        self._stopper.start()

    def _kill(self, victims: list[_Node]) -> None:
        timeout = self.opts.connect_timeout_s + 20

        def kill_one(node: _Node) -> None:
            if node.rc is not None:
                return
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run(self.kill_argvs[node.slot.label], stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=timeout)

        if victims:
            with ThreadPoolExecutor(max_workers=min(len(victims), self.opts.max_connections)) as pool:
                list(pool.map(kill_one, victims))
        if not self.finished.wait(LOCAL_GRACE_S):
            for node in victims:
                if node.proc is not None and node.proc.poll() is None:
                    node.proc.terminate()
            if not self.finished.wait(5):
                for node in victims:
                    if node.proc is not None and node.proc.poll() is None:
                        node.proc.kill()

    def join_stopper(self, timeout: float) -> None:
        if self._stopper is not None:
            self._stopper.join(timeout)

    # -- state

    def state(self) -> JobState:
        with self.lock:
            n = len(self.nodes)
            done = [x for x in self.nodes if x.state == "done"]
            failed = [x for x in done if x.rc != 0]
            if not self.finished.is_set():
                running = sum(x.state == "running" for x in self.nodes)
                detail = f"{len(done)}/{n} hosts finished, {running} running"
                if failed:
                    detail += "; failed: " + ", ".join(f"{x.slot.label} ({_describe_rc(x.rc)})" for x in failed)
                return JobState("RUNNING" if running else "PENDING", done=False, detail=detail)
            skipped = [x.slot.label for x in self.nodes if x.state == "skipped"]
            parts = [f"{x.slot.label}: {'stopped' if x.stopped else _describe_rc(x.rc)}" for x in failed]
            if skipped:
                parts.append("not started: " + ", ".join(skipped))
            if self.stop_reason:
                parts.insert(0, self.stop_reason)
            ok = not failed and not skipped and self.stop_reason is None
            state = ("COMPLETED" if ok else "TIMEOUT" if self.timed_out else "CANCELLED" if self.cancelled
                     else "FAILED")
            return JobState(state, done=True, ok=ok, detail="; ".join(parts) or f"{n}/{n} hosts succeeded")

    def failed_tails(self) -> str:
        with self.lock:
            out = []
            for node in self.nodes:
                if node.state == "done" and node.rc != 0:
                    out.append(f"--- {node.slot.label} ({_describe_rc(node.rc)}), last lines:")
                    out.extend(f"[{node.slot.label}] {line}" for line in node.tail)
            return "\n".join(out)


def _describe_rc(rc: int | None) -> str:
    if rc is None:
        return "running"
    if rc == 255:
        return "ssh error 255"
    if rc == SETUP_FAILED:
        return "setup failed"
    if rc < 0:
        return f"ssh killed by signal {-rc}"
    if rc > 128:
        return f"exit {rc} (signal {rc - 128})"
    return f"exit {rc}"


def _parallel(fn: Any, items: list[Any], width: int) -> Iterator[Any]:
    if not items:
        return iter(())
    with ThreadPoolExecutor(max_workers=max(1, min(width, len(items)))) as pool:
        return iter(list(pool.map(fn, items)))


_PREFLIGHT_WHY = {4: "the working directory does not exist", 5: "the remote Python was not found",
                  6: "the remote Python cannot import a module the job needs"}


def preflight(spec: JobSpec, opts: SshOptions, slots: list[NodeSlot]) -> None:
    """Connect to every host and check it can run the job; InputError listing every host that cannot."""
    python = opts.remote_python or spec.python
    command = preflight_command(spec, python)
    needs = "gpuaccept" if spec.command is None else "torch" if uses_torchrun(spec) else ""

    def check(slot: NodeSlot) -> str | None:
        argv = ssh_argv(opts, slot.host, command)
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=opts.connect_timeout_s + 30)
        except subprocess.TimeoutExpired:
            return f"{slot.label}: no answer within {opts.connect_timeout_s + 30} s"
        except OSError as exc:
            return f"cannot run ssh: {exc.strerror}"
        if res.returncode == 0:
            return None
        err = " ".join(res.stderr.strip().splitlines()[-1:])
        if res.returncode in _PREFLIGHT_WHY:
            why = _PREFLIGHT_WHY[res.returncode]
            if res.returncode == 5:
                why += f" ({python!r}; set --remote-python)"
            elif res.returncode == 6:
                why += f" ({needs})"
            elif spec.workdir:
                why += f" ({spec.workdir!r})"
            return f"{slot.label}: {why}"
        return f"{slot.label}: {err or f'ssh exited with {res.returncode}'}"

    problems = [p for p in _parallel(check, slots, opts.max_connections) if p]
    if problems:
        raise InputError(f"ssh preflight failed on {len(problems)} of {len(slots)} host(s), nothing was started: "
                         + "; ".join(problems))


# ------------------------------------------------------------------ backend


class SshBackend(Backend):
    """Hosts from --hosts, --hostfile or ssh config aliases (--ssh-config-hosts); reports come back with scp.

    One process, or one torchrun for a distributed job, per host; output is
    streamed with a [host] prefix; remote processes are stopped on Ctrl-C,
    failure or a lost connection. An unreachable host stops the launch before
    anything starts.
    """

    name: ClassVar[str] = "ssh"
    help: ClassVar[str] = "run on hosts over ssh (one process or torchrun per host), fetch reports with scp"

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self._ready: set[tuple[str, str]] = set()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("ssh")
        g.add_argument("--hosts", action="append", default=None, metavar="A,B,user@C:2222",
                       help="hosts to run on, in node-rank order (repeatable)")
        g.add_argument("--hostfile", default=None, metavar="FILE",
                       help="one host per line: ENTRY [slots=N] [user=U] [port=P] [identity=KEY]; # comments")
        g.add_argument("--ssh-config", default=None, metavar="FILE", help="ssh config file (ssh -F); "
                       "default: ssh's own (~/.ssh/config)")
        g.add_argument("--ssh-config-hosts", default=None, metavar="PATTERN",
                       help="take the Host aliases of the ssh config that match PATTERN (e.g. 'gpu-*')")
        g.add_argument("--user", default=None, help="remote user where a host does not name one")
        g.add_argument("--port", type=int, default=None, help="ssh port where a host does not name one")
        g.add_argument("--identity", default=None, metavar="KEY", help="private key (ssh -i)")
        g.add_argument("--ssh-option", action="append", default=None, metavar="KEY=VALUE",
                       help="extra ssh -o option (repeatable), e.g. ProxyJump=bastion")
        g.add_argument("--connect-timeout", type=int, default=DEFAULT_CONNECT_TIMEOUT_S, metavar="S",
                       help=f"seconds to wait for each connection (default {DEFAULT_CONNECT_TIMEOUT_S})")
        g.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                       help=f"at most N hosts connected at once (default {DEFAULT_MAX_CONNECTIONS})")
        g.add_argument("--remote-python", default=None, metavar="PATH",
                       help="Python on the hosts, with gpuaccept (and torch) installed (default: --python, "
                            "python3)")
        g.add_argument("--remote-dir", default=DEFAULT_REMOTE_DIR, metavar="DIR",
                       help=f"results directory on each host; RUN_ID/HOST below it (default {DEFAULT_REMOTE_DIR})")
        g.add_argument("--rendezvous", choices=("static", "c10d"), default="static",
                       help="torchrun rendezvous on the first host (default static: ranks follow the host list)")
        g.add_argument("--master-addr", default=None, metavar="ADDR",
                       help="address the hosts use to reach the first one (default: its HostName or name)")
        g.add_argument("--master-port", type=int, default=None, metavar="PORT",
                       help="rendezvous port (default: derived from the run id)")
        g.add_argument("--fail-fast", action=argparse.BooleanOptionalAction, default=None,
                       help="stop every host when one fails (default: on for distributed jobs)")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """Read the host sources (files are read here, so the plan stays pure) into validated options."""
        if getattr(args, "detach", False):
            raise UsageError("--detach: the ssh backend holds one connection per host for the job's lifetime and "
                             "stops the job when the launcher exits; run the launch under tmux/screen/nohup instead")
        hosts: list[Host] = []
        for text in args.hosts or []:
            hosts.extend(parse_host_list(text, "--hosts"))
        if args.hostfile:
            hosts.extend(parse_hostfile(_read(args.hostfile, "--hostfile"), args.hostfile))
        config_path = args.ssh_config
        if config_path is not None:
            _read(config_path, "--ssh-config")
        blocks = []
        default_config = Path.home() / ".ssh" / "config"
        readable = config_path or (str(default_config) if default_config.is_file() else None)
        if readable:
            try:
                blocks = parse_ssh_config(_read(readable, "--ssh-config"), readable)
            except ConfigError:
                # ssh reads its default config itself; only a config we were told to use must parse here
                if config_path or args.ssh_config_hosts:
                    raise
        if args.ssh_config_hosts:
            if not readable:
                raise ConfigError("--ssh-config-hosts", args.ssh_config_hosts,
                                  f"no ssh config to read ({default_config} does not exist; pass --ssh-config)")
            hosts.extend(select_aliases(blocks, args.ssh_config_hosts))
        if not hosts:
            raise ConfigError("launch ssh", "", "no hosts: give --hosts, --hostfile or --ssh-config-hosts")
        for name, value in (("--connect-timeout", args.connect_timeout), ("--max-connections", args.max_connections)):
            if value < 1:
                raise ConfigError(name, str(value), "must be at least 1")
        addr = args.master_addr
        if addr is None and blocks:
            addr = resolve_alias(blocks, hosts[0].name).hostname
        options: dict[str, Any] = {
            "hosts": [str(h) for h in hosts], "ssh_config": config_path, "user": args.user, "port": args.port,
            "identity": args.identity, "ssh_options": list(args.ssh_option or []),
            "connect_timeout_s": args.connect_timeout, "max_connections": args.max_connections,
            "remote_python": args.remote_python, "remote_dir": args.remote_dir, "rendezvous": args.rendezvous,
            "master_addr": addr, "master_port": args.master_port, "fail_fast": args.fail_fast,
        }
        SshOptions.from_dict(options, "launch ssh")
        return options

    # -- pure

    def plan(self, spec: JobSpec) -> Plan:
        opts = SshOptions.from_dict(spec.options)
        if spec.image:
            raise ConfigError("--image", spec.image, "the ssh backend runs directly on the hosts, without a "
                                                     "container runtime (use slurm with pyxis, or k8s)")
        if spec.mounts:
            raise ConfigError("--mount", str(spec.mounts[0]), "the ssh backend has no container to mount into")
        slots = layout(spec, opts)
        if uses_torchrun(spec) and len(slots) > opts.max_connections:
            raise ConfigError("--max-connections", str(opts.max_connections),
                              f"a distributed job needs all {len(slots)} hosts connected at once; "
                              f"raise it to at least {len(slots)}")
        run_dir = remote_run_dir(spec, opts)
        python = opts.remote_python or spec.python
        needs = "gpuaccept" if spec.command is None else "torch" if uses_torchrun(spec) else ""
        notes = [
            f"each command reads {SCRIPT_NAME} on standard input; at most {opts.max_connections} run at once",
            f"before launch, every host is checked: reachable, {python} runs"
            + (f" and imports {needs}" if needs else "") + (f", {spec.workdir} exists" if spec.workdir else ""),
            f"reports are fetched with scp -r HOST:{run_dir}/LABEL into {spec.run_results_dir}/LABEL",
        ]
        if len(opts.hosts) > len(slots):
            notes.append(f"{len(slots)} node(s): the first {len(slots)} of the {len(opts.hosts)} hosts given")
        if uses_torchrun(spec):
            notes.append(f"torchrun {opts.rendezvous} rendezvous at {master_addr(opts)}:{master_port(spec, opts)}")
        return Plan(
            backend=self.name,
            files={SCRIPT_NAME: node_script(spec, opts)},
            commands=[run_argv(opts, s) for s in slots],
            expected_hosts=[s.label for s in slots],
            notes=notes,
        )

    # -- I/O

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        """The preflight: every host reachable and able to run the job, else InputError (exit 2), nothing started."""
        opts = SshOptions.from_dict(spec.options)
        preflight(spec, opts, layout(spec, opts))
        self._ready.add((spec.run_id, plan.files[SCRIPT_NAME]))

    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        """Start the plan's ssh commands (in a window of ``max_connections``), after the preflight if not yet done.

        Each host's output is streamed with its prefix and kept in ``workdir/LABEL.log``.
        """
        opts = SshOptions.from_dict(spec.options)
        slots = layout(spec, opts)
        if (spec.run_id, plan.files[SCRIPT_NAME]) not in self._ready:
            preflight(spec, opts, slots)
        log_dir = Path(workdir)
        log_dir.mkdir(parents=True, exist_ok=True)
        run_dir = remote_run_dir(spec, opts)
        nodes = [_Node(slot, argv) for slot, argv in zip(slots, plan.commands, strict=True)]
        kill_argvs = {s.label: ssh_argv(opts, s.host, kill_command(run_dir, s.dirname)) for s in slots}
        fail_fast = opts.fail_fast if opts.fail_fast is not None else uses_torchrun(spec)
        limit = spec.time_limit_min * 60.0 if spec.time_limit_min else None
        job = SshJob(nodes, plan.files[SCRIPT_NAME].encode(), opts, kill_argvs=kill_argvs,
                     stream=self.stream or sys.stdout, log_dir=log_dir, fail_fast=fail_fast, time_limit_s=limit)
        job.start()
        return Submission(backend=self.name, job_id=spec.run_id, handle=job, hosts=[s.label for s in slots])

    def poll(self, submission: Submission) -> JobState:
        return _job(submission).state()

    def cancel(self, submission: Submission) -> None:
        """Stop every host and wait (up to the kill grace plus the connect timeout) until the ssh sessions end."""
        job = _job(submission)
        job.stop("cancelled")
        job.join_stopper(job.opts.connect_timeout_s + LOCAL_GRACE_S + 30)
        job.wait(5)

    def logs(self, submission: Submission) -> str:
        return _job(submission).failed_tails()

    def gather(self, submission: Submission, spec: JobSpec) -> list[NodeReport]:
        """scp each host's node directory back and read its reports, attributed to the host label.

        A host whose directory cannot be fetched or read is left out (the
        cluster report lists it as missing); the reason is printed with its prefix.
        """
        job = _job(submission)
        opts = job.opts
        local_run = Path(spec.run_results_dir)
        local_run.mkdir(parents=True, exist_ok=True)
        run_dir = remote_run_dir(spec, opts)
        stream = self.stream or sys.stdout

        def fetch(node: _Node) -> list[NodeReport]:
            slot = node.slot
            part = local_run / f".{slot.dirname}.part"
            shutil.rmtree(part, ignore_errors=True)
            argv = scp_argv(opts, slot.host, scp_path(f"{run_dir}/{slot.dirname}"), str(part))
            try:
                res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                     timeout=opts.connect_timeout_s + 300)
            except (subprocess.TimeoutExpired, OSError) as exc:
                _say(stream, slot.label, f"no reports fetched: {exc}")
                return []
            if res.returncode != 0 or not part.is_dir():
                why = " ".join(res.stderr.strip().splitlines()[-1:]) or f"scp exited with {res.returncode}"
                _say(stream, slot.label, f"no reports fetched: {why}")
                shutil.rmtree(part, ignore_errors=True)
                return []
            (part / "job.pid").unlink(missing_ok=True)
            final = local_run / slot.dirname
            shutil.rmtree(final, ignore_errors=True)
            part.rename(final)
            try:
                reports = read_reports(final)
            except InputError as exc:
                _say(stream, slot.label, f"unreadable report: {exc}")
                return []
            for report in reports:
                report.host = slot.label
            return reports

        started = [n for n in job.nodes if n.state == "done"]
        out: list[NodeReport] = []
        for reports in _parallel(fetch, started, opts.max_connections):
            out.extend(reports)
        return out


def _say(stream: TextIO, label: str, text: str) -> None:
    with contextlib.suppress(ValueError, OSError):
        stream.write(f"[{label}] {text}\n")
        stream.flush()


def _job(submission: Submission) -> SshJob:
    if not isinstance(submission.handle, SshJob):
        raise TypeError("not an ssh submission")
    return submission.handle


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except OSError as exc:
        raise ConfigError(flag, path, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(flag, path, "not a text file") from None
