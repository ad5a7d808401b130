"""The Prometheus metrics page, from the docstrings of the exporter modules (which define the families)."""

from __future__ import annotations

import inspect

from gpuaccept.docsgen.markdown import GENERATED, from_docstring


def page() -> str:
    """docs/reference/prometheus.md."""
    from gpuaccept.report import prometheus, serve

    return "\n".join([
        GENERATED, "", "# Prometheus metrics", "",
        "`gpuaccept report RUN --format prom --output DIR` writes `DIR/gpuaccept.prom` for node_exporter's textfile "
        "collector; `gpuaccept serve-metrics --port 9835 --report-dir gpuaccept-reports` (the `prometheus` extra) "
        "serves the newest report of every host on each scrape.", "",
        "## Families", "", from_docstring(inspect.getdoc(prometheus) or ""),
        "## The exporter's own metrics (`serve-metrics`)", "", from_docstring(inspect.getdoc(serve) or ""),
    ]).rstrip() + "\n"
