"""A plugin whose import takes ``GPUACCEPT_TEST_SLOW_IMPORT_S`` seconds (none when unset): named in the warm
process's GPUACCEPT_PLUGINS, it makes that process's first imports slow, as a cold torch import is on a loaded
node. It writes ``GPUACCEPT_TEST_SLOW_IMPORT_STAMP`` (when set) as its sleep begins. No checks of its own."""

import os
import time

from gpuaccept.checks.base import Check

_stamp = os.environ.get("GPUACCEPT_TEST_SLOW_IMPORT_STAMP")
if _stamp:
    with open(_stamp, "w") as fh:
        fh.write(f"{os.getpid()}\n")
time.sleep(float(os.environ.get("GPUACCEPT_TEST_SLOW_IMPORT_S", "0")))

CHECKS: tuple[type[Check], ...] = ()
