"""Subcommands ``report`` (render a run as HTML, Markdown, JSON, JUnit or Prometheus) and ``serve-metrics``.

``gpuaccept report REF --format FMT [--output PATH]``: REF is a run id (or a
unique prefix) from the history, a ``report.json`` or cluster report file, or
a run directory. Output goes to stdout, except HTML, which is written beside the
report unless ``--output`` says otherwise (``--output -`` for stdout):
``report.json`` -> ``report.html``, ``cluster-report.json`` -> ``cluster-report.html``,
``X.json`` -> ``X.html`` (``X-<host>.html`` with ``--host``), a run id -> its run
directory under the report directory; only a run found in the history alone,
with no run directory here, goes to ``./gpuaccept-<run-id>.html``. The directory
written into must be a real directory (not a link) of this user that no one
else may write to (:func:`gpuaccept.safefs.check_private`). ``--output DIR`` writes
``DIR/gpuaccept.prom`` for Prometheus (a stable name for node_exporter's
textfile directory) and ``DIR/gpuaccept-<run-id>.<ext>`` otherwise. Files are
written atomically. Exit 0 once rendered (with ``--exit-code``: 1 when the run
did not succeed), 2 when REF cannot be read.

Nothing here imports torch or prometheus_client at module level.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gpuaccept.argtypes import duration_up_to
from gpuaccept.cliargs import hidden_alias
from gpuaccept.errors import GpuacceptError, UsageError

FORMATS = {"html": "html", "md": "md", "markdown": "md", "json": "json", "junit": "xml", "prom": "prom",
           "prometheus": "prom"}
DEFAULT_PORT = 9835
REPORT_DIR_ENV = "GPUACCEPT_REPORT_DIR"


def _default_report_dir() -> str:
    return os.environ.get(REPORT_DIR_ENV, "gpuaccept-reports")


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return int(text)


MAX_AGE_S = 10 * 366 * 86400.0
"""The longest ``serve-metrics --max-age`` (ten years)."""


def register(subparsers: Any) -> None:
    rep = subparsers.add_parser(
        "report", help="render a run as HTML, Markdown, JSON, JUnit XML or a Prometheus textfile",
        description="Render a node or cluster run. REF is a run id (or unique prefix) in the history, a report.json "
                    "or cluster report file, or a run directory. Output goes to stdout, except HTML, which is written "
                    "beside the report (report.json -> report.html) unless --output says otherwise ('-' for "
                    "stdout); a run known only to the history goes to ./gpuaccept-<run-id>.html.")
    rep.add_argument("ref", metavar="REF", help="run id, report file or run directory")
    fmt = rep.add_argument("--format", choices=sorted(FORMATS), default="html",
                           help="html (default), md, json, junit (JUnit XML), prom (node_exporter textfile)")
    hidden_alias(rep, "-f", fmt)
    rep.add_argument("--output", "-o", default=None, metavar="PATH",
                     help="file or directory to write ('-' for stdout); a regular file is replaced atomically, "
                          "a device or FIFO written as a stream, a symbolic link to a file refused")
    rep.add_argument("--host", default=None, help="only this node of a cluster run (or of a run id shared by nodes)")
    rep.add_argument("--db", default=None, metavar="URL",
                     help="history store to look run ids up in (default: $GPUACCEPT_DB or the user's history.db)")
    rep.add_argument("--report-dir", default=None, metavar="DIR",
                     help=f"where run directories are looked up by run id (default: ${REPORT_DIR_ENV} "
                          "or ./gpuaccept-reports)")
    rep.add_argument("--exit-code", action="store_true",
                     help="exit 1 when the run did not succeed (like 'git diff --exit-code'; default: exit 0 "
                          "once the report is written)")
    rep.set_defaults(handler=cmd_report)

    srv = subparsers.add_parser(
        "serve-metrics", help="serve the latest results on HTTP for Prometheus",
        description="Expose the newest report of every host (and the newest cluster run) as Prometheus metrics, "
                    "read afresh at each scrape. Source: a report directory (default: $GPUACCEPT_REPORT_DIR or "
                    "./gpuaccept-reports) or the history store (--db).")
    srv.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any free)")
    srv.add_argument("--bind", default="0.0.0.0", metavar="ADDR", help="address to listen on (default 0.0.0.0)")
    src = srv.add_mutually_exclusive_group()
    src.add_argument("--report-dir", dest="source_dir", default=None, metavar="DIR",
                     help="report directory with <run-id>/report.json and cluster-report.json files")
    hidden_alias(src, "--from", src._group_actions[-1])
    src.add_argument("--db", default=None, metavar="URL", help="history store URL (sqlite:///... or postgresql://...)")
    srv.add_argument("--max-age", type=duration_up_to(MAX_AGE_S), default=None, metavar="DURATION",
                     help="ignore runs that started longer ago than this (e.g. 30d)")
    srv.set_defaults(handler=cmd_serve_metrics)


def render(report: Any, fmt: str, analysis: dict[str, Any] | None = None, grid: Any = None) -> str:
    """``report`` in format ``fmt`` (a key of FORMATS) as text; ``analysis`` marks outliers (not used by json);
    ``grid``: the HTML page's :class:`~gpuaccept.report.grid.GridBuilder` when gathered while reading."""
    kind = FORMATS[fmt]
    if kind == "html":
        from gpuaccept.report.html import render_html

        return render_html(report, analysis=analysis, grid=grid)
    if kind == "md":
        from gpuaccept.report.markdown import render_markdown

        return render_markdown(report, analysis)
    if kind == "xml":
        from gpuaccept.report.junit import render_junit

        return render_junit(report, analysis)
    if kind == "prom":
        from gpuaccept.report.prometheus import render_prometheus

        return render_prometheus(report, analysis)
    import json

    return json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"


def analysis_for(report: Any) -> dict[str, Any] | None:
    """The report's outlier analysis: a cluster report's stored one, else computed now (None if that fails)."""
    from gpuaccept.model import ClusterReport

    if isinstance(report, ClusterReport) and report.analysis:
        return None  # the renderers use the stored analysis
    try:
        from gpuaccept.results.analysis import analyze

        result: dict[str, Any] = analyze(report)
        return result
    except (GpuacceptError, ValueError, KeyError, TypeError) as exc:
        print(f"gpuaccept: warning: outlier analysis skipped: {exc}", file=sys.stderr)
        return None


def output_path(output: str | None, fmt: str, run_id: str) -> Path | None:
    """Where to write (None: stdout)."""
    kind = FORMATS[fmt]
    if output == "-":
        return None
    name = "gpuaccept.prom" if kind == "prom" else f"gpuaccept-{run_id}.{kind}"
    if output is None:
        return None  # HTML without --output: beside_path
    path = Path(output).expanduser()
    if path.is_dir():
        return path / name
    if not path.parent.is_dir():
        raise UsageError(f"--output {output}: directory {path.parent} does not exist")
    return path


def _source_file(ref: str, run_id: str, report_dir: str) -> Path | None:
    """The report file ``ref`` was read from (for a run id: the one in its run directory), or None."""
    from gpuaccept.results.load import CLUSTER_FILE, NODE_FILE

    path = Path(ref).expanduser()
    if path.is_file():
        return path
    candidates = [path] if path.is_dir() else [Path(report_dir).expanduser() / run_id]
    for directory in candidates:
        for name in (CLUSTER_FILE, NODE_FILE):
            if (directory / name).is_file():
                return directory / name
        if directory.is_dir():
            return directory / NODE_FILE  # a run whose report.json was lost, rebuilt from results.jsonl
    return None


def beside_path(source: Path | None, run_id: str, host: str | None) -> Path:
    """Where HTML goes by default: beside ``source`` (``X.json`` -> ``X.html``, ``X-<host>.html`` for one host
    of it), or ``./gpuaccept-<run-id>.html`` when the report has no file here. The directory is checked by
    :func:`gpuaccept.safefs.check_private` (UsageError: name another place with --output)."""
    from gpuaccept.argtypes import host_part
    from gpuaccept.safefs import check_private

    if source is None:
        return Path(f"gpuaccept-{run_id}.html")
    stem = source.stem + (f"-{host_part(host)}" if host else "")
    directory = source.parent
    try:
        check_private(directory, os.lstat(directory), "the report's directory")
    except (OSError, UsageError) as exc:
        raise UsageError(f"cannot write the HTML beside {source}: {exc}; name a file with --output") from None
    return directory / f"{stem}.html"


def _load_streamed(ref: str, grid: bool) -> tuple[Any, Any] | None:
    """(cluster report with slim healthy nodes, its GridBuilder) when ``ref`` is a cluster report file in the line
    layout (or a run directory holding one) with a stored analysis, read a node at a time
    (:func:`gpuaccept.report.slim.load_slim`); None otherwise (the report is read whole)."""
    from gpuaccept.report.slim import load_slim
    from gpuaccept.results.clusterfile import is_line_layout
    from gpuaccept.results.load import CLUSTER_FILE

    path = Path(ref).expanduser()
    if path.is_dir():
        path = path / CLUSTER_FILE
    if not path.is_file() or not is_line_layout(path):
        return None
    return load_slim(path, grid=grid)


def cmd_report(args: argparse.Namespace) -> int:
    from gpuaccept.model import Verdict
    from gpuaccept.outputs import FILE, write_output
    from gpuaccept.results.load import load_report

    kind = FORMATS[args.format]
    got = _load_streamed(args.ref, kind == "html") if kind in ("md", "html") and args.host is None else None
    report, grid = got if got is not None else (load_report(args.ref, db=args.db, host=args.host,
                                                            report_dir=args.report_dir or _default_report_dir()), None)
    analysis = analysis_for(report) if FORMATS[args.format] != "json" else None
    text = render(report, args.format, analysis, grid)
    report_dir = args.report_dir or _default_report_dir()
    if args.output is None and FORMATS[args.format] == "html":
        path: Path | None = beside_path(_source_file(args.ref, report.run_id, report_dir), report.run_id, args.host)
    else:
        path = output_path(args.output, args.format, report.run_id)
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    elif write_output(str(path), text) == FILE:
        print(f"gpuaccept: wrote {path}", file=sys.stderr)
    if args.exit_code and report.verdict is not Verdict.SUCCESS:
        return 1
    return 0


def cmd_serve_metrics(args: argparse.Namespace) -> int:
    from gpuaccept.report import serve

    serve._import_prometheus_client()
    source: serve.Source
    if args.db is not None:
        from gpuaccept.results.dburl import parse_db_url

        parse_db_url(args.db, "--db")
        db_source = serve.DbSource(args.db, args.max_age)
        db_source.check()
        source = db_source
    else:
        root = Path(args.source_dir or _default_report_dir()).expanduser()
        if not root.is_dir():
            raise UsageError(f"--report-dir {root}: no such directory")
        source = serve.DirSource(root, args.max_age)
    return serve.serve(source, args.port, args.bind)
