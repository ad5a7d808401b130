"""Collecting a launched run's node reports into the cluster report: progress, tolerant reading, writing.

Shared by ``gpuaccept launch`` and ``gpuaccept gather``. Prints ``[LAUNCH]``/``[RESULT]`` lines;
raises :class:`~gpuaccept.errors.InputError` when the cluster report cannot be written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpuaccept.errors import GpuacceptError, InputError

if TYPE_CHECKING:
    from gpuaccept.model import NodeReport

CLUSTER_REPORT = "cluster-report.json"


def progress(run_dir: Path, nodes: int) -> Any:
    """``reports K/N, checks C``: nodes with a finished report (a distributed run's one report counts each
    host in it), and checks done in every report so far (running ones included), when the reports are visible
    here while the job runs (a shared results directory)."""
    def count() -> str:
        hosts: set[str] = set()
        checks = 0
        for path in run_dir.glob("**/report.json"):
            try:
                data = json.loads(path.read_text())
                checks += len(data.get("checks", []))
                if data.get("verdict") in (None, "running"):
                    continue
                hosts.add(str(data.get("host")))
                hosts.update(str(c["host"]) for c in data.get("checks", []) if c.get("host"))
            except (OSError, ValueError, AttributeError, TypeError, KeyError):
                continue
        parts = ([f"reports {len(hosts)}/{nodes}"] if hosts else []) + ([f"checks done {checks}"] if checks else [])
        return ", ".join(parts)
    return count


def read_reports_tolerant(directory: Path) -> tuple[list[Any], list[str]]:
    """Every readable ``**/report.json`` under ``directory``, and one line per file that is not a report."""
    from gpuaccept.model import NodeReport

    reports, problems = [], []
    for path in sorted(directory.glob("**/report.json")):
        try:
            reports.append(NodeReport.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{path}: not a gpuaccept report ({type(exc).__name__}: {exc})")
    return reports, problems


def iter_reports(directory: Path, warn: Callable[[str], None]) -> Iterator[NodeReport]:
    """Every readable ``**/report.json`` under ``directory`` in path order, each read when it is wanted;
    ``warn`` gets one line per file that is not a report (as :func:`~gpuaccept.launch.collect.
    read_reports_tolerant` lists them)."""
    from gpuaccept.model import NodeReport

    for path in sorted(directory.glob("**/report.json")):
        try:
            report = NodeReport.from_dict(json.loads(path.read_bytes()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            warn(f"{path}: not a gpuaccept report ({type(exc).__name__}: {exc})")
            continue
        yield report


class ReportFiles:
    """The node reports under a directory, read when they are wanted (:func:`iter_reports`): iterated, one at a
    time; :func:`stream_gather` may read them in worker processes instead."""

    def __init__(self, directory: Path, warn: Callable[[str], None]) -> None:
        self.directory, self.warn = directory, warn

    def __iter__(self) -> Iterator[NodeReport]:
        return iter_reports(self.directory, self.warn)

    def paths(self) -> list[Path]:
        return sorted(self.directory.glob("**/report.json"))


def warn(line: str) -> None:
    print(f"[LAUNCH] warning: {line}", file=sys.stderr, flush=True)


def backend_reports(backend: Any, submission: Any, spec: Any, run_dir: Path) -> Iterable[Any]:
    """``backend.gather``, with a warning line on stderr for each report the backend could not read (the
    ``problems`` of the submission's handle). When the backend cannot be reached, or returns no report while
    ``run_dir`` holds some (from an earlier gather), the readable reports under ``run_dir`` are used instead,
    with a warning that says why. A backend that reads ``run_dir`` itself (the default ``gather``, a shared
    results directory): the reports there, each read when it is wanted (that is what its fallback reads too)."""
    from gpuaccept.launch.base import Backend

    if type(backend).gather is Backend.gather and Path(spec.run_results_dir).resolve() == run_dir.resolve():
        for line in getattr(submission.handle, "problems", None) or []:
            warn(str(line))
        return ReportFiles(run_dir, warn)
    try:
        reports: list[Any] = backend.gather(submission, spec)
        fallback = ""
    except GpuacceptError as exc:
        reports, fallback = [], f"cannot fetch the reports from the {backend.name} job: {exc}"
    finally:
        for line in getattr(submission.handle, "problems", None) or []:
            warn(str(line))
    if fallback or not reports:
        local, problems = read_reports_tolerant(run_dir)
        if fallback and type(backend).gather is not Backend.gather:  # the default gather reads run_dir itself
            warn(f"{fallback}; using the {len(local)} report(s) already under {run_dir}")
        elif local and not fallback:
            warn(f"the {backend.name} job returned no report; using the {len(local)} already under {run_dir}")
        if fallback or local:
            for line in problems:
                warn(line)
            reports = local
    return reports


def analysed(cluster: Any) -> Any:
    """The cluster report with outlier analysis across its GPUs and nodes added (``analysis`` keys
    ``outliers`` and ``stats``); an outlier is evidence for the operator, not a verdict."""
    return analysed_table(cluster)[0]


def analysed_table(cluster: Any) -> tuple[Any, tuple[Any, dict[str, Any]]]:
    """:func:`analysed`, and the metrics table it was computed from: ``(samples, configs)`` for
    :func:`write_cluster` (:mod:`gpuaccept.results.columns`)."""
    from gpuaccept.results.conformance_fleet import configs_of_reports
    from gpuaccept.results.samples import collect

    samples = collect([cluster])
    configs = configs_of_reports([cluster])
    analyse(cluster.analysis, samples, configs)
    return cluster, (samples, configs)


def analyse(analysis: dict[str, Any], samples: Any, configs: dict[str, Any]) -> None:
    """Add the outlier analysis of ``samples`` and the fleet conformance of ``configs`` (host -> items) to a
    cluster's ``analysis``, printing a ``[RESULT]`` line for each finding."""
    from gpuaccept.results.analysis import analyze_samples
    from gpuaccept.results.conformance_fleet import drift_lines, drift_summary, fleet_drift
    from gpuaccept.results.coverage import coverage_line, coverage_of, outlier_line
    from gpuaccept.results.heap import keep_freed_memory

    keep_freed_memory()  # the analysis frees and allocates big arrays again and again
    analysis.update(analyze_samples(samples))
    drift = fleet_drift(configs)
    if drift["groups"]:
        analysis["conformance"] = drift
        if drift["odd"] or drift["split"]:
            print(f"[RESULT] {drift_summary(drift)}", flush=True)
            for line in drift_lines(drift):
                print(f"[RESULT]   {line}", flush=True)
    outliers = analysis.get("outliers") or []
    cov = coverage_of(analysis)
    if outliers or cov["fully"] < cov["groups"]:
        print(f"[RESULT] outlier analysis: {outlier_line(analysis, len(outliers))}; "
              f"{coverage_line(analysis)}; see 'gpuaccept report' or 'gpuaccept analyze'", flush=True)


def write_cluster(cluster: Any, run_dir: Path, extra: str | None, table: tuple[Any, dict[str, Any]] | None = None
                  ) -> Path:
    """Write ``<run_dir>/cluster-report.json`` (replaced atomically), and a copy at ``extra`` when given. A
    cluster of more than 64 nodes, or too big to read whole, is written a node at a time in the line layout
    (:mod:`gpuaccept.results.clusterfile`), never as one string. With ``table`` (from :func:`analysed_table`),
    its metrics table is written beside each (``cluster-report.metrics.npz``, :mod:`gpuaccept.results.columns`);
    without, a table left there by an earlier gather is removed."""
    from gpuaccept.results.clusterfile import write_cluster_file

    return install(run_dir, extra, table, lambda fh: write_cluster_file(cluster, fh))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def install(run_dir: Path, extra: str | None, table: tuple[Any, dict[str, Any]] | None,
            write: Callable[[TextIO], None]) -> Path:
    """:func:`write_cluster` with the text written by ``write``: to a new file of a random name in ``run_dir``
    (removed on any error) that then replaces ``cluster-report.json``."""
    from gpuaccept.results.columns import remove_table, write_table

    path = run_dir / CLUSTER_REPORT
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".cluster-report.", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would have made it
        with open(fd, "w", encoding="utf-8") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InputError(f"cannot write {path}: {exc.strerror}") from None
        raise
    try:
        if table is not None:
            write_table(table[0], table[1], path)
        else:
            remove_table(path)
    except OSError as exc:
        raise InputError(f"cannot write the metrics table beside {path}: {exc.strerror}") from None
    if extra:
        try:
            Path(extra).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, extra)
            if table is not None:
                write_table(table[0], table[1], Path(extra))
        except OSError as exc:
            raise InputError(f"cannot write --cluster-report {extra}: {exc.strerror}; "
                             f"the cluster report is in {path}") from None
    return path
