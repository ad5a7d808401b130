"""What the runner and the rank launchers share about a check's child process.

Reading the outcome file it wrote, saying why it died without one, killing its process
group, and appending a result line to ``results.jsonl``. Imports nothing of ours.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 5


def append_jsonl(path: Path, data: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(data, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def read_outcome(out: Path) -> dict[str, Any] | None:
    """The outcome JSON a check process wrote (the file is removed), or None when there is none."""
    try:
        raw: dict[str, Any] = json.loads(out.read_text())
    except (OSError, ValueError):
        return None
    out.unlink(missing_ok=True)
    return raw


def died_reason(returncode: int, log: Path) -> str:
    """Why a check process left no result: its exit status and the tail of its log."""
    how = signal_name(returncode) if returncode < 0 else f"exit code {returncode}"
    tail = log_tail(log)
    return f"check process died ({how}) without a result" + (f": {tail}" if tail else "")


def kill_tree(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    child.wait()
