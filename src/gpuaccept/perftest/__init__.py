"""perftest (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``, ``ib_*_lat``): parse, judge and plan RDMA pair tests.

Pure modules (:mod:`.parse`, :mod:`.judge`, :mod:`.plan`) and the ``gpuaccept rdma`` command (:mod:`.cli`);
nothing here imports torch.
"""
