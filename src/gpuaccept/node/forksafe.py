"""Whether a process forked from this one could still use CUDA: the warm process's check after its imports.

A module that calls ``torch.cuda.is_available()`` (or anything that starts CUDA) at import, in the warm
process (:mod:`gpuaccept.node.zygote`), poisons every later fork: CUDA in the forked process fails with
"Cannot re-initialize CUDA in forked subprocess". Two signs, both read without starting CUDA here:

- ``torch.cuda.is_initialized()`` in this process (torch's lazy init ran);
- torch's bad-fork flag in a probe child forked for the purpose and ended at once
  (``torch.cuda._is_in_bad_fork()``: set by torch's fork handler once CUDA, or only its device count, was
  asked for: ``is_available()`` sets it without initializing).

Where torch is not imported there is nothing to poison. On a machine without CUDA both are False.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

BAD_FORK_EXIT = 3
"""The probe child's exit status when it is in torch's bad-fork state."""


def fork_poison() -> str | None:
    """Why a process forked from this one now could not use CUDA, or None when it could (see the module doc).
    Only reads torch's flags (and forks one probe that exits at once)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "cuda"):
        return None
    try:
        if torch.cuda.is_initialized():
            return "CUDA was initialized in the warm process after its imports (torch.cuda.is_initialized())"
    except Exception as exc:  # a broken torch: the probe below still asks
        return f"torch.cuda.is_initialized() failed in the warm process: {type(exc).__name__}: {exc}"
    code = _probe()
    if code == BAD_FORK_EXIT:
        return ("a process forked from the warm process is in torch's bad-fork state (CUDA was asked for there, "
                "e.g. torch.cuda.is_available() at an import)")
    if code not in (0, None):
        return f"the fork probe of the warm process ended with status {code}"
    return None


def _probe() -> int | None:
    """Fork a child that reports torch's bad-fork flag by its exit status; None when its status was lost."""
    with warnings.catch_warnings():  # as at the warm process's other forks (numpy's OpenBLAS thread)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 4
        with contextlib.suppress(BaseException):
            torch = sys.modules["torch"]
            code = BAD_FORK_EXIT if torch.cuda._is_in_bad_fork() else 0
        os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status)
