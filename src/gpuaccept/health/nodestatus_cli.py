"""``gpuaccept node-status``: a node's health verdict as a Kubernetes node label (and taint).

Three actions, each its own command with its own options:

- ``label``: the verdict, from ``--report PATH`` or from the suite run now with ``--profile P``; a dry run
  (the default) prints the change (label, annotations, taint) and changes nothing; ``--apply`` reads the node and
  sends the change as one JSON patch;
- ``daemonset --image IMG``: prints the DaemonSet that runs ``node-status label --apply`` on every node, with its
  ServiceAccount, minimal RBAC and an admission policy that keeps each pod to its own node;
- ``npd DIR``: writes a node-problem-detector custom plugin monitor and its plugin script.

The forms before these actions (``node-status --report R``, ``--daemonset``, ``--npd-config DIR``) still parse for
one release (:func:`gpuaccept.health.nodestatus_legacy.legacy_form`), with a deprecation line on stderr.

Exit codes (the CLI's map): 0 the node passed, 1 it failed a check, 2 bad usage or input (no such
node, an unreadable report, a report of another host) or the API refused or could not be reached
(the verdict is printed first, on stdout), 4 the suite could not write its report, 5 nothing was
measured (the node is left as it is), 130 interrupted (the node is left as it is). Nothing here
imports torch or, before ``label --apply``, the kubernetes client.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuaccept.argtypes import count, duration, go_duration, nonneg_int, whole_seconds
from gpuaccept.cliargs import add_suite_options
from gpuaccept.errors import GpuacceptError, UsageError
from gpuaccept.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NOTHING_MEASURED, EXIT_OK, EXIT_USAGE
from gpuaccept.health.nodestatus_legacy import ACTIONS
from gpuaccept.suiteplan import add_plan_option, show_plan

HELP = "label (and taint) Kubernetes nodes with their health verdict: label, daemonset, npd"
DEFAULT_NAME = "gpuaccept-health"
NPD_PLUGIN_PATH = "/config/plugin/gpuaccept-plugin.sh"
NPD_INTERVAL = "30m"
NPD_TIMEOUT = "10m"
DESCRIPTION = """\
A GPU node's health as a Kubernetes node label gpuaccept.io/health=pass|fail (and, with --taint, the taint
gpuaccept.io/health=fail:NoSchedule). 'label' judges this node (a report, or the suite run now) and patches it;
'daemonset' prints the manifests that run 'label --apply' on every node; 'npd' writes a node-problem-detector
plugin that reports the verdict as a node condition.
"""
LABEL_DESCRIPTION = """\
Label a Kubernetes node gpuaccept.io/health=pass|fail from a report (--report) or from the suite run
now (--profile), with annotations saying when and why; with --taint a failed node is also tainted
gpuaccept.io/health=fail:NoSchedule, and a passing node loses that taint (only ours: no other label,
annotation or taint is touched). Without --apply nothing is sent: the change is printed.
"""
DAEMONSET_DESCRIPTION = """\
Print (run nothing) a ServiceAccount, a ClusterRole (get, patch nodes), its ClusterRoleBinding, a
ValidatingAdmissionPolicy that lets that service account patch only the node its pod runs on, and a DaemonSet
whose pods run 'gpuaccept node-status label --apply' with these suite options (and --taint) every --interval.
Pipe it to 'kubectl apply -f -'.
"""
NPD_DESCRIPTION = """\
Write gpuaccept-monitor.json (a node-problem-detector custom plugin monitor) and gpuaccept-plugin.sh (the plugin,
which runs 'gpuaccept node-status label --summary' with --report or these suite options) into DIR.
"""


def register(sub: Any) -> None:
    p = sub.add_parser("node-status", help=HELP, description=DESCRIPTION)
    actions = p.add_subparsers(dest="node_status_action", metavar="ACTION", parser_class=type(p))
    p.set_defaults(handler=lambda args: _missing_action(p))
    _label_parser(actions.add_parser("label", help="judge this node and label it (a dry run unless --apply)",
                                     description=LABEL_DESCRIPTION))
    _daemonset_parser(actions.add_parser("daemonset", help="print the DaemonSet (and RBAC) that labels every node",
                                         description=DAEMONSET_DESCRIPTION))
    _npd_parser(actions.add_parser("npd", help="write a node-problem-detector plugin that reports the verdict",
                                   description=NPD_DESCRIPTION))


def _missing_action(parser: argparse.ArgumentParser) -> int:
    raise UsageError(f"{parser.prog} needs an action: {', '.join(ACTIONS)} (see '{parser.prog} --help')")


def _label_parser(p: argparse.ArgumentParser) -> None:
    add_suite_options(p)
    v = p.add_argument_group("verdict and node")
    v.add_argument("--report", default=None, metavar="PATH",
                   help="judge this report.json, cluster-report.json or run directory instead of running the suite")
    v.add_argument("--node", default=None, metavar="NAME",
                   help="the Kubernetes node (default: $NODE_NAME, which the DaemonSet sets, else the host name)")
    v.add_argument("--any-host", action="store_true",
                   help="use a node report for --node even when the report names another host")
    _taint_option(v)
    v.add_argument("--apply", action="store_true", help="send the change (default: print it and send nothing)")
    v.add_argument("--dry-run", action="store_true", help="print the change and send nothing (the default)")
    add_plan_option(v, " (with --profile; the verdict is not made)")
    v.add_argument("--server-dry-run", action="store_true",
                   help="with --apply: the API server checks the patch (RBAC included) and stores nothing")
    v.add_argument("--kubeconfig", default=None, metavar="FILE",
                   help="kubeconfig (default: the pod's service account in a pod, else $KUBECONFIG or ~/.kube/config)")
    v.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    v.add_argument("--summary", action="store_true",
                   help="print one line (the verdict and why) instead of the JSON document")
    b = p.add_argument_group("circuit breaker (with --apply --taint)")
    b.add_argument("--breaker", choices=("reset",), default=None,
                   help="reset: a person's reset of the breaker: acknowledge the nodes gpuaccept tainted in the "
                        "window (they stay tainted), then exit")
    _breaker_options(b)
    p.set_defaults(handler=run_label)


def _breaker_options(g: Any) -> None:
    g.add_argument("--breaker-limit", type=nonneg_int, default=0, metavar="N",
                   help="do not taint when N nodes stand tainted by gpuaccept within --breaker-window (the "
                        "cluster's Node objects); 0: no limit (default)")
    g.add_argument("--breaker-percent", type=float, default=0.0, metavar="P",
                   help="as --breaker-limit, as a percentage of the cluster's nodes (at least one node); 0: none")
    g.add_argument("--breaker-window", type=duration, default=3600.0, metavar="DURATION",
                   help="the breaker's sliding window (default 1h)")


def _breaker_args(args: argparse.Namespace) -> list[str]:
    """The breaker flags as given, for the DaemonSet's pods."""
    if not (args.breaker_limit or args.breaker_percent):
        return []
    return [f"--breaker-limit={args.breaker_limit}", f"--breaker-percent={args.breaker_percent:g}",
            f"--breaker-window={args.breaker_window:g}s"]


def _taint_option(g: Any) -> None:
    g.add_argument("--taint", action="store_true",
                   help="on a failure also add the taint gpuaccept.io/health=fail:NoSchedule (a pass always "
                        "removes it)")


def _daemonset_parser(p: argparse.ArgumentParser) -> None:
    add_suite_options(p)
    add_plan_option(p, " (of the suite the pods run, planned on this machine; nothing is printed)")
    d = p.add_argument_group("the manifests")
    d.add_argument("--image", required=True, help="image with gpuaccept[k8s] installed")
    # not an option here, but named so that argparse does not take it for an abbreviation of --report-dir
    d.add_argument("--report", default=None, help=argparse.SUPPRESS)
    _taint_option(d)
    _breaker_options(d)
    d.add_argument("--namespace", default=None, help=f"default: {DEFAULT_NAME}")
    d.add_argument("--name", default=None, help=f"name of the objects (default: {DEFAULT_NAME})")
    d.add_argument("--interval", type=whole_seconds, default=None, metavar="DURATION",
                   help="time between runs (90s, 10m, 1h; bare number: seconds; default: 10m)")
    d.add_argument("--node-selector", action="append", default=None, metavar="KEY=VALUE",
                   help="run only on nodes with this label (repeatable)")
    d.add_argument("--toleration", action="append", default=None, metavar="KEY[=VALUE][:EFFECT]",
                   help="tolerate a taint (repeatable; the pod always tolerates gpuaccept.io/health)")
    d.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs to request from the device plugin (default: 0, none allocated: every GPU through "
                        "NVIDIA_VISIBLE_DEVICES=all and the NVIDIA runtime)")
    d.add_argument("--gpu-resource", default=None, metavar="NAME", help="default: nvidia.com/gpu")
    d.add_argument("--runtime-class", default=None, metavar="NAME", help="runtimeClassName, e.g. nvidia")
    d.add_argument("--image-pull-secret", action="append", default=None, metavar="NAME")
    d.add_argument("--image-pull-policy", choices=("Always", "IfNotPresent", "Never"), default=None)
    d.add_argument("--cpus", default=None, metavar="QTY", help="CPU request of the pod")
    d.add_argument("--memory", default=None, metavar="QTY", help="memory request and limit of the pod")
    d.add_argument("--priority-class", default=None, metavar="NAME")
    d.add_argument("--run-as-user", type=count(0, 2**32 - 2), default=None, metavar="UID",
                   help="user id of the container (runAsNonRoot unless 0; default: the image's)")
    d.add_argument("--no-admission-policy", action="store_true", default=None,
                   help="leave out the ValidatingAdmissionPolicy and its binding (clusters before Kubernetes 1.30, "
                        "which have neither admissionregistration.k8s.io/v1 policies nor the node name in pod "
                        "tokens); the service account may then patch any node")
    p.set_defaults(handler=run_daemonset)


def _npd_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="where gpuaccept-monitor.json and gpuaccept-plugin.sh are written")
    add_suite_options(p)
    add_plan_option(p, " (of the suite the plugin runs, planned on this machine; nothing is written)")
    n = p.add_argument_group("the plugin")
    n.add_argument("--report", default=None, metavar="PATH",
                   help="the plugin judges this report (a path on the node) instead of running the suite")
    n.add_argument("--plugin-path", default=None, metavar="PATH",
                   help=f"where the plugin script is in NPD's container (default: {NPD_PLUGIN_PATH})")
    n.add_argument("--invoke-interval", type=go_duration, default=None, metavar="DURATION",
                   help=f"the monitor's invoke_interval (default: {NPD_INTERVAL})")
    n.add_argument("--timeout", type=go_duration, default=None, metavar="DURATION",
                   help=f"the plugin's timeout (default: {NPD_TIMEOUT})")
    p.set_defaults(handler=run_npd)


# ---- label ------------------------------------------------------------------------------------------------------

def _suite_args(args: argparse.Namespace) -> list[str]:
    from gpuaccept.launch.cli import suite_args

    return suite_args(args)


def _gpu_suite_args(args: argparse.Namespace) -> list[str]:
    """The suite options of a node that runs unattended: ``--require-gpu`` added unless ``--device cpu``, so a pod
    that sees no GPU (a runtime that hides them) fails instead of passing on the CPU."""
    out = _suite_args(args)
    if not args.require_gpu and args.device != "cpu":
        out.append("--require-gpu")
    return out


def _given_suite_options(args: argparse.Namespace) -> list[str]:
    from gpuaccept.launch.cli import _suite_given

    return [*_suite_given(args), *(["report_dir"] if args.report_dir else [])]


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _report_or_suite(args: argparse.Namespace) -> None:
    """``--report`` (judge a report, run nothing) or ``--profile`` (run the suite): exactly one."""
    given = _given_suite_options(args)
    if args.report and given:
        raise UsageError(f"{_flag(given[0])} is a suite option; --report judges a report and runs nothing")
    if not args.report and args.profile is None:
        raise UsageError("give --report PATH (a report to judge) or --profile quick|standard|full (run the suite)")


def run_label(args: argparse.Namespace) -> int:
    """``node-status label``."""
    if args.dry_run and args.apply:
        raise UsageError("--dry-run sends nothing, --apply sends the change: give one")
    if args.plan and args.report:
        raise UsageError("--plan shows the plan of the suite run with --profile; it goes without --report")
    if args.server_dry_run and not args.apply:
        raise UsageError("--server-dry-run goes with --apply")
    _check_breaker(args)
    if args.breaker == "reset":
        return _breaker_reset(args)
    _report_or_suite(args)
    if args.plan:
        return show_plan(_gpu_suite_args(args))
    return _verdict(args)


def _verdict(args: argparse.Namespace) -> int:
    from gpuaccept.health.nodepatch import NoVerdict, node_report_for, verdict_from_report
    from gpuaccept.health.nodestatus import SuiteInterrupted, node_name, read_report, run_suite, utc_now
    from gpuaccept.model import Verdict

    node = node_name(args.node, os.environ)
    try:
        if args.report:
            report = node_report_for(read_report(args.report), node, any_host=args.any_host)
        else:
            done = run_suite(_suite_args(args), node, Path(args.report_dir) if args.report_dir else None)
            if done.report is None:
                raise UsageError(f"the suite run (exit {done.returncode}) left no report in {done.run_dir}; "
                                 "nothing was decided")
            report = done.report
        verdict = verdict_from_report(report, node, utc_now())
    except SuiteInterrupted as exc:
        _say(args, f"unknown: {exc}")
        return EXIT_INTERRUPTED
    except NoVerdict as exc:
        _say(args, f"unknown: node {node}: {exc}")
        return EXIT_NOTHING_MEASURED if exc.verdict is Verdict.NOTHING_MEASURED else EXIT_USAGE
    return _act(args, verdict)


def _say(args: argparse.Namespace, line: str) -> None:
    """A line for the operator: stdout with --summary (NPD reads it), else stderr."""
    print(line if args.summary else f"[HEALTH] {line}", file=sys.stdout if args.summary else sys.stderr, flush=True)


def _act(args: argparse.Namespace, verdict: Any) -> int:
    from gpuaccept.health.nodepatch import desired_change, kubectl_equivalent, merge_patch
    change = desired_change(verdict, taint=args.taint)
    code = EXIT_OK if verdict.health == "pass" else EXIT_FAILED
    doc: dict[str, Any] = {"verdict": verdict.to_dict(), "change": change.to_dict(), "applied": False}
    line = f"node {verdict.node}: {verdict.health}: {verdict.reason}" + "".join(f"; {n}" for n in change.notes)
    if not args.apply:
        doc["merge_patch"] = merge_patch(change)
        doc["kubectl"] = [" ".join(_quote(a) for a in cmd) for cmd in kubectl_equivalent(change)]
        _emit(args, doc, line + " (dry run: nothing sent; --apply sends it)")
        return code
    try:
        ops = _apply(args, change)
    except GpuacceptError as exc:  # the verdict is not lost: printed first, then the one-line error (exit 2)
        doc["error"] = str(exc)
        _emit(args, doc, line + f" (not applied: {exc})", log=False)
        raise
    doc.update(applied=not args.server_dry_run, server_dry_run=args.server_dry_run, patch=ops)
    suffix = " (server dry run: checked, not stored)" if args.server_dry_run else " (applied)"
    _emit(args, doc, line + suffix)
    return code


def _api(args: argparse.Namespace) -> Any:
    from gpuaccept.launch.k8s.client import kubernetes_module, new_api_client

    k8s = kubernetes_module("node-status label --apply patches the node")
    kubeconfig = os.path.abspath(os.path.expanduser(args.kubeconfig)) if args.kubeconfig else None
    return new_api_client(k8s, kubeconfig, args.context)


def _apply(args: argparse.Namespace, change: Any) -> list[dict[str, Any]]:
    from gpuaccept.health.nodestatus import apply_change

    api = _api(args)
    return apply_change(api, _gate(args, api, change), server_dry_run=args.server_dry_run)


def _check_breaker(args: argparse.Namespace) -> None:
    from gpuaccept.health.breaker import check_breaker

    args.breaker_conf = check_breaker(args.breaker_limit, args.breaker_percent, args.breaker_window)


def _gate(args: argparse.Namespace, api: Any, change: Any) -> Any:
    """``change`` as the circuit breaker lets it be: a taint held back past the limit (or when the taints cannot
    be counted) is not added; the node gets ``gpuaccept.io/breaker-held`` saying why, and the output says what
    would have been done."""
    from dataclasses import replace
    from datetime import datetime, timezone

    from gpuaccept.health.breaker_k8s import HELD_ANNOTATION, decide
    from gpuaccept.health.nodepatch import TAINT
    from gpuaccept.health.nodestatus import list_nodes

    if change.taint != "add" or not args.breaker_conf.enabled:
        return change
    try:
        verdict = decide(args.breaker_conf, list_nodes(api), datetime.now(timezone.utc), change.node)
        hold, why = verdict.hold, verdict.why
    except GpuacceptError as exc:
        hold, why = True, f"circuit breaker: cannot count gpuaccept's taints ({exc}); not tainting"
    if not hold:
        return change
    taint = f"{TAINT['key']}={TAINT['value']}:{TAINT['effect']}"
    print(f"[HEALTH] {why}; would have tainted {change.node} {taint}", file=sys.stderr, flush=True)
    return replace(change, taint="keep", annotations={**change.annotations, HELD_ANNOTATION: why[:1024]},
                   notes=[*change.notes, f"not tainted: {why}"])


def _breaker_reset(args: argparse.Namespace) -> int:
    """``--breaker reset``: acknowledge every node gpuaccept tainted within the window (they stay tainted)."""
    from datetime import datetime, timezone

    from gpuaccept.health.breaker_k8s import ack_patch, counted
    from gpuaccept.health.nodestatus import list_nodes, patch_ops

    api = _api(args)
    mine = counted(list_nodes(api), datetime.now(timezone.utc), args.breaker_window)
    for t in mine:
        patch_ops(api, t.node, ack_patch(t))
    names = ", ".join(t.node for t in mine) or "none"
    print(f"[HEALTH] circuit breaker reset: {len(mine)} node(s) acknowledged ({names}); they stay tainted until "
          "they pass", file=sys.stderr, flush=True)
    return EXIT_OK


def _emit(args: argparse.Namespace, doc: dict[str, Any], line: str, log: bool = True) -> None:
    """The JSON document (or with --summary the line) on stdout; the line also on stderr unless ``log`` is
    False (an error follows, which must stay the one line there)."""
    if args.summary:
        print(line, flush=True)
        return
    print(json.dumps(doc, indent=2), flush=True)
    if log:
        print(f"[HEALTH] {line}", file=sys.stderr, flush=True)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


# ---- daemonset and npd ------------------------------------------------------------------------------------------

def run_daemonset(args: argparse.Namespace) -> int:
    """``node-status daemonset``: the manifests on stdout (or with ``--plan`` the suite's plan)."""
    from gpuaccept.health.daemonset import HealthDaemonOptions, health_manifests
    from gpuaccept.launch.k8s.manifests import to_yaml
    from gpuaccept.launch.k8s.options import parse_key_values, parse_toleration

    if args.report is not None:
        raise UsageError("--report does not apply to daemonset: its pods run the suite (give --profile)")
    if args.profile is None:
        raise UsageError("give --profile quick|standard|full: the suite the pods run")
    if args.report_dir:
        raise UsageError("--report-dir does not apply to daemonset: each run's report is kept in the pod's /tmp "
                         "only while it is judged")
    if args.plan:
        return show_plan(_gpu_suite_args(args))
    _validate_suite_options(args)
    inner = [*_gpu_suite_args(args), *(["--taint"] if args.taint else []), *_breaker_args(args)]
    given = {field: value for field, value in (
        ("name", args.name), ("namespace", args.namespace), ("interval_s", args.interval),
        ("gpus", args.gpus_per_node), ("gpu_resource", args.gpu_resource)) if value is not None}
    opts = HealthDaemonOptions(
        image=args.image, node_status_args=inner, **given,
        node_selector=parse_key_values(args.node_selector or [], "--node-selector"),
        tolerations=[parse_toleration(t) for t in args.toleration or []], runtime_class=args.runtime_class,
        image_pull_secrets=list(args.image_pull_secret or []), image_pull_policy=args.image_pull_policy,
        cpu=args.cpus, memory=args.memory, priority_class=args.priority_class, run_as_user=args.run_as_user,
        admission_policy=not args.no_admission_policy)
    sys.stdout.write(to_yaml(health_manifests(opts)))
    return EXIT_OK


def _validate_suite_options(args: argparse.Namespace) -> None:
    """The suite options as ``gpuaccept run`` will judge them on the node, judged here before a plan that
    carries them is printed or written (an unknown check, bad --gpus or --budget: exit 2 now, not in every pod)."""
    from gpuaccept.launch.cli import _validate_suite

    _validate_suite(args)
    if getattr(args, "budget", None) is not None:  # what `run --budget` refuses on the node: a window nothing fits
        from gpuaccept.checks import registry
        from gpuaccept.node.run import RunRequest, fit_budget, merge_options
        from gpuaccept.node.suite import plan_suite

        opts, cfg, _ = merge_options(RunRequest.from_namespace(args))
        reg = registry()
        plan = plan_suite(opts, cfg, reg, "cpu" if opts.device == "cpu" else "cuda")
        fit_budget(plan, cfg, reg, opts.timeout_scale, args.budget, getattr(args, "gpus_per_node", None) or 0, None,
                "the pods plan on their nodes")


def run_npd(args: argparse.Namespace) -> int:
    """``node-status npd DIR``: the monitor and the plugin script in DIR (or with ``--plan`` the suite's plan)."""
    from gpuaccept.health.npd import CONFIG_FILE, PLUGIN_FILE, PLUGIN_SCRIPT, npd_config

    if args.plan and args.report:
        raise UsageError("--plan shows the plan of the suite run with --profile; it goes without --report")
    _report_or_suite(args)
    if args.plan:
        return show_plan(_gpu_suite_args(args))
    if not args.report:
        _validate_suite_options(args)
    plugin_args = ["--report", args.report] if args.report else _gpu_suite_args(args)

    def pick(value: str | None, default: str) -> str:
        return value if value is not None else default

    plugin_path = pick(args.plugin_path, NPD_PLUGIN_PATH)
    config = npd_config(plugin_path, plugin_args, interval=pick(args.invoke_interval, NPD_INTERVAL),
                        timeout=pick(args.timeout, NPD_TIMEOUT))
    out = Path(args.dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        script = out / PLUGIN_FILE
        script.write_text(PLUGIN_SCRIPT)
        script.chmod(0o755)
    except OSError as exc:
        raise UsageError(f"node-status npd {out}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {out / CONFIG_FILE} and {script} (the plugin goes to {plugin_path} in NPD's container)")
    return EXIT_OK
