"""The healthcheck plan and its exit codes, pure.

The plan is the ordinary suite plan (:func:`gpuaccept.suite.plan_suite`) of four checks with the
``quick`` parameters, made shorter where a health check allows it, with every timeout cut so that
the whole run fits in the budget. Configuration files (``--config``) apply as for ``gpuaccept run``:
their parameters, thresholds and timeouts win over these.

The budget here is a deadline, not a choice: every check not ``--skip``-ped runs, and one the budget
leaves no time for is a FAIL. ``run --budget``'s planner (:mod:`gpuaccept.budget`) is not used: it
leaves out what its estimates say does not fit and calls the run a success without it, and its
estimates are deliberately long (on 8 GPUs it would keep only ``disk_space`` at ``--budget 10`` and
leave out ``health`` and ``compute`` at 20, where the checks take about 7 s), so a node would be called
healthy without its GPU checks; and each check has one level here (these parameters), so there is no
depth to choose.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuaccept.checks.base import Check, ThresholdRule
from gpuaccept.config import CheckSettings, Config
from gpuaccept.errors import UsageError
from gpuaccept.model import Status, Verdict
from gpuaccept.suite import RunOptions, SuitePlan, plan_suite

PROFILE = "health"
CHECKS = ("env", "health", "compute", "disk_space")
MIN_BUDGET_S = 5.0
MAX_BUDGET_S = 3600.0
DEFAULT_BUDGET_S = 45.0
SLURM_RESERVE_S = 5.0
"""Seconds of the budget kept for ``scontrol`` (show, then drain or resume) after the checks."""

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
EXIT_REPORT_WRITE = 4
EXIT_SLURM = 6
EXIT_INTERRUPTED = 130


def check_budget(budget_s: float) -> float:
    """``budget_s``, or UsageError when it is outside [MIN_BUDGET_S, MAX_BUDGET_S] or not a number."""
    if not (MIN_BUDGET_S <= budget_s <= MAX_BUDGET_S):
        raise UsageError(f"--budget {budget_s:g}: must be between {MIN_BUDGET_S:g} and {MAX_BUDGET_S:g} seconds "
                         f"(Slurm kills HealthCheckProgram after 60 s; the default is {DEFAULT_BUDGET_S:g})")
    return budget_s


def health_config(user: Config) -> Config:
    """``user``'s configuration over the healthcheck's own parameters, rules and timeouts."""
    checks: dict[str, CheckSettings] = {}
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
                skip: list[str] | None = None) -> SuitePlan:
    """The healthcheck's suite plan (pure). Each check's timeout is at most ``budget_s``; the runner
    also stops the run as a whole at the budget (see :mod:`gpuaccept.health.run`)."""
    opts = RunOptions(profile="quick", checks=[c for c in CHECKS if c in registry], skip=list(skip or []),
                      device=device, gpus=gpus, require_gpu=require_gpu, expect_gpus=expect_gpus)
    plan = plan_suite(opts, health_config(user), registry, device)
    plan.profile = PROFILE
    for check in plan.checks:
        check.timeout_s = min(check.timeout_s, budget_s)
    return plan


def faulty(verdict: Verdict) -> bool:
    """Whether a run with this verdict says the node is unfit (nothing measured counts: a GPU node where
    nothing could be measured is not fit for jobs)."""
    return verdict is not Verdict.SUCCESS


@dataclass(frozen=True)
class Ending:
    """How a healthcheck ended, before the exit code is chosen."""

    verdict: Verdict | None  # None: nothing ran; RUNNING/INTERRUPTED: the run was cut short (no verdict on the node)
    usage_error: bool = False
    report_write_failed: bool = False
    interrupted: bool = False
    slurm_failed: bool = False


def exit_code(mode: str, end: Ending) -> int:
    """The exit code for ``mode`` (see the README's "Health checks" table; pure).

    ``check``: 0 healthy, 1 node fault, 2 bad input, 4 a report file could not be written, 6 scontrol
    failed (whatever the verdict, which the summary line gives), 130 interrupted.

    ``prolog`` and ``epilog``: Slurm drains the node on any non-zero exit (and requeues the job of a
    prolog), so only a node fault (1) and bad input (2, seen the first time the line is run by hand)
    are non-zero; a report or scontrol problem, or an interruption, is said on stderr and exits 0.
    """
    if end.usage_error:
        return EXIT_USAGE
    fault = end.verdict in (Verdict.FAILURE, Verdict.NOTHING_MEASURED)  # not RUNNING: a run cut short
    if mode != "check":
        return EXIT_FAULT if fault else EXIT_OK
    if end.interrupted:
        return EXIT_INTERRUPTED
    if end.report_write_failed:
        return EXIT_REPORT_WRITE
    if end.slurm_failed:  # the node's Slurm state is not what the verdict calls for; the summary line says both
        return EXIT_SLURM
    return EXIT_FAULT if fault else EXIT_OK


def first_problem(checks: list[Any]) -> tuple[str, str]:
    """(check, reason) of the first check that failed or errored, for the drain reason; ("", "") if none."""
    for c in checks:
        if c.status in (Status.FAIL, Status.ERROR):
            return c.name, c.reason
    return "", ""
