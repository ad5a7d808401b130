"""What the CLI-driven backends (runai, bcp) share: running the scheduler's CLI, laying out its argv.

Errors are :class:`~gpuaccept.errors.UsageError` with one line: the CLI missing, silent past its
timeout, or exiting non-zero (with the last line it printed).
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from gpuaccept.errors import UsageError


def run_tool(argv: list[str], tool: str, what: str, *, cwd: Path | None = None, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (``argv[0]`` is the ``tool`` CLI, e.g. runai or ngc) with no standard input, text output."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, stdin=subprocess.DEVNULL,
                              timeout=timeout)
    except FileNotFoundError:
        raise UsageError(f"the {tool} CLI ({argv[0]}) is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{what}: {tool} did not answer in {timeout:.0f} s") from None
    except OSError as exc:
        raise UsageError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from None
    if check and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise UsageError(f"{what}: {tool} exited {proc.returncode}: {last[-1] if last else 'no output'}")
    return proc


def shell_lines(argv: list[str], head: int, option_prefix: str = "-", stop: str | None = "--") -> str:
    """``argv`` quoted for sh: the first ``head`` words on one line, then one option (a word starting with
    ``option_prefix``) per line with its values, continued with backslashes; from ``stop`` on, one line."""
    end = argv.index(stop) if stop is not None and stop in argv else len(argv)
    lines = [shlex.join(argv[:head])]
    for token in argv[head:end]:
        if token.startswith(option_prefix):
            lines.append(shlex.quote(token))
        else:
            lines[-1] += " " + shlex.quote(token)
    if end < len(argv):
        lines.append(shlex.join(argv[end:]))
    return " \\\n  ".join(lines)

