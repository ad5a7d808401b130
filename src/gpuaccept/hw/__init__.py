"""Hardware discovery: NVML readings, torch devices and the per-SKU data file."""
