"""``docs/reference/gpuaccept.1``: the manual page (roff, man macros), read from ``gpuaccept.cli.build_parser`` as
the command-line reference is (:mod:`gpuaccept.docsgen.cli_md`), so the two cannot disagree. ``man -l
docs/reference/gpuaccept.1`` shows it; ``pip install`` puts it in ``share/man/man1``."""

from __future__ import annotations

import argparse

from gpuaccept.docsgen.cli_md import _walk

EXIT_STATUS = (("0", "every check passed (warnings and skips allowed)"),
               ("1", "a check failed or errored"),
               ("2", "bad usage, configuration or input (one line on stderr, no traceback)"),
               ("3", "gather on a job that is still running (nothing written)"),
               ("4", "a report file could not be written (the environment, not the node)"),
               ("5", "nothing was measured (every check skipped)"),
               ("130", "interrupted by SIGINT, SIGTERM or SIGHUP (what was measured is on disk)"))
"""The exit codes, as :mod:`gpuaccept.exitcodes` documents them."""


def text(s: str) -> str:
    """``s`` as roff text: backslashes escaped, hyphens as minus signs (so that options copy and paste), a line
    that would start with a control character ('.' or "'") protected."""
    out = s.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line[:1] in (".", "'") else line for line in out.split("\n"))


def _para(s: str) -> str:
    """A filled paragraph: whitespace folded (roff fills it), one source line."""
    return text(" ".join(s.split()))


def _option_tag(action: argparse.Action) -> str:
    names = (", ".join(f"\\fB{text(s)}\\fR" for s in action.option_strings)
             or f"\\fI{text(str(action.metavar or action.dest))}\\fR")
    if action.option_strings and action.nargs != 0:
        metavar = action.metavar or ("{" + ",".join(map(str, action.choices)) + "}" if action.choices
                                     else action.dest.upper())
        names += f" \\fI{text(str(metavar))}\\fR"
    return names


def _option_help(action: argparse.Action) -> str:
    help_ = action.help or ""
    if "%" in help_:
        try:
            help_ = help_ % {**vars(action), "prog": "", "default": action.default}
        except (KeyError, TypeError, ValueError):
            pass
    if action.choices and not action.option_strings:
        help_ = f"{help_} (one of {', '.join(map(str, action.choices))})".strip()
    d = action.default
    if not (d is None or d is False or d == argparse.SUPPRESS or action.nargs == 0 or d == []) \
            and "default" not in help_:
        help_ += f" (default: {d})"
    return _para(help_)


def _section(words: list[str], parser: argparse.ArgumentParser, help_: str) -> list[str]:
    out = [f'.SS "{text(" ".join(words))}"']
    desc = parser.description or help_
    if desc:
        out.append(_para(desc.replace("%(prog)s", parser.prog)))
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                   and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        title = group.title or "arguments"
        out += [".PP", f"\\fI{text('options' if title == 'optional arguments' else title)}:\\fR"]
        for a in actions:
            out += [".TP", _option_tag(a), _option_help(a)]
    examples = (parser.epilog or "").partition("examples:\n")[2]
    if examples:
        out += [".PP", "\\fIexamples:\\fR", ".RS 4", ".nf"]
        out += [text(line.strip()) for line in examples.splitlines() if line.strip()]
        out += [".fi", ".RE"]
    return out


def page() -> str:
    """The manual page."""
    from gpuaccept.cli import build_parser

    root = build_parser()
    walked = list(_walk(root, ["gpuaccept"], ""))
    out = ['.\\" Generated from gpuaccept.cli.build_parser by python -m gpuaccept.docsgen (make docs-gen); '
           "do not edit.",
           '.TH GPUACCEPT 1 "" "gpuaccept" "User Commands"',
           ".SH NAME", "gpuaccept \\- " + _para(root.description or "").rstrip("."),
           ".SH SYNOPSIS", "\\fBgpuaccept\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]", ".br",
           "\\fBgpuaccept\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR",
           ".SH DESCRIPTION",
           _para("gpuaccept acceptance-tests GPU nodes and clusters: 'gpuaccept run' runs the suite of checks on "
                 "this node; 'gpuaccept launch' runs it on many nodes through Slurm, SSH, Kubernetes, Run:ai, MPI or "
                 "BCP; the results commands read, compare and judge the reports. Each command below is followed by "
                 "its options and examples, as 'gpuaccept COMMAND --help' prints them."),
           ".SH COMMANDS"]
    for words, parser, help_ in walked[1:]:
        out += _section(words, parser, help_)
    out.append(".SH EXIT STATUS")
    for code, meaning in EXIT_STATUS:
        out += [".TP", f"\\fB{code}\\fR", _para(meaning)]
    out += [".SH SEE ALSO", _para("The documentation site (docs/ in the source tree, built with mkdocs): getting "
                                  "started, concepts, how-tos, and the reference this page is generated with.")]
    return "\n".join(out) + "\n"
