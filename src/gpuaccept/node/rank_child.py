"""Entry point of one rank's process for a distributed check (``python -m gpuaccept.node.rank_child``).

Same protocol as :mod:`gpuaccept.node.child` (JSON request on stdin, outcome JSON
written to the requested path, death with the parent), plus the rank in
``GPUACCEPT_DIST``. It leaves with ``os._exit`` right after writing the outcome:
tearing down a process group whose peer died can hang, and nothing is left to do.
This module is the old way of starting a rank; a rank forked from the warm process
(:mod:`gpuaccept.node.zygote`) runs the same request and leaves the same way.
"""

from __future__ import annotations

import json
import os
import sys

from gpuaccept.node.child import _die_with_parent, run_request
from gpuaccept.node.childproc import write_outcome


def main() -> int:
    request = json.load(sys.stdin)
    _die_with_parent(int(request["parent_pid"]))
    return write_outcome(request["out"], run_request(request))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
