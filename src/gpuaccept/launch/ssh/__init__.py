"""The ssh backend: one process per host over OpenSSH, output streamed with a ``[host]`` prefix, reports fetched by scp.

What runs on each host (the rule of :mod:`gpuaccept.launch.jobargv`)
    * ``spec.distributed`` False (the suite on one host, or --per-node-only): the job once per
      host, the suite as ``PYTHON -m gpuaccept run ...``, which drives every
      GPU of its node itself; ``NODE_RANK``, ``NNODES``, ``MASTER_ADDR`` and
      ``MASTER_PORT`` are exported for commands that start their own ranks;
    * ``spec.distributed`` True (the default for a command): one torchrun per
      host (``PYTHON -m torch.distributed.run ... [--no-python] JOB``) with
      static rendezvous on the first host (``--node-rank`` = position in the
      host list, so ranks are reproducible) or, with ``--rendezvous c10d``, a
      c10d store there (ranks in arrival order). The port is
      ``--master-port`` or derived from the run id; the address is
      ``--master-addr`` or the first host's ``HostName`` in the ssh config.

    ``PYTHON`` is ``--remote-python`` or ``spec.python``.

How
    The plan holds one POSIX sh script, ``ssh-node.sh``, the same for every
    host, and one ``ssh ... HOST exec /bin/sh -s -- RANK LABEL DIR NPROC``
    argv per host, whose standard input is the script. The script creates the
    remote node directory ``REMOTE_DIR/RUN_ID/LABEL``, changes to the working
    directory, exports the environment, starts the job in a new session
    (its own process group, pid in ``job.pid``) and keeps reading its
    standard input: when that ends (Ctrl-C, cancel, a lost connection, even
    a SIGKILLed launcher) it stops the job's process group: TERM, then KILL
    after 45 s (torchrun needs up to 30 s to stop its workers, which run in
    sessions of their own). Cancel also sends the TERM through a second ssh.

    Before anything starts (``check_ready``), a preflight connects to every host
    (``BatchMode``, ``ConnectTimeout``) and checks the working directory,
    the remote Python and the module the job needs; any failure is an
    InputError (exit 2) naming each host, and nothing is started.

    Fan-out is bounded by ``--max-connections``: independent jobs (the suite,
    non-distributed commands) run in a sliding window; a distributed job needs
    every host at once, so more hosts than the bound is a ConfigError. A
    distributed job stops the other hosts when one fails (``--no-fail-fast``
    keeps them).

    Reports come back with ``scp -r`` from ``REMOTE_DIR/RUN_ID/LABEL`` into
    ``RESULTS_DIR/RUN_ID/LABEL`` (no shared file system assumed) and are
    attributed to the host label (``GPUACCEPT_HOSTNAME`` is exported too).
    Each host's output is also kept in ``LABEL.log`` in the launch directory.

The remote login shell must be a POSIX shell (sh, bash, dash, ksh, zsh).

Modules: ``options`` (validated options), ``plan`` (node layout, ssh/scp argv), ``script`` (the node
script), ``preflight``, ``fanout`` (the process manager) and ``backend``. They import the launch
interface, spec and host lists (:mod:`gpuaccept.launch.hosts`), never torch.
"""
