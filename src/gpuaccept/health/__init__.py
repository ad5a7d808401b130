"""Keeping accepted nodes healthy: ``gpuaccept healthcheck`` (Slurm) and ``gpuaccept node-status`` (Kubernetes).

``gpuaccept healthcheck`` is a fast node health check for Slurm's HealthCheckProgram, Prolog and Epilog.

Four checks through the ordinary runner (a child process each, with its timeout): ``env`` (GPU count
against ``--expect-gpus``), ``health`` (NVML: ECC, row remapping, XIDs, PCIe, throttling, NVLink),
``compute`` (one short GEMM burst per dtype on all GPUs at once, every result verified against fp64)
and ``disk_space`` (free space). The whole run, ``scontrol`` included, ends within ``--budget`` seconds
(default 45; Slurm kills HealthCheckProgram after 60 s). One summary line on stdout.

NHC semantics with ``--slurm drain``: the node is the one named by ``--node``, else
``SLURMD_NODENAME`` (slurmd sets it for the programs it runs), else the short host name, and must be
known to ``scontrol show node`` before anything runs (else exit 2, nothing measured or drained). On a
fault the node is drained with ``Reason="gpuaccept: <check>: <reason>"``; when healthy it is resumed
only if its drain reason is one of ours (it starts with ``gpuaccept:``, and is not one of
``gpuaccept isolate``'s). A drain someone else set is never touched, whatever the verdict.

``--mode`` chooses the exit codes (:func:`gpuaccept.health.plan.exit_code`):

- ``check`` (default; HealthCheckProgram, cron, by hand): 0 healthy, 1 node fault (a check failed,
  errored, timed out, was left no time by the budget, or nothing could be measured), 2 bad input, 4 a
  report file could not be written, 6 ``scontrol`` failed to drain or resume (whatever the verdict,
  which the summary line states), 130 interrupted. slurmd only logs HealthCheckProgram's exit code.
- ``prolog`` and ``epilog``: Slurm drains the node on any non-zero exit (and requeues the job, held, on
  a prolog failure), so only a node fault exits 1 and bad input 2 (seen the first time the line is run
  by hand); a report directory that refuses writes, a failing ``scontrol`` or an interruption is said
  on stderr and exits 0: neither the node nor the job is blamed for them.

Modules: ``plan`` (the suite plan, the budget, exit codes; pure), ``slurm`` (node name, ``scontrol show
node`` parser, drain/resume decision and argv; pure), ``run`` (the runner with one deadline), ``cli``
(the subcommand).

``gpuaccept node-status`` labels (and taints) a Kubernetes node with its verdict: ``nodepatch`` (the node
change for a verdict, pure), ``daemonset`` (the health DaemonSet and its RBAC, pure), ``npd``
(node-problem-detector files, pure), ``nodestatus`` (the verdict and the patch: I/O) and ``nodestatus_cli``
(the subcommand; building its parser imports no backend). May import ``model``, ``errors``, ``argtypes``,
``inputs``, ``checks``, the node engine it runs, and the Kubernetes client loader of ``launch.k8s``.
"""
