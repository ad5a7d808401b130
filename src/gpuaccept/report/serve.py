"""``gpuaccept serve-metrics``: the latest results over HTTP for Prometheus, read afresh on each scrape.

A :class:`ReportCollector` (a prometheus_client custom collector) asks its
source for the newest report of every host and the newest cluster run at each
scrape, and exports them as :mod:`gpuaccept.report.prometheus` families, plus
its own health:

- ``gpuaccept_exporter_up``: 1 when the source could be read this scrape;
- ``gpuaccept_exporter_unreadable_reports``: report files skipped as malformed;
- ``gpuaccept_exporter_reports``: node reports exported;
- ``gpuaccept_exporter_scrape_duration_seconds``.

Sources: a report directory (``--report-dir``; ``<dir>/<run-id>/report.json`` as
``gpuaccept run`` writes them, and ``cluster-report.json`` files; parsed files
are cached by modification time and size) or the history store (``--db``).
A scrape never fails because of one bad report: it is skipped, counted and
logged once. prometheus_client is imported lazily: only this command needs it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaccept.errors import GpuacceptError, InputError, UsageError
from gpuaccept.model import ClusterReport, NodeReport
from gpuaccept.report.prometheus import PREFIX, Family, families, iso_epoch
from gpuaccept.results.load import CLUSTER_FILE, NODE_FILE, load_file

MAX_DEPTH = 3
"""How deep under ``--report-dir`` report files are looked for (run dirs, cluster run dirs with node subdirs)."""


@dataclass
class Snapshot:
    """What a source found at one scrape."""

    nodes: list[NodeReport] = field(default_factory=list)
    cluster: ClusterReport | None = None
    unreadable: int = 0
    errors: list[str] = field(default_factory=list)
    up: bool = True


def _started(report: NodeReport | ClusterReport) -> float:
    ts = iso_epoch(report.started)
    return ts if ts is not None else float("-inf")


def newest(node_reports: list[NodeReport], cluster: ClusterReport | None) -> list[NodeReport]:
    """The newest node report per host, among ``node_reports`` and the nodes of ``cluster``; sorted by host."""
    best: dict[str, NodeReport] = {}
    pool = list(node_reports) + ([n.report for n in cluster.nodes if n.report is not None] if cluster else [])
    for rep in pool:
        cur = best.get(rep.host)
        if cur is None or _started(rep) > _started(cur):
            best[rep.host] = rep
    return [best[h] for h in sorted(best)]


def checked_load(path: Path) -> NodeReport | ClusterReport | str:
    """The report in ``path``, or why it cannot be served (a message naming the file). Catches every
    error, not only the loader's own: a 10**400 value or an array nested 100000 deep is one bad file,
    never a failed scrape. A report that loads but cannot be rendered is refused here too."""
    try:
        report = load_file(path)
    except GpuacceptError as exc:
        return str(exc)
    except Exception as exc:  # RecursionError, OverflowError, ... included
        return f"{path}: unreadable report ({type(exc).__name__}: {str(exc)[:200]})"
    why = unrenderable(report)
    return f"{path}: {why}" if why else report


def unrenderable(report: NodeReport | ClusterReport) -> str | None:
    """None when ``report`` renders as metric families, else why not."""
    try:
        if isinstance(report, ClusterReport):
            families([], report)
        else:
            families([report], None)
    except Exception as exc:  # RecursionError, OverflowError, ... included
        return f"cannot export this report ({type(exc).__name__}: {str(exc)[:200]})"
    return None


class DirSource:
    """Report files under a directory, re-scanned at each scrape (parsed files are cached)."""

    def __init__(self, root: Path, max_age_s: float | None = None) -> None:
        self.root = root
        self.max_age_s = max_age_s
        self._cache: dict[Path, tuple[tuple[int, int], NodeReport | ClusterReport | str]] = {}

    def describe(self) -> str:
        return f"report directory {self.root}"

    def _files(self) -> Iterator[Path]:
        root_depth = len(self.root.parts)
        for dirpath, dirnames, filenames in os.walk(self.root):
            depth = len(Path(dirpath).parts) - root_depth
            if depth >= MAX_DEPTH:
                dirnames[:] = []
            dirnames[:] = [d for d in dirnames if d not in ("logs",) and not d.startswith(".")]
            for name in (CLUSTER_FILE, NODE_FILE):
                if name in filenames:
                    yield Path(dirpath) / name

    def snapshot(self) -> Snapshot:
        snap = Snapshot()
        if not self.root.is_dir():
            snap.up = False
            snap.errors.append(f"{self.root}: no such directory")
            return snap
        seen: set[Path] = set()
        cutoff = time.time() - self.max_age_s if self.max_age_s is not None else None
        nodes: list[NodeReport] = []
        clusters: list[ClusterReport] = []
        for path in self._files():
            seen.add(path)
            try:
                st = path.stat()
            except OSError:
                continue
            stamp = (st.st_mtime_ns, st.st_size)
            cached = self._cache.get(path)
            if cached is None or cached[0] != stamp:
                self._cache[path] = (stamp, checked_load(path))
            result = self._cache[path][1]
            if isinstance(result, str):
                snap.unreadable += 1
                snap.errors.append(result)
                continue
            if cutoff is not None and _started(result) < cutoff:
                continue
            if isinstance(result, ClusterReport):
                clusters.append(result)
            else:
                nodes.append(result)
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        snap.cluster = max(clusters, key=_started) if clusters else None
        snap.nodes = newest(nodes, snap.cluster)
        return snap


class DbSource:
    """The history store: the newest node run per host and the newest cluster run (reports cached by run id)."""

    def __init__(self, url: str | None, max_age_s: float | None = None) -> None:
        self.url = url
        self.max_age_s = max_age_s
        self._cache: dict[tuple[str, str, str], NodeReport | ClusterReport] = {}

    def describe(self) -> str:
        from gpuaccept.results.dburl import resolve_db_url

        return f"history {resolve_db_url(self.url).redacted()}"

    def check(self) -> None:
        """Open the store once so that a bad URL or a foreign database is reported at startup."""
        from gpuaccept.results.history import open_store

        open_store(self.url).close()

    def _get(self, store: Any, run_id: str, host: str, kind: str) -> NodeReport | ClusterReport:
        key = (kind, run_id, host)
        if key not in self._cache:
            try:
                rep = store.get_run(run_id, host=host or None).report
            except GpuacceptError:
                raise
            except Exception as exc:  # RecursionError, OverflowError, ... included
                raise InputError(f"run {run_id} ({host or 'cluster'}): unreadable report "
                                 f"({type(exc).__name__}: {str(exc)[:200]})") from None
            why = unrenderable(rep)
            if why:
                raise InputError(f"run {run_id} ({host or 'cluster'}): {why}")
            self._cache[key] = rep
        return self._cache[key]

    def snapshot(self) -> Snapshot:
        from gpuaccept.results.history import open_store

        snap = Snapshot()
        since = time.time() - self.max_age_s if self.max_age_s is not None else None
        try:
            store = open_store(self.url, retry_s=10.0)
        except GpuacceptError as exc:
            snap.up = False
            snap.errors.append(str(exc))
            return snap
        try:
            wanted: set[tuple[str, str, str]] = set()
            nodes: list[NodeReport] = []
            for host in store.hosts():
                runs = store.list_runs(host=host, since=since, limit=1)
                if not runs:
                    continue
                try:
                    rep = self._get(store, runs[0].run_id, host, "node")
                except GpuacceptError as exc:
                    snap.unreadable += 1
                    snap.errors.append(str(exc))
                    continue
                wanted.add(("node", runs[0].run_id, host))
                if isinstance(rep, NodeReport):
                    nodes.append(rep)
            clusters = store.list_runs(kind="cluster", since=since, limit=1)
            if clusters:
                try:
                    crep = self._get(store, clusters[0].run_id, "", "cluster")
                except InputError as exc:
                    snap.unreadable += 1
                    snap.errors.append(str(exc))
                else:
                    wanted.add(("cluster", clusters[0].run_id, ""))
                    if isinstance(crep, ClusterReport):
                        snap.cluster = crep
            for stale in set(self._cache) - wanted:
                del self._cache[stale]
            snap.nodes = newest(nodes, snap.cluster)
        except GpuacceptError as exc:
            snap.up = False
            snap.errors.append(str(exc))
        finally:
            store.close()
        return snap


Source = DirSource | DbSource


class ReportCollector:
    """A prometheus_client collector exporting the source's latest reports at each scrape."""

    def __init__(self, source: Source, log: Any = None) -> None:
        self.source = source
        self.log = log if log is not None else sys.stderr
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def families(self) -> list[Family]:
        """This scrape's families (the report ones and the exporter's own)."""
        t0 = time.monotonic()
        with self._lock:
            snap = self.source.snapshot()
            for err in snap.errors:
                if err not in self._logged:
                    self._logged.add(err)
                    print(f"gpuaccept serve-metrics: {err}", file=self.log, flush=True)
        fams = families(snap.nodes, snap.cluster) if snap.up else []
        own = [Family(PREFIX + "exporter_up", "1 when the exporter could read its source at this scrape."),
               Family(PREFIX + "exporter_reports", "Node reports exported at this scrape."),
               Family(PREFIX + "exporter_unreadable_reports", "Report files or runs skipped as unreadable."),
               Family(PREFIX + "exporter_scrape_duration_seconds", "Time this scrape took to read the source.")]
        own[0].add(1 if snap.up else 0)
        own[1].add(len(snap.nodes))
        own[2].add(snap.unreadable)
        own[3].add(time.monotonic() - t0)
        return fams + own

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for fam in self.families():
            names = list(fam.samples[0][0]) if fam.samples else []
            gauge = GaugeMetricFamily(fam.name, fam.help, labels=names)
            for labels, value in fam.samples:
                gauge.add_metric([labels[n] for n in names], value)
            yield gauge


def _import_prometheus_client() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError("serve-metrics needs the prometheus_client package "
                         "(pip install 'gpuaccept[prometheus]' or pip install prometheus-client)") from None


def serve(source: Source, port: int, bind: str, *, ready: Any = None,
          stop: threading.Event | None = None) -> int:
    """Serve ``/metrics`` on ``bind:port`` until ``stop`` is set (or SIGINT/SIGTERM); returns the exit code.

    Prints ``serving http://ADDR:PORT/metrics`` (with the real port when 0 was
    asked) to stderr once listening; ``ready`` (a callable) gets the port.
    """
    _import_prometheus_client()
    import signal

    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(source))
    try:
        server, thread = start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        raise UsageError(f"cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    real_port = int(server.server_address[1])
    host = f"[{bind}]" if ":" in bind else bind
    print(f"gpuaccept serve-metrics: serving http://{host}:{real_port}/metrics from {source.describe()}",
          file=sys.stderr, flush=True)
    if ready is not None:
        ready(real_port)
    event = stop or threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: event.set())
    try:
        while not event.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0
