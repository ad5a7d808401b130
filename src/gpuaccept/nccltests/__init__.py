"""nccl-tests (github.com/NVIDIA/nccl-tests): find and run its binaries, parse their output, judge it.

``parse`` reads the text table of any version (and the ``-J`` JSON file) into a
:class:`~gpuaccept.nccltests.parse.NcclTestsResult`; ``judge`` turns one into a
status, a reason and metrics; ``binaries`` finds and runs ``<test>_perf``. None
of it imports torch.
"""
