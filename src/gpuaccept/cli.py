"""The command line. The only place that maps outcomes to exit codes.

Exit codes: 0 every check passed (warnings and skips allowed), 1 a check
failed or errored, 2 bad usage, configuration or input (one line, no
traceback), 3 ``gpuaccept gather`` on a job that is still running (nothing
written; gather again when it has ended), 4 a report file could not be
written (disk full, read-only: the environment, not the node), 5 nothing was
measured (every check skipped), 130 interrupted by SIGINT, SIGTERM or SIGHUP
(what was measured is on disk).

Nothing here imports torch; subcommands import their modules lazily.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuaccept import __version__
from gpuaccept.argtypes import csv as _csv
from gpuaccept.argtypes import duration as _duration
from gpuaccept.argtypes import nonneg_int as _nonneg_int
from gpuaccept.argtypes import positive_float as _positive_float
from gpuaccept.argtypes import positive_int as _positive_int
from gpuaccept.argtypes import run_id as _run_id
from gpuaccept.errors import GpuacceptError, ReportWriteError
from gpuaccept.model import Verdict

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_RUNNING = 3
EXIT_REPORT_WRITE = 4
EXIT_NOTHING_MEASURED = 5
PROFILES = ("quick", "standard", "full", "burnin")


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line and exits 2 (argparse's own convention)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"gpuaccept: error: {message} (see '{self.prog} --help')\n")


def add_suite_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``run`` and the default job of ``launch``."""
    g = p.add_argument_group("suite")
    g.add_argument("--profile", choices=PROFILES, default=None, help="check selection and sizes (default: standard)")
    g.add_argument("--checks", type=_csv, default=None, metavar="A,B", help="run only these checks")
    g.add_argument("--skip", type=_csv, default=None, metavar="C,D", help="do not run these checks")
    g.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None, help="default: auto")
    g.add_argument("--gpus", default=None, metavar="0,1", help="torch CUDA ordinals to test (default: all)")
    g.add_argument("--expect-gpus", type=_nonneg_int, default=None, metavar="N", help="fail unless N GPUs are seen")
    g.add_argument("--require-gpu", action="store_true", default=None, help="no GPU is a failure, not a skip")
    g.add_argument("--timeout-scale", type=_positive_float, default=None, metavar="F",
                   help="multiply every check's timeout by F")
    g.add_argument("--config", default=None, metavar="YAML", help="parameters, thresholds and options")
    g.add_argument("--baseline", default=None, metavar="YAML",
                   help="judge metrics against this fleet baseline (see 'gpuaccept baseline create')")
    g.add_argument("--baseline-thresholds", default=None, metavar="YAML",
                   help="threshold rules for --baseline (default: the baseline file's own, else max_z 5)")
    g.add_argument("--report-dir", default=None, metavar="DIR",
                   help="where <run-id>/report.json goes (default: $GPUACCEPT_REPORT_DIR or ./gpuaccept-reports)")
    g.add_argument("--disk-path", default=None, metavar="DIR",
                   help="scratch directory of the disk check (its path parameter, over --config; default: the "
                        "system temp directory); must exist and be writable, and the disk check must be selected "
                        "(--profile full or burnin, or --checks disk)")
    g.add_argument("--budget", type=_duration, default=None, metavar="DURATION",
                   help="fit the run in this window (90s, 10m, 1h30m; at most 7d): the checks and their depth are "
                        "chosen to fit, those that do not are left out (--plan shows which and why), and suspect "
                        "results are run again, deeper, with what is left (one node: not with --distributed)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpuaccept", description="Acceptance tests for GPU nodes and clusters.")
    parser.add_argument("--version", action="version", version=f"gpuaccept {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="run the acceptance suite on this node",
                         description="Run the acceptance suite on this node and write a JSON report.")
    add_suite_options(run)
    run.add_argument("--json", default=None, metavar="PATH", help="also write the report here ('-' for stdout)")
    run.add_argument("--plan", action="store_true", help="print the suite plan as JSON and run nothing")
    run.add_argument("--run-id", type=_run_id, default=None, help=argparse.SUPPRESS)
    run.add_argument("--verbose", "-v", action="store_true", help="more detail, tracebacks of internal errors")
    from gpuaccept.results.autosave import add_history_options

    add_history_options(run)
    d = run.add_argument_group("distributed")
    d.add_argument("--distributed", action="store_true",
                   help="run as one rank of a multi-process job started by torchrun, srun, mpirun or the "
                        "Kubeflow/Run:ai operators (rank and world size from their environment); node checks "
                        "run once per node, collectives and ddp_train on every rank, rank 0 writes the report")
    d.add_argument("--dist-timeout", type=_positive_float, default=120.0, metavar="S",
                   help="seconds allowed for rendezvous, process-group init and each collective; a rank silent "
                        "this long is declared dead (default: 120)")
    d.add_argument("--nproc", type=_positive_int, default=None, metavar="N",
                   help="without --distributed: processes for the distributed checks on this node "
                        "(default: one per selected GPU; 2 gloo ranks on CPU)")

    checks = sub.add_parser("checks", help="list every check with its parameters and default thresholds")
    checks.add_argument("--profile", choices=PROFILES, default="standard")
    checks.add_argument("--json", action="store_true", help="machine-readable output")

    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def _bounds(minimum: float | None, maximum: float | None) -> str:
    """", 16 to 65536", ", at least 1", ", at most 10" or nothing: a parameter's bounds in ``checks``."""
    from gpuaccept.checks.base import format_bound

    if minimum is not None and maximum is not None:
        return f", {format_bound(minimum)} to {format_bound(maximum)}"
    if minimum is not None:
        return f", at least {format_bound(minimum)}"
    return f", at most {format_bound(maximum)}" if maximum is not None else ""


def _cmd_checks(args: argparse.Namespace) -> int:
    from gpuaccept.checks import registry

    rows: list[dict[str, Any]] = []
    for name, cls in registry().items():
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
        })
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return EXIT_OK
    for row in rows:
        mark = "" if row["in_profile"] else f" (not in {args.profile})"
        print(f"{row['name']} [{row['tag']}]{mark}: {row['summary']}")
        print(f"    timeout: {row['timeout_s']} s ({args.profile})")
        for p in row["params"]:
            print(f"    {p['name']} ({p['kind']}{_bounds(p['minimum'], p['maximum'])}) = {p['value']!r}: {p['help']}")
        for t in row["thresholds"]:
            print(f"    threshold: {t}")
    return EXIT_OK


def _merge_options(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """Flags over config over defaults. Returns (RunOptions, Config, report_dir)."""
    from gpuaccept.checks import registry
    from gpuaccept.errors import UsageError
    from gpuaccept.node.config import Config, load_config, parse_gpus
    from gpuaccept.node.suite import RunOptions

    reg = registry()
    cfg = load_config(args.config, reg) if args.config else Config()
    if getattr(args, "disk_path", None) is not None:
        _set_disk_path(args.disk_path, cfg, reg)

    def pick(flag: Any, conf: Any, default: Any) -> Any:
        return flag if flag is not None else (conf if conf is not None else default)

    gpus = None
    if args.gpus is not None:
        try:
            gpus = parse_gpus(args.gpus, "--gpus", "")
        except GpuacceptError as exc:
            raise UsageError(f"--gpus: {exc.reason if hasattr(exc, 'reason') else exc}") from None
    opts = RunOptions(
        profile=pick(args.profile, cfg.profile, "standard"),
        checks=args.checks,
        skip=args.skip or [],
        device=pick(args.device, cfg.device, "auto"),
        gpus=gpus if gpus is not None else cfg.gpus,
        timeout_scale=pick(args.timeout_scale, cfg.timeout_scale, 1.0),
        require_gpu=bool(pick(args.require_gpu, cfg.require_gpu, False)),
        expect_gpus=pick(args.expect_gpus, cfg.expect_gpus, None),
    )
    report_dir = pick(args.report_dir, cfg.report_dir, os.environ.get("GPUACCEPT_REPORT_DIR", "gpuaccept-reports"))
    return opts, cfg, report_dir


def _set_disk_path(path: str, cfg: Any, reg: dict[str, Any]) -> None:
    """``--disk-path``: the disk check's ``path`` parameter in ``cfg``, over what the config file says."""
    from gpuaccept.errors import UsageError
    from gpuaccept.node.config import CheckSettings

    if not path.strip():
        raise UsageError("--disk-path needs a directory (leave the flag out for the system temp directory)")
    decl = reg["disk"].param("path") if "disk" in reg else None
    if decl is None:
        raise UsageError("--disk-path: this gpuaccept has no disk check")
    try:
        value = decl.coerce(path, "--disk-path", "")
    except GpuacceptError as exc:
        raise UsageError(str(exc)) from None
    cfg.checks.setdefault("disk", CheckSettings()).params["path"] = value


def check_disk_path_selected(args: argparse.Namespace, plan: Any) -> None:
    """UsageError when ``--disk-path`` is given and the plan leaves the disk check out (it would be ignored)."""
    from gpuaccept.errors import UsageError

    if getattr(args, "disk_path", None) is not None and not any(c.name == "disk" for c in plan.checks):
        raise UsageError(f"--disk-path {args.disk_path}: the disk check is not in this selection; it runs in the "
                         f"full and burnin profiles (or add disk to --checks)")


def _check_disk_path(args: argparse.Namespace, plan: Any) -> None:
    """``--disk-path`` on this node: selected, and a writable directory (UsageError, before anything runs)."""
    from gpuaccept.checks.disk_io import scratch_problem
    from gpuaccept.errors import UsageError

    check_disk_path_selected(args, plan)
    problem = scratch_problem(args.disk_path) if getattr(args, "disk_path", None) is not None else None
    if problem:
        raise UsageError(f"--disk-path: {problem}")


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
    from gpuaccept.checks import registry
    from gpuaccept.checks.base import host_memory_mib
    from gpuaccept.hw.devices import resolve_device
    from gpuaccept.node.runner import Interrupted, RunEvents, Runner, is_distributed
    from gpuaccept.node.suite import check_gpu_fit, check_host_fit, plan_suite, preflight
    from gpuaccept.report.console import PlainConsole, RichConsole
    from gpuaccept.results.autosave import save

    opts, cfg, report_dir = _merge_options(args)
    baseline = _load_baseline(args)
    if not args.no_history:  # a bad --db or $GPUACCEPT_DB is refused before anything runs, not after
        from gpuaccept.results.dburl import resolve_db_url

        resolve_db_url(args.db)
    info = _rank_info(args)
    reg = registry()
    device = resolve_device(opts.device)
    plan = plan_suite(opts, cfg, reg, device)
    _check_disk_path(args, plan)
    preflight(plan, cfg, reg)
    _check_expect_gpus(plan)
    check_host_fit(plan, cfg, reg, host_memory_mib())
    gpu_memory = _selected_gpu_memory(plan)
    check_gpu_fit(plan, cfg, reg, gpu_memory)
    budget: Any = None
    if args.budget is not None:
        if info is not None:
            from gpuaccept.errors import UsageError

            raise UsageError("--budget is for a run on one node; under --distributed every rank would plan its own "
                             "second pass (give the job a --profile and --checks that fit instead)")
        plan, budget = _budget(plan, cfg, reg, opts.timeout_scale, args.budget, len(gpu_memory), args.db or None,
                               "--no-history" if args.no_history else "")
        _check_expect_gpus(plan)
        estimates = budget[2]
    else:
        from gpuaccept.node.budget import candidates, estimates_of, planned_gpus

        gpus = planned_gpus(plan.device, plan.gpus, len(gpu_memory))[0]
        estimates = estimates_of(candidates(plan, cfg, reg, gpus))
    nproc = 1
    if info is None and any(is_distributed(c) for c in plan.checks):
        from gpuaccept.distributed.local import default_nproc

        nproc = args.nproc or default_nproc(plan.device, plan.gpus, os.environ)
    if args.plan:
        shown = plan.to_dict()
        if info is not None:
            shown["distributed"] = info.to_dict()
        else:
            shown["nproc"] = nproc
        if budget is not None:
            shown["budget"] = budget[0].to_dict()
        print(json.dumps(shown, indent=2, allow_nan=False))
        return EXIT_OK

    to_stdout = args.json == "-"
    stream = sys.stderr if to_stdout else sys.stdout
    keys = {c.name: c.key_metric for c in plan.checks}
    console: PlainConsole | RichConsole
    console = RichConsole(stream, keys) if stream.isatty() else PlainConsole(stream, keys)
    runner: Runner
    if info is not None:
        from gpuaccept.distributed.control import RendezvousError
        from gpuaccept.node.distributed_run import DistributedRunner

        leader = info.rank == 0
        runner = DistributedRunner(plan, Path(report_dir), info, run_id=args.run_id, argv=sys.argv[1:],
                                   events=RunEvents.of(console) if leader else RunEvents(), verbose=args.verbose,
                                   dist_timeout_s=args.dist_timeout, warm=warm)
        try:
            runner.join()
        except RendezvousError as exc:
            print(f"gpuaccept: error: rank {info.rank}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        if leader:
            console.header(plan, str(runner.run_dir))
    else:
        common: dict[str, Any] = dict(run_id=args.run_id, argv=sys.argv[1:], events=RunEvents.of(console),
                                      verbose=args.verbose, nproc=nproc, dist_timeout_s=args.dist_timeout, warm=warm)
        if budget is not None:
            from gpuaccept.node.budget_run import WindowRunner

            def say(line: str) -> None:
                print(f"[BUDGET] {line}", file=stream, flush=True)

            runner = WindowRunner(plan, Path(report_dir), deadline=started + args.budget, budget=budget[0],
                                  candidates=budget[1], registry=reg, config=cfg, timeout_scale=opts.timeout_scale,
                                  say=say, **common)
        else:
            runner = Runner(plan, Path(report_dir), **common)
        console.header(plan, str(runner.run_dir))
        for line in budget[0].lines() if budget is not None else []:
            print(f"[BUDGET] {line}", file=stream, flush=True)
    console.verbose = args.verbose
    runner.baseline = baseline
    runner.report.estimates = estimates
    leads = info is None or info.rank == 0
    try:
        report = runner.run()
    except Interrupted as exc:
        if isinstance(console, RichConsole):
            console.stop()
        kept = runner.report_path if leads else runner.results_path
        if leads:
            save(exc.report, args, kept)
        console.summary(exc.report, {})
        print(f"gpuaccept: interrupted by {signal_name(exc.signum)}; partial report in {kept}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ReportWriteError as exc:
        if isinstance(console, RichConsole):
            console.stop()
        print(f"gpuaccept: error: a report file could not be written: {exc}; not a failure of this node. "
              f"What was measured before is in "
              f"{runner.results_path} and {runner.report_path}; free space and run again", file=sys.stderr)
        return EXIT_REPORT_WRITE
    if info is not None and info.rank != 0:
        print(f"[RESULT] rank {info.rank}: {report.verdict.value.upper()}; own results in {runner.results_path}",
              file=stream, flush=True)
        return _verdict_exit(report.verdict)
    save(report, args, runner.report_path)
    _warn_unapplied(plan, report, stream)
    console.summary(report, {})
    if args.json:
        text = json.dumps(report.to_dict(), indent=2)
        if to_stdout:
            print(text)
        else:
            try:
                Path(args.json).write_text(text + "\n")
            except OSError as exc:
                print(f"gpuaccept: error: cannot write --json {args.json}: {exc.strerror}; "
                      f"the report is in {runner.report_path}", file=sys.stderr)
                return EXIT_USAGE
    return _verdict_exit(report.verdict)


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


def unapplied_options(plan: Any) -> list[str]:
    """Why an option given for this run could not apply, one line each (``--gpus`` on a CPU run)."""
    notes = []
    if plan.gpus is not None and plan.device != "cuda":
        shown = ",".join(str(g) for g in plan.gpus)
        notes.append(f"--gpus/gpus {shown} did not apply: the run's device is {plan.device} (no usable GPU), "
                     "so no GPU was selected")
    return notes


def _budget(plan: Any, cfg: Any, reg: Any, timeout_scale: float, budget_s: float, counted: int,
            db: str | None, off: str) -> tuple[Any, tuple[Any, Any, dict[str, float]]]:
    """(the plan cut to ``budget_s`` seconds, (its BudgetPlan, the calibrated candidates, the built-in estimates
    of what it keeps)); the estimates are calibrated from this host's runs in the history at ``db`` (None: the
    default one) unless ``off`` says why not. UsageError when nothing fits."""
    from gpuaccept.node.budget import apply_budget, candidates, estimates_of, plan_budget, planned_gpus, refuse_empty
    from gpuaccept.node.calibrate import planned_with_history
    from gpuaccept.node.runner import this_host

    gpus, assumed = planned_gpus(plan.device, plan.gpus, counted)
    raw = candidates(plan, cfg, reg, gpus)
    cands, calibration, warning = planned_with_history(raw, plan.device, db, this_host(), off)
    if warning:
        print(f"gpuaccept: warning: {warning}", file=sys.stderr)
    chosen = plan_budget(cands, budget_s, gpus, assumed)
    chosen.calibration = calibration
    refuse_empty(chosen, cands)
    return apply_budget(plan, chosen, reg, cfg, timeout_scale), (chosen, cands, estimates_of(raw, chosen))


def _check_expect_gpus(plan: Any) -> None:
    """--expect-gpus is enforced by the env check: a selection without it would ignore it silently."""
    from gpuaccept.errors import UsageError

    if plan.expect_gpus is not None and not any(c.name == "env" for c in plan.checks):
        raise UsageError(f"--expect-gpus/expect_gpus {plan.expect_gpus}: the env check counts the GPUs and "
                         "this selection leaves it out; add env to --checks (or do not skip it)")


def _selected_gpu_memory(plan: Any) -> list[Any]:
    """The memory of the GPUs a CUDA run selects, read through NVML (no torch); empty on a CPU run or when
    NVML cannot tell (the checks then find out for themselves)."""
    if plan.device != "cuda":
        return []
    from gpuaccept.hw.gpumem import read_gpu_memory

    try:
        return read_gpu_memory(os.environ.get("CUDA_VISIBLE_DEVICES"), plan.gpus)
    except GpuacceptError:  # no NVML, or a --gpus ordinal that is not visible: the checks report it
        return []


def _warn_unapplied(plan: Any, report: Any, stream: Any) -> None:
    """Options that could not apply on this node get a warning line before the verdict."""
    for line in unapplied_options(plan):
        print(f"[RESULT] warning: {line}", file=stream, flush=True)


def _load_baseline(args: argparse.Namespace) -> Any:
    """(Baseline, rules) from --baseline/--baseline-thresholds, validated before any check runs; or None."""
    if args.baseline is None:
        if args.baseline_thresholds is not None:
            from gpuaccept.errors import UsageError

            raise UsageError("--baseline-thresholds needs --baseline")
        return None
    from gpuaccept.results.baseline import load_baseline, load_rules

    rules = load_rules(args.baseline_thresholds) if args.baseline_thresholds else None
    return load_baseline(args.baseline), rules


def _rank_info(args: argparse.Namespace) -> Any:
    """The RankInfo under --distributed (UsageError when the environment is wrong), else None.

    A plain run refuses to be one of several launcher processes on a node:
    each would run the whole node suite on the same GPUs.
    """
    from gpuaccept.distributed.env import detect_rank, processes_on_node
    from gpuaccept.errors import UsageError

    if args.distributed:
        if args.nproc is not None:
            raise UsageError("--nproc is for a plain run; under --distributed the launcher starts the processes")
        return detect_rank(os.environ)
    found = processes_on_node(os.environ)
    if found is not None and found[0] > 1:
        raise UsageError(f"{found[1]}={found[0]}: a launcher started {found[0]} processes on this node, and each "
                         "would run the whole node suite; add --distributed (or start one process per node)")
    return None


COMMANDS = {"run": _cmd_run, "checks": _cmd_checks}

# Further subcommands live in their own modules, each with a function
# ``register(subparsers) -> None`` that adds its parsers and sets a default
# ``handler`` (a callable taking the parsed args and returning an exit code).
# Such modules import nothing heavy at module level.
SUBCOMMAND_MODULES: tuple[str, ...] = ("gpuaccept.results.cli", "gpuaccept.launch.cli",
                                      "gpuaccept.results.baseline_cli", "gpuaccept.results.analysis_cli",
                                      "gpuaccept.report.cli", "gpuaccept.containers.sshd_cli",
                                      "gpuaccept.containers.image_cli", "gpuaccept.nccltests.cli",
                                      "gpuaccept.isolate.cli",
                                      "gpuaccept.containers.constraints_cli", "gpuaccept.health.cli",
                                      "gpuaccept.health.nodestatus_cli")


def _negative_values(argv: Sequence[str], options: tuple[str, ...] = ("--budget",)) -> list[str]:
    """``--budget -5m`` as ``--budget=-5m``, so that argparse hands the value to its converter, which says what is
    wrong with it, instead of taking it for an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in options and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_negative_values(sys.argv[1:] if argv is None else argv))
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
        from gpuaccept.inputs import one_line

        print(f"gpuaccept: error: {one_line(str(exc))}", file=sys.stderr)
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
