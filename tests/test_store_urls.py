"""Database URLs and --since values: pure parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuaccept.errors import UsageError
from gpuaccept.results.dburl import default_db_path, parse_db_url, resolve_db_url
from gpuaccept.results.timespec import epoch_to_iso, iso_to_epoch, parse_since


def test_sqlite_urls_follow_sqlalchemy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_db_url("sqlite:///rel/history.db").path == Path("rel/history.db")
    assert parse_db_url("sqlite:////abs/history.db").path == Path("/abs/history.db")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_db_url("sqlite:///~/h.db").path == tmp_path / "h.db"
    assert parse_db_url("sqlite:///with%20space.db").path == Path("with space.db")
    plain = parse_db_url(str(tmp_path / "plain.db"))
    assert (plain.kind, plain.path) == ("sqlite", tmp_path / "plain.db")


def test_postgres_urls() -> None:
    u = parse_db_url("postgresql://ops:p%40ss@db.example:6543/fleet?sslmode=require&schema=gpu_hist")
    assert (u.kind, u.user, u.password, u.host, u.port, u.database, u.schema) == \
        ("postgresql", "ops", "p@ss", "db.example", 6543, "fleet", "gpu_hist")
    assert u.pg_kwargs() == {"sslmode": "require", "host": "db.example", "port": 6543, "user": "ops",
                             "password": "p@ss", "dbname": "fleet", "connect_timeout": 10,
                             "application_name": "gpuaccept"}
    assert u.redacted() == "postgresql://ops:***@db.example:6543/fleet?sslmode=require&schema=gpu_hist"
    assert "p%40ss" not in str(u)
    sock = parse_db_url("postgres://ops@/fleet?host=/run/postgresql")
    assert sock.host is None and sock.pg_kwargs()["host"] == "/run/postgresql"
    assert parse_db_url("postgresql+psycopg://u@[::1]:5432/d").host == "::1"
    assert parse_db_url("postgresql://u@h/d").schema == "gpuaccept"


@pytest.mark.parametrize(("text", "message"), [
    ("mysql://u@h/d", "unsupported database 'mysql'"),
    ("sqlite://", "needs a file"),
    ("sqlite:///", "needs a file"),
    ("sqlite:///:memory:", "in-memory"),
    ("sqlite:///x.db?mode=ro", "take no parameters"),
    ("postgresql://u@h:notaport/d", "bad PostgreSQL URL"),
    ("postgresql://u@h/d?schema=a;drop", "not a plain SQL identifier"),
    ("postgresql://u@h/d?password=x", "give password in the URL itself"),
    ("postgresql:/u@h/d", "did you mean postgresql://"),
    ("", "empty database URL"),
    ("mysql://u:secret@h/d", "u:***@h"),
])
def test_bad_urls(text: str, message: str) -> None:
    with pytest.raises(UsageError, match="^--db: .*" + message.replace("*", "\\*").replace("(", "\\(")) as err:
        parse_db_url(text)
    assert "secret" not in str(err.value)


def test_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GPUACCEPT_DB", raising=False)
    assert default_db_path() == tmp_path / "xdg" / "gpuaccept" / "history.db"
    assert resolve_db_url(None).path == tmp_path / "xdg" / "gpuaccept" / "history.db"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the XDG spec says relative values are invalid
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_db_path() == tmp_path / ".local" / "share" / "gpuaccept" / "history.db"
    monkeypatch.setenv("GPUACCEPT_DB", "postgresql://u@h/d")
    assert resolve_db_url(None).kind == "postgresql"
    assert resolve_db_url("sqlite:///x.db").kind == "sqlite"
    monkeypatch.setenv("GPUACCEPT_DB", "oracle://x")
    with pytest.raises(UsageError, match=r"^GPUACCEPT_DB: unsupported"):
        resolve_db_url(None)


NOW = iso_to_epoch("2026-11-22T10:30:00Z")


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-01", "2026-11-01T00:00:00Z"),
    ("2026-11-01T08:00", "2026-11-01T08:00:00Z"),
    ("2026-11-01T08:00:00+02:00", "2026-11-01T06:00:00Z"),
    ("2026-11-01 08:00Z", "2026-11-01T08:00:00Z"),
    ("12h", "2026-11-21T22:30:00Z"),
    ("7d", "2026-11-15T10:30:00Z"),
    ("2w", "2026-11-08T10:30:00Z"),
    ("90m", "2026-11-22T09:00:00Z"),
    ("today", "2026-11-22T00:00:00Z"),
    ("yesterday", "2026-11-21T00:00:00Z"),
])
def test_since(text: str, expected: str) -> None:
    assert epoch_to_iso(parse_since(text, now=NOW)) == expected


@pytest.mark.parametrize("text", ["last week", "2026-13-01", "7 days", "-3d", "12x", ""])
def test_bad_since(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--since: .* is not a date"):
        parse_since(text, now=NOW)
