"""``gpuaccept history``, ``compare`` and ``trend``: the history store on the command line.

Exit codes: 0 done, 1 ``trend`` found a regression in the newest run, 2 bad
input (unknown run id, bad URL, bad --since, a database gpuaccept must not
touch). Nothing heavy is imported until a command runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from gpuaccept.argtypes import nonneg_float as _nonneg_float
from gpuaccept.argtypes import nonneg_int as _nonneg_int
from gpuaccept.argtypes import positive_float as _positive_float
from gpuaccept.argtypes import positive_int as _positive_int
from gpuaccept.cliargs import add_json_option, hidden_alias
from gpuaccept.inputs import did_you_mean, shown_names


def _gpu_uuid(text: str) -> str:
    """argparse type: a GPU UUID (``GPU-`` optional), canonical; one clear line when malformed."""
    from gpuaccept.errors import InputError
    from gpuaccept.hw.identity import normalize_gpu_uuid

    try:
        return normalize_gpu_uuid(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port_guid(text: str) -> str:
    """argparse type: an RDMA port GUID, canonical (``0x`` + 16 hex digits)."""
    from gpuaccept.errors import InputError
    from gpuaccept.hw.identity import normalize_guid

    try:
        return normalize_guid(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _hardware_options(p: Any, what: str) -> Any:
    """``--gpu UUID`` and ``--nic GUID`` (one of them) on parser ``p``; returns the group."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gpu", type=_gpu_uuid, default=None, metavar="UUID",
                   help=f"{what} of this GPU on any host, by its UUID (GPU-..., as 'nvidia-smi -L' prints it)")
    g.add_argument("--nic", type=_port_guid, default=None, metavar="GUID",
                   help=f"{what} of this RDMA port on any host, by its port GUID (0x..., as ibstat prints it)")
    return g


DB_HELP = ("history database URL: sqlite:///PATH, sqlite:////ABS/PATH or postgresql://USER@HOST[:PORT]/DB "
           "(default: $GPUACCEPT_DB, else ~/.local/share/gpuaccept/history.db)")


def register(sub: Any) -> None:
    """Add ``history``, ``compare`` and ``trend`` to the top-level subparsers."""
    h = sub.add_parser("history", help="list stored runs (node and cluster)",
                       description="List runs stored in the history, newest first. Node runs that belong to a "
                                   "cluster run are listed under it unless --host or --all-nodes is given.")
    h.add_argument("--host", default=None, help="only node runs on this host")
    _hardware_options(h, "only the node runs")
    h.add_argument("--check", default=None, metavar="NAME", help="only runs that ran this check")
    h.add_argument("--since", default=None, metavar="WHEN",
                   help="only runs started since WHEN: 2026-11-01, 2026-11-01T08:00Z (UTC), 12h, 7d, 2w, today")
    h.add_argument("--kind", choices=("node", "cluster"), default=None, help="only node or only cluster runs")
    h.add_argument("--all-nodes", action="store_true", help="also list node runs that belong to cluster runs")
    h.add_argument("--limit", type=_nonneg_int, default=50, metavar="N", help="at most N runs (0: all; default 50)")
    h.add_argument("--import", dest="import_paths", nargs="+", default=None, metavar="PATH",
                   help="store report.json files (or every report.json under a directory) and exit")
    h.add_argument("--db", default=None, metavar="URL", help=DB_HELP)
    add_json_option(h, "the runs")
    h.set_defaults(handler=cmd_history)

    c = sub.add_parser("compare", help="per-metric deltas between two runs",
                       description="Per-metric differences from RUN_A to RUN_B (absolute and %). A run is a run id "
                                   "from 'gpuaccept history' (a unique prefix will do) or a report.json file. A "
                                   "difference within the metric's run-to-run noise is 'same': 3 x the standard "
                                   "deviation of the host's last runs of that metric where the history holds "
                                   "at least 4, else a default per family of metrics (throughput 3%, time and "
                                   "power 5%, temperature 3 C, counts exact; the output lists them all).")
    c.add_argument("run_a", metavar="RUN_A")
    c.add_argument("run_b", metavar="RUN_B")
    c.add_argument("--check", default=None, metavar="NAME", help="only this check's metrics")
    c.add_argument("--metric", default=None, metavar="NAME", help="only this metric")
    c.add_argument("--host", default=None, help="only this host (in cluster runs)")
    c.add_argument("--noise-pct", type=_nonneg_float, default=None, metavar="PCT",
                   help="differences within PCT %% of A are 'same', for every metric (default: each metric's "
                        "run-to-run noise from the history, else its family's default; 0: any difference counts)")
    c.add_argument("--db", default=None, metavar="URL",
                   help=DB_HELP + "; with two report files, the history is read for the noise only when --db is given")
    add_json_option(c, "the comparison")
    c.set_defaults(handler=cmd_compare)

    t = sub.add_parser("trend", help="a metric over time on one node or GPU, with regressions flagged",
                       description="Show METRIC over time on HOST (or of one GPU or RDMA port, wherever it was) "
                                   "and flag a regression against the hardware's own past: a GPU that moved "
                                   "keeps its history, one that replaced another in the same slot starts a new "
                                   "one. One noisy run is never a regression: a run is judged by the median of "
                                   "the last --recent runs (it and the ones just before it), which must be worse "
                                   "than the median of the runs before those (at least --min-history, at most "
                                   "--window of them) by more than --max-z robust deviations (1.4826 x "
                                   "their MAD) and by more than --min-drop-pct. With the defaults a drop is "
                                   "flagged once it holds for 2 of the last 3 runs, after 6 runs in all. "
                                   "Exit 1 when the newest run regressed (--no-exit-code: 0).")
    who = t.add_mutually_exclusive_group(required=True)
    who.add_argument("--host", default=None, help="the node (its GPUs' histories follow them from other hosts)")
    who.add_argument("--gpu", type=_gpu_uuid, default=None, metavar="UUID",
                     help="one GPU on whichever hosts it was, by its UUID (GPU-..., as 'nvidia-smi -L' prints it)")
    who.add_argument("--nic", type=_port_guid, default=None, metavar="GUID",
                     help="one RDMA port on whichever hosts it was, by its port GUID (0x..., as ibstat prints it)")
    t.add_argument("--metric", required=True, metavar="NAME", help="metric name, e.g. gemm_bf16_tflops")
    t.add_argument("--check", default=None, metavar="NAME", help="only this check's values of the metric")
    t.add_argument("--device", default=None, metavar="DEV", help="only this device of HOST, e.g. cuda:0")
    t.add_argument("--since", default=None, metavar="WHEN", help="only runs since WHEN (as for history)")
    z = t.add_argument("--max-z", type=_positive_float, default=3.0, metavar="Z",
                       help="a regression is worse by more than Z robust deviations (default 3)")
    hidden_alias(t, "--max-drop-sigma", z)
    t.add_argument("--min-drop-pct", type=_nonneg_float, default=5.0, metavar="PCT",
                   help="and worse by more than this %% of the earlier median (default 5)")
    t.add_argument("--window", type=_positive_int, default=20, metavar="N",
                   help="judge against at most the N previous runs (default 20)")
    t.add_argument("--min-history", type=_positive_int, default=3, metavar="N",
                   help="earlier runs needed before judging (default 3)")
    t.add_argument("--recent", type=_positive_int, default=3, metavar="K",
                   help="judge the median of the last K runs (default 3; 1 judges each run alone)")
    t.add_argument("--direction", choices=("auto", "higher", "lower"), default="auto",
                   help="which way is better (auto: from the threshold, unit and name)")
    t.add_argument("--db", default=None, metavar="URL", help=DB_HELP)
    add_json_option(t, "the trend")
    t.add_argument("--exit-code", action=argparse.BooleanOptionalAction, default=True,
                   help="exit 1 when a regression is found (the default; --no-exit-code: exit 0)")
    t.set_defaults(handler=cmd_trend)


# ---- formatting ---------------------------------------------------------------------------------------------------
def _num(x: float | None, digits: int = 6) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 100:+.1f}%"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _dump(dest: str, data: Any) -> None:
    """``data`` as JSON to ``--json``'s PATH, or stdout for ``-``."""
    from gpuaccept.outputs import write_output

    write_output(dest, json.dumps(data, indent=2, allow_nan=False) + "\n", "--json")


def _tags(tags: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(tags.items()))


# ---- report files ---------------------------------------------------------------------------------------------------
def load_report_file(path: Path) -> Any:
    """A NodeReport or ClusterReport from a JSON file, validated by the one report loader
    (:func:`gpuaccept.results.load.load_file`); InputError naming the file when it is not one."""
    from gpuaccept.results.load import load_file

    return load_file(path)


def _report_files(paths: list[str]) -> list[tuple[Path, Any]]:
    """(source, report) for every report named: a file, a run directory (report.json, else the
    results.jsonl of a run whose report.json is missing), or every report.json below a directory."""
    from gpuaccept.errors import InputError
    from gpuaccept.results.load import CLUSTER_FILE, NODE_FILE, RESULTS_FILE, load_dir

    found: list[tuple[Path, Any]] = []
    for text in paths:
        p = Path(text)
        if p.is_dir():
            if any((p / name).is_file() for name in (CLUSTER_FILE, NODE_FILE, RESULTS_FILE)):
                found.append((p, load_dir(p)))
                continue
            files = sorted(f for f in p.glob("**/report.json") if f.is_file())
            if not files:
                raise InputError(f"{p}: no report.json below this directory")
            found += [(f, load_report_file(f)) for f in files]
        elif p.is_file():
            found.append((p, load_report_file(p)))
        else:
            raise InputError(f"{p}: no such file or directory")
    return found


def _streamed(path: Path) -> Path | None:
    """The line-layout cluster report (:mod:`gpuaccept.results.clusterfile`) that ``path`` names, itself or as
    a run directory's ``cluster-report.json``: imported a node at a time. None for any other report."""
    from gpuaccept.results.clusterfile import is_line_layout
    from gpuaccept.results.load import CLUSTER_FILE

    candidate = path / CLUSTER_FILE if path.is_dir() else path
    return candidate if is_line_layout(candidate) else None


def _import(args: argparse.Namespace) -> int:
    """``history --import``: every report file is read and checked before anything is stored, except a
    cluster report in the line layout, checked a node at a time as it is stored (in one transaction, so a bad
    line stores nothing of it). Those are stored first: only a second one of them can fail after another
    report was stored."""
    from gpuaccept.model import ClusterReport
    from gpuaccept.results.history import open_store
    from gpuaccept.results.import_rows import open_cluster_rows
    from gpuaccept.results.timespec import epoch_to_iso

    streams = {i: (text, found) for i, text in enumerate(args.import_paths)
               if (found := _streamed(Path(text))) is not None}
    whole = [(i, f, rep) for i, text in enumerate(args.import_paths) if i not in streams
             for f, rep in _report_files([text])]
    with open_store(args.db) as store:
        stored: list[tuple[int, dict[str, str]]] = []
        for i, (text, path) in streams.items():
            stored_at = epoch_to_iso(time.time())  # the node rows are made with it in worker processes
            run_id = store.add_cluster_stream(functools.partial(open_cluster_rows, path, stored_at),
                                              stored_at=stored_at)
            stored.append((i, {"file": text, "run_id": run_id}))
        for i, f, rep in whole:
            if isinstance(rep, ClusterReport):
                store.add_cluster_report(rep)
            else:
                store.add_node_report(rep)
            stored.append((i, {"file": str(f), "run_id": rep.run_id}))
        listed = [item for _, item in sorted(stored, key=lambda pair: pair[0])]  # in the order given
        if args.json:
            _dump(args.json, {"db": str(store), "stored": listed})
        if args.json != "-":
            for item in listed:
                print(f"stored {item['run_id']} from {item['file']}")
            print(f"{len(listed)} report(s) stored in {store}")
    return 0


# ---- commands --------------------------------------------------------------------------------------------------------
def cmd_history(args: argparse.Namespace) -> int:
    from gpuaccept.results.history import open_store
    from gpuaccept.results.timespec import parse_since

    since = parse_since(args.since) if args.since else None
    if args.import_paths:
        return _import(args)
    hw, kind = _hardware_arg(args)
    with open_store(args.db, read_only=True) as store:
        known_check(store, args.check)
        runs = store.list_runs(host=args.host, check=args.check, since=since, kind=args.kind,
                               limit=args.limit or None, include_members=args.all_nodes, hw_id=hw)
        seen = store.sightings([hw]) if hw is not None else []
        where = str(store)
    if args.json:
        listed = [r.to_dict() for r in runs]
        if hw is not None:
            serial = next((s.serial for s in seen if s.serial), None)
            _dump(args.json, {"hardware": {"kind": kind, "id": hw, "serial": serial,
                                           "seen": [s.to_dict() for s in seen]}, "runs": listed})
        else:
            _dump(args.json, listed)
        if args.json == "-":
            return 0
    if hw is not None:
        if not seen:
            print(f"no run recorded {kind.upper()} {hw} in {where}")
            return 0
        print(_where_seen(kind, hw, seen))
    if not runs:
        print(f"no runs match in {where}")
        return 0
    rows = []
    for r in runs:
        checks = " ".join(f"{n} {s}" for s, n in sorted(r.checks.items()))
        who = r.host if r.kind == "node" else f"{r.nodes}/{r.expected_nodes or r.nodes} nodes"
        extra = r.failed[:4] + (["..."] if len(r.failed) > 4 else [])
        rows.append([r.run_id, r.kind, who, r.started, r.verdict, r.profile or r.backend or "-", r.sku or "-",
                     checks or "-", ",".join(extra) or "-", r.parent_run_id or "-"])
    print(_table(["RUN", "KIND", "HOST", "STARTED", "VERDICT", "PROFILE/BACKEND", "SKU", "CHECKS", "FAILED",
                  "IN CLUSTER"], rows))
    return 0


def known_check(store: Any, check: str | None) -> None:
    """UsageError when ``--check`` names neither a check of this gpuaccept nor one a stored run ran (a typo
    would otherwise list nothing), with a "did you mean"."""
    if check is None:
        return
    from gpuaccept.checks import registry
    from gpuaccept.errors import UsageError

    known = sorted(set(store.check_names()) | set(registry()))
    if check not in known:
        raise UsageError(f"--check {check!r}: no such check{did_you_mean(check, known)}; known: {', '.join(known)}")


def _hardware_arg(args: argparse.Namespace) -> tuple[str | None, str]:
    """(id, kind) of ``--gpu``/``--nic``; (None, "") when neither was given."""
    if getattr(args, "gpu", None):
        return args.gpu, "gpu"
    if getattr(args, "nic", None):
        return args.nic, "nic"
    return None, ""


def _where_seen(kind: str, hw: str, seen: list[Any]) -> str:
    """``GPU GPU-... (serial S): cuda:0 on gpu01 from ... to ... (3 runs)``, one line per place, then a blank."""
    serial = next((s.serial for s in seen if s.serial), None)
    lines = [f"{kind.upper()} {hw}" + (f" (serial {serial})" if serial else "") + ":"]
    lines += [f"  {s.device or '(node)'} on {s.host} from {s.first} to {s.last} ({s.runs} run{'s' * (s.runs != 1)})"
              for s in seen]
    return "\n".join(lines) + "\n"


def _resolve(store: Any, ref: str) -> Any:
    p = Path(ref)
    if ref.endswith(".json") or p.is_file():
        return load_report_file(p)
    return store.get_run(ref).report


def cmd_compare(args: argparse.Namespace) -> int:
    from gpuaccept.results.compare import compare_reports
    from gpuaccept.results.history import open_store

    def load(store: Any) -> tuple[Any, Any, Any]:
        a, b = _resolve(store, args.run_a), _resolve(store, args.run_b)
        return a, b, _noise_policy(store, args, a, b)

    if all(r.endswith(".json") or Path(r).is_file() for r in (args.run_a, args.run_b)) and args.db is None:
        a, b, noise = load(None)
    else:
        with open_store(args.db, read_only=True) as store:
            a, b, noise = load(store)
    cmp = compare_reports(a, b, check=args.check, metric=args.metric, host=args.host, noise=noise)
    if args.json:
        _dump(args.json, cmp.to_dict())
        if args.json == "-":
            return 0
    print(f"A: {cmp.run_a}\nB: {cmp.run_b}")
    if not cmp.deltas:
        print("no metric is in both runs" + (" (after the filters)" if args.check or args.metric or args.host else ""))
    else:
        rows = [[d.host or "-", d.check, d.metric, d.device or "-", _tags(d.tags) or "-", _num(d.a), _num(d.b),
                 _num(d.delta), _pct(d.change), d.unit, "" if d.noise is None else f"±{_num(d.noise)}",
                 d.verdict] for d in cmp.deltas]
        print(_table(["HOST", "CHECK", "METRIC", "DEVICE", "TAGS", "A", "B", "DELTA", "CHANGE", "UNIT", "NOISE",
                      "VERDICT"], rows))
        n = cmp.counts()
        print(f"{len(cmp.deltas)} metrics compared: {n['worse']} worse in B, {n['better']} better, {n['same']} "
              f"same (within noise)" + (f", {n['n/a']} without a value" if n["n/a"] else ""))
        print(_noise_line(cmp, args.noise_pct))
    if cmp.only_a or cmp.only_b:
        print(f"only in A: {len(cmp.only_a)} metrics; only in B: {len(cmp.only_b)} metrics (--json lists them)")
    return 0


def _noise_policy(store: Any, args: argparse.Namespace, a: Any, b: Any) -> Any:
    """The noise floors of ``compare``: ``--noise-pct``, else the history of the hosts compared (when a store
    is open), else the family defaults."""
    from gpuaccept.results.compare import hosts_of, run_ids_of
    from gpuaccept.results.noise import NoisePolicy, history_values
    from gpuaccept.results.trend import VOLATILE_TAGS

    if args.noise_pct is not None or store is None:
        return NoisePolicy(override_pct=args.noise_pct)
    hosts = sorted(hosts_of(a) | hosts_of(b))
    points = store.metric_points(metric=args.metric, hosts=hosts, check=args.check)
    skip = {a.run_id, b.run_id} | run_ids_of(a) | run_ids_of(b)
    return NoisePolicy(history=history_values(points, skip, VOLATILE_TAGS))


def _noise_line(cmp: Any, override: float | None) -> str:
    """``noise floors: 12 from the history (3 x stddev of the last runs), 40 family defaults (...)``."""
    from gpuaccept.results.noise import defaults_text

    if override is not None:
        return f"noise floor: {override:g}% of A for every metric (--noise-pct)"
    hist = sum(d.noise_from.startswith("history") for d in cmp.deltas)
    text = "noise floors: " + (f"{hist} from the history (3 x stddev of the host's last runs), " if hist else "")
    return text + f"defaults by family: {defaults_text()} (--noise-pct to set one for all)"


def _trend_series(store: Any, args: argparse.Namespace, since: float | None, rule: Any) -> tuple[list[Any], str]:
    """(series, who): the trends of ``--metric`` for ``--host`` (its hardware's histories, from
    whichever hosts they come) or for ``--gpu``/``--nic``; InputError naming what exists when none."""
    from gpuaccept.errors import InputError, UsageError
    from gpuaccept.results.trend import build_trends

    known_check(store, args.check)
    hw, kind = _hardware_arg(args)
    if hw is not None:
        if args.device is not None:
            raise UsageError("--device goes with --host: --gpu and --nic name the hardware itself")
        seen = store.sightings([hw])
        if not seen:
            raise InputError(f"no run recorded {kind.upper()} {hw} in {store} ({store.hardware_count(kind)} "
                             f"{kind.upper()}s recorded, by the env check of each run)")
        points = store.metric_points(metric=args.metric, hosts=sorted({s.host for s in seen}), since=since,
                                     check=args.check)
        series = [s for s in build_trends(points, rule, args.direction) if s.hw_id == hw]
        if not series:
            names = store.metric_names(hw_id=hw)
            if args.metric not in names:
                raise InputError(f"{kind.upper()} {hw} has no metric {args.metric!r} in {store}"
                                 f"{did_you_mean(args.metric, names)} (metrics: {shown_names(args.metric, names)})")
            raise InputError(f"no values of {args.metric} of {hw} match --check/--since")
        return series, hw
    own = store.metric_series(args.host, args.metric, since=since, check=args.check, device=args.device)
    if not own:
        hosts = store.hosts()
        if args.host not in hosts:
            raise InputError(f"no runs of host {args.host!r} in {store}{did_you_mean(args.host, hosts)} "
                             f"(hosts: {shown_names(args.host, hosts, 10)})")
        names = store.metric_names(args.host)
        if args.metric not in names:
            raise InputError(f"host {args.host!r} has no metric {args.metric!r} in {store}"
                             f"{did_you_mean(args.metric, names)} (metrics: {shown_names(args.metric, names)})")
        raise InputError(f"no values of {args.metric} on {args.host} match --check/--device/--since")
    ids = sorted({p.hw_id for p in own if p.hw_id is not None})
    hosts = sorted({s.host for s in store.sightings(ids)} | {args.host})
    points = store.metric_points(metric=args.metric, hosts=hosts, since=since, check=args.check)
    series = [s for s in build_trends(points, rule, args.direction)
              if any(p.host == args.host and (args.device is None or p.device == args.device) for p in s.points)]
    return series, args.host


def _gone(s: Any, host: str | None) -> str | None:
    """Why series ``s`` is no longer on ``host`` (None: it is, or no host was asked for)."""
    if host is None:
        return None
    last = s.points[-1]
    if last.host != host:
        return f"moved: now on {last.host} as {last.device or '(node)'}"
    if s.replaced_by is not None and s.hw_kind == "node":
        return f"replaced: the node's board is now {s.replaced_by}"
    if s.replaced_by is not None:
        return f"replaced: {last.device} now holds {s.replaced_by}"
    return None


def cmd_trend(args: argparse.Namespace) -> int:
    from gpuaccept.results.history import open_store
    from gpuaccept.results.timespec import parse_since
    from gpuaccept.results.trend import TrendRule

    since = parse_since(args.since) if args.since else None
    rule = TrendRule(max_drop_sigma=args.max_z, min_drop_frac=args.min_drop_pct / 100.0,
                     window=args.window, min_history=args.min_history, recent=args.recent)
    with open_store(args.db, read_only=True) as store:
        series, who = _trend_series(store, args, since, rule)
    host = args.host
    gone = {id(s): _gone(s, host) for s in series}
    judged = [s for s in series if gone[id(s)] is None]
    regressed = [s for s in judged if s.regressed]
    if args.json:
        hw, kind = _hardware_arg(args)
        head = {"host": host, "metric": args.metric} if hw is None else {kind: hw, "metric": args.metric}
        _dump(args.json, {**head, "rule": rule.__dict__, "regressed": bool(regressed),
                          "series": [{**s.to_dict(), "gone": gone[id(s)]} for s in series]})
        if args.json == "-":
            return 1 if regressed and args.exit_code else 0
    for s in series:
        better = "higher" if s.higher_is_better else "lower"
        note = f" ({gone[id(s)]}; not judged)" if gone[id(s)] else ""
        serial = f"; serial {s.hw_serial}" if s.hw_serial and s.hw_kind == "gpu" else ""
        print(f"{who} {s.describe(with_hw=host is not None)} [{s.unit}, {better} is better{serial}]{note}")
        where = s.moved or host is None
        rows = [[p.started, p.run_id, *([f"{p.host} {p.device or '(node)'}"] if where else []), _num(p.value),
                 _num(p.recent), _num(p.reference), _num(p.deviation, 3), _pct(p.change),
                 "REGRESSION" if p.regression else ("" if p.reference is not None else "(too little history)")]
                for p in s.points]
        print(_table(["STARTED", "RUN", *(["WHERE"] if where else []), "VALUE", f"LAST {rule.recent} MEDIAN",
                      "EARLIER MEDIAN", "WORSE BY (SIGMA)", "CHANGE", ""], rows))
        print()
    for s in regressed:
        p = s.points[-1]
        what = f"{_num(p.value)} {s.unit}" if rule.recent == 1 else \
            f"median {_num(p.recent)} {s.unit} of the last {rule.recent} runs"
        on = f" (on {p.host})" if host is None else ""
        print(f"REGRESSION: {who} {s.describe(with_hw=host is not None)}{on}: {what} vs median {_num(p.reference)} of "
              f"{p.history} earlier runs ({_pct(p.change)}, {_num(p.deviation, 3)} robust deviations worse)",
              file=sys.stdout)
    if not regressed:
        latest = [s for s in judged if s.latest is not None and s.latest.reference is not None]
        if latest:
            print(f"no regression in the newest run ({len(latest)} series judged)")
        else:
            print(f"not enough history to judge: fewer than {rule.recent} recent and {rule.min_history} earlier "
                  "runs")
    return 1 if regressed and args.exit_code else 0
