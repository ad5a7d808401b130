"""Calling ``gpuaccept.cli.main`` in-process with stdout and stderr captured (cheaper than a subprocess)."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from gpuaccept.cli import main


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    def one_line_error(self) -> str:
        """The single stderr line of an exit-2 result (asserts there is exactly one)."""
        assert self.rc == 2, (self.rc, self.out, self.err)
        assert len(self.err_lines) == 1, self.err
        assert "Traceback" not in self.err and "internal error" not in self.err, self.err
        return self.err_lines[0]


def run_main(*args: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return Result(rc, out.getvalue(), err.getvalue())
