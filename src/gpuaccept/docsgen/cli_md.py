"""The command-line reference, read from ``gpuaccept.cli.build_parser`` (every command and sub-command)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from gpuaccept.docsgen.markdown import GENERATED, cell, code, table


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name, "")


def _walk(parser: argparse.ArgumentParser, words: list[str], help_: str
          ) -> Iterator[tuple[list[str], argparse.ArgumentParser, str]]:
    yield words, parser, help_
    for name, sub, sub_help in _subcommands(parser):
        yield from _walk(sub, [*words, name], sub_help)


def _default(action: argparse.Action) -> str:
    d = action.default
    if d is None or d is False or d == argparse.SUPPRESS or action.nargs == 0 or d == []:
        return ""
    return code(d)


def _option(action: argparse.Action) -> str:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.option_strings and action.nargs != 0:
        metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                     else action.dest.upper())
        names += f" {code(metavar)}"
    return names


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%" in text:  # argparse's own formatting: %(default)s and friends, %% for a percent sign
        params = {**vars(action), "prog": "", "default": action.default}
        try:
            text = text % params
        except (KeyError, TypeError, ValueError):
            pass
    if action.choices and not action.option_strings and not isinstance(action, argparse._SubParsersAction):
        text = f"{text} (one of {', '.join(map(str, action.choices))})".strip()
    return cell(text)


def command_section(words: list[str], parser: argparse.ArgumentParser, help_: str) -> str:
    """One command's section: its description and a table of its arguments per group."""
    level = "#" * min(len(words) + 1, 4)
    out = [f"{level} `{' '.join(words)}`", ""]
    text = parser.description or help_
    if text and "%(prog)" in text:  # as argparse formats a description
        text = text % {"prog": parser.prog}
    if text:
        out += [" ".join(text.split()), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                   and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        title = group.title or "arguments"
        if title == "optional arguments":  # Python 3.10's name of what 3.11 calls "options"
            title = "options"
        out += [f"*{title}*", "", table(["argument", "default", "meaning"],
                                       [[_option(a), _default(a), _help(a)] for a in actions]), ""]
    subs = list(_subcommands(parser))
    if subs and len(words) > 1:
        out += ["Sub-commands: " + ", ".join(f"`{n}`" for n, _, _ in subs) + ".", ""]
    return "\n".join(out)


def page() -> str:
    """docs/reference/cli.md."""
    from gpuaccept.cli import build_parser

    root = build_parser()
    sections = [command_section(w, p, h) for w, p, h in _walk(root, ["gpuaccept"], "")]
    intro = [GENERATED, "", "# Command line", "",
             "Every command, sub-command and option, as `gpuaccept COMMAND --help` prints them; exit codes are on "
             "[Exit codes](exit-codes.md).", ""]
    return "\n".join(intro + sections).rstrip() + "\n"
