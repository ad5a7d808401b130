"""The node-run engine: everything between ``gpuaccept run``'s parsed options and its report.

:mod:`~gpuaccept.node.run` is the one entry point (``run_node``: pre-flight checks, plan, budget, run, report);
``config`` and ``suite`` make the plan, ``budget``/``budget_run``/``calibrate`` fit it to a time budget,
``runner`` runs it (``childproc``/``child`` a check in its own process, ``zygote``/``warm`` the warm process it
is forked from, ``local_group`` and ``distributed_run`` ranks), ``judge`` judges an outcome.
May import ``model``, ``errors``, ``argtypes``, ``inputs``, ``checks``, ``hw``, ``distributed`` and ``results``;
never ``launch``, ``isolate``, ``health``, ``report`` or ``cli``.
"""
