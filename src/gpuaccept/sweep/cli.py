"""``gpuaccept sweep slurm`` and ``gpuaccept sweep k8s``: continuous validation of idle nodes.

``sweep slurm`` submits ``gpuaccept run`` as a low-priority, non-requeued one-node job to each node that is idle
now (and has no sweep job queued); each run stores its result in the history (``--db``) with the node's
hardware identity, where ``gpuaccept trend`` flags a node whose figures fall before it fails outright. Run it
from cron or a systemd timer on a login node. ``sweep k8s`` prints a CronJob and a PriorityClass that do the
same on Kubernetes (``| kubectl apply -f -``).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from gpuaccept.argtypes import abs_path, count, time_limit
from gpuaccept.errors import UsageError


def _db_for_jobs(text: str | None) -> str | None:
    """The history URL written into each job: validated, a SQLite path made absolute, never a password (the
    job script is kept on disk and by Slurm: give a password through ~/.pgpass or PGPASSWORD)."""
    if text is None:
        return None
    from gpuaccept.results.dburl import parse_db_url

    url = parse_db_url(text, "--db")
    if url.password is not None:
        raise UsageError("--db: the URL holds a password, which would be stored in every job script; give it to "
                         "the jobs through ~/.pgpass or PGPASSWORD instead")
    if url.kind == "sqlite" and url.path is not None:
        return f"sqlite:///{url.path.resolve()}"
    return url.text


def _run_args(args: argparse.Namespace) -> tuple[str, ...]:
    out = ["--profile", args.profile]
    if args.config:
        out += ["--config", args.config]
    if args.device:
        out += ["--device", args.device]
    rest = list(args.run_args or [])
    if rest[:1] == ["--"]:
        rest = rest[1:]
    return (*out, *rest)


def cmd_slurm(args: argparse.Namespace) -> int:
    from gpuaccept.argtypes import check_abs_path
    from gpuaccept.sweep.plan import SweepOptions, job_script, summary
    from gpuaccept.sweep.slurm import submit, survey

    try:
        check_abs_path(args.report_dir)
    except ValueError as exc:
        raise UsageError(f"--report-dir: {exc} (the nodes write there)") from None
    opts = SweepOptions(python=args.python or sys.executable, results_dir=args.report_dir,
                        db=_db_for_jobs(args.db), partition=args.partition, qos=args.qos, account=args.account,
                        nice=args.nice, time_min=args.time, deadline_min=args.deadline or None,
                        max_nodes=args.max_nodes, gpus_per_node=args.gpus_per_node, run_args=_run_args(args))
    decisions = survey(opts)
    for line in summary(decisions):
        print(f"[SWEEP] {line}")
    chosen = [d.node for d in decisions if d.submit]
    if args.dry_run:
        for node in chosen:
            print(f"# --- {node}.sbatch (not submitted: --dry-run)")
            print(job_script(node, opts), end="")
        return 0
    failed = 0
    for s in submit(decisions, opts):
        if s.job_id:
            print(f"[SWEEP] {s.node}: job {s.job_id} ({s.script})")
        else:
            failed += 1
            print(f"[SWEEP] {s.node}: not submitted: {s.error}", file=sys.stderr)
    print(f"[RESULT] {len(chosen) - failed} sweep job(s) submitted, {len(decisions) - len(chosen)} node(s) skipped"
          + (f", {failed} submission(s) failed" if failed else ""))
    return 1 if failed else 0


def cmd_k8s(args: argparse.Namespace) -> int:
    from gpuaccept.sweep.k8s import CronSweep, manifests, to_yaml

    sweep = CronSweep(image=args.image, namespace=args.namespace, schedule=args.schedule, nodes=args.nodes,
                      gpus_per_node=args.gpus_per_node, priority=args.priority, profile=args.profile,
                      db_secret=args.db_secret, deadline_s=args.time * 60,
                      node_selector=tuple(args.node_selector or ()))
    print(to_yaml(manifests(sweep)), end="")
    return 0


def cmd_flag(args: argparse.Namespace) -> int:
    import json

    from gpuaccept.results.history import open_store
    from gpuaccept.results.timespec import parse_since
    from gpuaccept.results.trend import TrendRule
    from gpuaccept.sweep.flag import scan

    rule = TrendRule(max_drop_sigma=args.max_z, min_drop_frac=args.min_drop_pct / 100.0)
    since = parse_since(args.since) if args.since else None
    with open_store(args.db, read_only=True) as store:
        found, judged = scan(store, args.metric, since, rule)
    need = rule.min_history + rule.recent
    not_judged = (f"NOT JUDGED: no series has enough history (a series is judged once it holds {need} runs of "
                  "one metric on one part)") if not judged else ""
    if args.json:
        text = json.dumps({"series_judged": judged, "verdict": "not_judged" if not judged else
                           "regressed" if found else "steady", "regressions": [f.__dict__ for f in found]},
                          indent=2)
        if args.json == "-":
            print(text)
            return 1 if found and args.exit_code else 0
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    for f in found:
        print(f"REGRESSION: {f.line()}")
    hosts = sorted({f.host for f in found})
    if not_judged:
        print(f"[RESULT] {not_judged}")
        return 0
    print(f"[RESULT] {len(found)} regressed series on {len(hosts)} node(s)"
          + (f": {', '.join(hosts)}" if hosts else "") + f" ({judged} series with enough history judged)")
    return 1 if found and args.exit_code else 0


_TOKEN = re.compile(r"^[A-Za-z0-9_.:@+-]+$")


def token_type(flag: str) -> Any:
    """A Slurm name (partition, QOS, account): letters, digits and ``. _ : @ + -`` (it goes into #SBATCH lines)."""
    def check(text: str) -> str:
        if not _TOKEN.match(text):
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {flag} value (letters, digits, . _ : @ + -)")
        return text
    return check


def _selector(text: str) -> str:
    key, sep, _value = text.partition("=")
    if not sep or not key or "\n" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return text


def register(sub: Any) -> None:
    """Add ``sweep slurm`` and ``sweep k8s`` to the top-level subparsers."""
    from gpuaccept.cliargs import PROFILES, Parser

    p = sub.add_parser("sweep", help="validate idle nodes continuously with low-priority jobs",
                       description="Continuous validation: run the suite on nodes that are idle now, as "
                                   "low-priority preemptible jobs that yield to real work, each result stored in "
                                   "the history (then 'gpuaccept trend' flags a node whose figures fall).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=Parser)
    s = verbs.add_parser("slurm", help="submit the suite to each idle Slurm node (run it from cron)",
                         description="Submit 'gpuaccept run' to each node that sinfo shows idle and that has no "
                                     "sweep job queued: one exclusive one-node job per node, --nice, "
                                     "--no-requeue, a time limit and a start deadline, in the site's partition "
                                     "and QOS. Each run stores its result in the history (--db).")
    s.add_argument("--report-dir", required=True, metavar="DIR",
                   help="shared directory for the reports, job logs and the job scripts (absolute)")
    s.add_argument("--db", default=None, metavar="URL",
                   help="history the runs store into (postgresql://USER@HOST/DB for a fleet; no password in it: "
                        "use ~/.pgpass); default: each run's own default")
    s.add_argument("--partition", type=token_type("--partition"), default=None, help="partition to sweep")
    s.add_argument("--qos", type=token_type("--qos"), default=None,
                   help="the site's preemptible QOS (e.g. scavenger), so that real work preempts a sweep job")
    s.add_argument("--account", type=token_type("--account"), default=None, help="account to charge")
    s.add_argument("--nice", type=count(0, 2147483645), default=10000,
                   help="sbatch --nice: lower the jobs' priority by this much (default 10000)")
    s.add_argument("--time", type=time_limit, default=30, metavar="TIME",
                   help="each job's time limit (Slurm forms or 90s, 1h30m; default 30 minutes)")
    s.add_argument("--deadline", type=time_limit, default=60, metavar="TIME",
                   help="drop a job that has not started within this time (sbatch --deadline; default 1h)")
    s.add_argument("--max-nodes", type=count(1), default=None, metavar="N",
                   help="submit to at most N idle nodes per sweep")
    s.add_argument("--gpus-per-node", type=count(1, 64), default=None, metavar="N",
                   help="ask for N GPUs per node (sites with GRES)")
    s.add_argument("--profile", choices=PROFILES, default="quick", help="suite profile each job runs (default quick)")
    s.add_argument("--config", type=abs_path, default=None, metavar="FILE", help="suite config on the nodes")
    s.add_argument("--device", default=None, choices=("auto", "cuda", "cpu"), help="device each run uses")
    s.add_argument("--python", type=abs_path, default=None, metavar="PATH",
                   help="interpreter on the nodes that has gpuaccept (default: this one; the nodes share it)")
    s.add_argument("--dry-run", action="store_true", help="print the decisions and the job scripts; submit nothing")
    s.add_argument("run_args", nargs=argparse.REMAINDER, metavar="-- RUN_ARGS",
                   help="more 'gpuaccept run' arguments for every job, after --")
    s.set_defaults(handler=cmd_slurm)
    k = verbs.add_parser("k8s", help="print a CronJob and PriorityClass that sweep idle GPU nodes",
                         description="Print a PriorityClass (negative value, never preempts) and a CronJob whose "
                                     "pods each ask for a whole node's GPUs, one pod per node, so they only start "
                                     "on idle nodes and real work preempts them. Apply with kubectl apply -f -.")
    k.add_argument("--image", required=True, help="image with gpuaccept (e.g. the runtime image)")
    k.add_argument("--namespace", default="gpuaccept", help="namespace (default gpuaccept)")
    k.add_argument("--schedule", default="17 * * * *", help="cron schedule (default: hourly at minute 17)")
    k.add_argument("--nodes", type=count(1, 10000), default=4, metavar="N", help="idle nodes per sweep (default 4)")
    k.add_argument("--gpus-per-node", type=count(1, 64), default=8, metavar="N", help="GPUs of a node (default 8)")
    k.add_argument("--priority", type=count(-1000000000, -1), default=-100,
                   help="PriorityClass value, negative so real work comes first (default -100)")
    k.add_argument("--profile", choices=PROFILES, default="quick", help="suite profile (default quick)")
    k.add_argument("--db-secret", default=None, metavar="NAME",
                   help="Secret whose key 'url' is the history URL (GPUACCEPT_DB in the pods)")
    k.add_argument("--time", type=time_limit, default=30, metavar="TIME", help="each pod's time limit (default 30m)")
    k.add_argument("--node-selector", action="append", type=_selector, metavar="KEY=VALUE",
                   help="only nodes with this label (repeatable)")
    k.set_defaults(handler=cmd_k8s)
    from gpuaccept.argtypes import nonneg_float, positive_float
    from gpuaccept.cliargs import add_json_option
    from gpuaccept.results.autosave import DB_HELP

    f = verbs.add_parser("flag", help="name every node whose figures fall against its own past",
                         description="Judge every series of the history (each metric of each GPU, port or node, "
                                     "as 'gpuaccept trend' does for one) and name the nodes whose newest runs "
                                     "regressed: the node that degrades after acceptance, before it fails. "
                                     "Exit 1 when one is found (--no-exit-code: 0).")
    f.add_argument("--metric", action="append", default=None, metavar="NAME",
                   help="only this metric (repeatable; default: every metric in the history)")
    f.add_argument("--since", default=None, metavar="WHEN", help="only runs since WHEN (30d, 2026-11-01)")
    f.add_argument("--max-z", type=positive_float, default=3.0, metavar="Z",
                   help="a regression is worse by more than Z robust deviations (default 3)")
    f.add_argument("--min-drop-pct", type=nonneg_float, default=5.0, metavar="PCT",
                   help="and worse by more than this %% of the earlier median (default 5)")
    f.add_argument("--db", default=None, metavar="URL", help=DB_HELP)
    add_json_option(f, "the regressions")
    f.add_argument("--exit-code", action=argparse.BooleanOptionalAction, default=True,
                   help="exit 1 when a regression is found (the default)")
    f.set_defaults(handler=cmd_flag)
