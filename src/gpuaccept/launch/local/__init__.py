"""The local backend: several "nodes" as process groups on this machine, to try a launch flow.

Imports the launch interface and spec, never torch.
"""
