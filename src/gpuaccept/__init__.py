"""gpuaccept: acceptance tests for GPU nodes and clusters.

Importing this package is cheap: it never imports torch. Heavy modules are
imported lazily by the checks that need them.
"""

__version__ = "0.1.0"
