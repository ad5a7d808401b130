"""A real PostgreSQL server for the tests: ``initdb`` + ``postgres`` from the Debian package.

The server listens on 127.0.0.1 at a free port (and a Unix socket in its
temporary directory), with trust authentication, fsync off and
``max_connections`` low (40, below the 64 concurrent writers of the
concurrency test) so refused connections are part of what is tested. PostgreSQL refuses to run as root: under
root (as in CI) the data directory is owned by the ``postgres`` user and
both programs run as that user through ``setpriv`` (or ``runuser``).

One server serves the whole test session (:func:`shared_server`); each test
gets its own database (:meth:`PgServer.new_database`). Binaries come from
``$GPUACCEPT_PG_BIN``, else the newest ``/usr/lib/postgresql/*/bin``, else
``PATH``. When they are missing the tests are skipped with the reason, except
under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

MAX_CONNECTIONS = 40


def missing(reason: str) -> None:
    """Skip with ``reason``, or fail when ``CI=true`` (CI must have every system binary)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: required)", pytrace=False)
    pytest.skip(reason)


def pg_bindir() -> Path | None:
    """Directory holding ``initdb`` and ``postgres``, or None."""
    env = os.environ.get("GPUACCEPT_PG_BIN")
    candidates = [Path(env)] if env else []

    def version(p: str) -> float:
        try:
            return float(Path(p).parent.name)
        except ValueError:
            return 0.0

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    which = shutil.which("initdb")
    if which:
        candidates.append(Path(which).parent)
    for c in candidates:
        if (c / "initdb").is_file() and (c / "postgres").is_file():
            return c
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """A PostgreSQL instance in a temporary directory. :meth:`start`, then :meth:`stop`."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.base = Path(tempfile.mkdtemp(prefix="gpuaccept-pg-", dir="/tmp"))
        self.data = self.base / "data"
        self.log = self.base / "postgres.log"
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.prefix: list[str] = []
        self.user = "postgres"

    def _as_owner(self) -> None:
        """Under root, hand the directory to the ``postgres`` user and run the binaries as it."""
        if os.geteuid() != 0:
            return
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            missing("running as root and there is no 'postgres' user to run PostgreSQL as")
            raise
        os.chown(self.base, pw.pw_uid, pw.pw_gid)
        self.base.chmod(0o700)
        if shutil.which("setpriv"):
            self.prefix = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
        elif shutil.which("runuser"):
            self.prefix = ["runuser", "-u", "postgres", "--"]
        else:
            missing("running as root and neither setpriv nor runuser is installed to drop to 'postgres'")

    def start(self) -> None:
        self._as_owner()
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        init = subprocess.run([*self.prefix, str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user,
                               "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"],
                              capture_output=True, text=True, cwd=self.base, env=env, timeout=120)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr.strip()[-2000:]}")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*self.prefix, str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.base}",
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", f"max_connections={MAX_CONNECTIONS}", "-c", "shared_buffers=32MB",
                 "-c", "log_min_messages=warning"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.base, env=env, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not accept connections in {timeout:.0f} s: "
                                       f"{self.log_tail()}") from None
                time.sleep(0.1)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-2000:]
        return ""

    def url(self, database: str, user: str | None = None) -> str:
        return f"postgresql://{user or self.user}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """Create an empty database; return its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)  # fast shutdown (the whole group: runuser forks)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)


_SERVER: PgServer | None = None


def shared_server() -> PgServer:
    """The session's server, started on first use (skip or fail as :func:`missing` says when it cannot be)."""
    global _SERVER
    if _SERVER is not None:
        return _SERVER
    bindir = pg_bindir()
    if bindir is None:
        missing("PostgreSQL server binaries (initdb, postgres) not found; apt-get install postgresql")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("psycopg 3 is not installed (pip install 'psycopg[binary]')")
    assert bindir is not None
    server = PgServer(bindir)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    atexit.register(server.stop)
    _SERVER = server
    return server
