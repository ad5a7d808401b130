"""Typed exceptions. The CLI maps them to exit codes; the library never exits."""

from __future__ import annotations


class GpuacceptError(Exception):
    """Base class of every error gpuaccept raises on purpose."""


class UsageError(GpuacceptError):
    """Bad flags or arguments (exit 2)."""


class ConfigError(GpuacceptError):
    """A configuration, threshold or baseline file is malformed (exit 2).

    The message names the file, the key and the reason.
    """

    def __init__(self, source: str, key: str, reason: str) -> None:
        self.source = source
        self.key = key
        self.reason = reason
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:  # raised in a worker process, read back here
        return type(self), (self.source, self.key, self.reason)


class InputError(GpuacceptError):
    """An input file or tool output could not be understood (exit 2)."""


class CheckTimeout(GpuacceptError):
    """A check ran past its timeout."""


class ReportWriteError(GpuacceptError):
    """A report file could not be written (disk full, read-only, quota): a failure of the
    environment, never of the node (exit 4). ``report`` is what had been measured, when known."""

    def __init__(self, message: str, report: object = None, cause: OSError | None = None) -> None:
        self.report = report
        self.errno = cause.errno if cause is not None else None
        self.strerror = (cause.strerror or str(cause)) if cause is not None else message
        super().__init__(message)
