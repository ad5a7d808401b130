"""``gpuaccept run`` as two calls: :func:`prepare` and :func:`run_node`.

:func:`prepare` turns a :class:`RunRequest` (flags over config over defaults) into a :class:`Prepared` run: the
suite plan, checked before anything runs (selection, preflight, host and GPU memory fit, ``--expect-gpus``,
``--disk-path``, the history URL, the rank environment), fitted to ``--budget`` when given, with the estimates
that later budgets calibrate against. Every refusal is a :class:`~gpuaccept.errors.UsageError` (exit 2).
:func:`run_node` runs it and stores it in the history, and returns a :class:`NodeOutcome`. Nothing here prints:
progress goes to the display and the ``say`` callback the caller gives; the CLI picks them and maps the outcome
to an exit code.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaccept.errors import GpuacceptError, ReportWriteError, UsageError
from gpuaccept.model import NodeReport


@dataclass(frozen=True)
class RunRequest:
    """What ``gpuaccept run`` was asked for, before config and defaults are merged (None: not given)."""

    profile: str | None = None
    checks: list[str] | None = None
    skip: list[str] | None = None
    device: str | None = None
    gpus: str | None = None
    expect_gpus: int | None = None
    require_gpu: bool | None = None
    timeout_scale: float | None = None
    config: str | None = None
    baseline: str | None = None
    baseline_thresholds: str | None = None
    report_dir: str | None = None
    disk_path: str | None = None
    conformance: str | None = None
    budget: float | None = None
    db: str | None = None
    no_history: bool = False
    distributed: bool = False
    dist_timeout: float = 120.0
    nproc: int | None = None
    run_id: str | None = None
    argv: tuple[str, ...] = ()
    verbose: bool = False

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, argv: list[str] | tuple[str, ...] = ()) -> RunRequest:
        """The request from parsed arguments; attributes a parser lacks keep their defaults (``launch`` and
        ``node-status`` take only the suite options)."""
        names = cls.__dataclass_fields__
        given = {k: getattr(args, k) for k in names if k != "argv" and hasattr(args, k)}
        return cls(**given, argv=tuple(argv))


def merge_options(req: RunRequest) -> tuple[Any, Any, str]:
    """Flags over config over defaults: (RunOptions, Config, report directory)."""
    from gpuaccept.checks import registry
    from gpuaccept.node.config import Config, load_config, parse_gpus
    from gpuaccept.node.suite import RunOptions

    reg = registry()
    cfg = load_config(req.config, reg) if req.config else Config()
    if req.disk_path is not None:
        _set_disk_path(req.disk_path, cfg, reg)
    _set_conformance(req.conformance, cfg, reg)

    def pick(flag: Any, conf: Any, default: Any) -> Any:
        return flag if flag is not None else (conf if conf is not None else default)

    gpus = None
    if req.gpus is not None:
        try:
            gpus = parse_gpus(req.gpus, "--gpus", "")
        except GpuacceptError as exc:
            raise UsageError(f"--gpus: {exc.reason if hasattr(exc, 'reason') else exc}") from None
    opts = RunOptions(
        profile=pick(req.profile, cfg.profile, "standard"),
        checks=req.checks,
        skip=req.skip or [],
        device=pick(req.device, cfg.device, "auto"),
        gpus=gpus if gpus is not None else cfg.gpus,
        timeout_scale=pick(req.timeout_scale, cfg.timeout_scale, 1.0),
        require_gpu=bool(pick(req.require_gpu, cfg.require_gpu, False)),
        expect_gpus=pick(req.expect_gpus, cfg.expect_gpus, None),
    )
    report_dir = pick(req.report_dir, cfg.report_dir, os.environ.get("GPUACCEPT_REPORT_DIR", "gpuaccept-reports"))
    return opts, cfg, report_dir


def _set_disk_path(path: str, cfg: Any, reg: dict[str, Any]) -> None:
    """``--disk-path``: the disk check's ``path`` parameter in ``cfg``, over what the config file says."""
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


def _set_conformance(path: str | None, cfg: Any, reg: dict[str, Any]) -> None:
    """``--conformance FILE`` (over the config's ``conformance.manifest``): the manifest is read and validated
    here, so that a bad one is exit 2 before anything runs; the check gets its absolute path."""
    from gpuaccept.checks.conformance_manifest import load_manifest
    from gpuaccept.node.config import CheckSettings

    settings = cfg.checks.get("conformance")
    given = path if path is not None else (settings.params.get("manifest") if settings is not None else None)
    if not given:
        if path is not None:
            raise UsageError("--conformance needs a manifest file")
        return
    if "conformance" not in reg:
        raise UsageError("--conformance: this gpuaccept has no conformance check")
    load_manifest(given)
    cfg.checks.setdefault("conformance", CheckSettings()).params["manifest"] = os.path.abspath(given)


def check_disk_path_selected(disk_path: str | None, plan: Any) -> None:
    """UsageError when ``--disk-path`` is given and the plan leaves the disk check out (it would be ignored)."""
    if disk_path is not None and not any(c.name == "disk" for c in plan.checks):
        raise UsageError(f"--disk-path {disk_path}: the disk check is not in this selection; it runs in the "
                         f"full and burnin profiles (or add disk to --checks)")


def _check_disk_path(disk_path: str | None, plan: Any) -> None:
    """``--disk-path`` on this node: selected, and a writable directory (UsageError, before anything runs)."""
    from gpuaccept.checks.disk_io import scratch_problem

    check_disk_path_selected(disk_path, plan)
    problem = scratch_problem(disk_path) if disk_path is not None else None
    if problem:
        raise UsageError(f"--disk-path: {problem}")


def _check_expect_gpus(plan: Any) -> None:
    """--expect-gpus is enforced by the env check: a selection without it would ignore it silently."""
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


def _load_baseline(req: RunRequest) -> Any:
    """(Baseline, rules) from --baseline/--baseline-thresholds, validated before any check runs; or None."""
    if req.baseline is None:
        if req.baseline_thresholds is not None:
            raise UsageError("--baseline-thresholds needs --baseline")
        return None
    from gpuaccept.results.baseline import load_baseline, load_rules

    rules = load_rules(req.baseline_thresholds) if req.baseline_thresholds else None
    return load_baseline(req.baseline), rules


def _baseline_rule_metrics(req: RunRequest, baseline: Any, rules: Any) -> list[tuple[str, str, str]]:
    """(metric glob, file, key) of each threshold rule --baseline judges with (none for the built-in ``*``)."""
    source = str(req.baseline_thresholds if rules is not None else baseline.path)
    chosen = rules if rules is not None else baseline.thresholds
    return [(r.metric, source, f"thresholds[{i}].metric") for i, r in enumerate(chosen)]


def _rank_info(req: RunRequest) -> Any:
    """The RankInfo under --distributed (UsageError when the environment is wrong), else None.

    A plain run refuses to be one of several launcher processes on a node:
    each would run the whole node suite on the same GPUs.
    """
    from gpuaccept.distributed.env import detect_rank, processes_on_node

    if req.distributed:
        if req.nproc is not None:
            raise UsageError("--nproc is for a plain run; under --distributed the launcher starts the processes")
        return detect_rank(os.environ)
    found = processes_on_node(os.environ)
    if found is not None and found[0] > 1:
        raise UsageError(f"{found[1]}={found[0]}: a launcher started {found[0]} processes on this node, and each "
                         "would run the whole node suite; add --distributed (or start one process per node)")
    return None


def fit_budget(plan: Any, cfg: Any, reg: Any, timeout_scale: float, budget_s: float, counted: int,
               db: str | None, off: str,
               warn: Callable[[str], None] = lambda line: None) -> tuple[Any, tuple[Any, Any, dict[str, float]]]:
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
        warn(warning)
    chosen = plan_budget(cands, budget_s, gpus, assumed)
    chosen.calibration = calibration
    refuse_empty(chosen, cands)
    return apply_budget(plan, chosen, reg, cfg, timeout_scale), (chosen, cands, estimates_of(raw, chosen))


@dataclass
class Prepared:
    """A run checked and planned, nothing run yet: what ``--plan`` shows and :func:`run_node` runs."""

    request: RunRequest
    plan: Any  # SuitePlan
    config: Any
    registry: dict[str, Any]
    report_dir: str
    baseline: Any = None
    rank: Any = None  # RankInfo under --distributed
    budget: Any = None  # (BudgetPlan, candidates, estimates) under --budget
    estimates: dict[str, float] = field(default_factory=dict)
    nproc: int = 1
    timeout_scale: float = 1.0
    requested_device: str = "auto"  # what --device/config asked for, before "auto" was resolved

    @property
    def leads(self) -> bool:
        """This process writes the report and the history (rank 0, or a plain run)."""
        return self.rank is None or self.rank.rank == 0

    def to_dict(self) -> dict[str, Any]:
        """What ``gpuaccept run --plan`` prints: the plan, each check's ``expected_s`` (its built-in estimate,
        process start included; None without one), ``expected_total_s`` (those and the run's own overhead) and
        ``profile_expected`` (the profile's seconds on an 8-GPU node, :mod:`gpuaccept.equivalents`)."""
        from gpuaccept.equivalents import EXPECTED_GPUS, PROFILES
        from gpuaccept.node.budget import RUN_OVERHEAD_S

        shown: dict[str, Any] = self.plan.to_dict()
        for c in shown["checks"]:
            c["expected_s"] = self.estimates.get(c["name"])
        shown["expected_total_s"] = round(RUN_OVERHEAD_S + sum(self.estimates.values()), 1)
        info = PROFILES.get(self.plan.profile)
        if info is not None:
            shown["profile_expected"] = {"expected_s": info.expected_s, "gpus": EXPECTED_GPUS,
                                         "dcgm": f"like DCGM {info.dcgm_level}: {info.dcgm_note}"}
        if self.rank is not None:
            shown["distributed"] = self.rank.to_dict()
        else:
            shown["nproc"] = self.nproc
        if self.budget is not None:
            shown["budget"] = self.budget[0].to_dict()
        return shown


def prepare(req: RunRequest, warn: Callable[[str], None] = lambda line: None) -> Prepared:
    """Options → a checked plan (UsageError, ConfigError or InputError before anything runs); ``warn`` gets
    warnings that do not stop the run (a history that cannot calibrate the budget)."""
    from gpuaccept.checks import registry
    from gpuaccept.checks.base import host_memory_mib
    from gpuaccept.hw.devices import resolve_device
    from gpuaccept.node.runner import is_distributed
    from gpuaccept.node.suite import check_gpu_fit, check_host_fit, check_rule_metrics, plan_suite, preflight

    opts, cfg, report_dir = merge_options(req)
    baseline = _load_baseline(req)
    if not req.no_history:  # a bad --db or $GPUACCEPT_DB is refused before anything runs, not after
        from gpuaccept.results.dburl import resolve_db_url

        resolve_db_url(req.db)
    info = _rank_info(req)
    reg = registry()
    device = resolve_device(opts.device)
    plan = plan_suite(opts, cfg, reg, device)
    if baseline is not None:
        check_rule_metrics(plan, reg, _baseline_rule_metrics(req, *baseline))
    _check_disk_path(req.disk_path, plan)
    if req.conformance is not None and not any(c.name == "conformance" for c in plan.checks):
        raise UsageError(f"--conformance {req.conformance}: the conformance check is not in this selection "
                         f"(add conformance to --checks, or leave it out of --skip)")
    preflight(plan, cfg, reg)
    _check_expect_gpus(plan)
    check_host_fit(plan, cfg, reg, host_memory_mib())
    gpu_memory = _selected_gpu_memory(plan)
    check_gpu_fit(plan, cfg, reg, gpu_memory)
    budget: Any = None
    if req.budget is not None:
        if info is not None:
            raise UsageError("--budget is for a run on one node; under --distributed every rank would plan its own "
                             "second pass (give the job a --profile and --checks that fit instead)")
        plan, budget = fit_budget(plan, cfg, reg, opts.timeout_scale, req.budget, len(gpu_memory), req.db or None,
                               "--no-history" if req.no_history else "", warn)
        _check_expect_gpus(plan)
        estimates = budget[2]
    else:
        from gpuaccept.node.budget import candidates, estimates_of, planned_gpus

        gpus = planned_gpus(plan.device, plan.gpus, len(gpu_memory))[0]
        estimates = estimates_of(candidates(plan, cfg, reg, gpus))
    nproc = 1
    if info is None and any(is_distributed(c) for c in plan.checks):
        from gpuaccept.distributed.local import default_nproc

        nproc = req.nproc or default_nproc(plan.device, plan.gpus, os.environ)
    return Prepared(req, plan, cfg, reg, report_dir, baseline=baseline, rank=info, budget=budget,
                    estimates=estimates, nproc=nproc, timeout_scale=opts.timeout_scale, requested_device=opts.device)


@dataclass
class NodeOutcome:
    """How a run ended. ``ending``: "done" (``report`` holds the verdict), "interrupted" (a signal; ``report`` is
    partial and on disk at ``kept``), "write" (a report file could not be written: ``message``), "rendezvous"
    (under --distributed the job never formed: ``message``)."""

    ending: str
    report: NodeReport | None = None
    kept: Path | None = None
    signum: int = 0
    message: str = ""
    results_path: Path | None = None
    report_path: Path | None = None


def run_node(prep: Prepared, display: Any, *, warm: Any = None, started: float | None = None,
             on_ready: Callable[[Any, str], None] = lambda plan, run_dir: None,
             say: Callable[[str], None] = lambda line: None,
             save: Callable[[NodeReport, Path], Any] | None = None) -> NodeOutcome:
    """Run ``prep``: ``display`` gets each check's start and end (``on_start``/``on_end``), ``on_ready`` the
    plan and the run directory once it exists, ``say`` the budget's lines; ``save`` stores a leading
    process's report in the history (default: :func:`gpuaccept.results.autosave.store`, as the request says)."""
    from gpuaccept.node.runner import Interrupted, RunEvents, Runner

    req = prep.request
    started = time.monotonic() if started is None else started
    if save is None:
        from gpuaccept.results.autosave import store

        def save(report: NodeReport, where: Path) -> Any:
            return store(report, where, db=req.db, off=req.no_history)

    runner: Runner
    if prep.rank is not None:
        from gpuaccept.distributed.control import RendezvousError
        from gpuaccept.node.distributed_run import DistributedRunner

        runner = DistributedRunner(prep.plan, Path(prep.report_dir), prep.rank, run_id=req.run_id,
                                   argv=list(req.argv), events=RunEvents.of(display) if prep.leads else RunEvents(),
                                   verbose=req.verbose, dist_timeout_s=req.dist_timeout, warm=warm,
                                   requested_device=prep.requested_device)
        try:
            runner.join()
        except RendezvousError as exc:
            return NodeOutcome("rendezvous", message=f"rank {prep.rank.rank}: {exc}")
        if prep.leads:
            on_ready(prep.plan, str(runner.run_dir))
    else:
        common: dict[str, Any] = dict(run_id=req.run_id, argv=list(req.argv), events=RunEvents.of(display),
                                      verbose=req.verbose, nproc=prep.nproc, dist_timeout_s=req.dist_timeout,
                                      warm=warm, requested_device=prep.requested_device)
        if prep.budget is not None:
            from gpuaccept.node.budget_run import WindowRunner

            assert req.budget is not None
            runner = WindowRunner(prep.plan, Path(prep.report_dir), deadline=started + req.budget,
                                  budget=prep.budget[0], candidates=prep.budget[1], registry=prep.registry,
                                  config=prep.config, timeout_scale=prep.timeout_scale, say=say, **common)
        else:
            runner = Runner(prep.plan, Path(prep.report_dir), **common)
        on_ready(prep.plan, str(runner.run_dir))
        for line in prep.budget[0].lines() if prep.budget is not None else []:
            say(line)
    runner.baseline = prep.baseline
    runner.report.estimates = prep.estimates
    results_path, report_path = runner.results_path, runner.report_path
    try:
        report = runner.run()
    except Interrupted as exc:
        kept = runner.report_path if prep.leads else runner.results_path
        if prep.leads:
            save(exc.report, kept)
        return NodeOutcome("interrupted", report=exc.report, kept=kept, signum=exc.signum,
                           results_path=results_path, report_path=report_path)
    except ReportWriteError as exc:
        return NodeOutcome("write", message=str(exc), results_path=results_path, report_path=report_path)
    if prep.leads:
        save(report, runner.report_path)
    return NodeOutcome("done", report=report, results_path=results_path, report_path=report_path)


def unapplied_options(plan: Any) -> list[str]:
    """Why an option given for this run could not apply, one line each (``--gpus`` on a CPU run)."""
    notes = []
    if plan.gpus is not None and plan.device != "cuda":
        shown = ",".join(str(g) for g in plan.gpus)
        notes.append(f"--gpus/gpus {shown} did not apply: the run's device is {plan.device} (no usable GPU), "
                     "so no GPU was selected")
    return notes
