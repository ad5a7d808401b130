"""Subcommand ``sshd-config``: a user-owned sshd configuration directory (see :mod:`gpuaccept.containers.sshd`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from gpuaccept.containers.sshd import DEFAULT_PATTERN


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range (1-65535)")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sshd-config", help="write a user-owned sshd configuration (keys, sshd_config, ssh_config)",
        description="Create DIR with ed25519 and RSA host keys, an sshd_config for public-key login only on "
                    "PORT (no root needed: /usr/sbin/sshd -D -e -f DIR/sshd_config), a client key that it "
                    "authorises, and an ssh_config for the host patterns that pins the host keys in "
                    "DIR/known_hosts (ssh -F DIR/ssh_config HOST). Running it again keeps the keys.")
    p.add_argument("--dir", required=True, metavar="DIR", help="the configuration directory (created, mode 0700)")
    p.add_argument("--port", required=True, type=_port, metavar="PORT", help="TCP port sshd listens on")
    p.add_argument("--hosts", default=DEFAULT_PATTERN, metavar="PATTERN[,PATTERN]",
                   help="host patterns of the cluster for ssh_config and known_hosts, e.g. 'gpu-*' "
                        f"(default: {DEFAULT_PATTERN!r}, for use with ssh -F)")
    p.add_argument("--listen", action="append", default=[], metavar="ADDR",
                   help="address sshd binds (repeatable; default: every address)")
    p.add_argument("--user", default=None, metavar="NAME", help="login name in ssh_config (default: the client's)")
    p.set_defaults(handler=cmd_sshd_config)


def cmd_sshd_config(args: argparse.Namespace) -> int:
    from gpuaccept.containers.sshd import parse_patterns, write_config_dir

    patterns = parse_patterns(args.hosts)
    files = write_config_dir(Path(args.dir).expanduser(), args.port, patterns, listen=args.listen, user=args.user)
    print(f"gpuaccept: sshd configuration in {files.directory} (port {args.port})")
    print(f"  start sshd:  /usr/sbin/sshd -D -e -f {files.sshd_config}")
    print(f"  log in:      ssh -F {files.ssh_config} HOST   (HOST matching {', '.join(patterns)})")
    if args.port < 1024 and os.geteuid() != 0:
        print(f"gpuaccept: note: port {args.port} is privileged; an ordinary user's sshd cannot bind it")
    return 0
