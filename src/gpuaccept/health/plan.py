"""The healthcheck plan and its exit codes, pure.

The plan is the ordinary suite plan (:func:`gpuaccept.node.suite.plan_suite`) of four checks with the
``quick`` parameters, made shorter where a health check allows it, with every timeout cut so that
the whole run fits in the budget. Configuration files (``--config``) apply as for ``gpuaccept run``:
their parameters, thresholds and timeouts win over these.

Without ``--budget`` the run is this fast plan, ended at ``--deadline`` (default :data:`DEFAULT_BUDGET_S`):
every check not ``--skip``-ped runs; one the deadline leaves no time for, or stops at the deadline, is a
SKIP marked ``budget`` and the run has no verdict on the node (exit 3): running out of time is never by
itself a fault. This is the mode for HealthCheckProgram and Prolog, which run often and beside jobs.

With ``--budget SECONDS`` the window is planned (:func:`plan_health_budget`, :mod:`gpuaccept.node.budget`'s
planner): the four checks always run, at this fast level at least (they are ``required``: a node is
never called healthy without its GPU checks, whatever an estimate says); the time left adds the
:data:`EXTRAS` that fit (``fabric``, ``memory``, ``memtest`` at their quick level) and takes the checks
deeper, level by level (the ``quick``, ``standard`` and ``full`` profiles' values), keeping a fifth of the
window for a second pass that runs suspect results again, deeper. The estimates are calibrated from this
host's past runs in ``--db`` (:mod:`gpuaccept.node.calibrate`); the built-in ones are deliberately long, so
without a history a short budget keeps the fast level.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuaccept.checks.base import Check, ThresholdRule
from gpuaccept.errors import UsageError
from gpuaccept.model import Status, Verdict
from gpuaccept.node.budget import BudgetPlan, Candidate, apply_budget, candidates, plan_budget
from gpuaccept.node.config import CheckSettings, Config
from gpuaccept.node.suite import RunOptions, SuitePlan, plan_suite

PROFILE = "health"
CHECKS = ("env", "health", "compute", "disk_space")
EXTRAS = ("fabric", "memory", "memtest")
"""Checks a ``--budget`` with room adds, in this order, at their quick level."""
OVERHEAD_S = 1.0
"""Seconds of a healthcheck outside its checks (planning, the report); the warm process's import of torch
is waited for by the first check before its own limit starts counting (the deadline still bounds it)."""
MIN_BUDGET_S = 5.0
MAX_BUDGET_S = 3600.0
DEFAULT_BUDGET_S = 45.0
SLURM_RESERVE_S = 5.0
"""Seconds of the budget kept for ``scontrol`` (show, then drain or resume) after the checks."""
MIN_CHECKS_S = 5.0
"""The checks' share of the budget (what ``--slurm`` leaves of it) is at least this; less is bad usage."""

#: parameters over the quick profile's; a config file's win over these
PARAMS: dict[str, dict[str, Any]] = {
    "health": {"sample_s": 0.5},
    # one short burst per dtype on all GPUs at once; every result verified against fp64
    "compute": {"dtypes": ["bf16", "fp32"], "size": 4096, "cpu_size": 256, "buffers": 2,
                "per_gpu": False, "concurrent": True, "trials": 3, "iters": 10,
                "warmup_s": 0.1, "warmup_max_s": 0.5, "min_window_s": 0.02},
}
#: each check's own limit before the budget cuts it (seconds)
TIMEOUTS: dict[str, float] = {"env": 20.0, "health": 15.0, "compute": 30.0, "disk_space": 5.0}
#: a GEMM sanity test, not a benchmark: fail only a GPU far below its spec (throttled hard, broken)
RULES: dict[str, list[ThresholdRule]] = {
    "compute": [ThresholdRule("gemm_*_tflops*", min_fraction=0.25, source="healthcheck")],
}

MODES = ("check", "prolog", "epilog")
EXIT_OK, EXIT_FAULT, EXIT_USAGE = 0, 1, 2
EXIT_OUT_OF_TIME = 3
EXIT_REPORT_WRITE = 4
EXIT_SLURM = 6
EXIT_INTERRUPTED = 130


def check_budget(budget_s: float, flag: str = "--budget") -> float:
    """``budget_s``, or UsageError when it is outside [MIN_BUDGET_S, MAX_BUDGET_S] or not a number."""
    if not (MIN_BUDGET_S <= budget_s <= MAX_BUDGET_S):
        raise UsageError(f"{flag} {budget_s:g}: must be between {MIN_BUDGET_S:g} and {MAX_BUDGET_S:g} seconds "
                         f"(Slurm kills HealthCheckProgram after 60 s; the default is {DEFAULT_BUDGET_S:g})")
    return budget_s


def check_window(budget_s: float, slurm: bool, flag: str) -> float:
    """The checks' window (seconds) of a ``budget_s`` run: what ``--slurm``'s reserve for ``scontrol`` (or half a
    second for the report) leaves. UsageError when ``--slurm`` leaves under :data:`MIN_CHECKS_S`."""
    if not slurm:
        return budget_s - 0.5
    window = budget_s - SLURM_RESERVE_S
    if window < MIN_CHECKS_S:
        least = MIN_CHECKS_S + SLURM_RESERVE_S
        raise UsageError(f"{flag} {budget_s:g} with --slurm: {SLURM_RESERVE_S:g} s of it is kept for scontrol, "
                         f"leaving {max(window, 0):g} s for the checks (at least {MIN_CHECKS_S:g}); give "
                         f"{flag} {least:g} or more")
    return window


def health_config(user: Config) -> Config:
    """``user``'s configuration over the healthcheck's own parameters, rules and timeouts (the extras: the
    user's alone)."""
    checks: dict[str, CheckSettings] = {n: s for n, s in user.checks.items() if n in EXTRAS}
    for name in CHECKS:
        mine = CheckSettings(params=dict(PARAMS.get(name, {})), thresholds=list(RULES.get(name, [])),
                             timeout_s=TIMEOUTS[name])
        theirs = user.checks.get(name)
        if theirs is not None:
            mine.params.update(theirs.params)
            mine.thresholds.extend(theirs.thresholds)
            if theirs.timeout_s is not None:
                mine.timeout_s = theirs.timeout_s
        checks[name] = mine
    return replace(user, checks=checks)


def plan_health(user: Config, registry: dict[str, type[Check]], device: str, *, budget_s: float,
                gpus: list[int] | None = None, expect_gpus: int | None = None, require_gpu: bool = True,
                skip: list[str] | None = None, extras: bool = False) -> SuitePlan:
    """The healthcheck's suite plan (pure): the four checks, and with ``extras`` the :data:`EXTRAS` too (for a
    budget to choose from). Each check's timeout is at most ``budget_s``; the runner also stops the run as a
    whole at the budget (see :mod:`gpuaccept.health.run`)."""
    names = CHECKS + (EXTRAS if extras else ())
    opts = RunOptions(profile="quick", checks=[c for c in names if c in registry], skip=list(skip or []),
                      device=device, gpus=gpus, require_gpu=require_gpu, expect_gpus=expect_gpus)
    plan = plan_suite(opts, health_config(user), registry, device)
    plan.profile = PROFILE
    for check in plan.checks:
        check.timeout_s = min(check.timeout_s, budget_s)
    return plan


def health_candidates(plan: SuitePlan, user: Config, registry: dict[str, type[Check]],
                      gpus: int) -> list[Candidate]:
    """The planned checks' depth levels (pure): the fast level planned, every profile's deeper, the four checks
    required; the four first, then the extras (the order the budget covers them in)."""
    cands = [replace(c, required=c.name in CHECKS, ceiling=len(c.levels) - 1)
             for c in candidates(plan, user, registry, gpus)]
    return sorted(cands, key=lambda c: not c.required)


def plan_health_budget(plan: SuitePlan, user: Config, registry: dict[str, type[Check]], cands: list[Candidate],
                       window_s: float, gpus: int, gpus_assumed: bool) -> tuple[SuitePlan, BudgetPlan]:
    """``plan`` cut and deepened to ``window_s`` seconds (the checks' share of ``--budget``), and the budget plan
    (pure). Each kept check's timeout is its level's (the user's configuration wins), at most the window; the
    four checks run first, the extras after them."""
    chosen = plan_budget(cands, window_s, gpus, gpus_assumed, overhead_s=OVERHEAD_S)
    cut = apply_budget(plan, chosen, registry, user)
    for check in cut.checks:
        check.timeout_s = round(min(check.timeout_s, window_s), 1)
    cut.checks.sort(key=lambda c: c.name not in CHECKS)  # an extra that runs long never delays the four
    return cut, chosen


def faulty(verdict: Verdict) -> bool:
    """Whether a run with this verdict says the node is unfit (nothing measured counts: a GPU node where
    nothing could be measured is not fit for jobs)."""
    return verdict is not Verdict.SUCCESS


@dataclass(frozen=True)
class Ending:
    """How a healthcheck ended, before the exit code is chosen."""

    verdict: Verdict | None  # None: nothing ran; RUNNING/INTERRUPTED: the run was cut short (no verdict on the node)
    usage_error: bool = False
    out_of_time: bool = False  # a required check ran out of the budget (and none found a fault): no verdict
    report_write_failed: bool = False
    interrupted: bool = False
    slurm_failed: bool = False
    breaker_held: bool = False  # the circuit breaker held a drain back (prolog/epilog then exit 0: see exit_code)


def exit_code(mode: str, end: Ending) -> int:
    """The exit code for ``mode`` (the table in docs/howto/healthcheck.md, "Exit codes"; pure).

    ``check``: 0 healthy, 1 node fault, 2 bad input, 3 not finished (a check ran out of the budget and
    none found a fault: no verdict on the node), 4 a report file could not be written, 6 scontrol
    failed (whatever the verdict, which the summary line gives), 130 interrupted.

    ``prolog`` and ``epilog``: Slurm drains the node on any non-zero exit (and requeues the job of a
    prolog), so only a node fault (1) and bad input (2, seen the first time the line is run by hand)
    are non-zero; a report or scontrol problem, running out of time, or an interruption, is said on
    stderr and exits 0.
    """
    if end.usage_error:
        return EXIT_USAGE
    fault = end.verdict is Verdict.FAILURE or (end.verdict is Verdict.NOTHING_MEASURED and not end.out_of_time)
    if mode != "check":  # Slurm drains on a non-zero prolog/epilog: a breaker that held back must not be undone
        return EXIT_FAULT if fault and not end.breaker_held else EXIT_OK
    if end.interrupted:
        return EXIT_INTERRUPTED
    if end.report_write_failed:
        return EXIT_REPORT_WRITE
    if end.slurm_failed:  # the node's Slurm state is not what the verdict calls for; the summary line says both
        return EXIT_SLURM
    if fault:
        return EXIT_FAULT
    return EXIT_OUT_OF_TIME if end.out_of_time else EXIT_OK


def out_of_time(checks: list[Any]) -> list[str]:
    """The four checks (first pass) that the budget left no time to finish (:mod:`gpuaccept.health.run`)."""
    return [c.name for c in checks if c.name in CHECKS and not c.is_rerun and c.status is Status.SKIP
            and c.details.get("budget")]


def first_problem(checks: list[Any]) -> tuple[str, str]:
    """(check, reason) of the first check that failed or errored, for the drain reason; ("", "") if none."""
    for c in checks:
        if c.status in (Status.FAIL, Status.ERROR):
            return c.name, c.reason
    return "", ""
