"""A module whose import raises: ``needs_broken`` names it in its warm_imports."""

raise RuntimeError("broken_import cannot be imported (on purpose)")
