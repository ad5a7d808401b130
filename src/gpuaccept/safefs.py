"""Directories the tool owns: made or checked without following a link, pruned only where it made them.

gpuaccept runs as root on shared machines, where another user may plant a symbolic link or a
directory of their own at a name the tool is about to use (a fixed name under ``/tmp`` above all).
:func:`private_dir` makes a directory mode 0700, or accepts an existing one only when it is a real
directory (not a link, checked with ``lstat`` and opened with ``O_NOFOLLOW``), owned by the caller and
writable by no one else. :func:`mark` leaves a marker file in a directory the tool made;
:func:`prune` removes only such marked directories, each checked with ``lstat`` first, and never
through a link (``shutil.rmtree`` walks by file descriptor and refuses a link).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from gpuaccept.errors import UsageError

MARKER = ".gpuaccept-made"
"""The file :func:`mark` writes in a directory the tool made; :func:`prune` removes nothing without it."""


def check_private(path: Path, st: os.stat_result, what: str) -> None:
    """UsageError unless ``st`` (an ``lstat`` of ``path``) is a directory owned by the caller that no one
    else may write to."""
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{what} {path} is a symbolic link; gpuaccept does not write through links "
                         "(give the real directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {path} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise UsageError(f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}); "
                         "refusing to write or prune there")
    if st.st_mode & 0o022:
        raise UsageError(f"{what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                         "refusing to write or prune there (chmod go-w it)")


def private_dir(path: Path | str, what: str = "directory", *, parents: bool = True) -> Path:
    """``path``, made mode 0700 when missing (its missing parents 0700 too with ``parents``), or checked
    by :func:`check_private` when it exists; UsageError when it cannot be made or is not safe."""
    path = Path(path)
    try:
        if parents and not path.parent.exists():
            private_dir(path.parent, what)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
        check_private(path, st, what)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if not os.path.samestat(st, os.fstat(fd)):
                raise UsageError(f"{what} {path} changed while it was checked; try again")
        finally:
            os.close(fd)
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from None
    return path


def mark(directory: Path) -> None:
    """Leave :data:`MARKER` in ``directory`` (one the tool made), never through a link."""
    fd = os.open(directory / MARKER, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)


def is_ours(path: Path) -> bool:
    """Whether ``path`` is a real directory (not a link) owned by the caller holding a regular-file
    :data:`MARKER`."""
    try:
        st = os.lstat(path)
        marker = os.lstat(path / MARKER)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and stat.S_ISREG(marker.st_mode) and marker.st_uid == os.geteuid())


def prune(parent: Path, keep: int, match: Callable[[str], bool], spare: str = "") -> list[Path]:
    """Remove all but the newest ``keep`` (by name, which sorts by time) of the directories in ``parent``
    whose name ``match``\\ es and that :func:`is_ours`; the removed paths. ``spare`` (the caller's own run) is
    never removed and counts as one of the ``keep``. Never raises on a failed removal; removes nothing when
    ``keep`` <= 0 or ``parent`` is not a private directory of the caller."""
    if keep <= 0:
        return []
    try:
        check_private(parent, os.lstat(parent), "directory")
        names = sorted(e.name for e in os.scandir(parent)
                       if e.name != spare and match(e.name) and not e.is_symlink())
    except (OSError, UsageError):
        return []
    kept = keep - 1 if spare else keep
    removed = []
    for name in names[:len(names) - kept]:
        old = parent / name
        if not is_ours(old):
            continue
        try:
            shutil.rmtree(old)  # by file descriptor; refuses a link put in its place since the check
        except OSError:
            continue
        removed.append(old)
    return removed
