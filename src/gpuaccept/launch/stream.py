"""Gathering a fleet's node reports one at a time (issue #27): bounded memory, the same cluster report.

:class:`StreamGather` takes the node reports one by one (from
:func:`~gpuaccept.launch.collect.iter_reports`, which reads each file only when it is wanted). Each node's
entry line (the compact JSON that :func:`~gpuaccept.results.clusterfile.write_cluster_file` writes) goes at
once to an unnamed temporary file in the run directory; only what the header, the summary and the analysis
need is kept (a :class:`~gpuaccept.launch.gather.NodeLine`, the node's metrics as
:class:`~gpuaccept.results.samples.NodeSamples`, the conformance items, the cross-node results).
:meth:`StreamGather.finish` then writes the cluster report exactly as
:func:`~gpuaccept.launch.gather.merge_reports`, :func:`~gpuaccept.launch.collect.analysed_table` and
:func:`~gpuaccept.launch.collect.write_cluster` write it for the same reports (byte for byte;
tests/test_gather_stream.py).

The files of a :class:`~gpuaccept.launch.collect.ReportFiles` are read and prepared (:func:`prepare`) in
worker processes, a few ahead of the writer, which takes them in path order.

Reports that :func:`~gpuaccept.launch.gather.split_by_host` would merge (a report holding other hosts'
results, or a host in two reports) are held and merged at the end, as before.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import multiprocessing
import signal
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuaccept.errors import InputError
from gpuaccept.launch.collect import ReportFiles
from gpuaccept.launch.gather import CrossNode, NodeLine, cluster_verdict, entry_reason, split_by_host, summary_of
from gpuaccept.model import SCHEMA_VERSION, NodeEntry, NodeReport, NodeState, Status, Verdict
from gpuaccept.results.parallel import default_workers

if TYPE_CHECKING:
    from gpuaccept.results.samples import NodeSamples

MISSING_REASON = "no report: the node never ran the job or its report did not come back"


def peek(reports: Iterable[Any]) -> Iterable[Any] | None:
    """``reports`` unchanged (its first item read ahead), or None when it has none."""
    it = iter(reports)
    first = next(it, None)
    return None if first is None else itertools.chain((first,), it)


@dataclass
class Gathered:
    """What a streamed gather wrote: the cluster report's path, verdict and summary lines."""

    path: Path
    verdict: Verdict
    lines: list[str]


@dataclass
class Prepared:
    """What the cluster report takes of one node report (picklable: made where the report was read)."""

    host: str
    hosts: list[str]                 # the hosts its results belong to
    line: bytes                      # its node entry as the cluster report holds it (empty when it names others)
    node: NodeLine | None
    samples: NodeSamples | None
    config: dict[str, Any] | None
    cross: list[tuple[str, int | None, Status, str, str | None]]
    report: NodeReport | None = None  # kept when its results belong to other hosts too (merged at the end)


def prepare(report: NodeReport, rank: dict[str, int], expected: bool, *, whole: bool = False) -> Prepared:
    """:class:`Prepared` of ``report``; ``rank``: the expected hosts' node ranks (``expected``: whether any host
    was expected); ``whole``: its entry even when its results name other hosts (a merged report)."""
    from gpuaccept.results.conformance_fleet import config_of_report
    from gpuaccept.results.samples import node_samples

    host = report.host
    hosts = list(dict.fromkeys(c.host or host for c in report.checks)) if report.checks else [host]
    cross = CrossNode.items(report)
    if hosts != [host] and not whole:
        return Prepared(host, hosts, b"", None, None, None, cross, report)
    node_rank = rank.get(host)
    reason = entry_reason(report)
    if node_rank is None and expected:
        reason = "; ".join(x for x in (reason, "not in the expected host list") if x)
    entry = NodeEntry(host, NodeState.REPORTED, report=report, node_rank=node_rank, reason=reason)
    line = json.dumps(entry.to_dict(), allow_nan=False).encode()
    return Prepared(host, hosts, line, NodeLine.of(entry), node_samples(report), config_of_report(report), cross)


_RANK: dict[str, int] = {}
_EXPECTED = False


def _init_worker(rank: dict[str, int], expected: bool) -> None:
    global _RANK, _EXPECTED
    _RANK, _EXPECTED = rank, expected
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the writer's to act on (it stops the pool)


def _prepare_file(path: str) -> Prepared | str:
    """In a worker process: :func:`prepare` of the report at ``path``, or the warning line for a file that is
    not a report."""
    try:
        report = NodeReport.from_dict(json.loads(Path(path).read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{path}: not a gpuaccept report ({type(exc).__name__}: {exc})"
    return prepare(report, _RANK, _EXPECTED)


class StreamGather:
    """The cluster report of a run, fed a node report at a time (see the module docstring)."""

    def __init__(self, run_dir: Path, expected_hosts: Iterable[str] = ()) -> None:
        from gpuaccept.results.samples import Builder

        self.run_dir = run_dir
        self.expected = list(dict.fromkeys(expected_hosts))
        self.rank = {h: i for i, h in enumerate(self.expected)}
        run_dir.mkdir(parents=True, exist_ok=True)
        self.tmp = tempfile.TemporaryFile(dir=run_dir)  # no name (O_TMPFILE) or unlinked at once: never left
        self.size = 0
        self.where: dict[str, tuple[int, int, int]] = {}  # host -> (arrival, offset, length) of its line
        self.nodes: dict[str, NodeLine] = {}
        self.held: list[tuple[int, NodeReport]] = []      # (arrival, report) merged at the end
        self.held_hosts: set[str] = set()
        self.cross = CrossNode()
        self.builder: Builder | None = Builder()
        self.built: list[str] = []
        self.configs: dict[str, dict[str, Any]] = {}
        self.arrivals = 0

    def close(self) -> None:
        self.tmp.close()

    def __enter__(self) -> StreamGather:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, report: NodeReport) -> None:
        """Take one node report (as :func:`~gpuaccept.launch.gather.merge_reports` takes each of its list)."""
        self.take(prepare(report, self.rank, bool(self.expected)), report)

    def take(self, p: Prepared, report: NodeReport | None = None) -> None:
        """Take one node report as :func:`prepare` made it (``report``: the report itself, when at hand)."""
        self.cross.add_items(p.cross)
        arrival = self.arrivals
        self.arrivals += 1
        host = p.host
        if p.hosts == [host] and host not in self.where and host not in self.held_hosts:
            self._store(p, arrival)
            return
        if report is None:
            report = p.report or NodeReport.from_dict(json.loads(p.line)["report"])
        for h in p.hosts:  # merged at the end with every other report of these hosts, in arrival order
            if h in self.where:
                first, _o, _n = self.where[h]
                self.held.append((first, self._report(h)))
                del self.where[h], self.nodes[h]
                self.builder = None  # its columns hold that report: rebuilt at the end
        self.held.append((arrival, report))
        self.held_hosts.update(p.hosts)

    def _store(self, p: Prepared, arrival: int) -> None:
        assert p.node is not None and p.samples is not None
        self.tmp.seek(self.size)
        self.tmp.write(p.line)
        self.where[p.host] = (arrival, self.size, len(p.line))
        self.size += len(p.line)
        self.nodes[p.host] = p.node
        if self.builder is not None:
            self.builder.add_node(p.samples)
            self.built.append(p.host)
            if p.config is not None:
                self.configs[p.host] = p.config

    def _line(self, host: str) -> bytes:
        _a, offset, length = self.where[host]
        self.tmp.seek(offset)
        return self.tmp.read(length)

    def _report(self, host: str) -> NodeReport:
        return NodeReport.from_dict(json.loads(self._line(host))["report"])

    def _table(self, order: list[str]) -> tuple[Any, dict[str, Any]]:
        """The metrics table and conformance items of the reported hosts in ``order`` (cluster order): as
        collected while streaming when the reports came in that order, else read back from the lines."""
        from gpuaccept.results.conformance_fleet import config_of_report
        from gpuaccept.results.samples import Builder

        if self.builder is not None and self.built == order:
            return self.builder.build(), self.configs
        self.builder = None
        builder, configs = Builder(), {}
        for host in order:
            report = self._report(host)
            builder.add_report(report)
            items = config_of_report(report)
            if items is not None:
                configs[host] = items
        return builder.build(), configs

    def finish(self, *, run_id: str, backend: str, started: str, finished: str | None, expected_nodes: int = 0,
               job_id: str | None = None, job: dict[str, Any] | None = None, extra: str | None = None
               ) -> Gathered:
        """Write ``cluster-report.json`` (and its metrics table; a copy at ``extra``); print the analysis's
        ``[RESULT]`` lines. ``job``: the launch's ``analysis.job``."""
        from gpuaccept.launch.collect import analyse, install
        from gpuaccept.results.clusterfile import LINE_LAYOUT_MIN_NODES

        expected = self.expected
        if self.held:
            self.held.sort(key=lambda x: x[0])
            merged = split_by_host(r for _a, r in self.held)
            self.held, self.held_hosts = [], set()
            for report in merged.values():
                self._store(prepare(report, self.rank, bool(expected), whole=True), -1)
        extra_hosts = sorted(h for h in self.where if h not in self.rank)
        order: list[tuple[str, int | None, str | None]] = []  # (host, node_rank, why missing)
        for rank, host in enumerate(expected):
            order.append((host, rank, None if host in self.where else MISSING_REASON))
        order.extend((h, None, None) for h in extra_hosts)
        for k in range(len(order), expected_nodes):
            order.append((f"missing-{k}", None, f"{expected_nodes} node(s) expected; no report from this one "
                                                "(its name is unknown)"))
        lines = [self.nodes[h] if why is None else NodeLine(h, NodeState.MISSING, Verdict.FAILURE, why)
                 for h, _r, why in order]
        total = max(expected_nodes, len(expected))
        verdict = cluster_verdict(lines, total)
        analysis: dict[str, Any] = {"gather": {
            "reported": sum(n.state is NodeState.REPORTED for n in lines),
            "missing": [n.host for n in lines if n.state is NodeState.MISSING],
            "failed": [n.host for n in lines if n.verdict is not Verdict.SUCCESS],
            "unexpected": extra_hosts if expected else [],
        }}
        fabric = self.cross.result(total)
        if fabric is not None:
            analysis["cross_node"] = fabric
        if job is not None:
            analysis["job"] = job
        table = self._table([h for h, _r, why in order if why is None])
        analyse(analysis, *table)
        header = {"schema_version": SCHEMA_VERSION, "kind": "cluster", "run_id": run_id, "backend": backend,
                  "job_id": job_id, "started": started, "finished": finished, "expected_nodes": total,
                  "verdict": verdict.value}

        def entries() -> Iterator[str]:
            for host, rank, why in order:
                if why is None:
                    yield self._line(host).decode()
                else:
                    yield json.dumps(NodeEntry(host, NodeState.MISSING, node_rank=rank, reason=why).to_dict(),
                                     allow_nan=False)

        def write(fh: Any) -> None:
            from gpuaccept import inputs
            from gpuaccept.results.clusterfile import write_line_layout

            if len(order) <= LINE_LAYOUT_MIN_NODES:  # small: indented, as always
                whole = {**header, "nodes": [json.loads(e) for e in entries()], "analysis": analysis}
                text = json.dumps(whole, indent=2, allow_nan=False) + "\n"
                del whole
                if len(text.encode()) <= inputs.MAX_INPUT_BYTES:
                    fh.write(text)
                    return
                del text
            write_line_layout(fh, {**header, "analysis": analysis}, entries())

        path = install(self.run_dir, extra, table, write)
        return Gathered(path, verdict, summary_of(run_id, backend, job_id, total, lines, analysis))


def stream_gather(reports: Iterable[NodeReport], run_dir: Path, *, expected_hosts: Iterable[str] = (),
                  workers: int | None = None, **finish: Any) -> Gathered:
    """Gather ``reports`` (read lazily, one at a time) into ``run_dir/cluster-report.json``; ``finish``: the
    keywords of :meth:`StreamGather.finish`. :class:`ReportFiles` are read and prepared in ``workers`` processes
    (default :func:`default_workers`), a few files ahead of the writer, in path order all the same."""
    with StreamGather(run_dir, expected_hosts) as sg:
        n = default_workers() if workers is None else workers
        if isinstance(reports, ReportFiles) and n > 1:
            _take_files(sg, reports, n)
        else:
            for report in reports:
                sg.add(report)
        return sg.finish(**finish)


def _take_files(sg: StreamGather, files: ReportFiles, workers: int) -> None:
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    paths = iter(files.paths())
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(sg.rank, bool(sg.expected))) as pool:
        try:
            ahead: collections.deque[Future[Prepared | str]] = collections.deque(
                pool.submit(_prepare_file, str(p)) for p in itertools.islice(paths, 2 * workers))
            while ahead:
                done = ahead.popleft().result()
                nxt = next(paths, None)
                if nxt is not None:
                    ahead.append(pool.submit(_prepare_file, str(nxt)))
                if isinstance(done, str):
                    files.warn(done)
                else:
                    sg.take(done)
        except BrokenProcessPool as exc:
            raise InputError(f"a worker process reading the node reports under {files.directory} died ({exc}); "
                             "'gpuaccept gather' again reads them anew") from None
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def report_out(gathered: Gathered, args: Any) -> None:
    """Print the summary and where the cluster report is; store it in the history unless ``--no-history``
    (which reads it back from the file)."""
    from gpuaccept.results.autosave import save_stream

    for line in gathered.lines:
        print(line, flush=True)
    print(f"[RESULT] cluster report: {gathered.path}", flush=True)
    if getattr(args, "no_history", False):
        return
    save_stream(functools.partial(read_back_stream, gathered.path), gathered.verdict, args, gathered.path)


def read_back_stream(path: Path) -> tuple[Any, Iterator[Any]]:
    """The cluster this module just wrote at ``path``: its header as a :class:`~gpuaccept.model.ClusterReport`
    without nodes, and its node entries as read (in the line layout one line at a time, as JSON objects, so the
    history stores a batch at a time; not schema-validated, as gather never validated what it stored)."""
    from gpuaccept.model import ClusterReport
    from gpuaccept.results.clusterfile import is_line_layout, iter_cluster

    if not is_line_layout(path):
        cluster = ClusterReport.from_dict(json.loads(path.read_bytes()))
        nodes, cluster.nodes = cluster.nodes, []
        return cluster, iter(nodes)
    header, entries = iter_cluster(path)
    return ClusterReport.from_dict(header), (e for _i, e in entries)


def read_back(path: Path) -> Any:
    """The whole :class:`~gpuaccept.model.ClusterReport` of :func:`read_back_stream`."""
    cluster, entries = read_back_stream(path)
    cluster.nodes = [e if isinstance(e, NodeEntry) else NodeEntry.from_dict(e) for e in entries]
    return cluster
