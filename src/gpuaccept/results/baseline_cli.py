"""``gpuaccept baseline create|show|apply``: fleet baselines on the command line.

- ``create --from PATH...`` learns a baseline from node reports
  (``report.json``), cluster reports (``"kind": "cluster"``) or directories
  holding them (searched recursively); ``create --history`` learns from the
  node runs in the history store (``--db``, ``--host``, ``--since``). The YAML
  goes to ``--output`` (default: stdout), a one-line summary to stderr.
- ``show FILE`` validates a baseline file and lists its entries.
- ``apply REPORT --baseline FILE`` judges a finished report against a
  baseline (:func:`~gpuaccept.results.baseline.apply_baseline`).

Exit codes: 0 done (``apply``: no check failed), 1 ``apply`` found a failed
check, 2 bad input (unreadable or malformed report, baseline or threshold file).
Nothing heavy is imported at module level.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuaccept.argtypes import positive_float as _positive_float
from gpuaccept.argtypes import positive_int as _positive_int
from gpuaccept.cliargs import add_json_option, hidden_alias

if TYPE_CHECKING:
    from gpuaccept.model import ClusterReport, NodeReport
    from gpuaccept.results.baseline import Baseline


# ---------------------------------------------------------------------------------------------- reading reports


def _parse_report(data: Any, where: str) -> NodeReport | ClusterReport | None:
    """A report from parsed JSON; None when ``data`` is plainly not a report; InputError when broken."""
    from gpuaccept.results.load import report_from_dict

    if not isinstance(data, dict) or "run_id" not in data:
        return None
    if data.get("kind") != "cluster" and not ("checks" in data and "host" in data):
        return None
    return report_from_dict(data, where)


def _read_json(path: Path) -> Any:
    from gpuaccept.inputs import load_json_file

    return load_json_file(path, "JSON file")


def _report_at(path: Path) -> NodeReport | ClusterReport | None:
    """``_parse_report`` of a file; a cluster report in the line layout is read a node at a time."""
    from gpuaccept.results.clusterfile import is_line_layout
    from gpuaccept.results.load import load_file

    if is_line_layout(path):
        return load_file(path)
    return _parse_report(_read_json(path), str(path))


def read_report_files(paths: Sequence[str]) -> list[NodeReport | ClusterReport]:
    """Reports from files and directories (recursively: every ``*.json`` that is a report).

    A named file must be a report; in a directory, other JSON files are passed
    over, but a broken ``report.json`` or ``cluster-report.json`` is an error.
    A node report seen twice (its own file and inside a cluster report: same
    host, run id and start) is kept once. InputError names the file.
    """
    from gpuaccept.errors import InputError
    from gpuaccept.model import ClusterReport

    found: list[NodeReport | ClusterReport] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*.json") if not f.name.startswith(".") and f.is_file())
            for f in files:
                strict = f.name in ("report.json", "cluster-report.json")
                try:
                    rep = _report_at(f)
                except InputError:
                    if strict:
                        raise
                    continue
                if rep is None and strict:
                    raise InputError(f"{f}: not a gpuaccept report (no run_id, host and checks)")
                if rep is not None:
                    found.append(rep)
        elif p.exists():
            rep = _report_at(p)
            if rep is None:
                raise InputError(f"{p}: not a gpuaccept report (no run_id, host and checks)")
            found.append(rep)
        else:
            raise InputError(f"{p}: no such file or directory")
    # Drop node reports that a cluster report also holds.
    seen: set[tuple[str, str, str]] = set()
    for rep in found:
        if isinstance(rep, ClusterReport):
            seen.update((n.report.host, n.report.run_id, n.report.started) for n in rep.nodes if n.report)
    out: list[NodeReport | ClusterReport] = []
    for rep in found:
        if isinstance(rep, ClusterReport):
            out.append(rep)
            continue
        ident = (rep.host, rep.run_id, rep.started)
        if ident not in seen:
            seen.add(ident)
            out.append(rep)
    return out


@contextlib.contextmanager
def _from_history(args: argparse.Namespace) -> Iterator[tuple[int, Iterator[NodeReport]]]:
    """The number of matching node runs and an iterator that reads their reports one at a time (so that
    learning from a thousand runs holds one report in memory, not all), the store open meanwhile."""
    from gpuaccept.model import NodeReport
    from gpuaccept.results.history import open_store
    from gpuaccept.results.timespec import parse_since

    since = parse_since(args.since) if args.since else None
    store = open_store(args.db, read_only=True)
    try:
        runs = store.list_runs(host=args.host, since=since, kind="node", include_members=True)

        def reports() -> Iterator[NodeReport]:
            for r in runs:
                rep = store.get_run(r.run_id, host=r.host).report
                if isinstance(rep, NodeReport):
                    yield rep

        yield len(runs), reports()
    finally:
        store.close()


def write_output(path: str, text: str, flag: str = "--output") -> None:
    """Write ``text`` to ``path`` (:func:`gpuaccept.outputs.write_output`: stdout for ``-``, a device or FIFO as a
    stream, a regular file atomically, a link refused)."""
    from gpuaccept.outputs import write_output as write

    write(path, text, flag)


def check_rule_names(rules: Sequence[Any], source: str, checks: Sequence[str] | None = None) -> None:
    """ConfigError when a threshold rule of ``source`` names a metric no check produces (with a "did you mean");
    a note on stderr for one that names only metrics of checks outside ``checks`` (None: every check)."""
    from gpuaccept.checks import registry
    from gpuaccept.checks.metricnames import rule_finding
    from gpuaccept.errors import ConfigError

    reg = registry()
    for i, rule in enumerate(rules):
        found = rule_finding(rule.metric, reg, list(reg) if checks is None else checks)
        if found.error:
            raise ConfigError(source, f"thresholds[{i}].metric", found.error)
        if found.note:
            print(f"gpuaccept: note: {source}: thresholds[{i}].metric: {found.note}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------- commands


def cmd_create(args: argparse.Namespace) -> int:
    from gpuaccept.errors import InputError, UsageError
    from gpuaccept.results.baseline import load_rules
    from gpuaccept.results.baseline_learn import learn_baseline, learn_baseline_samples
    from gpuaccept.results.columns import tables_of

    if bool(args.paths) == bool(args.history):
        raise UsageError("baseline create needs --from PATH... or --history (one of them)")
    if not args.history and (args.host or args.since or args.db):
        raise UsageError("--host, --since and --db select runs from the history: use them with --history")
    rules = load_rules(args.thresholds) if args.thresholds else ()
    check_rule_names(rules, args.thresholds)
    if args.history:
        origin = [f"history{':' + args.host if args.host else ''}{' since ' + args.since if args.since else ''}"]
        with _from_history(args) as (count, stream):
            if not count:
                raise InputError("no node runs in the history match (see 'gpuaccept history --all-nodes')")
            baseline = learn_baseline(stream, trim_z=args.max_z, min_samples=args.min_samples, origin=origin)
    else:
        origin = [str(p) for p in args.paths]
        table = tables_of(args.paths)  # cluster reports with their metrics table beside them: no report re-read
        if table is not None and any(k.check == "reference_train" for k in table[0].keys):
            table = None  # reference_train's per-step digests (the baseline's curves) are in the reports only
        if table is not None:
            baseline = learn_baseline_samples(table[0], trim_z=args.max_z, min_samples=args.min_samples,
                                              origin=origin)
        else:
            items = read_report_files(args.paths)
            if not items:
                raise InputError(f"no gpuaccept reports found in {', '.join(args.paths)}")
            baseline = learn_baseline(items, trim_z=args.max_z, min_samples=args.min_samples, origin=origin)
    if not len(baseline):
        raise InputError(f"no metric had {args.min_samples} or more usable values in {baseline.runs} report(s) "
                         f"(lower --min-samples, or check the reports ran any measurement)")
    if rules:
        baseline.thresholds = tuple(rules)
    if args.note:
        baseline.note = args.note
    write_output(args.output, baseline.to_yaml())
    where = "stdout" if args.output == "-" else args.output
    print(f"gpuaccept: baseline of {len(baseline)} metric(s) for {len(baseline.skus)} SKU(s) "
          f"({', '.join(sorted(baseline.skus))}) from {baseline.nodes} node(s), {baseline.runs} run(s) -> {where}",
          file=sys.stderr)
    return 0


def _entry_rows(baseline: Baseline, sku_filter: str | None) -> list[dict[str, Any]]:
    rows = []
    for sku, entries in sorted(baseline.skus.items()):
        if sku_filter and sku != sku_filter:
            continue
        for e in entries:
            rows.append({"sku": sku, **e.to_dict()})
    return rows


def cmd_show(args: argparse.Namespace) -> int:
    from gpuaccept.errors import UsageError
    from gpuaccept.inputs import one_line
    from gpuaccept.results.baseline import load_baseline

    baseline = load_baseline(args.file)
    if args.sku and args.sku not in baseline.skus:
        raise UsageError(f"--sku {args.sku}: not in {args.file} (SKUs: {', '.join(sorted(baseline.skus))})")
    rows = _entry_rows(baseline, args.sku)
    if args.json:
        data = baseline.to_dict()
        if args.sku:
            data["skus"] = {args.sku: data["skus"][args.sku]}
        write_output(args.json, json.dumps(data, indent=2) + "\n", "--json")
        if args.json == "-":
            return 0
    src = [f"{k} {v}" for k, v in (("created", baseline.created), ("nodes", baseline.nodes),
                                   ("runs", baseline.runs), ("by", baseline.tool)) if v is not None]
    print(one_line(f"{args.file}: {len(baseline)} metric(s), {len(baseline.skus)} SKU(s)"
                   + (f"; {', '.join(src)}" if src else "")))
    header = ("sku", "metric", "dtype", "size_bytes", "value", "unit", "mad", "mad%", "n", "nodes")
    table = [header]
    for r in rows:
        pct = f"{100 * r['mad'] / abs(r['value']):.2f}" if r["value"] else "-"
        table.append((r["sku"], r["metric"], r.get("dtype", "-"), str(r.get("size_bytes", "-")), f"{r['value']:g}",
                      r["unit"], f"{r['mad']:g}", pct, str(r["n"]), str(r.get("nodes", "-"))))
    cells = [[one_line(str(c)) for c in row] for row in table]  # a name in the file is no control sequence
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    rules = baseline.rules()
    label = "thresholds" if baseline.thresholds else "thresholds (default)"
    print(one_line(f"{label}: " + "; ".join(r.describe() for r in rules)))
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from gpuaccept.errors import UsageError
    from gpuaccept.model import ClusterReport, state_label
    from gpuaccept.results.baseline import load_baseline, load_rules
    from gpuaccept.results.baseline_judge import apply_baseline

    baseline = load_baseline(args.baseline)
    rules = load_rules(args.thresholds) if args.thresholds else None
    items = read_report_files([args.report])
    if len(items) != 1:
        raise UsageError(f"{args.report}: holds {len(items)} reports; give one report file")
    item = items[0]
    ran = sorted({c.name for rep in ([n.report for n in item.nodes if n.report] if isinstance(item, ClusterReport)
                                     else [item])
                  for c in rep.checks})
    check_rule_names(rules if rules is not None else baseline.thresholds,
                     args.thresholds if rules is not None else baseline.path, ran)
    judged: NodeReport | ClusterReport
    nodes: list[NodeReport]
    if isinstance(item, ClusterReport):
        entries = [replace(n, report=apply_baseline(n.report, baseline, rules) if n.report else None)
                   for n in item.nodes]
        judged = replace(item, nodes=entries)
        nodes = [n.report for n in entries if n.report is not None]
    else:
        judged = apply_baseline(item, baseline, rules)
        nodes = [judged]
    if args.output:
        write_output(args.output, json.dumps(judged.to_dict(), indent=2) + "\n")
    for rep in nodes:
        for c in rep.checks:
            info = c.details.get("baseline")
            if not isinstance(info, dict):
                continue
            mark = state_label(c.state)
            print(f"{rep.host} {c.name}: {mark} ({info.get('matched', 0)} metric(s) matched the baseline)"
                  + (f": {c.reason}" if info.get("violations") or c.status.is_failure else ""))
    if not any(isinstance(c.details.get("baseline"), dict) for rep in nodes for c in rep.checks):
        print(f"gpuaccept: no metric of {args.report} matched {args.baseline} (different SKUs or metrics?)",
              file=sys.stderr)
    return 1 if any(rep.failed_checks() for rep in nodes) else 0


def register(sub: Any) -> None:
    """Add ``baseline create|show|apply`` to the top-level subparsers."""
    b = sub.add_parser("baseline", help="learn, show and apply fleet baselines",
                       description="Fleet baselines: the median and spread of each metric per GPU SKU.")
    bsub = b.add_subparsers(dest="baseline_command", metavar="ACTION", parser_class=type(b))
    b.set_defaults(handler=lambda args: _missing_action(b))

    c = bsub.add_parser("create", help="learn a baseline from reports or the history",
                        description="Learn a baseline: per SKU and metric, the median after dropping values more "
                                    "than --max-z robust deviations out (repeated until stable).")
    c.add_argument("--from", dest="paths", nargs="+", default=None, metavar="PATH",
                   help="report.json / cluster report files, or directories searched for them")
    c.add_argument("--history", action="store_true", help="learn from the node runs in the history store")
    c.add_argument("--db", default=None, metavar="URL", help="history database URL (with --history)")
    c.add_argument("--host", default=None, help="only runs on this host (with --history)")
    c.add_argument("--since", default=None, metavar="WHEN",
                   help="only runs since WHEN: 2026-11-01, 7d (with --history)")
    c.add_argument("--output", "-o", default="-", metavar="FILE", help="where the YAML goes (default: stdout)"
                   "; a device or FIFO is written as a stream, a file replaced atomically, a link refused")
    z = c.add_argument("--max-z", type=_positive_float, default=3.5, metavar="Z",
                       help="drop values beyond Z robust deviations before taking the median (default 3.5)")
    hidden_alias(c, "--trim-z", z)
    c.add_argument("--min-samples", type=_positive_int, default=3, metavar="N",
                   help="omit metrics with fewer than N values left (default 3)")
    c.add_argument("--thresholds", default=None, metavar="YAML", help="embed these threshold rules in the baseline")
    c.add_argument("--note", default=None, help="a note stored in the baseline's source")
    c.set_defaults(handler=cmd_create)

    s = bsub.add_parser("show", help="validate a baseline file and list its entries",
                        description="Validate a baseline file and list its entries: per SKU and metric the median, "
                                    "spread, sample count and the threshold rules it carries.")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--sku", default=None, help="only this SKU")
    add_json_option(s, "the baseline")
    s.set_defaults(handler=cmd_show)

    a = bsub.add_parser("apply", help="judge a finished report against a baseline",
                        description="Judge REPORT (node or cluster) against a baseline. A baseline applied after "
                                    "the run can only lower a status; exit 1 when a check fails.")
    a.add_argument("report", metavar="REPORT")
    a.add_argument("--baseline", required=True, metavar="FILE")
    a.add_argument("--thresholds", default=None, metavar="YAML", help="rules to use instead of the baseline's")
    a.add_argument("--output", "-o", default=None, metavar="PATH", help="write the re-judged report JSON here"
                   "; a device or FIFO is written as a stream, a file replaced atomically, a link refused")
    a.set_defaults(handler=cmd_apply)


def _missing_action(parser: argparse.ArgumentParser) -> int:
    from gpuaccept.errors import UsageError

    raise UsageError(f"{parser.prog} needs an action: create, show or apply (see '{parser.prog} --help')")
