"""``gpuaccept launch <backend>`` and ``gpuaccept gather``: spec -> plan -> submit -> watch -> gather.

Each backend's own flags come from ``Backend.add_arguments``; its module is
imported only when that backend is named (``gpuaccept --help`` imports none
of them, and nothing here imports torch). Exit codes follow the CLI's map:
0 every node passed, 1 a node failed or is missing (or the job failed, or
the timeout hit), 2 bad usage, spec or input with nothing submitted, 130
interrupted (the job is cancelled and what came back is gathered); ``gather``
exits 3 when the scheduler says the job is still queued or running, and
writes nothing (the cluster report of a finished job is not overwritten).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuaccept.argtypes import check_run_id, duration, time_limit
from gpuaccept.argtypes import csv as _csv
from gpuaccept.argtypes import integer as _count
from gpuaccept.cliargs import Parser as _Parser
from gpuaccept.cliargs import add_suite_options, flag_hints, hidden_alias
from gpuaccept.errors import GpuacceptError, InputError, UsageError
from gpuaccept.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_RUNNING
from gpuaccept.launch.collect import (
    CLUSTER_REPORT,
    ReportFiles,
    backend_reports,
    progress,
    warn,
)
from gpuaccept.launch.registry import BACKENDS
from gpuaccept.results.autosave import add_history_options
from gpuaccept.suiteplan import add_plan_option, show_plan

JOB_FILE = "job.json"

#: One line per backend for ``gpuaccept launch --help`` (the backend's own ``help`` once it is loaded).
BACKEND_HELP = {
    "slurm": "sbatch + srun, torchrun per node, Pyxis/Enroot containers",
    "ssh": "hosts over ssh, torchrun per host, reports back with scp",
    "k8s": "Kubernetes Job, JobSet, PyTorchJob, MPIJob or TrainJob manifests",
    "runai": "runai training pytorch|mpi submit",
    "mpi": "mpirun (Open MPI) with a hostfile: MPI programs, nccl-tests",
    "local": "N nodes as processes on this machine (try the flow, tests)",
    "bcp": "NVIDIA Base Command Platform: ngc base-command job run (PYTORCH or MPI arrays)",
}
#: Backends whose nodes normally see this machine's filesystem: without --image they default to this interpreter.
SHARED_FS_BACKENDS = ("local", "slurm", "mpi")
#: Suite option dests (``gpuaccept run`` flags) other than --report-dir.
SUITE_DESTS = ("profile", "checks", "skip", "device", "gpus", "expect_gpus", "require_gpu", "timeout_scale", "config",
               "baseline", "baseline_thresholds", "disk_path", "budget")


class BackendParser(_Parser):
    """The parser of ``launch <backend>``: loads the backend's flags on first use and splits off ``-- cmd``."""

    def __init__(self, *args: Any, backend_name: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.backend_name = backend_name
        self.backend_dests: set[str] = set()
        self._backend: Any = None

    def load(self) -> Any:
        """The backend class, with its flags added to this parser (once)."""
        if self._backend is None:
            from gpuaccept.launch.registry import backend_class

            try:
                cls = backend_class(self.backend_name)
            except ImportError as exc:
                self.error(f"backend {self.backend_name!r} is not available here: {exc}")
            before = {a.dest for a in self._actions}
            cls.add_arguments(self)
            self.backend_dests = {a.dest for a in self._actions} - before
            doc = (sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")
            if len(doc) > 1:  # the module's second paragraph says how the backend works
                self.description = (self.description or "") + "\n\n" + doc[1].replace("``", "")
            self._backend = cls
        return self._backend

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self.load()
        argv = list(sys.argv[1:] if args is None else args)
        command: list[str] | None = None
        if "--" in argv:
            i = argv.index("--")
            argv, command = argv[:i], argv[i + 1:]
        ns, rest = super().parse_known_args(argv, namespace)
        if rest:
            self.error(f"unrecognized arguments: {' '.join(rest)}{flag_hints(self, rest)} (a command goes after --)")
        ns.command_argv = command
        return ns, []

    def format_help(self) -> str:
        self.load()
        return super().format_help()


def _add_job_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job")
    g.add_argument("--nodes", type=_count, default=None, metavar="N",
                   help="number of nodes (default: 1, or the number of hosts given)")
    g.add_argument("--gpus-per-node", type=_count, default=None, metavar="G",
                   help="GPUs to request and test per node (default: every GPU each node has, counted on it)")
    g.add_argument("--procs-per-node", type=_count, default=None, metavar="P",
                   help="processes (ranks) per node under torchrun/mpirun (default: one per GPU of the node)")
    g.add_argument("--image", default=None, help="container image (Pyxis on slurm, the pod image on k8s)")
    g.add_argument("--env", action="append", default=None, metavar="NAME=VALUE", help="job environment (repeatable)")
    g.add_argument("--mount", action="append", default=None, metavar="SRC:DST[:ro]",
                   help="bind mount into the container (repeatable)")
    g.add_argument("--time", type=time_limit, default=None, metavar="TIME",
                   help="scheduler time limit: minutes (30), Slurm's MM:SS, HH:MM:SS, D-HH:MM, or 90s, 1h30m, 2d; "
                        "rounded up to whole minutes")
    g.add_argument("--name", default=None, help="job name (made a DNS label: My_Job -> my-job)")
    g.add_argument("--workdir", default=None, metavar="DIR",
                   help="working directory of the job (default for a command: this directory)")
    g.add_argument("--python", default=None, metavar="PATH",
                   help="interpreter on the nodes that has gpuaccept/torch (default: this one for local, slurm "
                        "and mpi without --image, as their nodes share the filesystem; else python3)")
    g.add_argument("--distributed", action="store_true", default=None,
                   help="run the suite as ranks (gpuaccept run --distributed): node checks once per node, the "
                        "cross-node checks (collectives, ddp_train) over every rank; the default for 2+ nodes")
    g.add_argument("--per-node-only", action="store_true", default=None,
                   help="run the suite once per node, with no cross-node check (the fabric is not tested)")
    g.add_argument("--no-torchrun", action="store_true", default=None,
                   help="run the command once per node instead of under torchrun")
    o = p.add_argument_group("launch")
    hidden_alias(o, "--results-dir", p._option_string_actions["--report-dir"])
    o.add_argument("--run-id", default=None, help="name of this run (default: UTC time, job name, random suffix)")
    o.add_argument("--spec", default=None, metavar="FILE.yaml", help="job spec file; flags override it")
    o.add_argument("--dry-run", action="store_true", help="print the job (scripts, manifests), submit nothing")
    add_plan_option(o, " (made here, as 'gpuaccept run --plan' makes it: each node makes its own from its GPUs)")
    o.add_argument("--output", default=None, metavar="DIR",
                   help="also write the plan's files to DIR (a file holding a secret --env value: mode 0600)")
    o.add_argument("--show-env", action="store_true",
                   help="--dry-run prints secret --env values (default: <redacted>; see docs/reference/security.md)")
    o.add_argument("--detach", action="store_true", help="submit and return; gather later with 'gpuaccept gather'")
    o.add_argument("--timeout", type=duration, default=None, metavar="DURATION",
                   help="cancel the job if it has not ended after this long (default: wait)")
    o.add_argument("--poll-interval", type=duration, default=None, metavar="DURATION",
                   help="time between status queries (default: 2s)")
    o.add_argument("--cluster-report", default=None, metavar="PATH", help="also write the cluster report here")
    add_history_options(o)
    o.add_argument("--verbose", "-v", action="store_true", help="tracebacks of internal errors")


def register(subparsers: Any) -> None:
    """Add ``launch`` (one sub-parser per backend) and ``gather``."""
    launch = subparsers.add_parser(
        "launch", help="run the suite (or a command) across nodes through a scheduler",
        description="Turn one job description into a scheduler's native job, submit it, wait, gather the "
                    "per-node reports into one cluster report. The default job is the acceptance suite "
                    "(same options as 'gpuaccept run'); put a command after -- to run that instead.")
    backends = launch.add_subparsers(dest="backend", metavar="BACKEND", parser_class=BackendParser)
    for name in BACKENDS:
        p = backends.add_parser(name, help=BACKEND_HELP.get(name, ""), backend_name=name, allow_abbrev=False,
                                usage=f"gpuaccept launch {name} [options] [-- command args...]",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description=f"gpuaccept launch {name}: {BACKEND_HELP.get(name, '')}.")
        add_suite_options(p)
        _add_job_options(p)
        p.set_defaults(handler=_cmd_launch, launch_parser=p)
    launch.set_defaults(handler=_launch_without_backend, launch_parser=launch)

    gather = subparsers.add_parser(
        "gather", help="merge the node reports of a launched run into a cluster report",
        description="Collect the node reports of a launch (for instance one started with --detach), write "
                    "<run-dir>/cluster-report.json, print the per-node verdicts; exit 0 when every node passed. "
                    "For a k8s or runai run the job is found again from <run-dir>/launch/job.json and the "
                    "reports are read from its pod logs (copies land under <run-dir>); when the backend cannot "
                    "be reached, a warning says why and the reports already under <run-dir> are used. Other "
                    "backends (and --local) read <run-dir>/**/report.json. Nodes that never reported are "
                    "listed as missing.")
    gather.add_argument("run_dir", metavar="RUN_DIR", help="<report-dir>/<run-id> of a launch")
    gather.add_argument("--nodes", type=_count, default=None, help="nodes expected (default: from job.json)")
    gather.add_argument("--hosts", type=_csv, default=None, metavar="H1,H2",
                        help="hosts expected (default: from job.json, or the nodes the pods ran on)")
    gather.add_argument("--cluster-report", default=None, metavar="PATH", help="also write the cluster report here")
    gather.add_argument("--local", action="store_true",
                        help="only read the reports already under RUN_DIR; do not ask the backend")
    b = gather.add_argument_group("backend", "Where to find a k8s or runai job; default: what launch/job.json "
                                             "saved at launch.")
    for flag, owner, metavar, text in _GATHER_OVERRIDES:
        b.add_argument(flag, default=None, metavar=metavar, help=f"{owner}: {text}")
    add_history_options(gather)
    gather.set_defaults(handler=_cmd_gather)


#: ``gpuaccept gather`` flags that override a backend option saved in job.json: (flag, backend, metavar, help).
_GATHER_OVERRIDES = (
    ("--kubeconfig", "k8s", "FILE", "kubeconfig to reach the cluster with"),
    ("--context", "k8s", "NAME", "kubeconfig context"),
    ("--namespace", "k8s", "NAME", "namespace of the job"),
    ("--project", "runai", "NAME", "Run:ai project of the workload"),
    ("--runai-bin", "runai", "PATH", "the runai CLI"),
)


def _launch_without_backend(args: argparse.Namespace) -> int:
    raise UsageError(f"launch needs a backend: {', '.join(BACKENDS)} (see 'gpuaccept launch --help')")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def new_run_id(name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{name}-{uuid.uuid4().hex[:4]}"


def _suite_given(args: argparse.Namespace) -> list[str]:
    return [d for d in SUITE_DESTS if getattr(args, d, None) not in (None, False)]


def suite_args(args: argparse.Namespace) -> list[str]:
    """The ``gpuaccept run`` flags of the default job (``--report-dir`` is added by the spec)."""
    out: list[str] = []
    if args.profile:
        out += ["--profile", args.profile]
    if args.checks is not None:
        out += ["--checks", ",".join(args.checks)]
    if args.skip:
        out += ["--skip", ",".join(args.skip)]
    if args.device:
        out += ["--device", args.device]
    if args.gpus:
        out += ["--gpus", args.gpus]
    if args.expect_gpus is not None:
        out += ["--expect-gpus", str(args.expect_gpus)]
    if args.require_gpu:
        out.append("--require-gpu")
    if args.timeout_scale is not None:
        out += ["--timeout-scale", f"{args.timeout_scale:g}"]
    if args.config:
        out += ["--config", os.path.abspath(args.config)]
    if args.baseline:
        out += ["--baseline", os.path.abspath(args.baseline)]
    if args.baseline_thresholds:
        out += ["--baseline-thresholds", os.path.abspath(args.baseline_thresholds)]
    if getattr(args, "disk_path", None) is not None:  # a directory on the node: passed as given
        out += ["--disk-path", args.disk_path]
    budget = getattr(args, "budget", None)
    if budget is not None:  # seconds, as gpuaccept run reads them back
        out += ["--budget", str(int(budget)) if float(budget).is_integer() else f"{budget:.3f}"]
    return out


def _validate_suite(args: argparse.Namespace) -> Any:
    """Check the suite options here, before anything is submitted. Returns the loaded config."""
    from gpuaccept.checks import registry
    from gpuaccept.node.run import RunRequest, check_disk_path_selected, merge_options
    from gpuaccept.node.suite import plan_suite

    opts, cfg, _ = merge_options(RunRequest.from_namespace(args))
    plan = plan_suite(opts, cfg, registry(), "cpu" if opts.device == "auto" else opts.device)
    check_disk_path_selected(getattr(args, "disk_path", None), plan)
    return cfg


def _run_supports_distributed() -> bool:
    from gpuaccept.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            run = action.choices.get("run")
            return run is not None and "--distributed" in run._option_string_actions
    return False


def build_spec(args: argparse.Namespace, backend_cls: Any) -> Any:
    """The validated JobSpec from parsed flags (and the spec file already applied to them)."""
    from gpuaccept.launch.gpucount import requested
    from gpuaccept.launch.spec import JobSpec, Mount, parse_env, sanitize_name

    command: list[str] | None = args.command_argv
    if command is not None and not command:
        raise UsageError("nothing after --: give a command, or leave -- out to run the acceptance suite")
    given = _suite_given(args)
    if command is not None and given:
        raise UsageError(f"--{given[0].replace('_', '-')} is a suite option; it does not apply to a command after --")
    if command is not None and args.distributed:
        raise UsageError("--distributed is for the suite; a command runs under torchrun already (see --no-torchrun)")
    if command is None and args.no_torchrun:
        raise UsageError("--no-torchrun applies to a command after --; for the suite see --per-node-only")
    if command is not None and args.per_node_only:
        raise UsageError("--per-node-only is for the suite; a command runs once per node with --no-torchrun")
    if args.distributed and args.per_node_only:
        raise UsageError("--distributed and --per-node-only contradict each other; give one")

    cfg = _validate_suite(args) if command is None else None
    results = (args.report_dir or (cfg.report_dir if cfg is not None else None)
               or os.environ.get("GPUACCEPT_REPORT_DIR") or "gpuaccept-reports")
    options = backend_cls.options_from_args(args)
    hosts = options.get("hosts") if isinstance(options, dict) else None
    nodes = args.nodes if args.nodes is not None else (len(hosts) if hosts else 1)

    name = sanitize_name(args.name or ("gpuaccept" if command is None else Path(command[0]).name))
    run_id = args.run_id or new_run_id(name)
    try:
        check_run_id(run_id)
    except ValueError as exc:
        raise UsageError(f"--run-id {exc}") from None
    if command is None:  # 2+ nodes: the suite tests the fabric between them unless told not to
        distributed = bool(args.distributed) or (nodes > 1 and not args.per_node_only)
    else:
        distributed = not args.no_torchrun
    s_args = suite_args(args) if command is None else []
    if command is None and distributed and getattr(args, "budget", None) is not None:
        raise UsageError("--budget fits one node's run in a window; under --distributed every rank would plan its "
                         "own: add --per-node-only (or launch one node)")
    if command is None and distributed:
        if not _run_supports_distributed():
            raise UsageError("--distributed: this gpuaccept's 'run' has no --distributed mode")
        s_args.append("--distributed")
    python = args.python or (sys.executable if backend_cls.name in SHARED_FS_BACKENDS and not args.image
                             else "python3")
    # A command starts where it was launched from; in a container too where the nodes share this filesystem
    # (slurm mounts the directory into the Pyxis container).
    here = command is not None and (not args.image or backend_cls.name in SHARED_FS_BACKENDS)
    workdir = args.workdir or (os.getcwd() if here else None)
    gpn, ppn = requested(args.gpus_per_node, args.procs_per_node, args.gpus or getattr(cfg, "gpus", None),
                         args.device or getattr(cfg, "device", None))
    return JobSpec(
        name=name, nodes=nodes, run_id=run_id, results_dir=os.path.abspath(results),
        gpus_per_node=gpn, procs_per_node=ppn, command=command,
        suite_args=s_args, image=args.image, env=parse_env(args.env or []),
        mounts=[Mount.parse(m) for m in args.mount or []], time_limit_min=args.time, workdir=workdir,
        distributed=distributed, python=python, options=options,
    )


def _no_plan() -> int:
    raise UsageError("--plan shows the suite's plan; with a command after -- there is none (--dry-run shows the job)")


def _cmd_launch(args: argparse.Namespace) -> int:
    from gpuaccept.launch import specfile
    from gpuaccept.launch.jobargv import launch_dir
    from gpuaccept.launch.secrets import redact_env, secret_values
    from gpuaccept.launch.spec import risk_warnings

    parser: BackendParser = args.launch_parser
    backend_cls = parser.load()
    if args.spec:
        specfile.apply(specfile.load(args.spec), args.spec, parser, args, parser.backend_name, list(BACKENDS),
                       parser.backend_dests)
    spec = build_spec(args, backend_cls)
    if args.plan:
        return show_plan(spec.suite_args) if spec.command is None else _no_plan()
    backend = backend_cls()
    plan = backend.plan(spec)
    for risk in risk_warnings(spec):
        print(f"[LAUNCH] warning: {risk}", file=sys.stderr, flush=True)
    if args.output:
        try:
            plan.write(Path(args.output), secret_values(spec.env))
        except OSError as exc:
            raise InputError(f"cannot write the plan to --output {args.output}: {exc.strerror}") from None
        print(f"[LAUNCH] plan files written to {args.output}", file=sys.stderr)
    if args.dry_run:
        hidden = [] if args.show_env else [k for k, v in spec.env.items() if redact_env({k: v})[k] != v]
        shown = backend.plan(dataclasses.replace(spec, env=redact_env(spec.env))) if hidden else plan
        sys.stdout.write(shown.render())
        if hidden:
            print(f"# note: the value of --env {', '.join(hidden)} is shown as <redacted> (--show-env prints it)")
        return EXIT_OK

    backend.check_ready(plan, spec)
    run_dir = Path(spec.run_results_dir)
    workdir = Path(launch_dir(spec))
    if (workdir / JOB_FILE).exists() or (run_dir / CLUSTER_REPORT).exists():
        raise UsageError(f"run {spec.run_id} already exists in {spec.results_dir}; choose another --run-id")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        plan.write(workdir, secret_values(spec.env), launch=True)
    except OSError as exc:
        raise InputError(f"cannot write to the results directory {spec.results_dir}: {exc.strerror}") from None
    from gpuaccept.launch.watch import cancel_early, sigterm_as_interrupt, watch

    started = utc_now()
    with sigterm_as_interrupt():  # from the submission on, Ctrl-C or SIGTERM cancels the job
        submission = backend.submit(plan, spec, workdir)
        try:
            job = {"backend": backend.name, "run_id": spec.run_id, "job_id": submission.job_id, "started": started,
                   "nodes": spec.nodes, "expected_hosts": list(submission.hosts or plan.expected_hosts),
                   "spec": {**dataclasses.asdict(spec), "env": redact_env(spec.env)}}
            (workdir / JOB_FILE).write_text(json.dumps(job, indent=2, default=str) + "\n")
            print(f"[LAUNCH] {backend.name} job {submission.job_id} submitted: {spec.nodes} node(s), run "
                  f"{spec.run_id}", flush=True)
            print(f"[LAUNCH] results: {run_dir}", flush=True)
            if args.detach:
                print(f"[LAUNCH] detached; when it ends: gpuaccept gather {run_dir}", flush=True)
                return EXIT_OK
            outcome = watch(backend, submission, stream=sys.stdout, timeout_s=args.timeout,
                            poll_s=args.poll_interval or 2.0, progress=progress(run_dir, spec.nodes))
        except KeyboardInterrupt:  # before watch took over
            outcome = cancel_early(backend, submission, sys.stdout)
    return _finish(backend, submission, spec, plan, outcome, started, args, run_dir)


def _finish(backend: Any, submission: Any, spec: Any, plan: Any, outcome: Any, started: str,
            args: argparse.Namespace, run_dir: Path) -> int:
    from gpuaccept.launch.jobargv import launch_dir
    from gpuaccept.launch.stream import peek, report_out, stream_gather
    from gpuaccept.model import Verdict

    state = outcome.state
    fetched = backend_reports(backend, submission, spec, run_dir)
    job_failed = state.done and not state.ok and state.state != "UNKNOWN"
    if job_failed or outcome.timed_out or outcome.interrupted or spec.command is not None:
        tail = backend.logs(submission)
        if tail:
            print(f"[LAUNCH] last output of the job ({state.state}):", file=sys.stderr)
            print(tail, file=sys.stderr)
        print(f"[LAUNCH] job output: {Path(launch_dir(spec))}", file=sys.stderr)
    gathered = None
    reports = fetched if spec.command is None else peek(fetched)
    if reports is not None:
        job = {"state": state.state, "ok": state.ok, "detail": state.detail, "timed_out": outcome.timed_out,
               "interrupted": outcome.interrupted}
        gathered = stream_gather(reports, run_dir, expected_hosts=submission.hosts or plan.expected_hosts,
                                 run_id=spec.run_id, backend=backend.name, started=started, finished=utc_now(),
                                 expected_nodes=spec.nodes, job_id=submission.job_id, job=job,
                                 extra=args.cluster_report)
        report_out(gathered, args)
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    if outcome.timed_out:
        return EXIT_FAILED
    ended = f"the {backend.name} job ended {state.state}" + (f" ({state.detail})" if state.detail else "")
    if gathered is not None:
        if gathered.verdict is not Verdict.SUCCESS:
            return EXIT_FAILED
        if job_failed:
            print(f"[RESULT] FAILURE: every node reported success, but {ended}", flush=True)
            return EXIT_FAILED
        return EXIT_OK
    if job_failed or not state.ok:
        print(f"[RESULT] FAILURE: {ended}", flush=True)
        return EXIT_FAILED
    print("[RESULT] SUCCESS", flush=True)
    return EXIT_OK


def spec_from_job(job: dict[str, Any], where: Path, overrides: dict[str, str] | None = None) -> Any:
    """The JobSpec saved in job.json (``spec``), with backend ``overrides`` put into its options; None for a
    job.json without one. InputError naming ``where`` when it cannot be rebuilt."""
    from gpuaccept.launch.spec import JobSpec, Mount

    raw = job.get("spec")
    if raw is None:
        return None
    try:
        if not isinstance(raw, dict):
            raise TypeError("not a mapping")
        names = {f.name for f in dataclasses.fields(JobSpec)}
        values = {k: v for k, v in raw.items() if k in names}  # keys a later gpuaccept added are left out
        values["mounts"] = [Mount(**m) if isinstance(m, dict) else Mount.parse(str(m), "spec.mounts")
                            for m in values.get("mounts") or []]
        options = values.get("options") or {}
        if not isinstance(options, dict):
            raise TypeError("options is not a mapping")
        values["options"] = {**options, **(overrides or {})}
        return JobSpec(**values)
    except (GpuacceptError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{where}: cannot rebuild the job spec ({exc}); 'gpuaccept gather --local' reads the "
                         "reports already in the run directory") from None


def _gather_overrides(args: argparse.Namespace, backend_name: str) -> dict[str, str]:
    """Backend options given on the gather command line; UsageError for a flag of another backend."""
    out: dict[str, str] = {}
    for flag, owner, _metavar, _help in _GATHER_OVERRIDES:
        key = flag.lstrip("-").replace("-", "_")
        value = getattr(args, key, None)
        if value is None:
            continue
        if owner != backend_name:
            what = f"a {backend_name} run" if backend_name else "not a launched run (no launch/job.json)"
            raise UsageError(f"{flag} is for {owner} runs; {args.run_dir} is {what}")
        if args.local:
            raise UsageError(f"{flag} tells where the {owner} job is; --local does not ask the backend")
        out[key] = os.path.abspath(os.path.expanduser(value)) if key == "kubeconfig" else value
    return out


def _reports_from_backend(job: dict[str, Any], job_path: Path, run_dir: Path,
                          args: argparse.Namespace) -> tuple[Iterable[Any], list[str]] | None:
    """(reports, hosts the job ran on) fetched through the backend that submitted the run, for a backend that
    can find a detached job again (``resume``); None when the run's reports are just the files under run_dir."""
    from gpuaccept.launch.registry import backend_class

    name = str(job.get("backend") or "")
    overrides = _gather_overrides(args, name)
    if args.local or name not in BACKENDS:
        return None
    try:
        cls = backend_class(name)
    except ImportError as exc:
        warn(f"the {name} backend is not available here ({exc}); using the reports already under {run_dir}")
        return None
    if not callable(getattr(cls, "resume", None)):
        return None
    spec = spec_from_job(job, job_path, overrides)
    if spec is None:
        warn(f"{job_path} has no job spec to find the {name} job with; using the reports already under {run_dir}")
        return None
    here = run_dir.resolve()
    if here.name == spec.run_id:  # copies of logs and reports go where gather was pointed, even if moved
        spec = dataclasses.replace(spec, results_dir=str(here.parent))
    backend = cls()
    submission = getattr(backend, "resume")(spec)  # noqa: B009 (not every backend has resume)
    reports = backend_reports(backend, submission, spec, run_dir)
    return reports, list(submission.hosts or [])


def _still_running(job: dict[str, Any], args: argparse.Namespace) -> str | None:
    """What the scheduler says when the launched job has not ended yet (``the slurm job 42 is RUNNING``), for a
    backend that can look a job up by its id (``live_state``); None when it has ended or nobody can tell."""
    from gpuaccept.launch.registry import backend_class

    name, job_id = str(job.get("backend") or ""), job.get("job_id")
    if args.local or name not in BACKENDS or not job_id:
        return None
    try:
        cls = backend_class(name)
    except ImportError:
        return None
    live = getattr(cls, "live_state", None)
    if not callable(live):
        return None
    state = live(str(job_id))
    if state is None or state.done:
        return None
    return f"the {name} job {job_id} is {state.state}" + (f" ({state.detail})" if state.detail else "")


def _cmd_gather(args: argparse.Namespace) -> int:
    from gpuaccept.launch.stream import report_out, stream_gather
    from gpuaccept.model import Verdict

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    job: dict[str, Any] = {}
    job_path = run_dir / "launch" / JOB_FILE
    if job_path.exists():
        try:
            job = json.loads(job_path.read_text())
            if not isinstance(job, dict):
                raise ValueError("not a mapping")
        except (OSError, ValueError) as exc:
            raise InputError(f"{job_path}: unreadable ({exc})") from None
    running = _still_running(job, args)
    if running:
        print(f"[RESULT] STILL RUNNING: {running}; nothing written, gather again when it has ended")
        return EXIT_RUNNING
    fetched = _reports_from_backend(job, job_path, run_dir, args)
    reports, ran_on = (ReportFiles(run_dir, warn), []) if fetched is None else fetched
    hosts = args.hosts if args.hosts is not None else (ran_on or list(job.get("expected_hosts") or []))
    try:
        nodes = args.nodes if args.nodes is not None else int(job.get("nodes") or 0)
    except (TypeError, ValueError):
        raise InputError(f"{job_path}: nodes is not a number: {job.get('nodes')!r}") from None
    gathered = stream_gather(reports, run_dir, expected_hosts=hosts, run_id=str(job.get("run_id") or run_dir.name),
                             backend=str(job.get("backend") or "unknown"), started=str(job.get("started") or utc_now()),
                             finished=utc_now(), expected_nodes=nodes, job_id=job.get("job_id"),
                             extra=args.cluster_report)
    report_out(gathered, args)
    return EXIT_OK if gathered.verdict is Verdict.SUCCESS else EXIT_FAILED
