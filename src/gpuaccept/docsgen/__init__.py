"""The documentation's generated pages: the command line from the argparse parser, one page per check from the
registry, and the report's JSON Schema as a table.

``python -m gpuaccept.docsgen [DOCS_DIR]`` writes them (``make docs-gen``); ``--check`` compares instead and
exits 1 naming each stale file. Nothing here is imported by ``gpuaccept --help`` or by the node engine, and
nothing here imports torch: the check modules import it inside the functions that measure.
"""
