"""``python -m gpuaccept.docsgen [DOCS_DIR] [--check]``: write the generated pages, or compare them (exit 1)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpuaccept.docsgen import generate

REGENERATE = "regenerate them with `make docs-gen` (python -m gpuaccept.docsgen docs) and commit the result"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuaccept.docsgen", description=__doc__)
    parser.add_argument("docs_dir", nargs="?", default="docs", help="the site's docs/ directory (default: docs)")
    parser.add_argument("--check", action="store_true", help="compare with the files there; write nothing")
    args = parser.parse_args(argv)
    docs = Path(args.docs_dir)
    if not docs.is_dir():
        print(f"error: {docs} is not a directory", file=sys.stderr)
        return 2
    stale = generate.stale(docs) if args.check else generate.write(docs)
    if args.check:
        for line in stale:
            print(f"stale: {line}", file=sys.stderr)
        if stale:
            print(f"{len(stale)} generated documentation file(s) are not current: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    for line in stale:
        print(f"wrote {os.path.join(args.docs_dir, line)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
