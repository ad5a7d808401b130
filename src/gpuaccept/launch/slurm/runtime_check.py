"""``launch slurm --runtime``: the plan's extra files and notes, and what is checked before sbatch.

Before anything is submitted (exit 2, one line): the calling user has a passwd entry, every mount
source exists here (the nodes share this filesystem), and where the runtime is installed on this host
an image named ``localhost/...`` (one that only a local build makes) exists. A runtime missing on a
node, an image a node cannot pull, a port in use or a mount missing on a node fail the job with a
line naming the node, and the containers are removed: each failed node writes ``failed.<node>`` in the
job's state directory, and :func:`node_failures` reads them for the launcher.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
from pathlib import Path

from gpuaccept.errors import UsageError
from gpuaccept.launch.slurm.incontainer import IN_CONTAINER, IN_CONTAINER_SCRIPT
from gpuaccept.launch.slurm.options import SCRIPT, SlurmOptions
from gpuaccept.launch.slurm.runtime_script import (
    FAILED_PREFIX,
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


_NODE_FILE = re.compile(re.escape(FAILED_PREFIX) + r"([A-Za-z0-9_-][A-Za-z0-9._-]{0,254})")
_MAX_LINE = 1000


def node_failures(state: Path) -> list[str]:
    """``[LAUNCH] <node> failed: <why>`` for each ``failed.<node>`` file in the job's state directory ``state``,
    by node name; files whose name is not a plain host name, links and anything not a regular file are
    ignored, and only a file's first line (at most 1000 bytes) is read. Empty when there are none."""
    try:
        if not stat.S_ISDIR(os.lstat(state).st_mode):
            return []
        names = sorted(os.listdir(state))
    except OSError:
        return []
    lines = []
    for name in names:
        match = _NODE_FILE.fullmatch(name)
        if match is None:
            continue
        try:
            fd = os.open(state / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            data = os.read(fd, _MAX_LINE)
        except OSError:
            continue
        finally:
            os.close(fd)
        why = data.decode(errors="replace").splitlines()[0].strip() if data.strip() else "no reason written"
        lines.append(f"[LAUNCH] {match.group(1)} failed: {why}")
    return lines
