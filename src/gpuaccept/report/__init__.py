"""Renderings of reports: console, and later HTML, JUnit, Prometheus, Markdown."""
