"""Renderings of reports: the console, HTML, Markdown, JUnit, Prometheus (a textfile and ``serve-metrics``).

Reads reports through ``model``; may import ``results`` (history, analysis) and the runner's event
interface; never torch.
"""
