"""Results over time and across nodes: the history store, baselines and analysis.

Modules here import only :mod:`gpuaccept.model` and :mod:`gpuaccept.errors`
of ours, and nothing heavy at import time (database drivers load lazily).
"""
