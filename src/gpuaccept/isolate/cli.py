"""``gpuaccept isolate``: which node is bad. Pairwise or bisection rounds of the collectives check (or nccl-tests).

Exit codes: 0 every node good, 1 a node is bad or still suspect (or ``--apply``
could not drain one), 2 bad usage or input (fewer than 2 nodes, a threshold
that is not a number, an unknown backend). ``--simulate`` exits 0. ``--rails-of``
exits 0 when every rail passes alone, 1 when one is bad.

``--per-rail`` then tests each bad node's rails (:mod:`gpuaccept.isolate.rails`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from gpuaccept.argtypes import check_host, duration, int_at_least, nonneg_float, positive_float, positive_int
from gpuaccept.cliargs import add_json_option, hidden_alias
from gpuaccept.errors import InputError, UsageError
from gpuaccept.exitcodes import EXIT_FAILED, EXIT_OK


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "isolate", help="find the bad node(s): pair tests in rounds, re-tests with good partners, bisection",
        description="Run the collectives check (or nccl-tests' all_reduce_perf, --pair-test nccl-tests) on disjoint "
                    "pairs of nodes in parallel rounds (or on halves of the "
                    "node set, with --mode bisect), re-test each suspect with nodes that passed, and name the bad "
                    "nodes with the evidence (partners, busbw). Exit 0 all good, 1 bad or suspect nodes, 2 bad "
                    "input. --simulate drives the same planner with a fake pair test.")
    p.add_argument("--backend", choices=("slurm", "ssh", "mpi", "local"), default=None,
                   help="the launcher that runs each pair test")
    p.add_argument("--nodes", default=None, metavar="LIST",
                   help="the nodes: a comma list or Slurm hostlist (node[01-16]); a count for local and --simulate")
    p.add_argument("--mode", choices=("pairs", "bisect"), default="pairs",
                   help="pairs (default), or bisect for a failure that shows only at full scale")
    p.add_argument("--min-busbw", type=positive_float, default=None, metavar="GBS",
                   help="a test passes only at this allreduce busbw or more (default: the check's own verdict)")
    p.add_argument("--confirm", type=positive_int, default=2, metavar="K",
                   help="failures with distinct good partners that make a node bad (default: 2)")
    p.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                   help="run each test N times, judged on the worst run (intermittent faults)")
    p.add_argument("--max-rounds", type=positive_int, default=None, metavar="R", help="stop after R rounds")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the random pairing (default: 0)")
    p.add_argument("--racks", default=None, metavar="N1=R1,N2=R1",
                   help="rack or switch of each node: pairs within a rack first, re-tests across racks")
    add_json_option(p, "also write the verdicts")
    p.add_argument("--drain", action="store_true", help="print the scontrol commands that drain the bad nodes")
    p.add_argument("--apply", action="store_true", help="with --drain: run them")
    p.add_argument("--dry-run", action="store_true",
                   help="print the first round's tests as 'gpuaccept launch' commands and run nothing")
    r = p.add_argument_group("pair tests")
    r.add_argument("--pair-test", choices=("collectives", "nccl-tests"), default="collectives",
                   help="collectives: our check (default); nccl-tests: all_reduce_perf (slurm and mpi only)")
    r.add_argument("--gpus-per-node", type=positive_int, default=None, metavar="G",
                   help="GPUs per node: requested and tested by each pair test (default: every GPU each node has; "
                        "8 for a nccl-tests pair test), the rails of --per-rail and --rails-of (default: 8)")
    r.add_argument("--nccl-arg", action="append", default=None, metavar="ARG",
                   help="nccl-tests: an all_reduce_perf argument (repeatable; default -b 8M -e 1G -f 2; -g is "
                        "set by the plan), e.g. --nccl-arg=-e --nccl-arg=8G")
    r.add_argument("--nccl-tests-bin", default=None, metavar="PATH",
                   help="nccl-tests: all_reduce_perf on the nodes (default: as found here on $PATH, "
                        "$NCCL_TESTS_DIR or /workspace/nccl-tests/build, else all_reduce_perf)")
    r.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None, help="passed to each launch")
    r.add_argument("--profile", choices=("quick", "standard", "full"), default="quick",
                   help="profile of the collectives check (default: quick)")
    r.add_argument("--report-dir", default="gpuaccept-reports", metavar="DIR",
                   help="where each test's run directory goes (default: ./gpuaccept-reports)")
    hidden_alias(r, "--results-dir", p._option_string_actions["--report-dir"])
    r.add_argument("--test-timeout", type=duration, default=None, metavar="DURATION",
                   help="a test still running after this long is cancelled and fails")
    r.add_argument("--launch-arg", action="append", default=None, metavar="ARG",
                   help="a further 'gpuaccept launch' flag for every test, e.g. --launch-arg=--partition=gpu")
    g = p.add_argument_group("per-rail tests (which GPU/NIC pair of a bad node)")
    g.add_argument("--per-rail", action="store_true",
                   help="after the rounds, test each bad node's rails one at a time (GPU i with its NIC, one rank "
                        "per node) with a good partner, and name the rails at fault")
    g.add_argument("--rails-of", default=None, metavar="NODE=PARTNER",
                   help="test NODE's rails with PARTNER, a node known good; no rounds (and no --nodes)")
    g.add_argument("--rail-ports", default=None, metavar="P0,P1",
                   help="the node's RDMA ports in rail order, e.g. mlx5_0:1,mlx5_1:1 (default: those its "
                        "collectives check read in an earlier test, else NCCL picks the NIC of each GPU)")
    g.add_argument("--rail-test", choices=("pair", "rdma"), default="pair",
                   help="pair: the pair test on one GPU per rail, one rail after another (default); rdma: perftest "
                        "(ib_write_bw) on every NIC at once, the partner serving, each NIC judged against 0.95 x its "
                        "port rate (mpi, slurm, ssh; needs the NICs: --rail-ports, or an earlier collectives test)")
    g.add_argument("--html", default=None, metavar="PATH",
                   help="also write the rails as an HTML page: a NIC x node table of each rail's figure, the "
                        "cells under their bound marked, then each bad rail's evidence ('-' for stdout)")
    s = p.add_argument_group("simulation")
    s.add_argument("--simulate", action="store_true", help="fake pair tests: rounds and accuracy over trials")
    s.add_argument("--bad", type=int_at_least(0), default=1, metavar="K", help="broken nodes (default: 1)")
    s.add_argument("--slow", type=int_at_least(0), default=0, metavar="K", help="slow nodes (default: 0)")
    s.add_argument("--noise", type=nonneg_float, default=0.03, metavar="F",
                   help="relative busbw noise per node and test (default: 0.03)")
    s.add_argument("--trials", type=positive_int, default=100, metavar="T", help="(default: 100)")
    p.set_defaults(handler=_cmd_isolate)


def parse_racks(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        node, sep, rack = item.partition("=")
        if not sep or not node.strip() or not rack.strip():
            raise UsageError(f"--racks: {item!r} is not NODE=RACK")
        out[node.strip()] = rack.strip()
    return out


MAX_NODES = 4096
"""Nodes one isolation takes (the planner's work grows with the square of the count)."""
MAX_SIM_WORK = 2e7
"""Nodes squared times trials that ``--simulate`` takes (about half a minute on one core)."""


def node_count(n: int) -> int:
    """``n``, or UsageError when it is outside [2, :data:`MAX_NODES`]."""
    if n < 2:
        raise UsageError(f"isolation needs at least 2 nodes, got {n}")
    if n > MAX_NODES:
        raise UsageError(f"--nodes: {n} nodes is more than isolate takes ({MAX_NODES}); isolate a part of the "
                         "cluster (a rack, a switch) at a time")
    return n


def parse_nodes(text: str | None, backend: str | None) -> list[str]:
    if not text:
        raise UsageError("--nodes is required")
    if text.isdigit():
        if backend != "local":
            raise UsageError(f"--nodes {text}: name the nodes (a count is for --backend local and --simulate)")
        return [f"node{i}" for i in range(count_nodes(text))]
    from gpuaccept.distributed.hostlist import expand_hostlist

    try:
        nodes = expand_hostlist(text)
    except InputError as exc:
        raise UsageError(f"--nodes: {exc}") from None
    if len(nodes) > MAX_NODES:
        node_count(len(nodes))
    return host_names(nodes, "--nodes")


def count_nodes(text: str) -> int:
    """``--nodes N`` as a count (2 to :data:`MAX_NODES`); UsageError otherwise."""
    if not text.isdigit() or len(text) > 9:
        raise UsageError(f"--nodes {text[:40]}: a count of nodes is at most {MAX_NODES}")
    return node_count(int(text))


def host_names(names: list[str], flag: str) -> list[str]:
    """``names`` when each is a host name (:func:`gpuaccept.argtypes.check_host`); UsageError otherwise."""
    for name in names:
        try:
            check_host(name)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    return names


def _settings(args: argparse.Namespace) -> Any:
    from gpuaccept.isolate.plan import Settings

    return Settings(mode=args.mode, threshold=args.min_busbw, confirm=args.confirm, repeat=args.repeat,
                    max_rounds=args.max_rounds or 0, seed=args.seed)


def _emit_json(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """The --json file, and the --html page of the rails (when rails were tested)."""
    if getattr(args, "html", None):
        from gpuaccept.outputs import write_output
        from gpuaccept.report.html_rails import render_rails_html

        write_output(args.html, render_rails_html(data), "--html")
    if args.json:
        from gpuaccept.outputs import write_output

        write_output(args.json, json.dumps(data, indent=2) + "\n", "--json")


def _simulate(args: argparse.Namespace) -> int:
    from gpuaccept.isolate.sim import simulate, summary_lines

    if args.backend is not None:
        raise UsageError("--simulate runs no backend; drop --backend")
    if not (args.nodes or "").isdigit():
        raise UsageError("--simulate needs --nodes N (a count)")
    n = count_nodes(args.nodes)
    if n * n * args.trials > MAX_SIM_WORK:
        raise UsageError(f"--simulate --nodes {n} --trials {args.trials}: more work than a simulation takes "
                         f"(nodes x nodes x trials at most {MAX_SIM_WORK:.0e}, about half a minute); give fewer "
                         "--trials or --nodes")
    summary = simulate(n, args.bad, args.trials, args.seed, slow=args.slow, noise=args.noise,
                       settings=_settings(args))
    data = summary.to_dict()
    out = sys.stderr if args.json == "-" else sys.stdout
    for line in summary_lines(data):
        print(line, file=out)
    _emit_json(args, data)
    return EXIT_OK


def table(verdicts: Any) -> list[str]:
    """One line per node: state, rack, passes, strikes and the evidence of its pair tests."""
    lines = [f"{'NODE':<20} {'STATE':<8} {'RACK':<8} EVIDENCE"]
    order = {"bad": 0, "suspect": 1, "untested": 2, "good": 3}
    for v in sorted(verdicts.nodes, key=lambda v: (order[v.state], v.node)):
        ev = "; ".join(f"r{e['round']} {'+'.join(e['partners'])} "
                       f"{'pass' if e['passed'] else 'FAIL'}"
                       + (f" {e['busbw']:.3g} GB/s" if e["busbw"] is not None else "") for e in v.evidence)
        lines.append(f"{v.node:<20} {v.state.upper():<8} {v.rack or '-':<8} {ev or '-'}")
    return lines


def _drain(args: argparse.Namespace, verdicts: Any, data: dict[str, Any], out: Any) -> int:
    """Print (and with --apply run) the drain commands; the number of nodes that could not be drained."""
    from gpuaccept.isolate.drain import apply_drain
    from gpuaccept.isolate.plan import drain_commands

    rails = {node: r.get("bad_rails") or [] for node, r in (data.get("rails") or {}).items()}
    commands = drain_commands(verdicts, rails)
    for argv in commands:
        print(shlex.join(argv), file=out)
    if not args.apply:
        return 0
    done = apply_drain(commands)
    data["drained"] = [d.to_dict() for d in done]
    for d in done:
        if d.ok:
            print(f"[ISOLATE] drained {d.node} (State={d.state})", file=out)
        else:
            print(f"[ISOLATE] cannot drain {d.node}: {d.error}", file=sys.stderr)
    return sum(not d.ok for d in done)


def _pair_test(args: argparse.Namespace) -> Any:
    from gpuaccept.isolate.nccl import BINARY, DEFAULT_ARGS, command
    from gpuaccept.isolate.pairs import PairTest

    if args.pair_test == "collectives":
        for flag, given in (("--nccl-arg", args.nccl_arg), ("--nccl-tests-bin", args.nccl_tests_bin)):
            if given:
                raise UsageError(f"{flag} is for --pair-test nccl-tests")
        return PairTest()
    binary = args.nccl_tests_bin
    if binary is None:
        from gpuaccept.nccltests.judge import find_binary

        binary = find_binary("all_reduce") or BINARY
    pair = PairTest("nccl-tests", _gpus(args), tuple(args.nccl_arg or DEFAULT_ARGS), binary, args.min_busbw)
    command(args.backend, pair.gpus, pair.args, pair.binary)  # UsageError for what cannot run
    return pair


DEFAULT_GPUS = 8
"""GPUs per node of a nccl-tests pair test and of the rails when --gpus-per-node is not given."""


def _gpus(args: argparse.Namespace) -> int:
    return int(args.gpus_per_node or DEFAULT_GPUS)


def _collectives_flags(args: argparse.Namespace, pair: Any) -> list[str]:
    """The launch flags of a collectives pair test: profile, device, and the GPUs per node when given (without
    it, each node tests every GPU it has)."""
    if pair.kind != "collectives":
        return []
    gpus = [] if args.gpus_per_node is None else ["--gpus-per-node", str(args.gpus_per_node)]
    return ["--profile", args.profile, *(["--device", args.device] if args.device else []), *gpus]


def _dry_run(args: argparse.Namespace, runner: Any, first: Any, tag: str) -> int:
    """Round 1 as the 'gpuaccept launch' command of each test (pure output: the plan; nothing runs)."""
    print(f"# gpuaccept isolate: round 1 of {args.mode} mode, {len(first.tests)} test(s) in parallel, each run "
          f"{first.repeat} time(s); later rounds depend on the results")
    for i, test in enumerate(first.tests):
        print(shlex.join(["gpuaccept", *runner.argv(test, f"{tag}-r1-t{i}-0")]))
    return EXIT_OK


def _cmd_isolate(args: argparse.Namespace) -> int:
    from gpuaccept.isolate.pairs import PairRunner
    from gpuaccept.isolate.plan import Result, Round, next_step, validate

    if args.simulate:
        if args.per_rail or args.rails_of:
            raise UsageError("--simulate fakes node pair tests only; drop --per-rail/--rails-of")
        if args.html:
            raise UsageError("--html writes the rails: give --per-rail or --rails-of (not --simulate)")
        return _simulate(args)
    if args.backend is None:
        raise UsageError("--backend is required: slurm, ssh, mpi or local (or --simulate)")
    if args.apply and not args.drain:
        raise UsageError("--apply runs the --drain commands; give --drain too")
    if args.rails_of is not None:
        return _rails_only(args)
    nodes = parse_nodes(args.nodes, args.backend)
    racks = parse_racks(args.racks)
    settings = _settings(args)
    validate(nodes, settings, racks)
    pair = _pair_test(args)
    extra = [*_collectives_flags(args, pair), *(args.launch_arg or [])]
    from gpuaccept.launch.cli import new_run_id

    tag = "dry-run" if args.dry_run else new_run_id("isolate")
    out = sys.stderr if args.json == "-" else sys.stdout
    runner = PairRunner(args.backend, Path(args.report_dir).resolve(), extra, args.test_timeout, name="isolate",
                        log=out, pair=pair)
    ports = _rail_options(args, runner)
    if args.dry_run:
        _dry_run(args, runner, next_step(nodes, [], settings, racks), tag)
        if args.per_rail:
            if args.rail_test == "rdma":
                from gpuaccept.isolate.rdma import estimate_line

                print("# then, for each bad node, one perftest pair job over its NICs with a good partner: see "
                      "--rails-of NODE=PARTNER --dry-run")
                if ports:
                    print(estimate_line([p.split(":", 1)[0] for p in ports]))
            else:
                print("# then, for each bad node, one test per rail with a good partner, one after the other: "
                      "see --rails-of NODE=PARTNER --dry-run")
        return EXIT_OK
    results: list[Result] = []
    while True:
        step = next_step(nodes, results, settings, racks)
        if not isinstance(step, Round):
            break
        kinds = sorted({t.kind for t in step.tests})
        print(f"[ISOLATE] round {step.number}: {len(step.tests)} test(s) ({', '.join(kinds)})", file=out, flush=True)
        for test, runs in runner.run_round(step, tag):
            results.append(Result(test, step.number, tuple(runs)))
    data = step.to_dict()
    data["tests_run"] = [r.to_dict(settings.threshold) for r in results]
    data["cluster_reports"] = runner.cluster_reports
    for line in table(step):
        print(line, file=out)
    for note in step.notes:
        print(f"[ISOLATE] note: {note}", file=out)
    print(f"[RESULT] {len(step.named('good'))} good, {len(data['suspect'])} suspect, {len(data['bad'])} bad "
          f"after {step.rounds} round(s)" + (f": bad {', '.join(data['bad'])}" if data["bad"] else ""), file=out)
    if args.per_rail:
        data["rails"] = _per_rail(args, runner, step, ports, tag, out)
    drain_failed = _drain(args, step, data, out) if args.drain else 0
    _emit_json(args, data)
    return EXIT_OK if step.all_good and not drain_failed else EXIT_FAILED


def _rail_options(args: argparse.Namespace, runner: Any) -> list[str]:
    """The --rail-ports (validated), and UsageError for rail options that cannot apply."""
    from gpuaccept.isolate.rails import check_rail_backend, parse_rail_ports

    ports = parse_rail_ports(args.rail_ports)
    rail_run = args.per_rail or args.rails_of is not None
    if args.html and not rail_run:
        raise UsageError("--html writes the rails: give --per-rail or --rails-of")
    if ports and not rail_run:
        raise UsageError("--rail-ports is for --per-rail or --rails-of")
    if ports and len(ports) > (_gpus(args)):
        raise UsageError(f"--rail-ports names {len(ports)} ports for {_gpus(args)} GPUs per node "
                         "(--gpus-per-node)")
    if args.rail_test == "rdma":
        from gpuaccept.isolate.rdma import launch_flags

        if not rail_run:
            raise UsageError("--rail-test is for --per-rail or --rails-of")
        launch_flags(args.backend, "node", "partner", [])  # UsageError for a backend that cannot run it
    elif rail_run:
        check_rail_backend(args.backend, runner.pair)
    return ports


def _per_rail(args: argparse.Namespace, runner: Any, verdicts: Any, ports: list[str], tag: str,
              out: Any) -> dict[str, Any]:
    """The rail tests of every bad node, printed as a table per node; their JSON by node. With ``--rail-test
    rdma`` the pair jobs of all bad nodes run at once, each on its own perftest ports."""
    from gpuaccept.isolate import rails as ir
    from gpuaccept.isolate.rail_plan import pick_partner

    found: dict[str, Any] = {}

    def show(report: Any) -> None:
        for line in ir.table(report):
            print(line, file=out)
        print(f"[RAIL] {report.to_dict()['summary']}", file=out)
        found[report.node] = report.to_dict()

    rdma_jobs: list[tuple[str, str, list[str], str]] = []
    for node in verdicts.named("bad"):
        partner = pick_partner(node, verdicts)
        if partner is None:
            print(f"[ISOLATE] note: no good node to test the rails of {node} with", file=out)
            found[node] = {"partner": None, "summary": "not tested: no good partner"}
            continue
        known = ports or ir.ports_from_reports(node, runner.cluster_reports.values())
        where = "--rail-ports" if ports else ("its collectives reports" if known else "unknown: NCCL's choice")
        if args.rail_test == "rdma":
            from gpuaccept.isolate import rdma

            rdma_jobs.append((node, partner, rdma.nics_of(known), where))
        else:
            show(ir.run_rails(runner, ir.plan(runner, node, partner, _gpus(args), known), args.repeat, tag, where,
                              out))
    if rdma_jobs:
        from gpuaccept.isolate import rdma

        plain = dataclasses.replace(runner, launch_args=list(args.launch_arg or []))  # no collectives flags
        for report in rdma.run_many(plain, rdma_jobs, tag, out):
            show(report)
    return found


def _rails_only(args: argparse.Namespace) -> int:
    """``--rails-of NODE=PARTNER``: the rail tests of NODE alone (no rounds)."""
    from gpuaccept.isolate import rails as ir
    from gpuaccept.isolate.pairs import PairRunner
    from gpuaccept.isolate.plan import validate
    from gpuaccept.launch.cli import new_run_id

    for flag, given in (("--nodes", args.nodes), ("--per-rail", args.per_rail), ("--drain", args.drain),
                        ("--racks", args.racks)):
        if given:
            raise UsageError(f"{flag} does not apply to --rails-of, which names its two nodes and runs no rounds")
    node, partner = host_names(list(ir.parse_rails_of(args.rails_of)), "--rails-of")
    validate([node, partner], _settings(args))
    pair = _pair_test(args)
    extra = [*(_collectives_flags(args, pair) if args.rail_test != "rdma" else []), *(args.launch_arg or [])]
    tag = "dry-run" if args.dry_run else new_run_id("rails")
    out = sys.stderr if args.json == "-" else sys.stdout
    runner = PairRunner(args.backend, Path(args.report_dir).resolve(), extra, args.test_timeout, name="isolate",
                        log=out, pair=pair)
    ports = _rail_options(args, runner)
    if args.rail_test == "rdma":
        return _rdma_rails_only(args, runner, node, partner, ports, tag, out)
    tests = ir.plan(runner, node, partner, _gpus(args), ports)
    if args.dry_run:
        print(f"# gpuaccept isolate: the rails of {node}, each with {partner}, one test after the other, each run "
              f"{args.repeat} time(s)")
        for line in ir.dry_run_lines(runner, tests, tag):
            print(line)
        return EXIT_OK
    report = ir.run_rails(runner, tests, args.repeat, tag, "--rail-ports" if ports else "unknown: NCCL's choice",
                          out)
    return _rails_done(args, runner, report, node, out)


def _rails_done(args: argparse.Namespace, runner: Any, report: Any, node: str, out: Any) -> int:
    """Print a node's rail table and summary, write --json/--html, and say whether a rail was bad."""
    from gpuaccept.isolate import rails as ir

    for line in ir.table(report):
        print(line, file=out)
    data = report.to_dict()
    print(f"[RAIL] {data['summary']}", file=out)
    data["node"] = node
    data["cluster_reports"] = runner.cluster_reports
    _emit_json(args, data)
    return EXIT_FAILED if report.bad else EXIT_OK


def _rdma_rails_only(args: argparse.Namespace, runner: Any, node: str, partner: str, ports: list[str], tag: str,
                     out: Any) -> int:
    """``--rails-of NODE=PARTNER --rail-test rdma``: one perftest pair job over every NIC of NODE."""
    from gpuaccept.isolate import rdma

    nics = rdma.nics_of(ports)
    if args.dry_run:
        print(f"# gpuaccept isolate: the rails of {node} with {partner}: perftest on {len(nics)} NICs at once")
        print(shlex.join(rdma.dry_run_line(runner, node, partner, nics, tag)))
        print(rdma.estimate_line(nics))
        return EXIT_OK
    report = rdma.run_rails(runner, node, partner, nics, tag, "--rail-ports", out)
    return _rails_done(args, runner, report, node, out)
