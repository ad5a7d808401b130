"""Running checks across ranks: launcher detection, rendezvous, bounded waits, result gathering.

- :mod:`~gpuaccept.distributed.hostlist`: Slurm hostlist expansion (pure);
- :mod:`~gpuaccept.distributed.env`: rank, world size, local rank and node rank from the
  environment of torchrun, srun, mpirun or the Kubeflow/Run:ai operators (pure);
- :mod:`~gpuaccept.distributed.control`: the run's control plane on a c10d TCPStore
  (membership, heartbeats, barriers that name dead ranks, result exchange);
- :mod:`~gpuaccept.distributed.group`: what a distributed check's process sees
  (:class:`~gpuaccept.distributed.group.RankContext`) and process-group set-up with timeouts;
- :mod:`~gpuaccept.distributed.gather`: merging per-rank outcomes and reading a run directory;
- :mod:`~gpuaccept.distributed.local`: how many ranks a plain ``gpuaccept run`` starts on a node, and each
  one's environment.

The processes themselves are started and watched by the node engine (:mod:`gpuaccept.node.local_group`,
:mod:`gpuaccept.node.distributed_run`, :mod:`gpuaccept.node.rank_child`).

Ranks are attributed to hosts by ``$GPUACCEPT_HOSTNAME`` when set (launchers and
tests that run several "nodes" on one machine set it), else the short host name.
Only ``control`` and ``group`` import torch, and only inside functions. May import ``model``,
``errors``, ``hw`` and the checks' interface; never the node engine above it.
"""
