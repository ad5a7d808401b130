"""The ssh backend: the job started on every host over ssh, with a bound on connections.

Imports the launch interface, spec and host lists (:mod:`gpuaccept.launch.hosts`), never torch.
"""
