"""An ordinary (non-root) account for tests that must not run as root, and rootless podman for it.

Under root (CI) :func:`ordinary_account` makes a throw-away user with ``useradd`` (home in a temporary
directory, subordinate uid/gid ranges for rootless podman) and removes it afterwards; elsewhere the
current user, who is not root, is the account. :func:`account_python` is how the account runs this
checkout's gpuaccept: this interpreter where the account can read it, else the system ``python3`` of
the same version with this checkout's sources and site-packages on PYTHONPATH (here the interpreter
lives under /root, which other users cannot enter). :class:`UserPodman` is the account's own rootless
image store, with the test store's runtime and ulimit settings (tests/podman_support.py).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT
from tests.podman_support import Podman, containers_conf_text
from tests.sshd import need_binary

SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))


@dataclass
class Account:
    name: str
    uid: int
    gid: int
    home: Path
    env: dict[str, str] = field(default_factory=dict)

    def ids(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def environ(self, **extra: str) -> dict[str, str]:
        path = os.environ.get("PATH", "/usr/bin:/bin")
        for d in ("/usr/sbin", "/sbin"):
            if d not in path.split(":"):
                path += f":{d}"
        env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "PATH": path, "LANG": "C.UTF-8",
               **self.env}
        env.update(extra)
        return env

    def run(self, argv: list[str], timeout: float = 120, cwd: Path | None = None,
            **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=self.environ(**env), cwd=cwd or self.home, **self.ids())

    def chown(self, *paths: Path) -> None:
        if os.geteuid() == 0:
            for p in paths:
                os.chown(p, self.uid, self.gid)


def _has_subids(name: str) -> bool:
    return all(p.exists() and any(line.split(":")[0] == name for line in p.read_text().splitlines())
               for p in SUBID_FILES)


@contextmanager
def ordinary_account() -> Iterator[Account]:
    """The account, with subordinate ids for rootless podman (skip, or fail under CI=true, without them)."""
    home = Path(tempfile.mkdtemp(prefix="gpuaccept-user-home-"))
    home.chmod(0o755)
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        if not _has_subids(me.pw_name):
            pytest.skip(f"rootless podman needs subordinate ids for {me.pw_name} in /etc/subuid and /etc/subgid")
        try:
            yield Account(me.pw_name, me.pw_uid, me.pw_gid, home)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        return
    useradd = need_binary("useradd", "the test runs the job as an ordinary user; apt-get install passwd")
    userdel = need_binary("userdel", "apt-get install passwd")
    need_binary("newuidmap", "rootless podman maps the user's subordinate ids; apt-get install uidmap")
    name = f"gpuaccept-u{secrets.token_hex(3)}"
    subprocess.run([useradd, "--home-dir", str(home), "--no-create-home", "--shell", "/bin/sh", "--user-group",
                    name], check=True, capture_output=True)
    added: list[tuple[Path, str]] = []
    try:
        entry = pwd.getpwnam(name)
        if not _has_subids(name):  # useradd adds them where /etc/login.defs says so; else a free range
            start = 1_000_000 + (entry.pw_uid % 1000) * 65536
            for path in SUBID_FILES:
                line = f"{name}:{start}:65536\n"
                with open(path, "a") as fh:
                    fh.write(line)
                added.append((path, line))
        os.chown(home, entry.pw_uid, entry.pw_gid)
        yield Account(name, entry.pw_uid, entry.pw_gid, home)
    finally:
        for path, line in added:
            path.write_text(path.read_text().replace(line, ""))
        subprocess.run([userdel, name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def account_python(account: Account) -> tuple[list[str], dict[str, str]]:
    """(argv prefix, extra environment) with which the account runs ``-m gpuaccept`` from this checkout."""
    paths = f"{ROOT / 'src'}:{sysconfig.get_paths()['purelib']}"
    probe = [sys.executable, "-c", "import gpuaccept.launch.cli"]
    try:
        if account.run(probe, PYTHONPATH=paths).returncode == 0:
            return [sys.executable], {"PYTHONPATH": paths}
    except OSError:
        pass
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system and account.run([system, *probe[1:]], PYTHONPATH=paths).returncode == 0:
        return [system], {"PYTHONPATH": paths}
    message = (f"the account {account.name} can run neither {sys.executable} nor a system {version} that "
               "imports this checkout (Debian: apt-get install python3)")
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI=true, so this is a failure, not a skip")
    pytest.skip(message)


@dataclass
class UserPodman:
    """The account's rootless podman store (under ``directory``) and the environment that selects it."""

    account: Account
    directory: Path

    def env(self) -> dict[str, str]:
        return {"CONTAINERS_CONF": str(self.directory / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.directory / "storage.conf"),
                "XDG_RUNTIME_DIR": str(self.directory / "xdg")}

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.account.run(["podman", *args], timeout=timeout, **self.env())

    def containers(self) -> list[str]:
        out = self.run("ps", "-a", "--format", "{{.Names}}")
        assert out.returncode == 0, out.stderr
        return out.stdout.split()


def user_podman(account: Account, directory: Path, root_store: Podman, image: str) -> UserPodman:
    """A rootless store for ``account`` in ``directory`` holding ``image``, copied from ``root_store``."""
    need_binary("podman", "apt-get install podman")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "xdg").mkdir(mode=0o700, exist_ok=True)
    (directory / "containers.conf").write_text(containers_conf_text())
    (directory / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\nrootless_storage_path = "{directory / "storage"}"\n')
    account.chown(directory, directory / "xdg", directory / "containers.conf", directory / "storage.conf")
    store = UserPodman(account, directory)
    archive = directory / "image.tar"
    root_store.run("save", "-o", str(archive), image, timeout=600)  # docker-archive: keeps the tag
    archive.chmod(0o644)
    loaded = store.run("load", "-i", str(archive), timeout=600)
    archive.unlink()
    if loaded.returncode != 0:
        pytest.fail(f"podman load as {account.name} failed: {loaded.stderr[-2000:]}")
    assert store.run("image", "exists", image).returncode == 0, loaded.stdout
    return store


def account_dir(account: Account, prefix: str) -> Path:
    """A new directory in the system's temporary directory that the account owns (pytest's are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    account.chown(path)
    return path
