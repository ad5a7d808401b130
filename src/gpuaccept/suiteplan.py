"""``--plan``, one meaning in every command that runs the suite (``run``, ``launch``, ``node-status``): print the
suite's plan (which checks, their sizes and timeouts, what a ``--budget`` left out and why; a table on a
terminal, JSON when piped) and run nothing. ``run`` makes it in-process; the others run ``gpuaccept run --plan``
in a child process, so that they never import torch themselves. (``--dry-run`` is the other flag: what a
command would do, done by none.)"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence

PLAN_HELP = ("print the suite's plan (checks, sizes, expected time, timeouts, what --budget leaves out and why): "
             "a table on a terminal, JSON when piped or with --json; run nothing")


def add_plan_option(p: argparse.ArgumentParser | argparse._ArgumentGroup, here: str = "") -> None:
    """``--plan`` with :data:`PLAN_HELP`; ``here`` says where the plan is made when not on the node itself."""
    p.add_argument("--plan", action="store_true", default=None, help=PLAN_HELP + here)


def show_plan(suite_args: Sequence[str]) -> int:
    """``gpuaccept run --plan SUITE_ARGS`` in a child process, its output on ours; its exit code."""
    sys.stdout.flush()
    return subprocess.call([sys.executable, "-m", "gpuaccept", "run", "--plan", *suite_args],
                           stdin=subprocess.DEVNULL)
