"""The Run:ai backend: ``runai training pytorch|mpi submit`` with the same pod scripts as Kubernetes.

Imports the launch interface and spec, the shared pod scripts (:mod:`gpuaccept.launch.pod_script`,
:mod:`gpuaccept.launch.log_reports`) and Kubernetes name checks; never torch.
"""
