"""What ``gpuaccept run`` leaves beside ``report.json`` for a person: ``report.html``, and the line that says where.

:func:`write_run_html` renders the run's report as the self-contained page ``gpuaccept report`` makes and writes
it atomically (:func:`gpuaccept.outputs.write_output`: never through a link) as ``<run dir>/report.html``. A
failure to render or write it is returned as one warning line: it never touches ``report.json`` nor the verdict.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuaccept.model import ClusterReport, NodeReport

HTML_NAME = "report.html"
"""The page's name in a run directory, beside ``report.json``."""


def write_run_html(report: NodeReport | ClusterReport, run_dir: Path) -> tuple[Path | None, str]:
    """(the path written, "") or (None, why not: one line). Never raises for a rendering or a disk problem."""
    path = run_dir / HTML_NAME
    try:
        from gpuaccept.outputs import write_output
        from gpuaccept.report.html import render_html

        text = render_html(report, analysis=_analysis(report))
        write_output(str(path), text, flag=HTML_NAME)
    except Exception as exc:  # whatever goes wrong here is reported, never lost in a traceback nor a verdict
        from gpuaccept.inputs import one_line

        return None, f"{path} not written: {one_line(f'{type(exc).__name__}: {exc}')} (report.json is complete)"
    return path, ""


def _analysis(report: NodeReport | ClusterReport) -> dict[str, object] | None:
    """The outlier analysis the page marks (as ``gpuaccept report`` does); None when it cannot be made."""
    try:
        from gpuaccept.results.analysis import analyze

        return analyze(report)
    except Exception:  # the page is still worth having without its outlier marks
        return None


def where_line(run_dir: Path | str, html: Path | None) -> str:
    """``report directory: /abs/run-dir (report.json, report.html)``: what the last lines of a run say."""
    files = "report.json" + (f", {HTML_NAME}" if html is not None else "")
    return f"report directory: {os.path.abspath(run_dir)} ({files})"
