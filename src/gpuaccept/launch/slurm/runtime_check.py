"""``launch slurm --runtime``: the plan's extra files and notes, and what is checked before sbatch.

Before anything is submitted (exit 2, one line): the calling user has a passwd entry, every mount
source exists here (the nodes share this filesystem), and where the runtime is installed on this host
an image named ``localhost/...`` (one that only a local build makes) exists. A runtime missing on a
node, an image a node cannot pull, a port in use or a mount missing on a node fail the job with a
line naming the node, and the containers are removed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

from gpuaccept.errors import UsageError
from gpuaccept.launch.slurm.incontainer import IN_CONTAINER, IN_CONTAINER_SCRIPT
from gpuaccept.launch.slurm.options import SCRIPT, SlurmOptions
from gpuaccept.launch.slurm.runtime_script import (
    NODE_SCRIPT,
    SSHD_CONFIG,
    render_node_script,
    render_runtime_script,
    sshd_text,
    uses_ssh,
)
from gpuaccept.launch.spec import JobSpec


def runtime_files(spec: JobSpec, opts: SlurmOptions) -> dict[str, str]:
    """job.sbatch, the per-node script, the in-container script, the sshd configuration."""
    files = {SCRIPT: render_runtime_script(spec, opts), NODE_SCRIPT: render_node_script(spec, opts),
             IN_CONTAINER: IN_CONTAINER_SCRIPT}
    if uses_ssh(spec):
        files[SSHD_CONFIG] = sshd_text(spec, opts)
    return files


def runtime_notes(spec: JobSpec, opts: SlurmOptions) -> list[str]:
    notes = [f"containers run as the calling user with {opts.runtime} on every node; each removes its container "
             "when the job ends, fails or is cancelled"]
    if uses_ssh(spec):
        last = opts.ssh_port + spec.nodes - 1
        notes.append(f"the command runs on the first node once every node's sshd answers (ports {opts.ssh_port}"
                     f"-{last}, node index added; the image needs sshd, ssh and ssh-keygen); keys are made by the "
                     "job and removed when it ends")
    if opts.network != "host":
        notes.append(f"--network {opts.network}: sshd and NCCL then see that network, not the node's interfaces")
    return notes


def check_runtime_ready(spec: JobSpec, opts: SlurmOptions) -> None:
    """Raise UsageError for what can be known wrong before sbatch."""
    try:
        pwd.getpwuid(os.getuid())
    except KeyError:
        raise UsageError(f"uid {os.getuid()} has no passwd entry here: the containers run as the calling user "
                         "and need one") from None
    for mount in spec.mounts:
        if not os.path.exists(mount.source):
            raise UsageError(f"--mount {mount}: {mount.source} does not exist")
    image = spec.image or ""
    binary = shutil.which(opts.runtime or "")
    if binary and image.startswith("localhost/"):
        try:
            found = subprocess.run([binary, "image", "inspect", image], capture_output=True, timeout=60,
                                   stdin=subprocess.DEVNULL, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return
        if not found:
            raise UsageError(f"--image {image}: no such image in {opts.runtime} here, and a localhost/ image "
                             "cannot be pulled")
