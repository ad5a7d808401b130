"""What the command lines share: the parser class (one-line errors, exit 2) and the suite options that
``run``, ``launch`` and ``node-status`` take. Imports only the argument converters and the exit codes."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import Any

from gpuaccept.argtypes import csv, duration, nonneg_int, positive_float
from gpuaccept.exitcodes import EXIT_USAGE

PROFILES = ("quick", "standard", "full", "burnin")


_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def close(name: str, candidates: Sequence[str]) -> str:
    """`` (did you mean a or b?)`` for the candidates close to ``name``; empty when none is."""
    near = difflib.get_close_matches(name, list(dict.fromkeys(candidates)), n=3, cutoff=0.7)
    return f" (did you mean {' or '.join(near)}?)" if near else ""


JSON_HELP = ("; '-' or no value: to stdout, in place of the text; a file: the text still printed (where "
             "positional arguments follow, write --json=PATH)")


def add_json_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--json [PATH|-]``, the one meaning of ``--json`` in every command: write ``what`` as JSON to PATH, or to
    stdout with ``-`` or no value. ``args.json`` is None, ``"-"`` or the path."""
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH|-", help=f"{what} as JSON{JSON_HELP}")


def bare_json_hint(value: str) -> str:
    """What an error adds when the word after a bare ``--json`` (taken as a positional argument) is in it."""
    return f" (a bare --json prints to stdout where positional arguments follow; to write {value}: --json={value})"


def bare_json(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """A bare ``--json`` as ``--json=-`` in a parser with positional arguments, so that ``compare --json A B``
    does not take A for the JSON path (a path is then written ``--json=PATH``)."""
    positional = any(not a.option_strings and not isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    if not positional:
        return list(argv)
    out = []
    for arg in argv:
        if arg == "--":
            break
        out.append("--json=-" if arg == "--json" else arg)
    return out + list(argv[len(out):])


RENAMED: dict[str, dict[str, str]] = {
    "launch *": {"--results-dir": "--report-dir"},
    "launch slurm": {"--mounts": "--mount", "--container-mounts": "--mount"},
    "isolate": {"--results-dir": "--report-dir"},
    "serve-metrics": {"--from": "--report-dir"},
    "trend": {"--max-drop-sigma": "--max-z"},
    "baseline create": {"--trim-z": "--max-z"},
    "analyze": {"--fail-on-outliers": "--exit-code"},
    "report": {"-f": "--format"},
    "launch k8s": {"--runtime": "--training-runtime"},
}
"""Old spellings kept for one release as hidden aliases (not in the help), by command (``launch *``: every
backend): old flag -> the flag it now is. Issue 28: one name per meaning across commands."""


def hidden_alias(p: argparse.ArgumentParser | argparse._ArgumentGroup, old: str, new: argparse.Action) -> None:
    """``old`` parses as ``new`` (same dest, value syntax and meaning) and is left out of the help."""
    kw: dict[str, Any] = {"dest": new.dest, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
    if new.nargs == 0:
        p.add_argument(old, action="store_const", const=new.const if new.const is not None else True, **kw)
    else:
        action = "append" if isinstance(new, argparse._AppendAction) else "store"
        if new.type is not None:
            kw["type"] = new.type
        p.add_argument(old, action=action, nargs=new.nargs, choices=new.choices, metavar=new.metavar, **kw)


def flag_hints(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """"did you mean" for each unknown ``--flag`` in ``extras``, among the flags ``parser``'s help shows."""
    flags = [f for a in parser._actions if a.help != argparse.SUPPRESS for f in a.option_strings if f[:2] == "--"]
    return "".join(close(e.split("=", 1)[0], flags) for e in extras if e.startswith("--"))


class Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line and exits 2 (argparse's own convention), pointing to the help
    of the (sub)command the error is in, with "did you mean" for a mistyped flag or choice."""

    def format_help(self) -> str:
        """argparse's help, the epilog (examples, the grouped commands) kept as written, not re-wrapped."""
        epilog, self.epilog = self.epilog, None
        try:
            text = super().format_help()
        finally:
            self.epilog = epilog
        return text + (f"\n{epilog}\n" if epilog else "")

    #: the word after a bare ``--json`` that :func:`bare_json` left as a positional argument (for the hint)
    bare_json_value: str | None = None

    def error(self, message: str) -> None:  # type: ignore[override]
        m = _CHOICE.search(message)
        if m:
            message += close(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        if self.bare_json_value is not None:
            message += bare_json_hint(self.bare_json_value)
        self.exit(EXIT_USAGE, f"gpuaccept: error: {message} (see '{self.prog} --help')\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        if args is None:
            return super().parse_known_args(None, namespace)
        given = list(args)
        converted = bare_json(self, given)
        if converted != given:
            k = given.index("--json")
            after = given[k + 1] if k + 1 < len(given) else ""
            self.bare_json_value = after if after and not after.startswith("-") else None
        return super().parse_known_args(converted, namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: Any = None) -> argparse.Namespace:
        """As argparse, but an unknown argument is reported by the sub-command that was given, e.g.
        ``(see 'gpuaccept run --help')``, with the flag it is close to."""
        ns, extras = self.parse_known_args(args, namespace)
        target = self
        while True:
            chosen = [a for a in target._actions if isinstance(a, argparse._SubParsersAction)
                      and getattr(ns, a.dest, None) in a.choices]
            if not chosen:
                break
            target = chosen[0].choices[getattr(ns, chosen[0].dest)]
        if isinstance(target, Parser) and target.bare_json_value is not None:
            ns.bare_json_value = target.bare_json_value  # for the hint on an error of the command (cli.main)
        if extras:
            target.error(f"unrecognized arguments: {' '.join(extras)}{flag_hints(target, extras)}")
        return ns


def add_suite_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``run`` and the default job of ``launch``."""
    from gpuaccept.equivalents import profile_help

    g = p.add_argument_group("suite")
    g.add_argument("--profile", choices=PROFILES, default=None,
                   help="check selection and sizes (default: standard); "
                        + "; ".join(profile_help(name) for name in PROFILES)
                        + " (conservative built-in estimates; --plan shows this node's)")
    g.add_argument("--checks", type=csv, default=None, metavar="A,B", help="run only these checks")
    g.add_argument("--skip", type=csv, default=None, metavar="C,D", help="do not run these checks")
    g.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None, help="default: auto")
    g.add_argument("--gpus", default=None, metavar="0,1", help="torch CUDA ordinals to test (default: all)")
    g.add_argument("--expect-gpus", type=nonneg_int, default=None, metavar="N", help="fail unless N GPUs are seen")
    g.add_argument("--require-gpu", action="store_true", default=None, help="no GPU is a failure, not a skip")
    g.add_argument("--timeout-scale", type=positive_float, default=None, metavar="F",
                   help="multiply every check's timeout by F")
    g.add_argument("--config", default=None, metavar="YAML", help="parameters, thresholds and options")
    g.add_argument("--baseline", default=None, metavar="YAML",
                   help="judge metrics against this fleet baseline (see 'gpuaccept baseline create')")
    g.add_argument("--baseline-thresholds", default=None, metavar="YAML",
                   help="threshold rules for --baseline (default: the baseline file's own, else max_z 5)")
    g.add_argument("--report-dir", default=None, metavar="DIR",
                   help="where <run-id>/ goes (for launch: a directory every node shares; default: "
                        "$GPUACCEPT_REPORT_DIR or ./gpuaccept-reports)")
    g.add_argument("--disk-path", default=None, metavar="DIR",
                   help="scratch directory of the disk check (its path parameter, over --config; default: the "
                        "system temp directory); must exist and be writable, and the disk check must be selected "
                        "(--profile full or burnin, or --checks disk)")
    g.add_argument("--budget", type=duration, default=None, metavar="DURATION",
                   help="fit the run in this window (90s, 10m, 1h30m; at most 7d): the checks and their depth are "
                        "chosen to fit, those that do not are left out (--plan shows which and why), and suspect "
                        "results are run again, deeper, with what is left (one node: not with --distributed)")
