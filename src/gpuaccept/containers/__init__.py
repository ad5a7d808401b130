"""Containers: the multi-node and runtime images, ``image build``, pip constraints and user-mode sshd.

Plans (build command lines, config files) are built by pure functions; running a builder or
writing files happens at the edges. May import :mod:`gpuaccept.errors`, :mod:`gpuaccept.model`
and :mod:`gpuaccept.launch`'s job spec; never torch.
"""
