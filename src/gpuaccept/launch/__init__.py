"""Launching the suite, or any command, across nodes through a scheduler.

At the top, what every backend shares: ``spec`` (the JobSpec), ``base`` (the Backend interface and
Plan; ``plan`` is pure, ``launch`` is that plan submitted), ``jobargv``, ``hosts``, the pod scripts,
``tool`` (running a scheduler CLI), ``watch``, ``gather``/``collect`` (reports into the cluster report),
``registry`` and ``cli``. One subpackage per backend (``slurm``, ``k8s``, ``ssh``, ``mpi``, ``runai``,
``bcp``, ``local``), readable alone: its options, its pure plan, its submit/watch/cancel and its
output parsers. Never imports torch, the checks or the runner at import time.
"""
