"""The Slurm backend: an sbatch script that starts one torchrun (or the suite) per node through srun.

``backend`` (options, plan, submit, watch, cancel) and ``parse`` (pure parsers of sbatch,
squeue, scontrol and sacct output). Imports the launch interface and spec, never torch.
"""
