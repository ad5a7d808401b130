"""A module whose import never ends: the ``stuck`` check names it in its warm_imports."""

import time

while True:
    time.sleep(1)
