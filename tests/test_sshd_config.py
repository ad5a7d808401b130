"""``gpuaccept sshd-config``: a real OpenSSH sshd, started by an ordinary user with the generated directory.

Under root (CI) the tests create a throw-away account with ``useradd`` (home in
a temporary directory) and run the command, ``sshd`` and ``ssh`` as that
account; elsewhere they run as the current user, who is not root either.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuaccept.containers.sshd import SshdFiles, SshHost, known_hosts_text, ssh_config_text, sshd_config_text
from gpuaccept.errors import UsageError
from tests.helpers import ROOT, cli_env, gpuaccept
from tests.sshd import SSHD, _wait_listening, free_port, need_binary


@dataclass
class Account:
    """Who runs sshd and ssh: a throw-away user under root, else the current user."""

    name: str
    uid: int
    gid: int
    home: Path
    password: str | None

    def run(self, argv: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=self.env(**env), cwd=self.home, **self.ids())

    def popen(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as fh:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    env=self.env(), cwd=self.home, **self.ids())

    def ids(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def env(self, **extra: str) -> dict[str, str]:
        env = cli_env(HOME=str(self.home), USER=self.name, LOGNAME=self.name)
        env.update(extra)
        return env


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    home = Path(tempfile.mkdtemp(prefix="gpuaccept-sshd-home-"))
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        yield Account(me.pw_name, me.pw_uid, me.pw_gid, home, None)
        shutil.rmtree(home, ignore_errors=True)
        return
    useradd = need_binary("useradd", "the tests log in as an ordinary user; apt-get install passwd")
    userdel = need_binary("userdel", "apt-get install passwd")
    chpasswd = need_binary("chpasswd", "apt-get install passwd")
    name = f"gpuaccept-t{secrets.token_hex(3)}"
    subprocess.run([useradd, "--home-dir", str(home), "--no-create-home", "--shell", "/bin/sh", "--user-group",
                    name], check=True, capture_output=True)
    try:
        # A real password, so that a refused password login is the server's configuration, not a locked account.
        password = secrets.token_urlsafe(12)
        subprocess.run([chpasswd], input=f"{name}:{password}\n", text=True, check=True, capture_output=True)
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        yield Account(name, entry.pw_uid, entry.pw_gid, home, password)
    finally:
        subprocess.run([userdel, name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def sshd_config_cmd(account: Account, directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpuaccept sshd-config --dir DIRECTORY ARGS`` as the account.

    Where the account cannot read this checkout or its interpreter (under
    /root), the command runs as root and the directory is handed over
    with chown, which is what the account would have made itself.
    """
    argv = [sys.executable, "-m", "gpuaccept", "sshd-config", "--dir", str(directory), *args]
    try:
        usable = account.run([sys.executable, "-c", "import gpuaccept.containers.sshd_cli"]).returncode == 0
    except OSError:  # the interpreter itself is out of the account's reach
        usable = False
    if usable:
        return account.run(argv)
    if os.geteuid() == 0 and directory.exists():  # root's own again, as the account's would be its own:
        for path in (directory, *directory.rglob("*")):  # sshd-config refuses a directory of another user
            os.chown(path, 0, 0)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=cli_env(), cwd=ROOT)
    if os.geteuid() == 0 and directory.exists():
        for path in (directory, *directory.rglob("*")):
            os.chown(path, account.uid, account.gid)
    return proc


@dataclass
class Server:
    files: SshdFiles
    port: int
    process: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def server(account: Account) -> Iterator[Server]:
    sshd = need_binary(SSHD, "the tests run a real sshd; apt-get install openssh-server")
    need_binary("ssh", "apt-get install openssh-client")
    need_binary("ssh-keygen", "apt-get install openssh-client")
    directory = account.home / "sshd"
    port = free_port()
    proc = sshd_config_cmd(account, directory, "--port", str(port), "--hosts", "node-*,127.0.0.1",
                           "--listen", "127.0.0.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = SshdFiles(directory)
    check = account.run([sshd, "-t", "-f", str(files.sshd_config)])
    assert check.returncode == 0, check.stdout + check.stderr
    log = account.home / "sshd.log"
    process = account.popen([sshd, "-D", "-e", "-f", str(files.sshd_config)], log)
    try:
        _wait_listening(port, process, log)
        yield Server(files, port, process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def ssh(account: Account, config: Path, host: str, command: str, *options: str,
        **env: str) -> subprocess.CompletedProcess[str]:
    return account.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", *options, host, command], timeout=30,
                       **env)


# ---- the real server -------------------------------------------------------------------------------------------

def test_sshd_runs_as_the_user_and_accepts_the_generated_key(account: Account, server: Server) -> None:
    assert os.geteuid() != 0 or account.uid != 0
    proc = ssh(account, server.files.ssh_config, "127.0.0.1", "id -un; id -u")
    assert proc.returncode == 0, proc.stderr + server.log.read_text(errors="replace")
    assert proc.stdout.split() == [account.name, str(account.uid)]
    # The server runs as the account, not root.
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
    assert uid_line.split()[1] == str(account.uid)
    assert server.files.pid_file.read_text().strip() == str(server.process.pid)


def test_wildcard_pattern_pins_the_host_keys(account: Account, server: Server) -> None:
    # node-7 is not resolvable: reach it at 127.0.0.1 under its name; the key is checked against node-*.
    proc = ssh(account, server.files.ssh_config, "node-7", "echo ok", "-o", "HostName=127.0.0.1",
               "-o", "HostKeyAlias=node-7")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_other_host_keys_are_refused(account: Account, server: Server) -> None:
    other = account.home / "other"
    made = sshd_config_cmd(account, other, "--port", str(server.port), "--hosts", "127.0.0.1")
    assert made.returncode == 0, made.stderr
    proc = ssh(account, SshdFiles(other).ssh_config, "127.0.0.1", "echo reached")
    assert proc.returncode == 255 and "reached" not in proc.stdout
    assert "Host key verification failed" in proc.stderr or "IDENTIFICATION HAS CHANGED" in proc.stderr, proc.stderr


def test_password_login_is_refused(account: Account, server: Server) -> None:
    askpass = account.home / "askpass.sh"
    asked = account.home / "asked"
    askpass.write_text(f"#!/bin/sh\ntouch {asked}\necho '{account.password or 'not-the-password'}'\n")
    askpass.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(askpass, account.uid, account.gid)
    proc = account.run(["ssh", "-F", str(server.files.ssh_config), "-o", "PubkeyAuthentication=no",
                        "-o", "PasswordAuthentication=yes", "-o", "KbdInteractiveAuthentication=yes",
                        "-o", "PreferredAuthentications=password,keyboard-interactive",
                        "-o", "NumberOfPasswordPrompts=1", "127.0.0.1", "echo reached"],
                       timeout=30, SSH_ASKPASS=str(askpass), SSH_ASKPASS_REQUIRE="force", DISPLAY=":0")
    assert proc.returncode == 255 and "reached" not in proc.stdout
    # The server offers public keys only: no password was ever asked for.
    assert "Permission denied (publickey)" in proc.stderr, proc.stderr
    assert not asked.exists()


def test_per_node_host_blocks_reach_the_server_by_name(account: Account, server: Server) -> None:
    """Part of the container use: a Host block per node name with its address and port."""
    config = server.files.directory / "nodes_config"
    config.write_text(ssh_config_text([SshHost("node-0", "127.0.0.1", server.port)], server.files.directory))
    if os.geteuid() == 0:
        os.chown(config, account.uid, account.gid)
    proc = ssh(account, config, "node-0", "echo node-0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "node-0"


def test_keys_are_private_and_a_second_run_keeps_them(account: Account, server: Server) -> None:
    files = server.files
    for key in files.keys():
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
        assert key.stat().st_uid == account.uid
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    assert [line.split()[0] for line in files.known_hosts.read_text().splitlines()] == \
        [f"node-*,[node-*]:{server.port}"] * 2 + [f"127.0.0.1,[127.0.0.1]:{server.port}"] * 2
    before = {p.name: p.read_bytes() for p in files.keys()}
    new_port = free_port()
    proc = sshd_config_cmd(account, files.directory, "--port", str(new_port), "--hosts", "node-*,127.0.0.1",
                           "--listen", "127.0.0.1")
    assert proc.returncode == 0, proc.stderr
    try:
        assert {p.name: p.read_bytes() for p in files.keys()} == before
        assert f"Port {new_port}\n" in files.sshd_config.read_text()
        assert len(files.authorized_keys.read_text().splitlines()) == 1
        assert all(f"]:{new_port} " in line for line in files.known_hosts.read_text().splitlines())
    finally:  # back to the running server's port for the other tests
        again = sshd_config_cmd(account, files.directory, "--port", str(server.port), "--hosts",
                                "node-*,127.0.0.1", "--listen", "127.0.0.1")
        assert again.returncode == 0, again.stderr
    assert ssh(account, files.ssh_config, "127.0.0.1", "true").returncode == 0


# ---- the texts -------------------------------------------------------------------------------------------------

def test_sshd_config_text() -> None:
    text = sshd_config_text(Path("/srv/ssh"), 2222, listen=["127.0.0.1"])
    lines = text.splitlines()
    for wanted in ("Port 2222", "ListenAddress 127.0.0.1", "HostKey /srv/ssh/ssh_host_ed25519_key",
                   "HostKey /srv/ssh/ssh_host_rsa_key", "AuthorizedKeysFile /srv/ssh/authorized_keys",
                   "PidFile /srv/ssh/sshd.pid", "StrictModes no", "UsePAM no", "PasswordAuthentication no",
                   "KbdInteractiveAuthentication no", "PubkeyAuthentication yes"):
        assert wanted in lines, wanted
    assert text == sshd_config_text(Path("/srv/ssh"), 2222, listen=["127.0.0.1"])  # deterministic


def test_ssh_config_and_known_hosts_for_nodes() -> None:
    hosts = [SshHost("node-0", "10.0.0.5", 2200), ("node-1", "10.0.0.6", 2201), SshHost("gpu-*", None, 22)]
    text = ssh_config_text(hosts, Path("/srv/ssh"), user="ml")
    blocks = [b for b in text.split("\n\n") if b.startswith("Host ")]
    assert [b.splitlines()[0] for b in blocks] == ["Host node-0", "Host node-1", "Host gpu-*"]
    assert "    HostName 10.0.0.6\n    HostKeyAlias node-1\n    Port 2201\n    User ml\n" in blocks[1]
    assert "HostName" not in blocks[2] and "    Port 22\n" in blocks[2]
    assert all("    UserKnownHostsFile /srv/ssh/known_hosts" in b and "StrictHostKeyChecking yes" in b
               and "IdentityFile /srv/ssh/id_ed25519" in b for b in blocks)
    assert "StrictHostKeyChecking no" not in text
    known = known_hosts_text(hosts, ["ssh-ed25519 AAAAC3Nza host-a", "ssh-rsa AAAAB3Nza"])
    assert known.splitlines() == [
        "node-0,[node-0]:2200 ssh-ed25519 AAAAC3Nza", "node-0,[node-0]:2200 ssh-rsa AAAAB3Nza",
        "node-1,[node-1]:2201 ssh-ed25519 AAAAC3Nza", "node-1,[node-1]:2201 ssh-rsa AAAAB3Nza",
        "gpu-*,[gpu-*]:22 ssh-ed25519 AAAAC3Nza", "gpu-*,[gpu-*]:22 ssh-rsa AAAAB3Nza",
    ]


def test_ssh_reads_the_node_blocks_as_written(tmp_path: Path) -> None:
    ssh_bin = need_binary("ssh", "apt-get install openssh-client")
    config = tmp_path / "ssh_config"
    config.write_text(ssh_config_text([SshHost("node-3", "10.1.2.3", 2203)], tmp_path))
    proc = subprocess.run([ssh_bin, "-G", "-F", str(config), "node-3"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    seen = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert seen["hostname"] == "10.1.2.3" and seen["port"] == "2203" and seen["hostkeyalias"] == "node-3"
    assert seen["stricthostkeychecking"] == "true" and seen["userknownhostsfile"] == str(tmp_path / "known_hosts")
    assert seen["passwordauthentication"] == "no"


@pytest.mark.parametrize("call, message", [
    (lambda: sshd_config_text(Path("/srv/my ssh"), 22), "unquoted"),
    (lambda: sshd_config_text(Path("/srv/ssh"), 0), "TCP port"),
    (lambda: ssh_config_text([SshHost("node 0", None, 22)], Path("/srv")), "host pattern"),
    (lambda: ssh_config_text([SshHost("node-0", "10.0.0.*", 22)], Path("/srv")), "wildcards"),
    (lambda: ssh_config_text([], Path("/srv")), "no hosts"),
])
def test_bad_text_inputs(call: object, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        call()  # type: ignore[operator]


# ---- bad input through the CLI ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--port", "0"], "out of range"),
    (["--port", "65536"], "out of range"),
    (["--port", "ssh"], "not a port number"),
    (["--port", "2222", "--hosts", "node 1"], "host pattern"),
    (["--port", "2222", "--hosts", ","], "at least one host pattern"),
])
def test_cli_bad_values_exit_2_and_create_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    target = tmp_path / "new" / "sshd"
    proc = gpuaccept("sshd-config", "--dir", str(target), *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "new").exists()


def test_cli_unusable_dir_exits_2(tmp_path: Path) -> None:
    need_binary("ssh-keygen", "apt-get install openssh-client")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for target, message in ((a_file, "not a directory"), (a_file / "sub", "cannot create"),
                            (tmp_path / "with space", "unquoted")):
        proc = gpuaccept("sshd-config", "--dir", str(target), "--port", "2222")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_cli_failure_midway_rolls_back(tmp_path: Path) -> None:
    need_binary("ssh-keygen", "apt-get install openssh-client")
    target = tmp_path / "sshd"
    target.mkdir()
    broken = SshdFiles(target).host_key("rsa")  # made after the ed25519 host key
    broken.write_text("not a key\n")
    proc = gpuaccept("sshd-config", "--dir", str(target), "--port", "2222")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "ssh_host_rsa_key" in proc.stderr, proc.stderr
    assert [p.name for p in target.iterdir()] == ["ssh_host_rsa_key"]  # the ed25519 key made before is gone
    assert broken.read_text() == "not a key\n"


def test_cli_prints_how_to_start_and_log_in(tmp_path: Path) -> None:
    need_binary("ssh-keygen", "apt-get install openssh-client")
    proc = gpuaccept("sshd-config", "--dir", str(tmp_path / "d"), "--port", "2222", "--hosts", "gpu-*")
    assert proc.returncode == 0, proc.stderr
    assert f"/usr/sbin/sshd -D -e -f {tmp_path / 'd' / 'sshd_config'}" in proc.stdout
    assert f"ssh -F {tmp_path / 'd' / 'ssh_config'} HOST" in proc.stdout
    assert "Host gpu-*\n    Port 2222\n" in (tmp_path / "d" / "ssh_config").read_text()


def test_cli_refuses_a_key_with_a_passphrase_without_prompting(tmp_path: Path) -> None:
    keygen = need_binary("ssh-keygen", "apt-get install openssh-client")
    target = tmp_path / "sshd"
    target.mkdir()
    key = SshdFiles(target).host_key("ed25519")
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True)
    before = key.read_bytes()
    proc = gpuaccept("sshd-config", "--dir", str(target), "--port", "2222", timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not a usable private key" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert key.read_bytes() == before
    assert sorted(p.name for p in target.iterdir()) == ["ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"]
