"""Every parser of ``gpuaccept.cli.build_parser()``, for the tests of the one command-line grammar."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from gpuaccept.cli import build_parser


def subparsers(parser: argparse.ArgumentParser | None = None,
               path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(``"launch slurm"``, parser) for the top parser and every sub-parser, each once (aliases left out)."""
    top = build_parser() if parser is None else parser
    seen: set[int] = set()

    def walk(p: argparse.ArgumentParser, where: tuple[str, ...]) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        if id(p) in seen:
            return
        seen.add(id(p))
        if hasattr(p, "load"):
            p.load()  # a lazily filled parser (launch backends)
        yield " ".join(where), p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, (*where, name))

    yield from walk(top, path)


def options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """Its optional arguments, without ``--help``/``--version``."""
    return [a for a in p._actions if a.option_strings and not isinstance(a, (argparse._HelpAction,
                                                                             argparse._VersionAction))]
