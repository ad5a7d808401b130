"""Running one check in its own process: :func:`run_request`, and the entry point of the old way.

A process forked from the warm process (:mod:`gpuaccept.node.zygote`, the default) calls
:func:`run_request` with the request it was forked for. Started the old way
(``python -m gpuaccept.node.child``: ``GPUACCEPT_ZYGOTE=0``, off Linux, or once the warm process
is gone), it reads the JSON request on stdin instead. Either way it writes the outcome as JSON
to the path named in the request, and dies with its parent (PR_SET_PDEATHSIG), so a killed
runner leaves no check running behind it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

from gpuaccept.checks import load_check
from gpuaccept.checks.base import CheckContext, Outcome, enforce_required, outcome_to_dict
from gpuaccept.model import Status
from gpuaccept.node.childproc import write_outcome

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(137)


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """Run the check named in ``request`` and return its outcome as a dict; never raises."""
    started = time.monotonic()
    try:
        cls = load_check(request["path"])
        ctx = CheckContext(**request["ctx"])
        outcome = cls().run(ctx)
        if not isinstance(outcome, Outcome):
            raise TypeError(f"{cls.__name__}.run returned {type(outcome).__name__}, not Outcome")
        outcome = enforce_required(cls, ctx, outcome)
        result = outcome_to_dict(outcome)
    except Exception as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        result = {
            "status": Status.ERROR.value,
            "reason": f"{type(exc).__name__}: {exc}".strip(),
            "metrics": [],
            "details": {"traceback": tb.splitlines()[-12:]},
            "needs_gpu": False,
        }
    result["elapsed_s"] = time.monotonic() - started
    return result


def main() -> int:
    request = json.load(sys.stdin)
    _die_with_parent(int(request["parent_pid"]))
    result = run_request(request)
    return write_outcome(request["out"], result)


if __name__ == "__main__":
    raise SystemExit(main())
