"""Continuous validation of idle nodes: ``gpuaccept sweep slurm`` (low-priority jobs on idle Slurm nodes) and
``gpuaccept sweep k8s`` (a CronJob with a negative PriorityClass)."""
