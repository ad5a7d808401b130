"""Re-record the fio JSON fixtures of tests/test_disk.py with the real fio (see README.md here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuaccept.checks.disk_io import fio_command

HERE = Path(__file__).resolve().parent


def main() -> int:
    fio = shutil.which("fio")
    if fio is None:
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fio-record-") as work:
        for name, direct, depth in (("direct.json", True, 32), ("buffered.json", False, 1)):
            out = subprocess.run(fio_command(fio, work, 64, 2, direct, depth), capture_output=True, text=True,
                                 check=True).stdout
            (HERE / name).write_text(out)
    # a job fio cannot run: its directory is not writable (error 13, EACCES) -- fio exits 1 with JSON
    proc = subprocess.run(fio_command(fio, "/sys/kernel", 16, 1, False, 1), capture_output=True, text=True)
    (HERE / "error.json").write_text(proc.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
