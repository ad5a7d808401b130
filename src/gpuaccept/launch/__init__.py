"""Launching the suite, or any command, across nodes through a scheduler.

Each backend turns a :class:`~gpuaccept.launch.spec.JobSpec` into a
:class:`~gpuaccept.launch.base.Plan` with a pure function; ``launch`` is that
plan submitted. Nothing here imports torch.
"""
