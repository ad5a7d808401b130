"""Where the history lives: SQLAlchemy-style database URLs, parsed by hand.

Accepted forms (as SQLAlchemy reads them):

- ``sqlite:///relative/path.db`` (three slashes: relative to the working
  directory), ``sqlite:////abs/path.db`` (four: absolute), ``~`` expanded;
  a plain path without ``scheme://`` is taken as a SQLite file too;
- ``postgresql://user[:password]@host[:port]/dbname[?param=value...]``, also
  ``postgres://`` and ``postgresql+psycopg://``. ``?host=/run/postgresql``
  selects a Unix socket directory; ``?schema=NAME`` the PostgreSQL schema the
  tables live in (default ``gpuaccept``); other parameters (``sslmode``,
  ``connect_timeout``, ``application_name``...) go to libpq unchanged.

The default, when neither ``--db`` nor ``GPUACCEPT_DB`` is given, is
``$XDG_DATA_HOME/gpuaccept/history.db`` (``~/.local/share/gpuaccept/history.db``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from gpuaccept.errors import UsageError

ENV_VAR = "GPUACCEPT_DB"
DEFAULT_PG_SCHEMA = "gpuaccept"
_PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2", "postgresql+psycopg3")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True)
class DbUrl:
    """A parsed store URL. ``kind`` is ``sqlite`` (then ``path`` is set) or ``postgresql``."""

    kind: str
    text: str
    path: Path | None = None
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = None
    database: str | None = None
    schema: str = DEFAULT_PG_SCHEMA
    params: dict[str, str] = field(default_factory=dict)

    def redacted(self) -> str:
        """The URL with any password replaced by ``***`` (for messages and logs)."""
        if self.password is None:
            return self.text
        return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", self.text, count=1)

    def pg_kwargs(self) -> dict[str, str | int]:
        """Keyword arguments for ``psycopg.connect``."""
        kw: dict[str, str | int] = dict(self.params)
        for key, value in (("host", self.host), ("port", self.port), ("user", self.user),
                           ("password", self.password), ("dbname", self.database)):
            if value is not None and key not in kw:
                kw[key] = value
        kw.setdefault("connect_timeout", 10)
        kw.setdefault("application_name", "gpuaccept")
        return kw

    def __str__(self) -> str:
        return self.redacted()


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/gpuaccept/history.db``, or ``~/.local/share/gpuaccept/history.db``."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "gpuaccept" / "history.db"


def resolve_db_url(cli_value: str | None = None) -> DbUrl:
    """``--db`` if given, else ``$GPUACCEPT_DB``, else the default SQLite file."""
    if cli_value:
        return parse_db_url(cli_value, "--db")
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return parse_db_url(env, ENV_VAR)
    path = default_db_path()
    return DbUrl(kind="sqlite", text=f"sqlite:///{path}", path=path)


def parse_db_url(text: str, source: str = "--db") -> DbUrl:
    """Parse ``text``; raise UsageError naming ``source`` and the reason when it is not a usable URL."""
    text = text.strip()
    if not text:
        raise UsageError(f"{source}: empty database URL")
    if "://" not in text:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text) and os.path.sep not in text.split(":", 1)[0]:
            scheme = text.split(":", 1)[0]
            raise UsageError(f"{source}: {text!r} is not a database URL (did you mean {scheme}://...?)")
        return _sqlite(text, text, source)
    scheme, rest = text.split("://", 1)
    scheme = scheme.lower()
    if scheme == "sqlite":
        path_part, _, query = rest.partition("?")
        if query:
            raise UsageError(f"{source}: SQLite URLs take no parameters (got ?{query})")
        if not path_part.startswith("/") or path_part == "/":
            raise UsageError(f"{source}: a SQLite URL needs a file: sqlite:///relative.db or sqlite:////abs/path.db")
        return _sqlite(text, unquote(path_part[1:]), source)
    if scheme in _PG_SCHEMES:
        return _postgres(text, source)
    raise UsageError(f"{source}: unsupported database {scheme!r} in {_redact_any(text)} "
                     "(use sqlite:///PATH or postgresql://USER@HOST[:PORT]/DB)")


def _sqlite(text: str, raw_path: str, source: str) -> DbUrl:
    if raw_path in (":memory:", ""):
        raise UsageError(f"{source}: an in-memory SQLite database would forget every run; give a file path")
    path = Path(os.path.expanduser(raw_path))
    if path.exists() and path.is_dir():
        raise UsageError(f"{source}: {path} is a directory; give a file such as {path / 'history.db'}")
    return DbUrl(kind="sqlite", text=text, path=path)


def _postgres(text: str, source: str) -> DbUrl:
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"{source}: bad PostgreSQL URL {_redact_any(text)}: {exc}") from None
    if parts.fragment:
        raise UsageError(f"{source}: unexpected '#' in {_redact_any(text)}")
    database = unquote(parts.path[1:]) if parts.path.startswith("/") else None
    if database is not None and "/" in database:
        raise UsageError(f"{source}: the database name cannot contain '/' ({database!r})")
    params: dict[str, str] = {}
    schema = DEFAULT_PG_SCHEMA
    for key, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if key == "schema":
            if not _IDENT.match(value):
                raise UsageError(f"{source}: schema={value!r} is not a plain SQL identifier (letters, digits, _)")
            schema = value
        elif key in ("dbname", "user", "password"):
            raise UsageError(f"{source}: give {key} in the URL itself, not as ?{key}=")
        else:
            params[key] = value
    # No host in the URL and no ?host=: libpq's default, the local Unix socket.
    return DbUrl(kind="postgresql", text=text, host=parts.hostname, port=port,
                 user=unquote(parts.username) if parts.username else None,
                 password=unquote(parts.password) if parts.password is not None else None,
                 database=database or None, schema=schema, params=params)


def _redact_any(text: str) -> str:
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", text, count=1)
