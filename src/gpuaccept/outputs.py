"""Writing a command's ``-o``/``--output``: what the path is decides how.

- ``-``: standard output;
- a missing path or a regular file: a temporary file in the same directory, fsync'd, renamed over it, so a
  reader sees the old file or the new one, never half of one (the new file is ``mode``, default 0644);
- a character device, FIFO or socket (``/dev/stdout``, ``/dev/null``, a named pipe): opened and written as a
  stream, never replaced by a regular file; a write error (``/dev/full``: no space) is an error;
- a symbolic link: refused. gpuaccept runs as root on shared machines; a link planted where a report is
  about to go would otherwise redirect it. Name the link's target instead;
- a directory or anything else: refused.

Every refusal and failure is one :class:`~gpuaccept.errors.UsageError` line naming the flag.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile

from gpuaccept.errors import UsageError

STDOUT = "stdout"
STREAM = "stream"
FILE = "file"


def _fail(flag: str, path: str, exc: OSError) -> UsageError:
    return UsageError(f"cannot write {flag} {path}: {exc.strerror or exc}")


def write_output(path: str, text: str, flag: str = "--output", mode: int = 0o644) -> str:
    """Write ``text`` to ``path`` as the module docstring says; how it went: :data:`STDOUT`, :data:`STREAM`
    or :data:`FILE`. UsageError when the path is refused or the write fails."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return STDOUT
    data = text.encode("utf-8")
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _fail(flag, path, exc) from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UsageError(f"cannot write {flag} {path}: it is a symbolic link; gpuaccept does not write through links "
                         f"(name its target, {os.path.realpath(path)}, instead)")
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UsageError(f"cannot write {flag} {path}: it is a directory; name a file")
    if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        _stream(path, data, flag)
        return STREAM
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError(f"cannot write {flag} {path}: neither a regular file nor a device or pipe; not replaced")
    _replace(path, data, flag, mode)
    return FILE


def _stream(path: str, data: bytes, flag: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise _fail(flag, path, exc) from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise _fail(flag, path, exc) from None
    finally:
        os.close(fd)


def _replace(path: str, data: bytes, flag: str, mode: int) -> None:
    directory = os.path.dirname(path) or "."
    name = os.path.basename(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise _fail(flag, path, exc) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)  # replaces the name; never follows a link put there since the check
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise _fail(flag, path, exc) from None
