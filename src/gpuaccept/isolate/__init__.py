"""``gpuaccept isolate``: which node, or which rail of a node, is bad.

``plan`` (which pairs or halves to test next, given the results so far; pure), ``sim`` (the same planner
driven by a simulated pair test), ``rail_plan`` (per-rail narrowing, pure), ``pairs`` (a pair test run as a
job through a launch backend), ``nccl`` (nccl-tests pairs), ``rails`` (rail tests), ``drain`` (draining the
nodes found bad), ``cli`` (the subcommand). May import ``model``, ``errors``, ``argtypes``, ``inputs``,
``results``, ``nccltests`` and the launch side it runs its tests through; never the node engine or torch.
"""
