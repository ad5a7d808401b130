"""The Kubernetes backend: an Indexed Job with a headless Service, a JobSet, a PyTorchJob, an MPIJob or a TrainJob.

``options`` (validated options and names), ``manifests`` (the pure manifest builder), ``status``
(pure job and pod state parsers), ``backend`` (submit through the kubernetes client, watch,
cancel, reports from pod logs), ``client`` (the client loader both sides share).
``gpuaccept node-status`` lives here too: ``nodepatch`` (the node change for a verdict, pure),
``healthds`` (the health DaemonSet and its RBAC, pure), ``npd`` (node-problem-detector files,
pure) and ``nodestatus`` (the verdict and the patch: I/O); its command line is
:mod:`gpuaccept.launch.nodestatus_cli`, outside this package, so that building the parser imports
no backend. Imports the launch interface and spec, never torch.
"""
