"""The mpi backend: one ``mpirun`` with a hostfile starts the job on every host.

Imports the launch interface, spec and host lists (:mod:`gpuaccept.launch.hosts`), never torch.
"""
