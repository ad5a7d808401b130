"""The exit codes of every ``gpuaccept`` command; :mod:`gpuaccept.cli` maps outcomes to them.

0 every check passed (warnings and skips allowed), 1 a check failed or errored, 2 bad usage, configuration or
input (one line, no traceback), 3 ``gpuaccept gather`` on a job that is still running (nothing written; gather
again when it has ended), 4 a report file could not be written (disk full, read-only: the environment, not the
node), 5 nothing was measured (every check skipped), 130 interrupted by SIGINT, SIGTERM or SIGHUP (what was
measured is on disk). Imports nothing.
"""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_RUNNING = 3
EXIT_REPORT_WRITE = 4
EXIT_NOTHING_MEASURED = 5
