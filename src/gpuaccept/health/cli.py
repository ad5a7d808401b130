"""Subcommand ``healthcheck`` (see :mod:`gpuaccept.health` for the semantics and exit codes).

The I/O edge: reads the node through ``scontrol``, runs the plan, drains or resumes, prints one line.
Nothing heavy is imported at module level (``gpuaccept --help`` stays free of torch).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuaccept.argtypes import duration, nonneg_int
from gpuaccept.errors import InputError, ReportWriteError, UsageError

TAG = "[HEALTHCHECK]"
RUN_PREFIX = "hc-"
SCONTROL_TIMEOUT_S = 10.0


def register(subparsers: Any) -> None:
    from gpuaccept.health.plan import CHECKS, DEFAULT_BUDGET_S, EXTRAS, MIN_BUDGET_S, MODES

    p = subparsers.add_parser(
        "healthcheck", help="fast node health check for Slurm (HealthCheckProgram, Prolog, Epilog)",
        description="env and GPU count, NVML health, a short verified GEMM and free disk space within a budget; "
                    "one summary line. With --slurm drain: drain this node on a fault, resume it when healthy "
                    "if the drain was gpuaccept's (never an admin's).")
    p.add_argument("--budget", type=duration, default=None, metavar="DURATION",
                   help=f"plan this window (at least {MIN_BUDGET_S:g}): the four checks always, then the extras "
                        f"({', '.join(EXTRAS)}) and deeper levels that fit, estimated from this host's past runs in "
                        f"--db, with a fifth kept to re-run suspect results deeper. Without it: the four checks at "
                        "their fastest (see --deadline). Slurm kills HealthCheckProgram after 60 s")
    p.add_argument("--deadline", type=duration, default=None, metavar="DURATION",
                   help=f"without --budget: the four checks at their fastest, ended within this (at least "
                        f"{MIN_BUDGET_S:g}; default {DEFAULT_BUDGET_S:g}); for HealthCheckProgram and Prolog")
    p.add_argument("--slurm", choices=("drain", "print"), default=None,
                   help="drain: drain this node on a fault and resume gpuaccept's own drain when healthy; "
                        "print: say which scontrol command that would run, run none")
    p.add_argument("--node", default=None, metavar="NAME",
                   help="this node's Slurm name (default: $SLURMD_NODENAME, else the short host name)")
    p.add_argument("--mode", choices=MODES, default="check",
                   help="exit codes for: check (HealthCheckProgram, by hand), prolog, epilog (non-zero only for "
                        "a node fault or bad input: Slurm drains on non-zero)")
    p.add_argument("--device", choices=("cuda", "cpu", "auto"), default="cuda",
                   help="cuda (the default here, unlike run's auto: a health check runs on a GPU node, where no "
                        "usable GPU is a fault and never a pass on the CPU), cpu, or auto")
    p.add_argument("--gpus", default=None, metavar="0,1", help="torch CUDA ordinals to test (default: all)")
    p.add_argument("--expect-gpus", type=nonneg_int, default=None, metavar="N", help="a fault unless N GPUs are seen")
    p.add_argument("--skip", default=None, metavar="C,D",
                   help=f"leave out these of {', '.join(CHECKS)} (and, with --budget, of {', '.join(EXTRAS)})")
    p.add_argument("--config", default=None, metavar="YAML",
                   help="parameters, thresholds and timeouts of the four checks (as for gpuaccept run)")
    p.add_argument("--report-dir", default=None, metavar="DIR",
                   help="where each run's report goes: a directory of this user's that no one else may write to, "
                        "not a link, made mode 0700 when missing (default: $GPUACCEPT_REPORT_DIR, else "
                        "$STATE_DIRECTORY or /var/lib/gpuaccept/healthcheck for root, "
                        "$XDG_STATE_HOME/gpuaccept/healthcheck or ~/.local/state/gpuaccept/healthcheck otherwise)")
    p.add_argument("--keep", type=nonneg_int, default=20, metavar="N",
                   help="keep the newest N healthcheck runs in the report directory (default 20; 0: keep all); only "
                        "run directories healthcheck made (with its marker file) are ever removed")
    p.add_argument("--db", default=None, metavar="URL",
                   help="also store the run in this history database; --budget estimates from its past runs here")
    p.add_argument("--breaker", choices=("reset",), default=None,
                   help="reset: a person's reset of the circuit breaker: mark gpuaccept's drains of the window as "
                        "seen (their reason gets ,ack; they stay drained and gpuaccept's to resume) and run no check")
    p.add_argument("--breaker-limit", type=nonneg_int, default=0, metavar="N",
                   help="with --slurm drain: drain no node while N nodes stand drained by gpuaccept within "
                        "--breaker-window (Slurm's own reasons and their times, sinfo -R); 0: no limit (default)")
    p.add_argument("--breaker-percent", type=float, default=0.0, metavar="P",
                   help="as --breaker-limit, as a percentage of the cluster's nodes (at least one node); 0: none")
    p.add_argument("--breaker-window", type=duration, default=3600.0, metavar="DURATION",
                   help="the breaker's sliding window (default 1h)")
    p.add_argument("--verbose", "-v", action="store_true", help="a line per check as well")
    p.set_defaults(handler=cmd_healthcheck)


# ------------------------------------------------------------------ scontrol (I/O)

def find_scontrol() -> str | None:
    """scontrol on PATH, else in /usr/bin or /usr/local/bin (slurmd runs HealthCheckProgram with no PATH)."""
    return shutil.which("scontrol") or next(
        (str(p) for p in (Path("/usr/bin/scontrol"), Path("/usr/local/bin/scontrol")) if p.exists()), None)


class NoAnswer(InputError):
    """scontrol gave no answer in time (slurmctld busy or unreachable): not a sign of a wrong command line."""


def _scontrol(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one scontrol command; InputError carrying its first error line when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)  # a reason in Latin-1 is no crash
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        errors = [ln.strip() for ln in said.splitlines() if "error:" in ln]
        if errors:  # scontrol retrying a configuration it cannot read: a wrong set-up, not a busy slurmctld
            raise InputError(f"{' '.join(argv[1:3])}: {errors[0]}") from None
        raise NoAnswer(f"{' '.join(argv[1:3])}: no answer in {timeout:.3g} s") from None
    except OSError as exc:
        raise InputError(f"{argv[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        last = next((ln for ln in lines if "fatal" in ln), lines[-1] if lines else f"exit {done.returncode}")
        raise InputError(f"{' '.join(argv[1:3])} failed: {last}")
    return done


def read_node(scontrol: str, node: str, timeout: float) -> Any:
    from gpuaccept.health.slurm import parse_scontrol_node, show_argv

    return parse_scontrol_node(_scontrol(show_argv(node, scontrol), timeout).stdout, node)


# ------------------------------------------------------------------ report directory

def default_report_dir(env: Any = os.environ) -> Path:
    """Root: ``$STATE_DIRECTORY`` (systemd's, its first entry), else ``/var/lib/gpuaccept/healthcheck``;
    any other user: ``$XDG_STATE_HOME/gpuaccept/healthcheck``, else ``~/.local/state/gpuaccept/healthcheck``.
    Never a fixed name in a shared temporary directory."""
    if os.geteuid() == 0:
        state = env.get("STATE_DIRECTORY", "").split(":")[0]
        return Path(state) if state else Path("/var/lib/gpuaccept/healthcheck")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpuaccept" / "healthcheck"


def _report_dir(args: argparse.Namespace) -> Path:
    if args.report_dir:
        return Path(args.report_dir)
    if os.environ.get("GPUACCEPT_REPORT_DIR"):
        return Path(os.environ["GPUACCEPT_REPORT_DIR"])
    return default_report_dir()


_RUN_DIR = re.compile(r"^hc-\d{8}T\d{6}Z-")


STALE_RUN_S = 7200.0
"""A run whose report.json still says ``running`` after this many seconds unchanged was killed: prunable."""


def _finished(run: Path) -> bool:
    """Whether healthcheck run directory ``run`` is done: its report says so, or it has not changed for
    :data:`STALE_RUN_S` (a run killed with SIGKILL)."""
    import json

    report = run / "report.json"
    try:
        running = json.loads(report.read_text()).get("verdict") == "running"
        changed = report.stat().st_mtime
    except (OSError, ValueError, AttributeError):
        try:
            running, changed = True, run.stat().st_mtime
        except OSError:
            return False
    return not running or time.time() - changed > STALE_RUN_S


def prune_runs(report_dir: Path, keep: int, mine: str = "") -> list[Path]:
    """Remove all but the newest ``keep`` healthcheck run directories (``hc-<stamp>-...``), this run's (``mine``)
    always among those kept; the removed ones. Never raises.

    Only runs healthcheck made (:func:`gpuaccept.safefs.prune`: marked, owned, never through a link), only
    finished ones (another healthcheck's run still going is left alone), and one prune at a time
    (``.prune.lock``, never a link; a prune that finds it held leaves the pruning to that one)."""
    import fcntl

    from gpuaccept.safefs import prune

    if keep <= 0:
        return []
    try:
        fd = os.open(report_dir / ".prune.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return prune(report_dir, keep, lambda name: _RUN_DIR.match(name) is not None and _finished(report_dir / name),
                     spare=mine)
    except OSError:
        return []
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the command

def _usage(args: argparse.Namespace) -> tuple[float, Any, list[int] | None, list[str]]:
    """Everything decided from the flags alone (UsageError/ConfigError before anything runs)."""
    from gpuaccept.health.plan import CHECKS, DEFAULT_BUDGET_S, EXTRAS, check_budget, check_window
    from gpuaccept.node.config import parse_gpus

    if args.budget is not None and args.deadline is not None:
        raise UsageError("--budget and --deadline: give one (--budget plans a window and fills it; --deadline "
                         "ends the fast plan)")
    if args.budget is not None:
        budget = check_budget(args.budget)
    else:
        budget = check_budget(DEFAULT_BUDGET_S if args.deadline is None else args.deadline, "--deadline")
    check_window(budget, bool(args.slurm), "--budget" if args.budget is not None else "--deadline")
    gpus = parse_gpus(args.gpus, "--gpus", "") if args.gpus is not None else None
    skip = [s.strip() for s in (args.skip or "").split(",") if s.strip()]
    bad = [s for s in skip if s not in CHECKS + EXTRAS]
    if bad:
        raise UsageError(f"--skip: {bad[0]!r} is not one of {', '.join(CHECKS + EXTRAS)}")
    extra = [s for s in skip if s in EXTRAS]
    if extra and args.budget is None:
        raise UsageError(f"--skip {extra[0]}: the extras ({', '.join(EXTRAS)}) run only with --budget")
    if all(c in skip for c in CHECKS):
        raise UsageError("--skip leaves none of the four checks to run")
    if args.expect_gpus is not None and "env" in skip:
        raise UsageError("--expect-gpus is enforced by the env check, which --skip leaves out")
    from gpuaccept.node.config import Config, load_config

    if args.config:
        from gpuaccept.checks import registry

        cfg = load_config(args.config, registry())
    else:
        cfg = Config()
    return budget, cfg, gpus, skip


def cmd_healthcheck(args: argparse.Namespace) -> int:
    from gpuaccept.health.breaker import check_breaker
    from gpuaccept.health.plan import SLURM_RESERVE_S, Ending, exit_code, out_of_time
    from gpuaccept.health.slurm import this_node

    started = time.monotonic()
    args.breaker_conf = check_breaker(args.breaker_limit, args.breaker_percent, args.breaker_window)
    if args.breaker == "reset":
        return _breaker_reset(args)
    budget, cfg, gpus, skip = _usage(args)
    node = scontrol = None
    if args.slurm:
        node, source = this_node(args.node, os.environ, socket.gethostname())
        scontrol = find_scontrol()
        conf = os.environ.get("SLURM_CONF")
        if conf and not Path(conf).is_file():
            raise UsageError(f"--slurm {args.slurm}: SLURM_CONF={conf} is not a file: not a Slurm node; "
                             "nothing was run or drained")
        if scontrol is None:
            raise UsageError(f"--slurm {args.slurm}: scontrol is not installed here: not a Slurm node; "
                             "nothing was run or drained")
        try:
            read_node(scontrol, node, min(SCONTROL_TIMEOUT_S, budget / 4))
        except NoAnswer as exc:  # the checks still run; the Slurm step tries again at the end
            print(f"gpuaccept: warning: {exc}", file=sys.stderr)
        except InputError as exc:
            raise UsageError(f"--slurm {args.slurm}: node {node} (from {source}) is not a node of a reachable "
                             f"Slurm cluster ({exc}); nothing was run or drained") from None
    deadline = started + budget - (SLURM_RESERVE_S if args.slurm else 0.5)
    report, report_path, run_end = _run(args, cfg, gpus, skip, deadline)
    verdict = report.verdict if report is not None and not run_end else None
    late = bool(verdict is not None and out_of_time(report.checks))
    line, slurm_failed, held = _slurm_step(args, scontrol, node, report, started + budget)
    end = Ending(verdict, out_of_time=late, report_write_failed=run_end == "write",
                 interrupted=run_end == "interrupted", slurm_failed=slurm_failed, breaker_held=held)
    code = exit_code(args.mode, end)
    elapsed = time.monotonic() - started
    print(_summary(report, elapsed, line, report_path), flush=True)
    if late and code in (0, 3):
        print(f"gpuaccept: warning: {', '.join(out_of_time(report.checks))} ran out of the "
              f"{'--budget' if args.budget is not None else '--deadline'} ({budget:g} s): no verdict on the node, "
              "which is left as it was; give more time", file=sys.stderr)
    if code == 0 and args.mode != "check" and (end.report_write_failed or slurm_failed or end.interrupted
                                               or late):
        print(f"gpuaccept: warning: {args.mode} mode exits 0: the problem above is not the node's", file=sys.stderr)
    return code


def _run(args: argparse.Namespace, cfg: Any, gpus: list[int] | None, skip: list[str],
         deadline: float) -> tuple[Any, Path | None, str]:
    """Run the plan; (report or None, report path, "" | "interrupted" | "write")."""
    from gpuaccept.checks import registry
    from gpuaccept.health.plan import health_candidates, plan_health
    from gpuaccept.health.run import BudgetRunner
    from gpuaccept.hw.devices import resolve_device
    from gpuaccept.node.budget import estimates_of, planned_gpus
    from gpuaccept.node.runner import DeadlineRunner, Interrupted, RunEvents, new_run_id, this_host

    reg = registry()
    device = resolve_device(args.device)
    planned = args.budget is not None
    plan = plan_health(cfg, reg, device, budget_s=max(deadline - time.monotonic(), 0.0), gpus=gpus,
                       expect_gpus=args.expect_gpus, require_gpu=args.device == "cuda", skip=skip, extras=planned)
    n_gpus, assumed = planned_gpus(device, gpus, 0)  # NVML is not asked (its start can take seconds); calibration
    # learns the node's real times under the same assumption
    raw = health_candidates(plan, cfg, reg, n_gpus)
    budget_lines: list[str] = []
    if planned:
        plan, runner_kw, estimates, budget_lines = _planned(args, plan, cfg, reg, raw, deadline, n_gpus, assumed)
    else:
        estimates, runner_kw = estimates_of(raw), {}
    from gpuaccept.safefs import mark, private_dir

    report_dir = private_dir(_report_dir(args), "--report-dir")
    run_id = RUN_PREFIX + new_run_id(this_host())
    try:
        mark(private_dir(report_dir / run_id, "run directory", parents=False))
    except OSError as exc:
        raise UsageError(f"--report-dir {report_dir}: {exc.strerror or exc}") from None
    events = None
    if args.verbose:
        from gpuaccept.report.console import PlainConsole

        events = RunEvents.of(PlainConsole(sys.stdout, {c.name: c.key_metric for c in plan.checks}))
        for line in budget_lines:
            print(f"[BUDGET] {line}", flush=True)
    cls: type[DeadlineRunner] = BudgetRunner
    if planned:
        from gpuaccept.health.run import WindowHealthRunner

        cls = WindowHealthRunner
    runner = cls(plan, report_dir, deadline=deadline, run_id=run_id,
                 argv=["healthcheck", *sys.argv[2:]], events=events, **runner_kw)
    runner.report.estimates = estimates
    try:
        report = runner.run()
    except Interrupted as exc:
        print(f"gpuaccept: interrupted; partial report in {runner.report_path}", file=sys.stderr)
        if args.db:  # what was measured is kept, as by gpuaccept run
            from gpuaccept.results.autosave import save

            save(exc.report, args, runner.report_path)
        return exc.report, runner.report_path, "interrupted"
    except ReportWriteError as exc:
        print(f"gpuaccept: error: a report file could not be written: {exc}; not a failure of this node",
              file=sys.stderr)
        return exc.report if exc.report is not None else None, None, "write"
    if args.db:
        from gpuaccept.results.autosave import save

        save(report, args, runner.report_path)
    prune_runs(report_dir, args.keep, runner.run_id)
    return report, runner.report_path, ""


def _planned(args: argparse.Namespace, plan: Any, cfg: Any, reg: Any, raw: list[Any], deadline: float,
             gpus: int, assumed: bool) -> tuple[Any, dict[str, Any], dict[str, float], list[str]]:
    """``--budget``: (the planned window's plan, the runner's keyword arguments, the built-in estimates of what
    it keeps, the plan's lines)."""
    from gpuaccept.health.plan import plan_health_budget
    from gpuaccept.node.budget import estimates_of
    from gpuaccept.node.calibrate import planned_with_history
    from gpuaccept.node.runner import this_host

    cands, calibration, warning = planned_with_history(raw, plan.device, args.db, this_host(),
                                                       "" if args.db else "no --db")
    if warning:
        print(f"gpuaccept: warning: {warning}", file=sys.stderr)
    plan, chosen = plan_health_budget(plan, cfg, reg, cands, deadline - time.monotonic(), gpus, assumed)
    chosen.calibration = calibration

    def say(line: str) -> None:
        if args.verbose:
            print(f"[BUDGET] {line}", flush=True)

    kw = {"budget": chosen, "candidates": cands, "registry": reg, "config": cfg, "say": say}
    return plan, kw, estimates_of(raw, chosen), chosen.lines()


def _slurm_step(args: argparse.Namespace, scontrol: str | None, node: str | None, report: Any,
                end_by: float) -> tuple[str, bool, bool]:
    """Drain, resume or leave the node, by the fault's ladder and the circuit breaker; (what was done, in words;
    whether scontrol failed; whether the breaker held a drain back)."""
    if not args.slurm or scontrol is None or node is None:
        return "", False, False
    from gpuaccept.health.ladder import decide_ladder
    from gpuaccept.health.plan import faulty, out_of_time
    from gpuaccept.health.slurm import decide, reason_text
    from gpuaccept.model import Verdict

    if report is None or report.verdict in (Verdict.INTERRUPTED, Verdict.RUNNING):
        return f"slurm: {node} left as it was (the run did not finish)", False, False
    if out_of_time(report.checks) and report.verdict is not Verdict.FAILURE:
        return f"slurm: {node} left as it was (the checks did not finish in the budget)", False, False
    healthy = not faulty(report.verdict)
    reason = ""
    if not healthy:
        ladder = decide_ladder(report.checks)
        if ladder.check and not ladder.leave:
            return f"slurm: {node} {ladder.why}", False, False
        reason = (reason_text(ladder.check, ladder.reason, ladder.code, ladder.origin) if ladder.check
                  else reason_text("", "nothing measured (every check skipped)", origin="node"))
    timeout = max(1.0, min(SCONTROL_TIMEOUT_S, (end_by - time.monotonic()) / 2))  # show, then update
    try:
        action = decide(read_node(scontrol, node, timeout), healthy, reason, scontrol)
    except InputError as exc:
        print(f"gpuaccept: error: {exc}; node {node} not updated", file=sys.stderr)
        return f"slurm: {node} NOT updated ({exc})", True, False
    if action.kind == "drain" and args.breaker_conf.enabled:
        try:
            hold = _breaker(args, scontrol, node, timeout)
        except InputError as exc:  # no count, no drain: the breaker fails closed
            hold = f"circuit breaker: cannot count gpuaccept's drains ({exc})"
        if hold:
            print(f"gpuaccept: warning: {node} NOT drained: {hold}; would have run: {' '.join(action.argv)}",
                  file=sys.stderr)
            return f"slurm: {node} NOT drained ({hold}); would have drained: {reason}", False, True
    if action.kind == "none" or args.slurm == "print":
        shown = f" would run: {' '.join(action.argv)}" if action.argv and args.slurm == "print" else ""
        return f"slurm: {node} {action.why}{shown}", False, False
    try:
        _scontrol(list(action.argv), timeout)
    except InputError as exc:
        print(f"gpuaccept: error: cannot {action.kind} {node}: {exc}", file=sys.stderr)
        return f"slurm: {node} NOT {action.kind}ed ({exc})", True, False
    return f"slurm: {node} {action.why}", False, False


def _sinfo(scontrol: str) -> str:
    """sinfo beside scontrol, else on PATH."""
    beside = Path(scontrol).parent / "sinfo"
    return str(beside) if beside.is_file() else (shutil.which("sinfo") or "sinfo")


def _breaker(args: argparse.Namespace, scontrol: str, node: str, timeout: float) -> str:
    """Why the breaker holds a drain of ``node`` back ("" when it does not): Slurm's reasons, counted."""
    from datetime import datetime

    from gpuaccept.health.breaker import decide, node_count, nodes_argv, parse_reasons, reasons_argv

    sinfo = _sinfo(scontrol)
    drained = parse_reasons(_scontrol(reasons_argv(sinfo), timeout).stdout)
    nodes = node_count(_scontrol(nodes_argv(sinfo), timeout).stdout)
    verdict = decide(args.breaker_conf, drained, nodes, datetime.now(), node)
    return verdict.why if verdict.hold else ""


def _breaker_reset(args: argparse.Namespace) -> int:
    """``--breaker reset``: mark each drain the breaker counts as seen by a person; print one line."""
    from datetime import datetime

    from gpuaccept.health.breaker import counted, parse_reasons, reasons_argv
    from gpuaccept.health.slurm import acked, drain_argv

    scontrol = find_scontrol()
    if scontrol is None:
        raise UsageError("--breaker reset: scontrol is not installed here: not a Slurm node")
    drained = parse_reasons(_scontrol(reasons_argv(_sinfo(scontrol)), SCONTROL_TIMEOUT_S).stdout)
    mine = counted(drained, datetime.now(), args.breaker_conf.window_s)
    for d in mine:
        _scontrol(drain_argv(d.node, acked(d.reason), scontrol), SCONTROL_TIMEOUT_S)
    names = ", ".join(d.node for d in mine) or "none"
    print(f"{TAG} circuit breaker reset: {len(mine)} drain(s) of the last {args.breaker_conf.window_s:g} s marked "
          f"seen ({names}); they stay drained until healthcheck finds them healthy", flush=True)
    return 0


def _summary(report: Any, elapsed: float, slurm_line: str, report_path: Path | None) -> str:
    """``[HEALTHCHECK] HEALTHY|FAULT ... in 4.2 s: env PASS, ...; slurm: ...; report: ...`` (one line)."""
    from gpuaccept.health.plan import faulty, first_problem, out_of_time
    from gpuaccept.inputs import one_line
    from gpuaccept.model import Verdict, state_label

    if report is None:
        head = "NOT RUN"
    elif report.verdict in (Verdict.INTERRUPTED, Verdict.RUNNING):
        head = "NOT FINISHED" if report.verdict is Verdict.RUNNING else "INTERRUPTED"
    elif out_of_time(report.checks) and report.verdict is not Verdict.FAILURE:
        head = f"NOT FINISHED: {', '.join(out_of_time(report.checks))} ran out of the budget"
    elif faulty(report.verdict):
        from gpuaccept.health.ladder import effective

        check, why = first_problem(effective(report.checks))
        code = next((c.code for c in effective(report.checks) if c.name == check and c.code), "")
        head = (f"FAULT {code + ' ' if code else ''}{check}: {why}" if check
                else "FAULT: nothing measured (every check skipped)")
    else:
        head = "HEALTHY"
    checks = ", ".join(f"{c.name}{' (re-run)' if c.is_rerun else ''} {state_label(c.state)}"
                       for c in report.checks) if report is not None else ""
    parts = [f"{TAG} {head} in {elapsed:.1f} s" + (f" ({checks})" if checks else "")]
    if slurm_line:
        parts.append(slurm_line)
    if report_path is not None:
        parts.append(f"report: {report_path}")
    text = one_line("; ".join(parts))
    return text if len(text) <= 600 else text[:597] + "..."
