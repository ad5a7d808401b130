"""``gpuaccept completion bash|zsh|tcsh``: print a shell completion script made from the parser itself (shtab),
so it knows every command and flag, the launch backends' included."""

from __future__ import annotations

import argparse
from typing import Any

from gpuaccept.errors import UsageError

SHELLS = ("bash", "zsh", "tcsh")


def register(sub: Any) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh or tcsh)",
                       description="Print the completion script of SHELL for gpuaccept on stdout, made from the "
                                   "command-line parser (every command, flag and choice). Needs the shtab package "
                                   "(pip install 'gpuaccept[completion]').")
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help=f"one of {', '.join(SHELLS)}")
    p.set_defaults(handler=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    try:
        import shtab
    except ImportError:
        raise UsageError("shell completion needs the shtab package: pip install 'gpuaccept[completion]'") from None
    from gpuaccept.cli import build_parser

    parser = build_parser()
    for action in parser._actions:  # the launch backends add their flags on first use: add them now
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                for inner in child._actions:
                    if isinstance(inner, argparse._SubParsersAction):
                        for backend in inner.choices.values():
                            if hasattr(backend, "load"):
                                backend.load()
    print(shtab.complete(parser, shell=args.shell))
    return 0
