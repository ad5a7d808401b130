"""The sbatch script (pure): one srun task per node, the job under torchrun or alone, Pyxis container options."""

from __future__ import annotations

import shlex

from gpuaccept.errors import ConfigError
from gpuaccept.launch.gpucount import NODE_WRAPPER
from gpuaccept.launch.jobargv import launch_dir, node_argv, nproc_option, torchrun_job
from gpuaccept.launch.slurm.options import RDZV_PORT_BASE, SlurmOptions
from gpuaccept.launch.spec import JobSpec, Mount


def pyxis_image(image: str) -> str:
    """The image as Pyxis/Enroot want it: ``nvcr.io/nvidia/pytorch:24.05-py3`` -> ``nvcr.io#nvidia/pytorch:24.05-py3``.

    A registry host (a first path component with ``.`` or ``:``, or
    ``localhost``) is separated with ``#``; Docker Hub names, squashfs files
    and images that already have a ``#`` are kept.
    """
    image = image.removeprefix("docker://")
    if "#" in image or image.startswith(("/", "./", "../")) or image.endswith(".sqsh"):
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def _sbatch_value(flag: str, value: str) -> str:
    """One ``#SBATCH --flag=value`` line; sbatch honours double quotes around a value with spaces."""
    if '"' in value or "\n" in value or "\r" in value:
        raise ConfigError(flag, value, "cannot contain double quotes or newlines in an #SBATCH line")
    if any(c.isspace() for c in value):
        value = f'"{value}"'
    return f"#SBATCH {flag}={value}"


def _covered(path: str, mounts: list[Mount]) -> bool:
    path = path.rstrip("/") or "/"
    return any(path == m.target.rstrip("/") or path.startswith(m.target.rstrip("/") + "/") for m in mounts)


def _container_mounts(spec: JobSpec, opts: SlurmOptions) -> list[Mount]:
    """The user's mounts, then the results directory and the job's working directory at their own paths
    (unless a mount covers them, or ``--container-workdir`` names a directory inside the image)."""
    mounts = list(spec.mounts)
    for path in (spec.results_dir, None if opts.container_workdir else spec.workdir):
        if path and not _covered(path, mounts):
            mounts.append(Mount(path.rstrip("/") or "/", path.rstrip("/") or "/"))
    for m in mounts:
        for path in (m.source, m.target):
            if "," in path or any(c.isspace() for c in path):
                raise ConfigError("--mount", str(m), "Pyxis mounts cannot contain commas or whitespace "
                                                      "(the results and working directories are mounted too)")
    return mounts


# Options that only --runtime docker|podman reads, with their flags and defaults.
RUNTIME_ONLY = (("ssh_port", "--ssh-port"), ("handshake_timeout_s", "--handshake-timeout"),
                ("runtime_args", "--runtime-arg"), ("privileged", "--privileged"), ("ipc_host", "--no-ipc-host"),
                ("network", "--network"), ("shm_size", "--shm-size"), ("container_gpus", "--container-gpus"))


def _check_container_options(spec: JobSpec, opts: SlurmOptions) -> None:
    default = SlurmOptions()
    for key, flag in RUNTIME_ONLY:
        if getattr(opts, key) != getattr(default, key):
            raise ConfigError(flag, "", "is an option of --runtime docker|podman (Pyxis has no such option)")
    if spec.image:
        return
    if spec.mounts:
        raise ConfigError("--mount", str(spec.mounts[0]),
                          "bind mounts need a container image: give --image (Pyxis/Enroot)")
    for flag, used in (("--container-workdir", opts.container_workdir is not None),
                       ("--no-container-mount-home", not opts.container_mount_home),
                       ("--container-env", bool(opts.container_env))):
        if used:
            raise ConfigError(flag, "", "is a Pyxis option and needs a container image: give --image")


def _quoted(text: str) -> str:
    """Single-quoted even when shlex would not quote (a comma list in a bash array trips SC2054)."""
    q = shlex.quote(text)
    return q if q.startswith("'") else f"'{text}'"


def _continued(words: list[str], indent: str = "  ") -> str:
    """Shell words on continuation lines of at most ~100 characters."""
    lines: list[str] = []
    cur = ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > 100:
            lines.append(cur)
            cur = indent + w
        else:
            cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return " \\\n".join(lines)


def sbatch_header(spec: JobSpec, opts: SlurmOptions, how: str) -> list[str]:
    """The script's first lines: the #SBATCH options, ``set -euo pipefail``, the exported --env values and
    the run directory made."""
    q = shlex.quote
    out_dir = launch_dir(spec)
    what = "the acceptance suite" if spec.command is None else "a command"
    out = [
        "#!/bin/bash",
        f"# gpuaccept launch slurm: {what} on {spec.nodes} node(s), {how}; run {spec.run_id}.",
        "# Generated from a job spec: the same spec gives the same script.",
        _sbatch_value("--job-name", spec.name),
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if spec.gpus_per_node:
        out.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    if opts.cpus_per_task:
        out.append(f"#SBATCH --cpus-per-task={opts.cpus_per_task}")
    if spec.time_limit_min:
        out.append(f"#SBATCH --time={spec.time_limit_min}")
    for flag, value in (("--partition", opts.partition), ("--account", opts.account), ("--qos", opts.qos),
                        ("--exclude", opts.exclude), ("--nodelist", opts.nodelist)):
        if value:
            out.append(_sbatch_value(flag, value))
    if opts.exclusive:
        out.append("#SBATCH --exclusive")
    if opts.mem is not None:
        out.append(f"#SBATCH --mem={opts.mem}")
    out.append(_sbatch_value("--output", out_dir.replace("%", "%%") + "/slurm-%j.out"))
    if spec.workdir and not spec.image:
        out.append(_sbatch_value("--chdir", spec.workdir))
    out.extend(f"#SBATCH {line}" for line in opts.sbatch_lines)
    out += ["set -euo pipefail", ""]

    for name, value in spec.env.items():
        out.append(f"export {name}={q(value)}")
    out.append(f"mkdir -p {q(spec.run_results_dir)}")
    out.append("")
    return out


def rendezvous_lines() -> list[str]:
    """Shell lines that set ``head_addr`` and ``rdzv_port``: the c10d rendezvous of torchrun."""
    return [
        "# c10d rendezvous on the first allocated node, at the address Slurm itself uses for it.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        'head_addr=$(scontrol show node "$head_node" -o 2>/dev/null '
        "| sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p' || true)",
        'head_addr=${head_addr:-$head_node}',
        f"rdzv_port=$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % 20000 ))",
        'echo "[LAUNCH] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: rendezvous $head_addr:$rdzv_port"',
        "",
    ]


def torchrun_words(spec: JobSpec) -> list[str]:
    """torchrun on this node, joining the rendezvous of :func:`rendezvous_lines` (shell words)."""
    q = shlex.quote
    return [q(spec.python), "-m", "torch.distributed.run", '--nnodes="$SLURM_JOB_NUM_NODES"',
            nproc_option(spec), "--rdzv-backend=c10d", '--rdzv-endpoint="$head_addr:$rdzv_port"',
            '--rdzv-id="$SLURM_JOB_ID"', *(q(a) for a in torchrun_job(spec))]


def torchrun_how(spec: JobSpec) -> str:
    """How many ranks torchrun starts per node, for the script's first comment."""
    return f"torchrun x{spec.nproc} per node" if spec.nproc else "torchrun, one rank per GPU of each node"


def node_gpus_lines() -> list[str]:
    """``node_gpus``: the script each node runs its job under when the ranks per node are counted there."""
    return ["# No --gpus-per-node: each node counts its GPUs and starts one rank per GPU (gpucount.py).",
            "node_gpus=$(cat <<'EOF'", *NODE_WRAPPER.splitlines(), "EOF", ")", ""]


def render_script(spec: JobSpec, opts: SlurmOptions) -> str:
    """The sbatch script for ``spec``: pure and deterministic (``--runtime``: runtime_script.py)."""
    _check_container_options(spec, opts)
    q = shlex.quote
    out = sbatch_header(spec, opts, torchrun_how(spec) if spec.distributed else "one process per node")
    srun = ['--nodes="$SLURM_JOB_NUM_NODES"', "--ntasks-per-node=1",
            f"--kill-on-bad-exit={1 if spec.distributed else 0}"]
    if opts.cpus_per_task:
        srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
    if spec.image:
        srun.append(_quoted(f"--container-image={pyxis_image(spec.image)}"))
        srun.append(_quoted("--container-mounts=" + ",".join(str(m) for m in _container_mounts(spec, opts))))
        passed = list(dict.fromkeys([*spec.env, *opts.container_env]))
        if passed:
            srun.append(_quoted("--container-env=" + ",".join(passed)))
        workdir = opts.container_workdir or spec.workdir
        if workdir:
            srun.append(q(f"--container-workdir={workdir}"))
        if not opts.container_mount_home:
            srun.append("--no-container-mount-home")
    srun.extend(_quoted(a) if "," in a else q(a) for a in opts.srun_args)

    if spec.distributed:
        out += rendezvous_lines()
        job = torchrun_words(spec)
        if spec.nproc is None:
            out += node_gpus_lines()
            job = ["sh", "-c", '"$node_gpus"', "gpuaccept-gpus", *job]
    else:
        out += ['echo "[LAUNCH] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"', ""]
        job = [q(a) for a in node_argv(spec)]
    out.append("srun_args=(")
    out.extend(f"  {a}" for a in srun)
    out.append(")")
    out.append("# Each task names its node, so reports are attributed to Slurm's node names.")
    out.append("# shellcheck disable=SC2016")
    wrapper = ['srun', '"${srun_args[@]}"', "sh", "-c",
               q('GPUACCEPT_HOSTNAME="$SLURMD_NODENAME"; export GPUACCEPT_HOSTNAME; exec "$@"'), "gpuaccept-node"]
    out.append(_continued([*wrapper, *job]))
    return "\n".join(out) + "\n"
