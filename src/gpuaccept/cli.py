"""The command line: parse the arguments, call one entry point per command, map its outcome to an exit code.

``run`` calls :func:`gpuaccept.node.run.prepare` and :func:`gpuaccept.node.run.run_node`; every other subcommand
lives in its own module (:data:`SUBCOMMAND_MODULES`). The exit codes are :mod:`gpuaccept.exitcodes`': 0 pass,
1 a check failed, 2 bad usage, configuration or input (one line, no traceback), 3 gather on a running job,
4 a report file could not be written, 5 nothing measured, 130 interrupted.

Nothing here imports torch; subcommands import their modules lazily.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpuaccept import __version__
from gpuaccept.argtypes import duration as _duration
from gpuaccept.argtypes import positive_int as _positive_int
from gpuaccept.argtypes import run_id as _run_id
from gpuaccept.cliargs import PROFILES, Parser, add_json_option, add_suite_options
from gpuaccept.errors import GpuacceptError, ReportWriteError
from gpuaccept.exitcodes import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_MEASURED,
    EXIT_OK,
    EXIT_REPORT_WRITE,
    EXIT_USAGE,
)
from gpuaccept.model import Verdict
from gpuaccept.outputs import write_output
from gpuaccept.suiteplan import add_plan_option


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gpuaccept", description="Acceptance tests for GPU nodes and clusters.")
    parser.add_argument("--version", action="version", version=f"gpuaccept {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser,
                                help="one of the commands below; 'gpuaccept COMMAND --help' for its options")

    run = sub.add_parser("run", help="run the acceptance suite on this node",
                         description="Run the acceptance suite on this node and write a JSON report.")
    add_suite_options(run)
    add_json_option(run, "also write the report")
    add_plan_option(run)
    run.add_argument("--no-html", action="store_true",
                     help="do not write report.html beside report.json (written by default)")
    run.add_argument("--conformance", default=None, metavar="MANIFEST",
                     help="judge this node's configuration against a conformance manifest (see 'gpuaccept "
                          "conformance capture'); each difference fails the conformance check, naming the item")
    run.add_argument("--run-id", type=_run_id, default=None, help=argparse.SUPPRESS)
    run.add_argument("--verbose", "-v", action="store_true", help="more detail, tracebacks of internal errors")
    from gpuaccept.results.autosave import add_history_options

    add_history_options(run)
    d = run.add_argument_group("distributed")
    d.add_argument("--distributed", action="store_true",
                   help="run as one rank of a multi-process job started by torchrun, srun, mpirun or the "
                        "Kubeflow/Run:ai operators (rank and world size from their environment); node checks "
                        "run once per node, collectives and ddp_train on every rank, rank 0 writes the report")
    d.add_argument("--dist-timeout", type=_duration, default=120.0, metavar="DURATION",
                   help="time allowed (90s, 2m; bare number: seconds) for rendezvous, process-group init and each "
                        "collective; a rank silent this long is declared dead (default: 2m)")
    d.add_argument("--nproc", type=_positive_int, default=None, metavar="N",
                   help="without --distributed: processes for the distributed checks on this node "
                        "(default: one per selected GPU; 2 gloo ranks on CPU)")

    checks = sub.add_parser("checks", help="list every check with its parameters and default thresholds",
                            description="List every check: its tag, profiles, timeout, parameters (kind, bounds, "
                                        "value in --profile), threshold rules and the metrics it produces.")
    checks.add_argument("--profile", choices=PROFILES, default="standard")
    add_json_option(checks, "the checks, their parameters and thresholds")

    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    _group_commands(parser, sub)
    return parser


class _GroupedFormatter(argparse.HelpFormatter):
    """The top help: argparse's flat list of commands left out (the epilog lists them by group)."""

    def _iter_indented_subactions(self, action: argparse.Action) -> Any:
        return iter(())


def _group_commands(parser: argparse.ArgumentParser, sub: Any) -> None:
    """``gpuaccept --help``: the commands under group headings, then examples (not argparse's flat list); each
    parser's epilog its examples."""
    from gpuaccept.cliexamples import attach, command_list, epilog

    commands = {a.dest: a.help or "" for a in sub._choices_actions}
    parser.formatter_class = _GroupedFormatter
    parser.epilog = command_list(commands) + "\n\n" + epilog("")
    walk: list[tuple[str, argparse.ArgumentParser]] = []
    todo: list[tuple[str, argparse.ArgumentParser]] = [(name, p) for name, p in sub.choices.items()]
    while todo:
        where, p = todo.pop()
        walk.append((where, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += [(f"{where} {name}", child) for name, child in a.choices.items()]
    attach(walk)


def _bounds(minimum: float | None, maximum: float | None) -> str:
    """", 16 to 65536", ", at least 1", ", at most 10" or nothing: a parameter's bounds in ``checks``."""
    from gpuaccept.checks.base import format_bound

    if minimum is not None and maximum is not None:
        return f", {format_bound(minimum)} to {format_bound(maximum)}"
    if minimum is not None:
        return f", at least {format_bound(minimum)}"
    return f", at most {format_bound(maximum)}" if maximum is not None else ""


def _cmd_checks(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from gpuaccept.checks import registry
    from gpuaccept.equivalents import CHECKS

    rows: list[dict[str, Any]] = []
    for name, cls in registry().items():
        counterpart = CHECKS.get(name) if cls.__module__.startswith("gpuaccept.") else None
        rows.append({
            "name": name,
            "tag": cls.tag,
            "summary": cls.summary,
            "in_profile": args.profile in cls.profiles,
            "timeout_s": cls.timeout_s.get(args.profile),
            "params": [{"name": p.name, "kind": p.kind if p.kind != "list" else f"list[{p.item}]",
                        "value": cls.defaults(args.profile)[p.name], "help": p.help,
                        "minimum": p.minimum, "maximum": p.maximum} for p in cls.params],
            "thresholds": [r.describe() for r in cls.thresholds],
            "metrics": list(cls.metrics) if cls.metrics is not None else None,
            "replaces": asdict(counterpart) if counterpart is not None else None,
        })
    if args.json:
        write_output(args.json, json.dumps(rows, indent=2, default=str) + "\n", "--json")
        if args.json == "-":
            return EXIT_OK
    for row in rows:
        mark = "" if row["in_profile"] else f" (not in {args.profile})"
        print(f"{row['name']} [{row['tag']}]{mark}: {row['summary']}")
        print(f"    timeout: {row['timeout_s']} s ({args.profile})")
        for p in row["params"]:
            print(f"    {p['name']} ({p['kind']}{_bounds(p['minimum'], p['maximum'])}) = {p['value']!r}: {p['help']}")
        for t in row["thresholds"]:
            print(f"    threshold: {t}")
        metrics = row["metrics"]
        print(f"    metrics: {', '.join(metrics) if metrics is not None else '(not declared: rules not verified)'}")
        if row["replaces"] is not None:
            dcgm = row["replaces"]["dcgm"]
            print(f"    replaces: {row['replaces']['tool']}" + (f"; DCGM diag plugin: {dcgm}" if dcgm else ""))
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    """``gpuaccept run``: the warm process starts first, so that it imports torch while the run is planned."""
    from gpuaccept.node.warm import start_warm

    started = time.monotonic()  # a --budget counts from here
    warm = None if args.plan else start_warm()
    try:
        return _run(args, warm, started)
    finally:
        if warm is not None:
            warm.close()  # the runner has closed it already, unless the run never started


def _run(args: argparse.Namespace, warm: Any, started: float) -> int:
    """Plan (exit 2 before anything runs on bad input), run with a console, map the outcome to an exit code."""
    from gpuaccept.node.run import RunRequest, prepare, run_node, unapplied_options
    from gpuaccept.report.console import PlainConsole, RichConsole

    prep = prepare(RunRequest.from_namespace(args, sys.argv[1:]),
                   warn=lambda line: print(f"gpuaccept: warning: {line}", file=sys.stderr))
    if args.plan:
        return _print_plan(prep, args.json)
    to_stdout = args.json == "-"
    stream = sys.stderr if to_stdout else sys.stdout
    keys = {c.name: c.key_metric for c in prep.plan.checks}
    console: PlainConsole | RichConsole
    console = RichConsole(stream, keys) if stream.isatty() else PlainConsole(stream, keys)
    console.verbose = args.verbose
    out = run_node(prep, console, warm=warm, started=started, on_ready=console.header,
                   say=lambda line: print(f"[BUDGET] {line}", file=stream, flush=True))
    if isinstance(console, RichConsole):
        console.stop()
    if out.ending == "rendezvous":
        print(f"gpuaccept: error: {out.message}", file=sys.stderr)
        return EXIT_FAILED
    if out.ending == "interrupted":
        assert out.report is not None
        console.summary(out.report, {}, _leave_html(args, out, stream) if prep.leads else "")
        print(f"gpuaccept: interrupted by {signal_name(out.signum)}; partial report in {out.kept}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if out.ending == "write":
        print(f"gpuaccept: error: a report file could not be written: {out.message}; not a failure of this node. "
              f"What was measured before is in {out.results_path} and {out.report_path}; free space and run again",
              file=sys.stderr)
        return EXIT_REPORT_WRITE
    report = out.report
    assert report is not None
    if not prep.leads:
        print(f"[RESULT] rank {prep.rank.rank}: {report.verdict.value.upper()}; own results in {out.results_path}",
              file=stream, flush=True)
        return _verdict_exit(report.verdict)
    for line in unapplied_options(prep.plan):  # options that could not apply on this node
        print(f"[RESULT] warning: {line}", file=stream, flush=True)
    console.summary(report, {}, _leave_html(args, out, stream))
    if args.json:
        text = json.dumps(report.to_dict(), indent=2)
        try:
            write_output(args.json, text + "\n", "--json")
        except GpuacceptError as exc:
            print(f"gpuaccept: error: {exc}; the report is in {out.report_path}", file=sys.stderr)
            return EXIT_USAGE
    return _verdict_exit(report.verdict)


def _print_plan(prep: Any, json_to: str | None) -> int:
    """``--plan``: JSON with ``--json`` (``-``: stdout, else that file) or when stdout is not a terminal (as
    before: scripts that pipe it keep working); else a table for a person."""
    from gpuaccept.report.plan_view import plan_lines

    shown = prep.to_dict()
    text = json.dumps(shown, indent=2, allow_nan=False) + "\n"
    if json_to is not None and json_to != "-":
        from gpuaccept.outputs import write_output

        write_output(json_to, text, flag="--json")
    if json_to == "-" or (json_to is None and not sys.stdout.isatty()):
        sys.stdout.write(text)
        return EXIT_OK
    lines = plan_lines(shown)
    lines += [f"budget: {line}" for line in (prep.budget[0].lines() if prep.budget is not None else [])]
    print("\n".join(lines))
    return EXIT_OK


def _leave_html(args: argparse.Namespace, out: Any, stream: Any) -> str:
    """Write ``report.html`` beside the run's ``report.json`` (unless ``--no-html``); the line that says where
    both are. A page that cannot be made is one warning line: ``report.json`` and the verdict stay as they are."""
    from gpuaccept.report.runfiles import where_line, write_run_html

    if out.report_path is None:
        return ""
    run_dir = out.report_path.parent
    html = None
    if not args.no_html:
        html, warning = write_run_html(out.report, run_dir)
        if warning:
            print(f"[RESULT] warning: {warning}", file=stream, flush=True)
    return where_line(run_dir, html)


def _verdict_exit(verdict: Verdict) -> int:
    if verdict is Verdict.SUCCESS:
        return EXIT_OK
    if verdict is Verdict.NOTHING_MEASURED:
        return EXIT_NOTHING_MEASURED
    return EXIT_FAILED


def signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


COMMANDS = {"run": _cmd_run, "checks": _cmd_checks}

# Further subcommands live in their own modules, each with a function
# ``register(subparsers) -> None`` that adds its parsers and sets a default
# ``handler`` (a callable taking the parsed args and returning an exit code).
# Such modules import nothing heavy at module level.
SUBCOMMAND_MODULES: tuple[str, ...] = ("gpuaccept.results.cli", "gpuaccept.launch.cli",
                                      "gpuaccept.results.baseline_cli", "gpuaccept.results.analysis_cli",
                                      "gpuaccept.report.cli", "gpuaccept.containers.sshd_cli",
                                      "gpuaccept.containers.image_cli", "gpuaccept.nccltests.cli",
                                      "gpuaccept.perftest.cli", "gpuaccept.isolate.cli",
                                      "gpuaccept.results.conformance_cli",
                                      "gpuaccept.containers.constraints_cli", "gpuaccept.health.cli",
                                      "gpuaccept.health.nodestatus_cli", "gpuaccept.sweep.cli",
                                      "gpuaccept.completion")


DURATION_FLAGS = ("--budget", "--deadline", "--time", "--timeout", "--dist-timeout", "--test-timeout",
                  "--poll-interval", "--interval", "--max-age")


def _negative_values(argv: Sequence[str], options: tuple[str, ...] = DURATION_FLAGS) -> list[str]:
    """``--budget -5m`` as ``--budget=-5m`` (any of the duration flags), so that argparse hands the value to its
    converter, which says what is wrong with it, instead of taking it for an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in options and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    from gpuaccept.health.nodestatus_legacy import legacy_form
    from gpuaccept.nccltests.cli import default_action

    args = parser.parse_args(legacy_form(default_action(_negative_values(sys.argv[1:] if argv is None else argv))))
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        handler = getattr(args, "handler", None) or COMMANDS[args.command]
        return int(handler(args))
    except ReportWriteError as exc:
        print(f"gpuaccept: error: {exc} (the environment, not the node)", file=sys.stderr)
        return EXIT_REPORT_WRITE
    except GpuacceptError as exc:
        from gpuaccept.cliargs import bare_json_hint
        from gpuaccept.inputs import one_line

        line = one_line(str(exc))
        value = getattr(args, "bare_json_value", None)
        if value and value in line:  # e.g. `compare --json out.json A B`: out.json was read as a report
            line += bare_json_hint(value)
        print(f"gpuaccept: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gpuaccept: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        if getattr(args, "verbose", False):
            raise
        print(f"gpuaccept: internal error: {type(exc).__name__}: {exc} (rerun with --verbose for a traceback)",
              file=sys.stderr)
        return EXIT_FAILED
