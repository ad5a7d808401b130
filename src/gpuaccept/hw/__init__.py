"""Hardware discovery: devices without torch, NVML readings and the per-SKU data file.

May import only ``model`` and ``errors`` of ours; torch only inside functions.
"""
