"""The NVIDIA Base Command Platform backend: ``ngc base-command job run`` with the shared pod scripts.

Imports the launch interface and spec, the shared pod scripts (:mod:`gpuaccept.launch.pod_script`,
:mod:`gpuaccept.launch.log_reports`) and :mod:`gpuaccept.launch.jobargv`; never torch.
"""
