"""A real OpenSSH server on a loopback port, for the ssh launcher tests.

:func:`start_sshd` generates a host key and a user key in a temporary
directory, writes an ``sshd_config`` (127.0.0.1 only, public-key login for
the current user, root included since CI runs as root) and an ``ssh_config``
whose aliases (``node-a`` and ``node-b`` unless told others) all reach that server, then runs
``/usr/sbin/sshd -D -e -f CONFIG`` until the fixture ends.

:func:`need_binary` is the rule for system binaries: missing means skip with
a reason on a developer machine, but a failure under ``CI=true``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"


def need_binary(name: str, why: str) -> str:
    """Path of ``name`` (a command or an absolute path); skip, or under CI=true fail, when it is missing."""
    path = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name)
    if path:
        return path
    msg = f"{name} is not installed ({why})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{msg}; CI=true, so this is a failure, not a skip")
    pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Sshd:
    """A running sshd and how to reach it."""

    port: int
    key: Path
    ssh_config: Path
    user: str
    directory: Path
    process: subprocess.Popen[bytes]

    def client_options(self) -> list[str]:
        """Options for an ``ssh``/``scp`` run without the generated config."""
        return ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-i", str(self.key)]

    def ssh(self, host: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``host`` (an alias of the generated config)."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), host, command], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)


def _account_locked(user: str) -> bool:
    """True when ``/etc/shadow`` (readable by root only) marks ``user`` locked (``!...``)."""
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == user:
                return rest.startswith(("!", "*LK*"))
    except OSError:
        pass
    return False


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, deadline_s: float = 15) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text(errors='replace').strip()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port} within {deadline_s} s")


def start_sshd(directory: Path, aliases: Sequence[str] = ("node-a", "node-b")) -> Iterator[Sshd]:
    """Generator for a fixture: yields a running :class:`Sshd`, stops it afterwards. Every name of ``aliases``
    is a ``Host`` of the generated ssh config that reaches this server."""
    sshd = need_binary(SSHD, "the ssh launcher tests run a real sshd; apt-get install openssh-server")
    need_binary("ssh", "apt-get install openssh-client")
    need_binary("scp", "apt-get install openssh-client")
    keygen = need_binary("ssh-keygen", "apt-get install openssh-client")
    directory.mkdir(parents=True, exist_ok=True)
    host_key, user_key = directory / "host_ed25519", directory / "id_ed25519"
    for key in (host_key, user_key):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True,
                       stdin=subprocess.DEVNULL)
    authorized = directory / "authorized_keys"
    authorized.write_text(Path(f"{user_key}.pub").read_text())
    authorized.chmod(0o600)
    if os.geteuid() == 0:
        # sshd's compiled-in privilege separation directory; Debian creates it only when the service starts.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    user = pwd.getpwuid(os.geteuid()).pw_name
    port = free_port()
    config = directory / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized}",
        f"PidFile {directory / 'sshd.pid'}",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        # sshd refuses even key logins to a locked account unless PAM decides (a root without a password)
        f"UsePAM {'yes' if os.geteuid() == 0 and _account_locked(user) else 'no'}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        f"AllowUsers {user}",
        "Subsystem sftp internal-sftp",
        "MaxStartups 100:30:200",
        "MaxSessions 64",
        "PrintMotd no",
        "LogLevel ERROR",
        "",
    ]))
    ssh_config = directory / "ssh_config"
    common = ["    HostName 127.0.0.1", f"    Port {port}", f"    User {user}", f"    IdentityFile {user_key}",
              "    IdentitiesOnly yes", "    StrictHostKeyChecking no", "    UserKnownHostsFile /dev/null",
              "    LogLevel ERROR"]
    ssh_config.write_text("\n".join(line for alias in aliases for line in (f"Host {alias}", *common, "")))
    log = directory / "sshd.log"
    with open(log, "wb") as log_fh:
        proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                stdout=log_fh, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, proc, log)
        yield Sshd(port=port, key=user_key, ssh_config=ssh_config, user=user, directory=directory, process=proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
