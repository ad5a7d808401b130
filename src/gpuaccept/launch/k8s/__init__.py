"""The Kubernetes backend: an Indexed Job with a headless Service, a JobSet, a PyTorchJob, an MPIJob or a TrainJob.

``options`` (validated options and names), ``manifests`` (the pure manifest builder), ``status``
(pure job and pod state parsers), ``backend`` (submit through the kubernetes client, watch,
cancel, reports from pod logs), ``client`` (the client loader, which ``gpuaccept node-status`` in
:mod:`gpuaccept.health` shares). Imports the launch interface and spec, never torch.
"""
