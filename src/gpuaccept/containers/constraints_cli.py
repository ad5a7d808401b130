"""Subcommand ``constraints``: a pip constraints file of the current environment.

``gpuaccept constraints [--output FILE] [--urls]`` writes ``name==version`` for every installed
distribution (see :mod:`gpuaccept.containers.constraints` for direct-URL and editable installs),
so that ``pip install -c FILE PKG`` adds PKG without changing anything installed, e.g. the torch
of an NGC container. The file is written atomically; exit 2 when it cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "constraints", help="write a pip constraints file that pins every installed package",
        description="Write a pip constraints file of this Python environment: name==version for every installed "
                    "distribution. 'pip install -c FILE PKG' then refuses anything that would change one of them, "
                    "e.g. the torch of an NGC container.")
    p.add_argument("--output", "-o", default="-", metavar="FILE", help="where to write (default '-': stdout)"
                   "; a device or FIFO is written as a stream, a file replaced atomically, a link refused")
    p.add_argument("--urls", action="store_true",
                   help="pin direct-URL installs (wheel files, VCS checkouts, local directories) by their URL "
                        "instead of their version; pip then fetches that URL whenever it resolves the package")
    p.set_defaults(handler=cmd_constraints)


def cmd_constraints(args: argparse.Namespace) -> int:
    from gpuaccept.containers.constraints import (
        constraints_text,
        environment_name,
        installed,
        site_paths,
    )
    from gpuaccept.outputs import FILE, write_output

    text = constraints_text(installed(site_paths(sys.argv[0])), urls=args.urls, source=environment_name())
    if write_output(args.output, text) != FILE:
        return 0
    pins = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"gpuaccept: wrote {args.output} ({pins} pins)", file=sys.stderr)
    return 0
