"""Subcommand ``nccl-tests``: run nccl-tests binaries here, or parse a saved log or ``-J`` file.

``gpuaccept nccl-tests [TEST ...] [--min-busbw X] [--json] -- <nccl-tests args>`` runs ``<TEST>_perf``
(default all_reduce) found in ``$PATH``, ``$NCCL_TESTS_DIR`` or /workspace/nccl-tests/build with the
extra args (``-g`` added: one per GPU), prints the table and the verdict. ``gpuaccept nccl-tests parse
LOG|JSON|- [--test NAME] [--min-busbw X] [--json]`` does the same for saved output (``-``: stdin), e.g.
``mpirun -np 16 all_reduce_perf -b 8M -e 8G -f 2 -g 1 | gpuaccept nccl-tests parse -``. A log of several
runs one after another (a script looping over tests into one file) is split into its runs, each judged
as the test its ``Collective test starting`` line names (else ``--test``, one name for all or one per
run, comma-separated; else all_reduce, said so), and reported one by one; the last line is the worst
status and each run's. Without ``--min-busbw`` busbw is judged against the expectation derived from the
fabric (:mod:`gpuaccept.hw.fabric_expect`): when run here, this node's NVML; for a saved log, the GPU
model its ``# Rank`` lines name, or ``--nvml-snapshot`` (a node's NVML dump), and across nodes
``--sysfs-root`` (a node's RDMA ports; ``/`` for this node). Exit 0 pass (or a WARN), 1 a failed
judgement or run, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gpuaccept.argtypes import duration, nonneg_int, positive_float
from gpuaccept.cliargs import add_json_option
from gpuaccept.errors import InputError, UsageError
from gpuaccept.model import NOT_JUDGED, Status, not_judged_names, state_label
from gpuaccept.outputs import write_output


def _options(p: argparse.ArgumentParser, run: bool = True) -> None:
    p.add_argument("--test", default=None, metavar="NAME[,NAME...]", help="parse: the test the log is of, or one per "
                   "run of a log of several runs (default: from each run's 'Collective test starting' line, else "
                   "all_reduce)")
    p.add_argument("--min-busbw", type=positive_float, default=None, metavar="GB/S",
                   help="fail when busbw at the judged sizes is below this (GB/s)")
    p.add_argument("--judge-min-bytes", type=nonneg_int, default=0, metavar="N",
                   help="judge busbw at every size >= N bytes (default 0: only the largest size)")
    p.add_argument("--nvml-snapshot", default=None, metavar="JSON",
                   help="derive the busbw expectation from this NVML dump of a node (python -m gpuaccept.hw.nvml "
                        "--dump); run: this node's NVML")
    p.add_argument("--sysfs-root", default=None, metavar="DIR",
                   help="across nodes, derive the network expectation from the RDMA ports under DIR/sys "
                        "('/': this node; taken to stand for every node)")
    if run:
        p.add_argument("--timeout", type=duration, default=1800.0, metavar="DURATION",
                       help="per binary (90s, 30m; bare number: seconds; default 30m)")
    add_json_option(p, "the parsed run and verdict")


class _Options(argparse.ArgumentParser):
    """Re-reads the options written after the test names (argparse stops at the first positional)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"nccl-tests: {message}")


JUDGED = ("Judged: #wrong = 0, the footer OK, exit code 7 a data or bandwidth failure, and busbw at the largest "
          "size (or sizes >= --judge-min-bytes) against --min-busbw, else the expectation derived from the fabric "
          "(NVLink/PCIe from NVML or the GPU model, RDMA ports from sysfs) x 0.8.")
ACTIONS = ("run", "parse")


def register(subparsers: Any) -> None:
    top = subparsers.add_parser(
        "nccl-tests", help="run nccl-tests (all_reduce_perf ...) here, or parse a saved nccl-tests log or -J file",
        description="Run nccl-tests binaries on this node ('run', the default action), or judge a saved output "
                    "('parse'). " + JUDGED)
    actions = top.add_subparsers(dest="nccl_action", metavar="ACTION", parser_class=type(top))
    p = actions.add_parser(
        "run", help="run nccl-tests binaries here (the default: 'gpuaccept nccl-tests all_reduce' is this)",
        description="Run nccl-tests binaries on this node (TEST: all_reduce, all_gather, reduce_scatter, alltoall, "
                    "broadcast, reduce, sendrecv, gather, scatter, hypercube; extra nccl-tests arguments after '--'). "
                    + JUDGED)
    _options(p)
    p.add_argument("items", nargs=argparse.REMAINDER, metavar="TEST ... [-- ARGS]",
                   help="tests to run (default all_reduce), then '-- <nccl-tests args>'")
    p.set_defaults(handler=cmd_nccl_tests)
    q = actions.add_parser(
        "parse", help="judge a saved nccl-tests log or -J JSON file ('-': stdin)",
        description="Judge a saved nccl-tests output: a log (of one run or several, one after another) or a -J "
                    "JSON file; '-' reads stdin. " + JUDGED)
    _options(q, run=False)
    q.set_defaults(timeout=1800.0)
    q.add_argument("file", metavar="LOG|JSON|-", help="the saved output ('-': stdin)")
    q.set_defaults(handler=cmd_nccl_parse)


def default_action(argv: list[str]) -> list[str]:
    """``nccl-tests [TEST ...]`` as ``nccl-tests run [TEST ...]`` (the action before ``run`` existed), unless
    an action or ``--help`` follows."""
    if argv[:1] == ["nccl-tests"] and not (set(argv[1:2]) & {*ACTIONS, "-h", "--help"}):
        return ["nccl-tests", "run", *argv[1:]]
    return argv


def cmd_nccl_parse(args: argparse.Namespace) -> int:
    """``nccl-tests parse FILE``."""
    args.items = ["parse", args.file]
    return cmd_nccl_tests(args)


def _split(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Positional items and the nccl-tests arguments after '--'; options among the items update ``args``."""
    items = list(args.items)
    extra: list[str] = []
    if "--" in items:
        k = items.index("--")
        items, extra = items[:k], items[k + 1:]
    mini = _Options(prog="gpuaccept nccl-tests", add_help=False)
    _options(mini)
    mini.add_argument("rest", nargs="*")
    given = mini.parse_args(items)
    for key in ("test", "min_busbw", "timeout", "nvml_snapshot", "sysfs_root"):
        if getattr(given, key) is not None and getattr(given, key) != mini.get_default(key):
            setattr(args, key, getattr(given, key))
    args.judge_min_bytes = given.judge_min_bytes or args.judge_min_bytes
    args.json = given.json or args.json
    return list(given.rest), extra


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    from gpuaccept.inputs import read_bytes

    return read_bytes(path, "nccl-tests log or JSON file").decode("utf-8", errors="replace")


def _table(result: Any) -> list[str]:
    lines = [f"{'size (B)':>12} {'type':>8} {'redop':>6} {'root':>4}  {'oop busbw':>9} {'oop wrong':>9}"
             f"  {'ip busbw':>9} {'ip wrong':>9}"]

    def cells(m: Any) -> str:
        if m is None:
            return f"{'-':>9} {'-':>9}"
        wrong = "N/A" if m.wrong is None else f"{m.wrong:g}"
        return f"{m.busbw_gbs:>9.2f} {wrong:>9}"

    for r in result.rows:
        root = "" if r.root is None else str(r.root)
        lines.append(f"{r.size_bytes:>12} {r.type:>8} {r.redop or '':>6} {root:>4}  {cells(r.out_of_place)}"
                     f"  {cells(r.in_place)}")
    f = result.footer
    if f is not None:
        lines.append(f"out of bounds: {f.out_of_bounds} ({'OK' if f.out_of_bounds_ok else 'FAILED'}); "
                     f"avg busbw: {'-' if f.avg_busbw_gbs is None else format(f.avg_busbw_gbs, 'g')} GB/s")
    return lines


def _report(result: Any, judgement: Any, args: argparse.Namespace, run: Any = None) -> int:
    """Print the judged run (a table and a status line, or JSON); a pass whose busbw found no expectation is
    ``NOT JUDGED`` (exit 0: nothing failed). The exit code: 1 for a fail or error, else 0."""
    unjudged = not_judged_names(judgement.metrics)
    if args.json:
        doc = {"status": judgement.status.value, "reason": judgement.reason, **result.to_dict(),
               "metrics": [m.to_dict() for m in judgement.metrics]}
        if unjudged:
            doc["not_judged"] = unjudged
        if run is not None:
            doc["argv"], doc["returncode"] = run.argv, run.returncode
        write_output(args.json, json.dumps(doc, indent=2) + "\n", "--json")
    if args.json != "-":
        if result.devices:
            print(f"devices: {len(result.devices)} ranks on {', '.join(result.hosts)}")
        print("\n".join(_table(result)))
        shown = NOT_JUDGED if judgement.status is Status.PASS and unjudged else judgement.status.value
        print(f"{state_label(shown)}: {judgement.reason}")
    return 0 if judgement.status in (Status.PASS, Status.WARN, Status.SKIP) else 1


def _recorded_facts(args: argparse.Namespace) -> Any:
    """:class:`~gpuaccept.nccltests.busbw.FabricFacts` from ``--nvml-snapshot`` and ``--sysfs-root``."""
    from gpuaccept.hw.fabric_expect import node_nics
    from gpuaccept.hw.nvml import snapshot_from_dict
    from gpuaccept.nccltests.busbw import FabricFacts

    snap = None
    if args.nvml_snapshot:
        try:
            snap = snapshot_from_dict(json.loads(_read(args.nvml_snapshot)))
        except ValueError as exc:
            raise InputError(f"--nvml-snapshot {args.nvml_snapshot}: not an NVML dump ({exc})") from exc
    nics = None
    if args.sysfs_root:
        from gpuaccept.hw.rdma import read_inventory

        nics = node_nics(read_inventory(args.sysfs_root).ports)
    return FabricFacts(snap, nics)


def _test_named(result: Any) -> str | None:
    """The test the run's 'Collective test starting' line names, if it names a known one."""
    from gpuaccept.nccltests.judge import canonical_test

    try:
        return canonical_test(result.program) if result.program else None
    except UsageError:
        return None


def _tests_for(results: list[Any], given: str | None) -> list[tuple[str, str]]:
    """(test, how it was chosen) for each run: ``--test`` (one name for all, or one per run), else the run's
    'Collective test starting' line, else all_reduce, assumed."""
    from gpuaccept.nccltests.judge import canonical_test

    if given:
        names = [canonical_test(n.strip()) for n in given.split(",")]
        if len(names) not in (1, len(results)):
            raise UsageError(f"--test names {len(names)} tests for a log of {len(results)} runs; name one, or one "
                             "per run")
        return [(names[0] if len(names) == 1 else names[k], "given by --test") for k in range(len(results))]
    out = []
    for result in results:
        named = _test_named(result)
        out.append((named, "named by the log") if named else ("all_reduce", "assumed: the run does not name its test"))
    return out


def _report_runs(judged: list[tuple[Any, str, str, Any]], args: argparse.Namespace) -> int:
    """Each run of a log of several, then the worst status and each run's; 0 when none failed, else 1."""
    from gpuaccept.model import worst

    status = worst(*(j.status for _r, _t, _h, j in judged))
    summary = f"{len(judged)} runs: " + ", ".join(f"{k} {t} {j.status.value.upper()}"
                                                   for k, (_r, t, _h, j) in enumerate(judged, 1))
    if args.json:
        runs = [{"run": k, "test": t, "test_from": h, "status": j.status.value, "reason": j.reason, **r.to_dict(),
                 "metrics": [m.to_dict() for m in j.metrics]} for k, (r, t, h, j) in enumerate(judged, 1)]
        doc = {"status": status.value, "reason": summary, "runs": runs}
        write_output(args.json, json.dumps(doc, indent=2) + "\n", "--json")
    if args.json != "-":
        for k, (result, test, how, j) in enumerate(judged, 1):
            where = f", {len(result.devices)} ranks on {', '.join(result.hosts)}" if result.devices else ""
            print(f"run {k} of {len(judged)}: {test} ({how}){where}")
            print("\n".join(_table(result)))
            print(f"{j.status.value.upper()}: {j.reason}\n")
        print(f"{status.value.upper()}: {summary}")
    return 0 if status in (Status.PASS, Status.WARN, Status.SKIP) else 1


def cmd_nccl_tests(args: argparse.Namespace) -> int:
    from gpuaccept.nccltests.busbw import live_facts, result_fabric
    from gpuaccept.nccltests.judge import OP_NAMES, canonical_test, find_binary, judge, places_looked, run_binary
    from gpuaccept.nccltests.parse import parse_runs, parse_text

    items, extra = _split(args)
    if items[:1] == ["parse"]:
        if len(items) != 2 or extra:
            raise UsageError("usage: gpuaccept nccl-tests parse LOG|JSON|- (one file)")
        results = parse_runs(_read(items[1]))
        tests = _tests_for(results, args.test)
        facts = _recorded_facts(args)
        judged = []
        for result, (test, how) in zip(results, tests, strict=True):
            fabric, _why = result_fabric(result, OP_NAMES.get(test, test), facts)
            j = judge(result, test, min_busbw_gbs=args.min_busbw, judge_min_bytes=args.judge_min_bytes,
                      source="--min-busbw", fabric=fabric)
            judged.append((result, test, how, j))
        if len(judged) == 1:
            return _report(judged[0][0], judged[0][3], args)
        return _report_runs(judged, args)
    if args.test is not None:
        raise UsageError("--test is for 'parse'; name the tests to run as arguments")
    to_run = [canonical_test(n) for n in items] or ["all_reduce"]
    if len(to_run) > 1 and args.json not in (None, "-"):
        raise UsageError(f"--json {args.json} with {len(to_run)} tests: run one test per file, or --json for stdout")
    if len(to_run) > 1 and args.json not in (None, "-"):
        raise UsageError(f"--json {args.json} with {len(to_run)} tests: run one test per file, or --json for stdout")
    from gpuaccept.checks.nccl_tests import gpu_args

    env = dict(os.environ)
    paths = {t: find_binary(t, env) for t in to_run}
    missing = [f"{t}_perf" for t, path in paths.items() if path is None]
    if missing:
        print(f"gpuaccept: nccl-tests not found: no {', '.join(missing)} in {places_looked(env)}", file=sys.stderr)
        return 2
    argv, env = gpu_args(extra, None, env)
    code = 0
    facts = None
    for test, path in paths.items():
        assert path is not None
        run = run_binary(path, argv, args.timeout, env)
        try:
            result = parse_text(run.stdout)
        except InputError as exc:
            tail = run.stderr.strip().splitlines()[-1:] or ["no stderr"]
            how = (f"was killed at the timeout ({args.timeout:g} s), its process group with it"
                   if run.returncode is None else f"exited {run.returncode}")
            print(f"gpuaccept: {test}_perf {how}: {exc}; stderr: {tail[0]}", file=sys.stderr)
            code = 1
            continue
        if facts is None:
            facts = _recorded_facts(args) if args.nvml_snapshot else live_facts(env.get("CUDA_VISIBLE_DEVICES"),
                                                                                  args.sysfs_root)
        fabric, _why = result_fabric(result, OP_NAMES.get(test, test), facts)
        j = judge(result, test, min_busbw_gbs=args.min_busbw, judge_min_bytes=args.judge_min_bytes,
                  returncode=run.returncode, source="--min-busbw", fabric=fabric)
        code = max(code, _report(result, j, args, run))
    return code
