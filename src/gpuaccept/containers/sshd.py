"""A user-owned OpenSSH server configuration: host keys, sshd_config, client key, ssh_config, known_hosts.

Everything lives in one directory that an ordinary user owns, so sshd runs
without root (``/usr/sbin/sshd -D -e -f DIR/sshd_config``) and clients reach
it with ``ssh -F DIR/ssh_config HOST``. Host keys are pinned: ``known_hosts``
in DIR lists them for the cluster's host patterns, and the client config says
``StrictHostKeyChecking yes`` (never ``no``).

The texts come from pure functions (:func:`sshd_config_text`,
:func:`ssh_config_text`, :func:`known_hosts_text`), reusable for per-node
servers inside containers (one :class:`SshHost` per node name, its address and
its port). Keys are made with ``ssh-keygen`` at the edge
(:func:`write_config_dir`); existing keys are kept, so running it again only
rewrites the configuration files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gpuaccept.errors import InputError, UsageError
from gpuaccept.safefs import check_private

HOST_KEY_TYPES: tuple[str, ...] = ("ed25519", "rsa")
CLIENT_KEY = "id_ed25519"
SSHD_CONFIG = "sshd_config"
SSH_CONFIG = "ssh_config"
KNOWN_HOSTS = "known_hosts"
AUTHORIZED_KEYS = "authorized_keys"
PID_FILE = "sshd.pid"
DEFAULT_PATTERN = "*"

# Paths go into sshd_config and ssh_config unquoted; '%' would be read as a token there.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@,=:-]+$")
# ssh_config Host patterns and known_hosts names: names, addresses, '*' and '?' wildcards.
_PATTERN = re.compile(r"^[A-Za-z0-9_.*?:-]+$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]*\$?$", re.IGNORECASE)
_PUBKEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp\d+) [A-Za-z0-9+/=]+")


class SshHost(NamedTuple):
    """One ``Host`` block: a pattern (``node-*``) or a node name, its address (None: the name itself), its port."""

    pattern: str
    hostname: str | None
    port: int


@dataclass(frozen=True)
class SshdFiles:
    """Where everything is in a configuration directory."""

    directory: Path

    def host_key(self, key_type: str) -> Path:
        return self.directory / f"ssh_host_{key_type}_key"

    @property
    def client_key(self) -> Path:
        return self.directory / CLIENT_KEY

    @property
    def sshd_config(self) -> Path:
        return self.directory / SSHD_CONFIG

    @property
    def ssh_config(self) -> Path:
        return self.directory / SSH_CONFIG

    @property
    def known_hosts(self) -> Path:
        return self.directory / KNOWN_HOSTS

    @property
    def authorized_keys(self) -> Path:
        return self.directory / AUTHORIZED_KEYS

    @property
    def pid_file(self) -> Path:
        return self.directory / PID_FILE

    def keys(self) -> list[Path]:
        """Every private key, host keys first."""
        return [*(self.host_key(t) for t in HOST_KEY_TYPES), self.client_key]


# ---- validation ------------------------------------------------------------------------------------------------

def check_port(port: int, what: str = "--port") -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UsageError(f"{what} {port}: must be a TCP port (1-65535)")
    return port


def check_path(path: Path, what: str = "--dir") -> Path:
    """``path`` made absolute; refused when sshd_config or ssh_config could not hold it as one plain word."""
    absolute = Path(os.path.abspath(path))
    if not _SAFE_PATH.match(str(absolute)):
        raise UsageError(f"{what} {path}: the path may hold only letters, digits and _ . / + @ , = : - "
                         "(it is written unquoted into sshd_config and ssh_config)")
    return absolute


def check_pattern(pattern: str, what: str = "--hosts") -> str:
    if not pattern or not _PATTERN.match(pattern):
        raise UsageError(f"{what} {pattern!r}: a host pattern is a name or address with '*' and '?' wildcards "
                         "(letters, digits, '.', '-', '_', ':')")
    return pattern


def parse_patterns(text: str, what: str = "--hosts") -> list[str]:
    """``"gpu-*, 10.0.0.*"`` -> ``["gpu-*", "10.0.0.*"]``."""
    patterns = [p.strip() for p in text.split(",") if p.strip()]
    if not patterns:
        raise UsageError(f"{what}: give at least one host pattern, e.g. 'gpu-*'")
    return [check_pattern(p, what) for p in patterns]


def _check_host(host: SshHost) -> None:
    check_pattern(host.pattern, "host pattern")
    if host.hostname is not None:
        check_pattern(host.hostname, f"address of {host.pattern}")
        if "*" in host.hostname or "?" in host.hostname:
            raise UsageError(f"address of {host.pattern} {host.hostname!r}: an address cannot hold wildcards")
    check_port(host.port, f"port of {host.pattern}")


# ---- pure functions: the texts ---------------------------------------------------------------------------------

def sshd_config_text(directory: Path, port: int, listen: Sequence[str] = (),
                     allow_users: Sequence[str] = (), key_types: Sequence[str] = HOST_KEY_TYPES) -> str:
    """``sshd_config`` of a server whose keys, authorized keys and pid file are all in ``directory``.

    Public-key login only (no password, no keyboard-interactive, no PAM);
    ``StrictModes no`` because the directory may sit under a shared temporary
    path (sshd would refuse it); :func:`write_config_dir` makes the directory
    itself 0700 and the private keys and ``authorized_keys`` 0600. ``listen``:
    addresses to bind (default: all); ``allow_users``: the only accounts that
    may log in (default: any the server can switch to).
    """
    files = SshdFiles(check_path(directory))
    check_port(port)
    lines = [
        "# sshd_config written by 'gpuaccept sshd-config'; start: /usr/sbin/sshd -D -e -f "
        f"{files.sshd_config}",
        f"Port {port}",
        *(f"ListenAddress {check_pattern(a, '--listen')}" for a in listen),
        *(f"HostKey {files.host_key(t)}" for t in key_types),
        f"AuthorizedKeysFile {files.authorized_keys}",
        f"PidFile {files.pid_file}",
        "StrictModes no",
        "UsePAM no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
    ]
    if allow_users:
        for user in allow_users:
            if not _USER.match(user):
                raise UsageError(f"--user {user!r}: not a user name")
        lines.append(f"AllowUsers {' '.join(allow_users)}")
    lines += ["Subsystem sftp internal-sftp", "PrintMotd no", ""]
    return "\n".join(lines)


def ssh_config_text(hosts: Iterable[SshHost | tuple[str, str | None, int]], directory: Path,
                    user: str | None = None) -> str:
    """``ssh_config`` with one ``Host`` block per entry: port, identity, and host keys pinned in directory.

    A block with an address (``HostName``) also sets ``HostKeyAlias`` to its
    name, so the host key is looked up under the name (as
    :func:`known_hosts_text` writes it), whatever address the node has.
    """
    files = SshdFiles(check_path(directory))
    if user is not None and not _USER.match(user):
        raise UsageError(f"--user {user!r}: not a user name")
    blocks: list[str] = ["# ssh_config written by 'gpuaccept sshd-config'; use: ssh -F "
                         f"{files.ssh_config} HOST", ""]
    entries = [SshHost(*h) for h in hosts]
    if not entries:
        raise UsageError("no hosts for the ssh_config")
    for host in entries:
        _check_host(host)
        blocks.append(f"Host {host.pattern}")
        if host.hostname is not None:
            blocks += [f"    HostName {host.hostname}", f"    HostKeyAlias {host.pattern}"]
        blocks.append(f"    Port {host.port}")
        if user is not None:
            blocks.append(f"    User {user}")
        blocks += [
            f"    IdentityFile {files.client_key}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {files.known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    UpdateHostKeys no",
            "    PasswordAuthentication no",
            "    KbdInteractiveAuthentication no",
            "",
        ]
    return "\n".join(blocks)


def known_hosts_text(hosts: Iterable[SshHost | tuple[str, str | None, int]], host_public_keys: Iterable[str]) -> str:
    """``known_hosts`` pinning every host key for every host: ``PATTERN,[PATTERN]:PORT TYPE KEY`` per key.

    ``host_public_keys`` are ``.pub`` lines (``TYPE BASE64 [comment]``);
    known_hosts patterns take the same ``*`` and ``?`` wildcards as ssh_config.
    """
    keys: list[str] = []
    for line in host_public_keys:
        line = line.strip()
        if not _PUBKEY.match(line):
            raise InputError(f"not an OpenSSH public key: {line[:40]!r}")
        keys.append(" ".join(line.split()[:2]))
    lines = []
    for host in (SshHost(*h) for h in hosts):
        _check_host(host)
        names = f"{host.pattern},[{host.pattern}]:{host.port}"
        lines += [f"{names} {key}" for key in keys]
    return "\n".join(lines) + "\n"


def authorized_keys_text(existing: str, public_key: str) -> str:
    """``existing`` authorized_keys with ``public_key`` added unless already there (other keys are kept)."""
    wanted = " ".join(public_key.split()[:2])
    lines = [line for line in existing.splitlines() if line.strip()]
    if not any(" ".join(line.split()[:2]) == wanted for line in lines):
        lines.append(public_key.strip())
    return "\n".join(lines) + "\n"


# ---- the edge: ssh-keygen and the files ------------------------------------------------------------------------

def _keygen() -> str:
    path = shutil.which("ssh-keygen")
    if path is None:
        raise UsageError("ssh-keygen is not installed (apt-get install openssh-client)")
    return path


def _run_keygen(argv: list[str], failure: str) -> str:
    """ssh-keygen's stdout; InputError ``failure: <its last line>`` when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise InputError(f"{failure}: {detail[-1] if detail else f'ssh-keygen exited {proc.returncode}'}")
    return proc.stdout


def ensure_key(path: Path, key_type: str, comment: str, created: list[Path]) -> str:
    """The public key of the private key at ``path``, made with ssh-keygen when missing; mode 0600.

    An existing key is kept (its ``.pub`` is rewritten from it); one that
    ssh-keygen cannot read is an InputError. Files made here are added to ``created``.
    """
    keygen = _keygen()
    pub = path.with_name(path.name + ".pub")
    if path.exists():
        # -P "": a key with a passphrase fails here instead of prompting (sshd could not use it either).
        text = _run_keygen([keygen, "-y", "-P", "", "-f", str(path)],
                           f"{path} is not a usable private key (move it away to make a new one)").strip()
        if not _PUBKEY.match(text) or not text.startswith(f"ssh-{key_type}"):
            raise InputError(f"{path} is not an {key_type} private key; move it away to make a new one")
        os.chmod(path, 0o600)
        if not pub.exists():
            created.append(pub)
        _write(pub, f"{text} {comment}\n", 0o644)
        return f"{text} {comment}"
    created += [path, pub]
    if pub.exists():
        pub.unlink()  # a stale .pub without its private key
    bits = ["-b", "3072"] if key_type == "rsa" else []
    _run_keygen([keygen, "-q", "-t", key_type, *bits, "-N", "", "-C", comment, "-f", str(path)],
                f"ssh-keygen could not make {path}")
    os.chmod(path, 0o600)
    return pub.read_text().strip()


def _write(path: Path, text: str, mode: int) -> None:
    """Replace ``path`` atomically (a temporary file in the same directory, then rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_config_dir(directory: Path, port: int, patterns: Sequence[str] = (DEFAULT_PATTERN,),
                     listen: Sequence[str] = (), user: str | None = None) -> SshdFiles:
    """Create or update the configuration directory; returns where everything is.

    Keys that exist are kept; the text files are rewritten. On an error, every
    file made by this call is removed again (and the directory, if this call
    made it), so nothing half-created is left behind.
    """
    files = SshdFiles(check_path(directory))
    hosts = [SshHost(check_pattern(p), None, check_port(port)) for p in patterns]
    sshd_text = sshd_config_text(files.directory, port, listen=listen)
    ssh_text = ssh_config_text(hosts, files.directory, user)
    _keygen()
    if files.directory.exists() and not files.directory.is_dir():
        raise UsageError(f"--dir {directory}: exists and is not a directory")
    made_dir = _first_missing(files.directory)
    created: list[Path] = []
    try:
        try:
            files.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--dir {directory}: cannot create it: {exc.strerror}") from None
        own_private(files.directory, f"--dir {directory}:")
        targets = [files.sshd_config, files.ssh_config, files.known_hosts, files.authorized_keys]
        created += [p for p in targets if not p.exists()]
        host_pubs = [ensure_key(files.host_key(t), t, f"gpuaccept-host-{t}", created) for t in HOST_KEY_TYPES]
        client_pub = ensure_key(files.client_key, "ed25519", "gpuaccept-client", created)
        existing = files.authorized_keys.read_text() if files.authorized_keys.exists() else ""
        _write(files.authorized_keys, authorized_keys_text(existing, client_pub), 0o600)
        _write(files.known_hosts, known_hosts_text(hosts, host_pubs), 0o644)
        _write(files.ssh_config, ssh_text, 0o644)
        _write(files.sshd_config, sshd_text, 0o644)
    except OSError as exc:
        _roll_back(files.directory, created, made_dir)
        raise UsageError(f"--dir {directory}: cannot write {exc.filename or ''}: {exc.strerror}") from None
    except BaseException:
        _roll_back(files.directory, created, made_dir)
        raise
    return files


def own_private(directory: Path, what: str) -> None:
    """Make ``directory`` mode 0700 when it is a real directory (not a link) of this user; UsageError otherwise.
    It holds private host keys and ``authorized_keys``, and sshd runs with ``StrictModes no``, so the tool
    itself enforces what StrictModes would: nobody else may write to it or read the keys."""
    if os.path.islink(directory):
        raise UsageError(f"{what} is a symbolic link; give the real directory")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # a link swapped in since: ENOTDIR
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UsageError(f"{what} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}); "
                             "it would hold this user's private keys: use a directory of your own")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    check_private(directory, os.lstat(directory), "--dir")


def _first_missing(directory: Path) -> Path | None:
    """The outermost directory of ``directory``'s path that does not exist yet (None: it exists)."""
    missing = None
    for path in (directory, *directory.parents):
        if path.exists():
            break
        missing = path
    return missing


def _roll_back(directory: Path, created: list[Path], made_dir: Path | None) -> None:
    if made_dir is not None:
        shutil.rmtree(made_dir, ignore_errors=True)
        return
    for path in created:
        path.unlink(missing_ok=True)
