"""``gpuaccept analyze``: outlier GPUs and nodes in reports, on the command line.

``gpuaccept analyze PATH...`` reads cluster reports, node reports or
directories of them (as ``baseline create --from``), runs
:func:`gpuaccept.results.analysis.analyze` over all of them together and
prints what was compared (SKU/metric groups left out, and why: fewer than
``--min-nodes`` nodes, fewer than ``--min-siblings`` GPUs in a node) and the
outliers, worst first. ``--json`` prints the analysis dict (the
shape of ``ClusterReport.analysis``); ``--output`` writes it to a file.

Exit codes: 0 done, 1 outliers found and ``--exit-code`` given, 2 bad input. With
``--exit-code``, a run that compared nothing (every SKU/metric group too small: fewer than
``--min-nodes`` nodes and ``--min-siblings`` GPUs) is also 1, with one line on stderr saying so and why: the
question "is there an outlier?" got no answer, which must not read as "no".
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuaccept.argtypes import int_at_least
from gpuaccept.argtypes import nonneg_int as _nonneg_int
from gpuaccept.argtypes import positive_float as _positive_float
from gpuaccept.cliargs import add_json_option, hidden_alias

_at_least_3 = int_at_least(3)


def format_outlier(o: dict[str, Any]) -> str:
    """One line: ``node017 cuda:3 [GPU-...] compute/gemm_bf16_tflops 574.7 TFLOP/s vs 699.3 median (-17.8%, z -12.0,
    node)`` (the hardware's id where the report names it)."""
    where = f"{o['host']} {o['device'] or '(node)'}"
    tags = ",".join(f"{k}={v}" for k, v in o["tags"].items() if k not in ("dtype",))
    frac = o.get("deviation_fraction")
    pct = f"{100 * frac:+.1f}%, " if isinstance(frac, (int, float)) else ""
    against = {"node": "sibling median", "cluster": "fleet median"}.get(o["scope"], "median")
    if o["scope"] == "cluster" and o["device"] is None:
        against = f"median of nodes (over {o.get('gpus', '?')} GPUs)"
    hw = f" [{o['hw_id']}]" if o.get("hw_id") and o.get("hw_kind") != "node" else ""
    return (f"{where}{hw} {o['check']}/{o['metric']}{'[' + tags + ']' if tags else ''} {o['value']:.4g} {o['unit']} "
            f"vs {o['median']:.4g} {against} ({pct}z {o['z']:+.1f}, {o['direction']}, {o['sku']})")


def cmd_analyze(args: argparse.Namespace) -> int:
    from gpuaccept.errors import InputError
    from gpuaccept.results.analysis import OutlierPolicy, analyze_samples
    from gpuaccept.results.baseline_cli import read_report_files, write_output
    from gpuaccept.results.columns import tables_of
    from gpuaccept.results.conformance_fleet import configs_of_reports, drift_lines, drift_summary, fleet_drift
    from gpuaccept.results.coverage import coverage_line, outlier_line
    from gpuaccept.results.heap import keep_freed_memory
    from gpuaccept.results.samples import collect

    keep_freed_memory()  # the analysis frees and allocates big arrays again and again
    policy = OutlierPolicy(max_z=args.max_z, min_siblings=args.min_siblings, min_nodes=args.min_nodes)
    table = tables_of(args.paths)  # cluster reports with their metrics table beside them: no report re-read
    if table is not None:
        samples, configs = table
    else:
        items = read_report_files(args.paths)
        if not items:
            raise InputError(f"no gpuaccept reports found in {', '.join(args.paths)}")
        samples, configs = collect(items), configs_of_reports(items)
    result = analyze_samples(samples, policy)
    drift = fleet_drift(configs)
    if drift["groups"]:  # the configuration first: a drifted node explains the outliers it causes
        result = {"conformance": drift, **result}
    text = json.dumps(result, indent=2) + "\n"
    if args.output:
        write_output(args.output, text)
    if args.json:
        write_output(args.json, text, "--json")
    if args.json != "-":
        outliers = result["outliers"]
        if drift["groups"]:
            print(drift_summary(drift))
            for line in drift_lines(drift):
                print("  " + line)
        print(f"{result['nodes']} node report(s), {result['samples']} value(s); {coverage_line(result)}")
        print(outlier_line(result, len(outliers), policy.max_z))
        for o in outliers[: args.limit or None]:
            print("  " + format_outlier(o))
        if args.limit and len(outliers) > args.limit:
            print(f"  ... and {len(outliers) - args.limit} more (--limit 0 for all, --json for everything)")
    if not args.exit_code:
        return 0
    if result["outliers"]:
        return 1
    unanswered = nothing_compared(result)
    if unanswered:
        print(f"gpuaccept analyze: --exit-code: {unanswered}", file=sys.stderr)
        return 1
    return 0


def nothing_compared(result: dict[str, Any]) -> str | None:
    """Why an analysis could find no outlier at all (nothing compared: ``40 SKU/metric group(s): 40 not compared
    (fewer than 3 nodes)``), or None when at least one group was compared."""
    from gpuaccept.results.coverage import coverage_line, coverage_of

    cov = coverage_of(result)
    if cov["compared"]:
        return None
    if not cov["groups"]:
        return "nothing was compared: the reports hold no values to compare"
    return f"nothing was compared, no outlier can be found ({coverage_line(result)})"


def register(sub: Any) -> None:
    """Add ``analyze`` to the top-level subparsers."""
    a = sub.add_parser("analyze", help="find outlier GPUs and nodes in reports",
                       description="Robust z-scores (median/MAD) of every metric: each GPU against its siblings "
                                   "in the node, each node against the other nodes of its GPU SKU.")
    a.add_argument("paths", nargs="+", metavar="PATH", help="cluster or node report files, or directories of them")
    a.add_argument("--max-z", type=_positive_float, default=5.0, metavar="Z",
                   help="flag values at least Z robust deviations out on the bad side (default 5)")
    a.add_argument("--min-siblings", type=_at_least_3, default=3, metavar="N",
                   help="GPUs a node needs for the within-node comparison (default 3)")
    a.add_argument("--min-nodes", type=_at_least_3, default=3, metavar="N",
                   help="nodes of a SKU needed for the cross-node comparison (default 3)")
    a.add_argument("--limit", type=_nonneg_int, default=50, metavar="N", help="outliers listed (0: all; default 50)")
    add_json_option(a, "the analysis")
    a.add_argument("--output", "-o", default=None, metavar="PATH", help="also write the analysis JSON here"
                   "; a device or FIFO is written as a stream, a file replaced atomically, a link refused")
    code = a.add_argument("--exit-code", action="store_true",
                          help="exit 1 when any outlier is found, or when nothing could be compared (default: 0)")
    hidden_alias(a, "--fail-on-outliers", code)
    a.set_defaults(handler=cmd_analyze)
