"""``gpuaccept conformance capture``: a manifest from a qualified node, or from its report.

``gpuaccept conformance capture [-o FILE]`` collects this node's configuration (NVML and sysfs, as the
``conformance`` check does) and writes the manifest it passes exactly; ``--from REPORT`` takes the
configuration from the ``conformance`` check of an existing node report instead (no NVML needed).
``gpuaccept conformance check MANIFEST`` validates a manifest (exit 2 and one line when it is bad);
``gpuaccept conformance diff BEFORE AFTER`` lists what changed between two reports of a node;
``gpuaccept conformance changes NODE`` what changed in a node's configuration since it last passed, from the
history (:mod:`gpuaccept.results.config_history`).
"""

from __future__ import annotations

import argparse
from typing import Any


def _items_from_report(path: str) -> dict[str, Any]:
    from gpuaccept.errors import InputError
    from gpuaccept.results.baseline_cli import read_report_files
    from gpuaccept.results.conformance_fleet import configs_of_reports

    configs = configs_of_reports(read_report_files([path]))
    if not configs:
        raise InputError(f"{path}: no report with a conformance check (its run must include the check, "
                         f"e.g. gpuaccept run --checks conformance)")
    if len(configs) > 1:
        raise InputError(f"{path}: reports of {len(configs)} nodes ({', '.join(sorted(configs))}); "
                         f"give the report of the one qualified node")
    return next(iter(configs.values()))


def cmd_capture(args: argparse.Namespace) -> int:
    import os

    from gpuaccept.checks.conformance_manifest import capture, dump_manifest
    from gpuaccept.results.baseline_cli import write_output

    if args.from_report:
        items, source = _items_from_report(args.from_report), f"from {args.from_report}"
    else:
        from gpuaccept.checks.conformance import read_config

        cfg, error = read_config(args.root, os.environ)
        items, source = cfg.items, "from this node" + (f" (no GPU items: {error})" if error else "")
    manifest = capture(items, description=f"captured {source}")
    write_output(args.output, dump_manifest(manifest))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from gpuaccept.checks.conformance_manifest import load_manifest

    manifest = load_manifest(args.manifest)
    print(f"{args.manifest}: {len(manifest.rules)} rule(s), valid")
    return 0


def _one_node(path: str) -> Any:
    from gpuaccept.errors import InputError
    from gpuaccept.results.baseline_cli import read_report_files
    from gpuaccept.results.conformance_fleet import config_of_report

    reports = [r for r in read_report_files([path]) if config_of_report(r) is not None]
    if len(reports) != 1:
        raise InputError(f"{path}: expected the report of one node with a conformance check, found {len(reports)}")
    return reports[0]


def cmd_diff(args: argparse.Namespace) -> int:
    """``conformance diff BEFORE AFTER``: each item and part identity that changed between two node reports."""
    from gpuaccept.results.conformance_fleet import config_changes, config_of_report, ids_of_report

    before, after = _one_node(args.before), _one_node(args.after)
    changes = config_changes(config_of_report(before) or {}, config_of_report(after) or {})
    parts = config_changes(ids_of_report(before), ids_of_report(after))
    print(f"{before.host} {before.started} -> {after.host} {after.started}: {len(changes)} item(s) changed, "
          f"{len(parts)} part(s) replaced")
    for c in changes:
        print(f"  {c['item']}: {c['before']} -> {c['after']}")
    for c in parts:
        print(f"  part {c['item']}: {c['before']} -> {c['after']}")
    return 0


def cmd_changes(args: argparse.Namespace) -> int:
    """``conformance changes NODE [--since RUN|DATE] [--json]``: from the history store."""
    import json

    from gpuaccept.results.baseline_cli import write_output
    from gpuaccept.results.config_history import change_lines, changes
    from gpuaccept.results.history import open_store

    with open_store(args.db, read_only=True) as store:
        result = changes(store, args.node, args.since)
    if args.json is not None:
        write_output(args.json, json.dumps(result, indent=2) + "\n", "--json")
    if args.json != "-":
        print("\n".join(change_lines(result)))
    return 0


def register(sub: Any) -> None:
    """Add ``conformance capture``, ``check``, ``diff`` and ``changes`` to the top-level subparsers."""
    c = sub.add_parser("conformance", help="capture or validate a fleet conformance manifest",
                       description="A manifest of a qualified node's configuration (driver, GPUs, PCIe, NVLink, "
                                   "NIC firmware and rate, NUMA, NCCL env, kernel, BIOS) that "
                                   "'gpuaccept run --conformance FILE' holds every node to.")
    from gpuaccept.cliargs import Parser, add_json_option

    verbs = c.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=Parser)
    cap = verbs.add_parser("capture", help="write the manifest this node (or its report) passes",
                           description="Write a conformance manifest that this node passes: its configuration "
                                       "read now, or from a node report's conformance check (--from). Items "
                                       "equal on every GPU, NIC or port become one '*' rule; edit it to allow "
                                       "ranges or several values.")
    cap.add_argument("-o", "--output", default="-", metavar="FILE", help="where to write it (default: stdout)")
    cap.add_argument("--from", dest="from_report", default=None, metavar="REPORT",
                     help="take the configuration from this node report (its conformance check)")
    cap.add_argument("--root", default="/", help=argparse.SUPPRESS)
    cap.set_defaults(handler=cmd_capture)
    val = verbs.add_parser("check", help="validate a manifest (exit 2 with one line when it is bad)",
                           description="Validate a conformance manifest without running anything: unknown "
                                       "keys or items, wrong types and impossible ranges are exit 2 with one "
                                       "line.")
    val.add_argument("manifest", metavar="MANIFEST")
    val.set_defaults(handler=cmd_validate)
    diff = verbs.add_parser("diff", help="what changed between two reports of a node (items and parts)",
                            description="List each configuration item that changed between two reports of a "
                                        "node (report.json files or run directories), and each part replaced "
                                        "(GPU UUID, NIC GUID).")
    diff.add_argument("before", metavar="BEFORE", help="the earlier node report (e.g. the run that last passed)")
    diff.add_argument("after", metavar="AFTER", help="the later node report")
    diff.set_defaults(handler=cmd_diff)
    from gpuaccept.results.cli import DB_HELP

    ch = verbs.add_parser("changes", help="what changed in a node's configuration since it last passed (history)",
                          description="Compare a node's latest configuration in the history store with the one "
                                      "of its last passing run (or of --since RUN|DATE): each item that changed, "
                                      "with its part (GPU UUID, NIC GUID), and each part replaced. Runs are "
                                      "stored with their configuration when they include the conformance check.")
    ch.add_argument("node", metavar="NODE", help="the node's host name as stored")
    ch.add_argument("--since", default=None, metavar="RUN|DATE",
                    help="compare with this run id of the node, or with its newest configuration at or before "
                         "DATE (2026-11-01, 7d); default: its last passing run")
    add_json_option(ch, "the changes")
    ch.add_argument("--db", default=None, metavar="URL", help=DB_HELP)
    ch.set_defaults(handler=cmd_changes)
