"""Subcommand ``rdma``: parse and judge a saved perftest output, and print the RDMA pair test's plan.

``gpuaccept rdma parse FILE|- [--json] [--rate-gbps N | --port mlx5_0:1 [--sysfs-root DIR]] [--fraction F]
[--min-gbps N] [--max-lat-us N] [--client NAME] [--server NAME]`` parses one side's output of ``ib_write_bw``,
``ib_read_bw``, ``ib_send_bw``, ``ib_write_lat`` or ``ib_read_lat`` (:mod:`gpuaccept.perftest.parse`) and judges it
(:mod:`gpuaccept.perftest.judge`): bandwidth against ``--fraction`` (0.95) x the port rate, the rate given or read
from sysfs (``/sys/class/infiniband/<dev>/ports/<n>/rate`` under ``--sysfs-root``, default ``/``); ``--min-gbps``
overrides. ``gpuaccept rdma plan --nodes A,B --nics mlx5_0,mlx5_1 [--gpus] ...`` prints the server and client
command of every rail (:mod:`gpuaccept.perftest.plan`). Exit 0 pass, 1 a failed or errored output, 2 bad usage or
input.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from typing import Any

from gpuaccept.argtypes import csv, duration, nonneg_int, positive_float, positive_int
from gpuaccept.cliargs import add_json_option
from gpuaccept.errors import InputError, UsageError
from gpuaccept.model import NOT_JUDGED, Status, not_judged_names, state_label
from gpuaccept.outputs import write_output

_PORT = re.compile(r"^([A-Za-z0-9_.-]{1,64}):(\d{1,3})$")
JUDGED = ("Judged: an error line or no result table is an ERROR naming both ends; bandwidth (BW average at the "
          "largest size, Gb/s) against --min-gbps, else --fraction (0.95) x the port rate (--rate-gbps, or --port "
          "read from sysfs; x 2 for a bidirectional -b run); latency (t_typical at the smallest size) only against "
          "--max-lat-us.")


def _fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]")
    return value


def register(subparsers: Any) -> None:
    top = subparsers.add_parser(
        "rdma", help="RDMA bandwidth per NIC with perftest: judge a saved ib_write_bw output, plan pair tests",
        description="perftest (ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat, ib_read_lat) per NIC: judge a "
                    "saved output ('parse'), or print the pair test's commands rail by rail ('plan'). " + JUDGED)
    actions = top.add_subparsers(dest="rdma_action", metavar="ACTION", parser_class=type(top))
    top.set_defaults(handler=lambda _a: _missing_action())
    p = actions.add_parser("parse", help="judge a saved perftest output ('-': stdin)",
                           description="Parse and judge one side's saved perftest output. " + JUDGED)
    p.add_argument("file", metavar="FILE|-", help="the saved output, stdout and stderr together ('-': stdin)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--rate-gbps", type=positive_float, default=None, metavar="N",
                      help="the port rate in Gb/s (as /sys/class/infiniband/DEV/ports/N/rate says)")
    rate.add_argument("--port", default=None, metavar="DEV:PORT",
                      help="read the rate of this port (mlx5_0:1) from sysfs under --sysfs-root")
    p.add_argument("--sysfs-root", default="/", metavar="DIR", help="where --port's sysfs is (default /)")
    p.add_argument("--fraction", type=_fraction, default=None, metavar="F",
                   help="fail below F x the port rate (default 0.95)")
    p.add_argument("--min-gbps", type=positive_float, default=None, metavar="N",
                   help="fail below N Gb/s (overrides the rate x fraction)")
    p.add_argument("--max-lat-us", type=positive_float, default=None, metavar="US",
                   help="latency tests: fail when t_typical is above this (usec)")
    p.add_argument("--client", default=None, metavar="NAME", help="the client end's name, for the verdict")
    p.add_argument("--server", default=None, metavar="NAME", help="the server end's name, for the verdict")
    add_json_option(p, "the parsed output and verdict")
    p.set_defaults(handler=cmd_parse)
    q = actions.add_parser("plan", help="print the pair test's server and client commands, rail by rail",
                           description="Print the perftest commands of a pair test: for each rail i, a server on "
                                       "NIC i of the first node and a client on NIC i of the second, on port "
                                       "--base-port + i + --pair-index x rails; --gpus adds --use_cuda=i "
                                       "(GPUDirect RDMA, where GPUs and nvidia_peermem are present).")
    _plan_options(q)
    add_json_option(q, "the plan")
    q.set_defaults(handler=cmd_plan)
    n = actions.add_parser("pair-node", help="one node's half of a pair test (started by a launcher on both nodes)",
                           description="Run this node's side of every rail of the plan at once: rank 0 of the job "
                                       "the servers, rank 1 the clients; print each line tagged for 'rdma parse'. "
                                       "Takes the options of 'plan'.")
    _plan_options(n)
    n.add_argument("--rank", type=nonneg_int, default=None, help="this node's rank when no launcher sets one")
    n.add_argument("--timeout", type=duration, default=120.0, metavar="DURATION",
                   help="per perftest run (90s, 5m; bare number: seconds; default 2m)")
    n.add_argument("--client-delay", type=duration, default=1.0, metavar="DURATION",
                   help="how long a client waits for its server before connecting (default 1s)")
    n.add_argument("--sysfs-root", default=None, metavar="DIR",
                   help="where the ports' rates and counters are read (default $GPUACCEPT_SYSFS_ROOT, else /: a "
                        "container that mounts the host's /sys under /host sets GPUACCEPT_SYSFS_ROOT=/host)")
    n.add_argument("--memory", choices=("auto", "host", "cuda"), default="auto",
                   help="auto (default): GPU memory where this node has NVIDIA GPUs and nvidia_peermem and perftest "
                        "takes --use_cuda, each NIC with the GPU on its NUMA node (by PCI address where perftest "
                        "takes --use_cuda_bus_id), else host memory; each node decides for its own end")
    n.set_defaults(handler=cmd_pair_node)


def _plan_options(q: argparse.ArgumentParser) -> None:
    q.add_argument("--nodes", type=csv, required=True, metavar="A,B", help="the server node and the client node")
    q.add_argument("--nics", type=csv, required=True, metavar="DEV[,DEV...]", help="the NICs, rail 0 first")
    q.add_argument("--gpus", action="store_true", help="GPU memory: --use_cuda=<rail index> (pair-node without it "
                   "picks each NIC's NUMA-local GPU: --memory)")
    q.add_argument("--test", default="write_bw", help="write_bw (default), read_bw, send_bw, write_lat, read_lat")
    q.add_argument("--base-port", type=positive_int, default=18515, metavar="N", help="default 18515")
    q.add_argument("--pair-index", type=nonneg_int, default=0, metavar="K", help="this pair's index among those "
                   "run at once (default 0)")
    q.add_argument("--perftest-arg", action="append", default=None, metavar="ARG",
                   help="a perftest argument (repeatable; default: -s 1048576 -D 5 -F --report_gbits)")


def _missing_action() -> int:
    raise UsageError("rdma: name an action: parse or plan (gpuaccept rdma --help)")


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    from gpuaccept.inputs import read_bytes

    return read_bytes(path, "perftest output").decode("utf-8", errors="replace")


def port_rate(port: str, root: str) -> float:
    """The data rate in Gb/s of ``DEV:PORT`` as sysfs under ``root`` says (its ``rate`` less the line encoding
    of SDR, DDR, QDR and FDR: :func:`gpuaccept.perftest.judge.data_rate_gbps`); InputError when absent."""
    m = _PORT.match(port)
    if not m:
        raise UsageError(f"--port: {port!r} is not DEV:PORT (e.g. mlx5_0:1)")
    from gpuaccept.hw.rdma import read_inventory

    found = {p.key: p for p in read_inventory(root).ports}
    if port not in found:
        raise InputError(f"--port {port}: no such RDMA port under {root.rstrip('/')}/sys/class/infiniband "
                         f"(found: {', '.join(sorted(found)) or 'none'})")
    found_port = found[port]
    if found_port.rate_gbps is None:
        raise InputError(f"--port {port}: sysfs gives no rate")
    from gpuaccept.perftest.judge import data_rate_gbps

    return data_rate_gbps(found_port.rate_gbps, found_port.speed, found_port.link_layer)


def cmd_parse(args: argparse.Namespace) -> int:
    from gpuaccept.perftest.judge import DEFAULT_FRACTION, ends_of, judge
    from gpuaccept.perftest.parse import parse_text

    text = _read(args.file)
    rate, source = args.rate_gbps, "--rate-gbps"
    if args.port:
        rate, source = port_rate(args.port, args.sysfs_root), f"{args.port} rate"
    if args.fraction is not None and rate is None:
        raise UsageError("--fraction needs a port rate: --rate-gbps N or --port DEV:PORT")
    if "\n@rdma " in f"\n{text}":
        return _parse_pair_log(text, args, rate)
    result = parse_text(text)
    j = judge(result, rate_gbps=rate, rate_source=source, fraction=args.fraction or DEFAULT_FRACTION,
              min_gbps=args.min_gbps, max_lat_us=args.max_lat_us, ends=ends_of(result, args.client, args.server))
    unjudged = not_judged_names(j.metrics)
    if args.json:
        doc: dict[str, Any] = {"status": j.status.value, "reason": j.reason, **result.to_dict(),
                               "metrics": [m.to_dict() for m in j.metrics]}
        if unjudged:
            doc["not_judged"] = unjudged
        write_output(args.json, json.dumps(doc, indent=2) + "\n", "--json")
    if args.json != "-":
        print("\n".join(table(result)))
        shown = NOT_JUDGED if j.status is Status.PASS and unjudged else j.status.value
        print(f"{state_label(shown)}: {j.reason}")
    return 0 if j.status in (Status.PASS, Status.WARN, Status.SKIP) else 1


def _parse_pair_log(text: str, args: argparse.Namespace, rate: float | None) -> int:
    """A pair test's job log (``rdma pair-node`` on both nodes): one line per rail, then the worst status."""
    from gpuaccept.model import worst
    from gpuaccept.perftest.judge import DEFAULT_FRACTION
    from gpuaccept.perftest.pairrun import judge_rails, rail_line, read_log

    rails = judge_rails(read_log(text), rate_gbps=rate, fraction=args.fraction or DEFAULT_FRACTION,
                        min_gbps=args.min_gbps)
    status = worst(*(r.judgement.status for r in rails))
    if args.json:
        doc = {"status": status.value, "rails": [r.to_dict() for r in rails]}
        write_output(args.json, json.dumps(doc, indent=2) + "\n", "--json")
    if args.json != "-":
        for r in rails:
            print(f"{r.judgement.status.value.upper()}: {r.judgement.reason}")
        bad = [rail_line(r) for r in rails if r.judgement.status.is_failure]
        print(f"{state_label(status.value)}: {len(rails)} rails" + (": " + "; ".join(bad) if bad else ""))
    return 0 if status in (Status.PASS, Status.WARN, Status.SKIP) else 1


def cmd_pair_node(args: argparse.Namespace) -> int:
    import os
    import shutil

    from gpuaccept.perftest.node import job_rank, own_gpus, run_node

    rank = job_rank(os.environ, args.rank, args.nodes)
    args.sysfs_root = args.sysfs_root or os.environ.get("GPUACCEPT_SYSFS_ROOT") or "/"
    gpus: list[int] | None = None
    bus: list[str | None] | None = None
    if args.gpus:
        gpus, why = list(range(len(args.nics))), "GPU memory (--gpus: --use_cuda=<rail index>)"
    else:
        from gpuaccept.hw.rdma import read_inventory
        from gpuaccept.perftest.loopback import help_of

        binary = shutil.which(f"ib_{args.test}")
        help_text = help_of(binary) if binary and args.memory != "host" else None
        gpus, bus, why = own_gpus(read_inventory(args.sysfs_root), args.nics, args.memory, help_text, os.environ)
    print(f"rdma pair-node: {why}", file=sys.stderr)
    return run_node(_plan(args, gpus, bus), rank, timeout_s=args.timeout, sysfs_root=args.sysfs_root,
                    client_delay_s=args.client_delay)


def table(result: Any) -> list[str]:
    """The parsed output as a few lines: what ran, then its rows."""
    side = result.side or "side unknown"
    if result.kind is None:
        return ["perftest output without a test header (it stopped before the test began)"]
    head = [f"{result.test} ({side}; device {result.device or '?'}"
            + (f", GPU {result.cuda_device}" if result.cuda_device else "")
            + (", bidirectional" if result.bidirectional else "")
            + (f", printed in {result.unit}" if result.unit else "") + ")"]
    if result.bw_rows:
        head.append(f"{'size (B)':>10} {'iters':>10} {'peak Gb/s':>10} {'avg Gb/s':>10} {'Mpps':>9}")
        head += [f"{r.size_bytes:>10} {r.iterations:>10} {r.peak_gbps:>10.2f} {r.avg_gbps:>10.2f} "
                 f"{r.msg_rate_mpps:>9.6f}" for r in result.bw_rows]
    if result.lat_rows:
        def cell(x: float | None) -> str:
            return f"{'-':>8}" if x is None else f"{x:>8.2f}"

        head.append(f"{'size (B)':>10} {'iters':>10} {'min us':>8} {'typ us':>8} {'avg us':>8} {'p99 us':>8} "
                    f"{'max us':>8}")
        head += [f"{r.size_bytes:>10} {r.iterations:>10} {cell(r.t_min_us)} {cell(r.t_typical_us)} "
                 f"{cell(r.t_avg_us)} {cell(r.p99_us)} {cell(r.t_max_us)}" for r in result.lat_rows]
    return head


def _plan(args: argparse.Namespace, gpus: list[int] | None = None, bus: list[str | None] | None = None) -> Any:
    from gpuaccept.perftest.plan import DEFAULT_ARGS, pair_plan

    if len(args.nodes) != 2:
        raise UsageError(f"--nodes names {len(args.nodes)} nodes; name two: the server's and the client's")
    extra = tuple(args.perftest_arg) if args.perftest_arg else DEFAULT_ARGS
    if gpus is None and args.gpus:
        gpus = list(range(len(args.nics)))
    return pair_plan(args.nodes[0], args.nodes[1], args.nics, args.nics, test=args.test, gpus=gpus,
                     base_port=args.base_port, pair_index=args.pair_index, args=extra, bus_ids=bus)


def cmd_plan(args: argparse.Namespace) -> int:
    rails = _plan(args)
    if args.json:
        write_output(args.json, json.dumps([r.to_dict() for r in rails], indent=2) + "\n", "--json")
    if args.json != "-":
        for r in rails:
            print(f"# rail {r.rail}: {r.server_node} {r.server_nic} <- {r.client_node} {r.client_nic}, port {r.port}")
            print(f"{r.server_node}$ {shlex.join(r.server_argv)}")
            print(f"{r.client_node}$ {shlex.join(r.client_argv)}")
    return 0
