"""Results over time and across nodes: the history store, baselines, statistics and outlier analysis.

``store`` is the interface, ``store_sqlite``/``store_postgres`` its implementations and ``history``
the URL-to-store factory. Modules here import only ``model``, ``errors`` and ``argtypes`` of ours
at import time, and nothing heavy (database drivers load lazily).
"""
