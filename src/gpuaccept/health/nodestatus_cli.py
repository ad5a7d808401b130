"""``gpuaccept node-status``: a node's health verdict as a Kubernetes node label (and taint).

Three modes:

- the verdict (the default): from ``--report PATH`` or from the suite run now with ``--profile P``;
  a dry run prints the change (label, annotations, taint) and changes nothing; ``--apply`` reads the
  node and sends the change as one JSON patch;
- ``--daemonset --image IMG``: prints the DaemonSet that runs ``node-status --apply`` on every node,
  with its ServiceAccount, minimal RBAC and an admission policy that keeps each pod to its own node;
- ``--npd-config DIR``: writes a node-problem-detector custom plugin monitor and its plugin script.

An option of one mode given without it is refused (exit 2), not ignored.

Exit codes (the CLI's map): 0 the node passed, 1 it failed a check, 2 bad usage or input (no such
node, an unreadable report, a report of another host) or the API refused or could not be reached
(the verdict is printed first, on stdout), 4 the suite could not write its report, 5 nothing was
measured (the node is left as it is), 130 interrupted (the node is left as it is). Nothing here
imports torch or, before ``--apply``, the kubernetes client.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuaccept.argtypes import count, go_duration, whole_seconds
from gpuaccept.cliargs import add_suite_options
from gpuaccept.errors import GpuacceptError, UsageError
from gpuaccept.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NOTHING_MEASURED, EXIT_OK, EXIT_USAGE
from gpuaccept.suiteplan import add_plan_option, show_plan

HELP = "label (and taint) this Kubernetes node with its health verdict"
DEFAULT_NAME = "gpuaccept-health"
NPD_PLUGIN_PATH = "/config/plugin/gpuaccept-plugin.sh"
NPD_INTERVAL = "30m"
NPD_TIMEOUT = "10m"
#: Flags that only --daemonset uses (their argparse dests): refused in the other modes rather than ignored.
DAEMONSET_DESTS = ("image", "namespace", "name", "interval", "node_selector", "toleration", "gpus_per_node",
                   "gpu_resource", "runtime_class", "image_pull_secret", "image_pull_policy", "cpus", "memory",
                   "priority_class", "run_as_user", "no_admission_policy")
#: Flags that only --npd-config uses.
NPD_DESTS = ("npd_plugin_path", "npd_interval", "npd_timeout")
DESCRIPTION = """\
Label a Kubernetes node gpuaccept.io/health=pass|fail from a report (--report) or from the suite run
now (--profile), with annotations saying when and why; with --taint a failed node is also tainted
gpuaccept.io/health=fail:NoSchedule, and a passing node loses that taint (only ours: no other label,
annotation or taint is touched). Without --apply nothing is sent: the change is printed. --daemonset
prints the manifests that do this on every node; --npd-config writes a node-problem-detector plugin.
"""


def register(sub: Any) -> None:
    p = sub.add_parser("node-status", help=HELP, description=DESCRIPTION)
    add_suite_options(p)
    v = p.add_argument_group("verdict and node")
    v.add_argument("--report", default=None, metavar="PATH",
                   help="judge this report.json, cluster-report.json or run directory instead of running the suite")
    v.add_argument("--node", default=None, metavar="NAME",
                   help="the Kubernetes node (default: $NODE_NAME, which the DaemonSet sets, else the host name)")
    v.add_argument("--any-host", action="store_true",
                   help="use a node report for --node even when the report names another host")
    v.add_argument("--taint", action="store_true",
                   help="on a failure also add the taint gpuaccept.io/health=fail:NoSchedule (a pass always "
                        "removes it)")
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
    d = p.add_argument_group("--daemonset (print the manifests, run nothing)")
    d.add_argument("--daemonset", action="store_true",
                   help="print a ServiceAccount, ClusterRole (get, patch nodes), ClusterRoleBinding, a "
                        "ValidatingAdmissionPolicy that lets that service account patch only the node its pod runs "
                        "on, and a DaemonSet that runs node-status --apply with these suite options and --taint on "
                        "every node")
    d.add_argument("--image", default=None, help="image with gpuaccept[k8s] (required with --daemonset)")
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
    n = p.add_argument_group("--npd-config (write node-problem-detector files)")
    n.add_argument("--npd-config", default=None, metavar="DIR",
                   help="write gpuaccept-monitor.json and gpuaccept-plugin.sh into DIR; the plugin runs "
                        "node-status --summary with --report or these suite options")
    n.add_argument("--npd-plugin-path", default=None, metavar="PATH",
                   help=f"where the plugin script is in NPD's container (default: {NPD_PLUGIN_PATH})")
    n.add_argument("--npd-interval", type=go_duration, default=None, metavar="DURATION",
                   help=f"invoke_interval (default: {NPD_INTERVAL})")
    n.add_argument("--npd-timeout", type=go_duration, default=None, metavar="DURATION",
                   help=f"plugin timeout (default: {NPD_TIMEOUT})")
    p.set_defaults(handler=run)


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


def _check_modes(args: argparse.Namespace) -> None:
    modes = [m for m, on in (("--daemonset", args.daemonset), ("--npd-config", args.npd_config is not None)) if on]
    if len(modes) > 1:
        raise UsageError("--daemonset and --npd-config are separate modes: give one")
    if modes:
        for dest in ("apply", "server_dry_run", "summary", "any_host", "node", "kubeconfig", "context"):
            if getattr(args, dest):
                raise UsageError(f"{_flag(dest)} is for a verdict; {modes[0]} only writes configuration")
    for dests, on, mode in ((DAEMONSET_DESTS, args.daemonset, "--daemonset"),
                            (NPD_DESTS, args.npd_config is not None, "--npd-config")):
        stray = [d for d in dests if getattr(args, d) is not None]
        if stray and not on:
            raise UsageError(f"{_flag(stray[0])} is an option of {mode}, which is not given: it would be ignored")
    if args.daemonset and args.report:
        raise UsageError("--report does not apply to --daemonset: its pods run the suite (give --profile)")
    if args.server_dry_run and not args.apply:
        raise UsageError("--server-dry-run goes with --apply")
    given = _given_suite_options(args)
    if args.report and given:
        raise UsageError(f"{_flag(given[0])} is a suite option; --report judges a report and runs nothing")
    if not args.report and args.profile is None:
        raise UsageError("give --report PATH (a report to judge) or --profile quick|standard|full (run the suite)")


def run(args: argparse.Namespace) -> int:
    if args.dry_run and args.apply:
        raise UsageError("--dry-run sends nothing, --apply sends the change: give one")
    if args.plan and (args.report or args.daemonset or args.npd_config is not None):
        raise UsageError("--plan shows the plan of the suite run with --profile; it goes without --report, "
                         "--daemonset and --npd-config")
    _check_modes(args)
    if args.plan:
        return show_plan(_gpu_suite_args(args))
    if args.daemonset:
        return _daemonset(args)
    if args.npd_config is not None:
        return _npd(args)
    return _verdict(args)


# ---- the verdict ------------------------------------------------------------------------------------------------

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


def _apply(args: argparse.Namespace, change: Any) -> list[dict[str, Any]]:
    from gpuaccept.health.nodestatus import apply_change
    from gpuaccept.launch.k8s.client import kubernetes_module, new_api_client

    k8s = kubernetes_module("node-status --apply patches the node")
    kubeconfig = os.path.abspath(os.path.expanduser(args.kubeconfig)) if args.kubeconfig else None
    api = new_api_client(k8s, kubeconfig, args.context)
    return apply_change(api, change, server_dry_run=args.server_dry_run)


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


# ---- --daemonset and --npd-config ------------------------------------------------------------------------------

def _daemonset(args: argparse.Namespace) -> int:
    from gpuaccept.health.daemonset import HealthDaemonOptions, health_manifests
    from gpuaccept.launch.k8s.manifests import to_yaml
    from gpuaccept.launch.k8s.options import parse_key_values, parse_toleration

    if not args.image:
        raise UsageError("--daemonset needs --image (an image with gpuaccept[k8s] installed)")
    if args.report_dir:
        raise UsageError("--report-dir does not apply to --daemonset: each run's report is kept in the pod's /tmp "
                         "only while it is judged")
    _validate_suite_options(args)
    inner = [*_gpu_suite_args(args), *(["--taint"] if args.taint else [])]
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


def _npd(args: argparse.Namespace) -> int:
    from gpuaccept.health.npd import CONFIG_FILE, PLUGIN_FILE, PLUGIN_SCRIPT, npd_config

    if args.taint:
        raise UsageError("--taint does not apply to --npd-config: NPD sets a node condition, it does not patch")
    if not args.report:
        _validate_suite_options(args)
    plugin_args = ["--report", args.report] if args.report else _gpu_suite_args(args)
    def pick(value: str | None, default: str) -> str:
        return value if value is not None else default

    plugin_path = pick(args.npd_plugin_path, NPD_PLUGIN_PATH)
    config = npd_config(plugin_path, plugin_args, interval=pick(args.npd_interval, NPD_INTERVAL),
                        timeout=pick(args.npd_timeout, NPD_TIMEOUT))
    out = Path(args.npd_config)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        script = out / PLUGIN_FILE
        script.write_text(PLUGIN_SCRIPT)
        script.chmod(0o755)
    except OSError as exc:
        raise UsageError(f"--npd-config {out}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {out / CONFIG_FILE} and {script} (the plugin goes to {plugin_path} in NPD's container)")
    return EXIT_OK
