"""``node-status`` before its actions (``label``, ``daemonset``, ``npd``): the old forms rewritten to the new ones
for one release, before the parser sees them. Imports nothing of gpuaccept (``cli.main`` calls it)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

ACTIONS = ("label", "daemonset", "npd")
"""The actions of ``gpuaccept node-status``."""

LEGACY_NPD = {"--npd-plugin-path": "--plugin-path", "--npd-interval": "--invoke-interval",
              "--npd-timeout": "--timeout"}
"""Old flags of ``--npd-config`` -> the flags of ``npd``."""


def legacy_form(argv: Sequence[str], warn: Callable[[str], None] | None = None) -> list[str]:
    """``node-status [OPTIONS]`` (before the actions) as ``node-status label|daemonset|npd``: ``--daemonset``
    selects ``daemonset``, ``--npd-config DIR`` selects ``npd DIR`` (and its ``--npd-*`` flags are renamed),
    otherwise ``label``. Other argv, and ``node-status --help``, are returned as they are. ``warn`` gets the
    deprecation line (default: stderr)."""
    argv = list(argv)
    if argv[:1] != ["node-status"] or len(argv) < 2 or argv[1] in (*ACTIONS, "-h", "--help"):
        return argv
    rest, action, npd_dir = argv[1:], "label", None
    end = rest.index("--") if "--" in rest else len(rest)
    if "--daemonset" in rest[:end]:
        rest.remove("--daemonset")
        action = "daemonset"
    else:
        for i, arg in enumerate(rest[:end]):
            if arg.startswith("--npd-config="):
                npd_dir, rest = arg.split("=", 1)[1], rest[:i] + rest[i + 1:]
                break
            if arg == "--npd-config" and i + 1 < end:
                npd_dir, rest = rest[i + 1], rest[:i] + rest[i + 2:]
                break
        if npd_dir is not None:
            action = "npd"
            rest = [_renamed(a) for a in rest]
    new = ["node-status", action, *([npd_dir] if npd_dir is not None else []), *rest]
    note = (f"gpuaccept: warning: 'node-status' without an action is deprecated and goes in the next release; "
            f"this is 'gpuaccept node-status {action}{' DIR' if npd_dir is not None else ''} ...'")
    (warn or (lambda line: print(line, file=sys.stderr, flush=True)))(note)
    return new


def _renamed(arg: str) -> str:
    flag, eq, value = arg.partition("=")
    return LEGACY_NPD[flag] + eq + value if flag in LEGACY_NPD else arg
