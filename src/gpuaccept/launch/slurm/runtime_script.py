"""``launch slurm --runtime docker|podman``: the job starts its own containers, as the calling user (pure).

Where a cluster has Docker or podman on its nodes but no Pyxis/Enroot. The plan is four files:

- ``job.sbatch``: writes the job's state directory ``<launch>/container`` (mode 0700): the calling user's
  own passwd and group entries (from ``getent``, nothing else of the node's databases), an
  ``ssh_config`` with a ``Host`` block per allocated node (its NodeAddr, port base + index), and an MPI
  hostfile; then one srun task per node runs ``container-node.sh``, and a second step sweeps away any
  container a killed task left. The ssh keys are removed when the script exits, however it exits.
- ``container-node.sh``: on each node, starts ``<runtime> run --rm`` as the user (``--user uid:gid``;
  rootless podman adds ``--userns=keep-id`` so files keep the user's ids; docker adds the supplementary
  groups), with HOME, the working directory, the results directory and the mounts at their own paths,
  host network and IPC by default, and the node's GPUs (``--gpus`` for docker, CDI
  ``--device nvidia.com/gpu=...`` for podman, honouring Slurm's GPU binding). SIGTERM (scancel),
  SIGINT and SIGHUP remove the container before the task exits.
- ``in-container.sh`` (incontainer.py): the sshd handshake and the job.
- ``sshd_config``: the user-mode sshd configuration every node includes.

With a command, the command runs once, on the first node, after every node's sshd answered (the
``mpirun`` pattern); with no command, the suite runs in every node's container (under torchrun across
the nodes when distributed), as with Pyxis. The job's exit code is the command's.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from gpuaccept.containers.sshd import SshHost, check_path, ssh_config_text, sshd_config_text
from gpuaccept.errors import ConfigError, UsageError
from gpuaccept.launch.gpucount import PLACEHOLDER, count_lines
from gpuaccept.launch.jobargv import launch_dir, node_argv
from gpuaccept.launch.slurm.incontainer import IN_CONTAINER
from gpuaccept.launch.slurm.options import SlurmOptions
from gpuaccept.launch.slurm.script import (
    _container_mounts,
    _continued,
    _quoted,
    rendezvous_lines,
    sbatch_header,
    torchrun_how,
    torchrun_words,
)
from gpuaccept.launch.spec import JobSpec

NODE_SCRIPT = "container-node.sh"
SSHD_CONFIG = "sshd_config"
STATE_DIR = "container"
CONTAINER_PREFIX = "gpuaccept"


def state_dir(spec: JobSpec) -> str:
    """The job's state directory: passwd, group, ssh_config, hostfile, keys, per-node markers and logs."""
    return f"{launch_dir(spec)}/{STATE_DIR}"


def uses_ssh(spec: JobSpec) -> bool:
    """A command runs the mpirun pattern (sshd on every node); the suite runs in every container."""
    return spec.command is not None


def _check(spec: JobSpec, opts: SlurmOptions) -> None:
    if not spec.image:
        raise ConfigError("--runtime", opts.runtime or "", "needs --image: the container image every node runs")
    if opts.ssh_port + spec.nodes - 1 > 65535:
        raise ConfigError("--ssh-port", str(opts.ssh_port), f"the last of {spec.nodes} nodes would listen on "
                                                              f"{opts.ssh_port + spec.nodes - 1}, past 65535")
    if uses_ssh(spec):
        try:
            check_path(Path(state_dir(spec)), "--report-dir")
        except UsageError as exc:
            raise ConfigError("--report-dir", spec.results_dir,
                              f"{exc}; the ssh configuration of the job lives there") from None


def sshd_text(spec: JobSpec, opts: SlurmOptions) -> str:
    """The user-mode sshd configuration all nodes include (keys in the state directory; port on the command line)."""
    text = sshd_config_text(Path(state_dir(spec)) / "ssh", opts.ssh_port, key_types=("ed25519",))
    body = text.split("\n", 1)[1]
    return ("# sshd_config of 'gpuaccept launch slurm --runtime': every node's sshd includes it and listens on\n"
            "# --ssh-port + the node's index; the keys are made by the job on its first node.\n" + body)


def _ssh_config_lines(spec: JobSpec) -> list[str]:
    """Bash lines writing ``ssh_config``: one ``Host`` block per node, rendered by ssh_config_text."""
    template = ssh_config_text([SshHost("NODE", "ADDR", 65535)], Path(state_dir(spec)) / "ssh")
    block = [line for line in template.splitlines()[2:] if line]
    subs = {"Host NODE": "Host $host", "    HostName ADDR": "    HostName $addr",
            "    HostKeyAlias NODE": "    HostKeyAlias $host", "    Port 65535": "    Port $((ssh_port + i))"}
    words = " ".join(f'"{subs.get(line, line)}"' for line in block)
    return [
        "# One Host block per node: its NodeAddr and its own port (two nodes may share a host).",
        "{",
        '  echo "# ssh_config of slurm job $SLURM_JOB_ID (its sbatch script wrote it): ssh -F $state/ssh_config NODE"',
        '  for i in "${!hosts[@]}"; do',
        '    host=${hosts[$i]}',
        '    addr=$(scontrol show node "$host" -o 2>/dev/null | sed -n \'s/.* NodeAddr=\\([^ ]*\\).*/\\1/p\' || true)',
        '    addr=${addr:-$host}',
        f"    printf '%s\\n' {words} ''",
        "  done",
        '} >"$state/ssh_config"',
    ]


def _identity_lines() -> list[str]:
    return [
        "# The calling user's own passwd and group entries for the containers (nothing else from this node).",
        'uid=$(id -u); gid=$(id -g); user=$(id -un)',
        'if ! entry=$(getent passwd "$uid"); then',
        '  echo "[LAUNCH] uid $uid has no passwd entry on $(hostname): the containers need one" >&2',
        "  exit 2",
        "fi",
        'home=$(printf "%s" "$entry" | cut -d: -f6)',
        "{",
        "  [ \"$uid\" = 0 ] || echo 'root:x:0:0:root:/root:/bin/sh'",
        "  printf '%s:x:%s:%s:%s:%s:/bin/sh\\n' \"$user\" \"$uid\" \"$gid\" \"$user\" \"$home\"",
        '} >"$state/passwd"',
        "{",
        "  [ \"$gid\" = 0 ] || echo 'root:x:0:'",
        "  for g in $(id -G); do",
        '    gname=$(getent group "$g" | cut -d: -f1 || true)',
        "    printf '%s:x:%s:%s\\n' \"${gname:-g$g}\" \"$g\" \"$user\"",
        "  done",
        '} >"$state/group"',
        'chmod 0644 "$state/passwd" "$state/group"',
    ]


def render_runtime_script(spec: JobSpec, opts: SlurmOptions) -> str:
    """The sbatch script of ``--runtime docker|podman``: pure and deterministic."""
    _check(spec, opts)
    q = shlex.quote
    ssh = uses_ssh(spec)
    how = (f"{opts.runtime} containers, the command on the first node over sshd" if ssh else
           f"{opts.runtime} containers, " + (torchrun_how(spec) if spec.distributed else "one process per node"))
    counted = spec.nproc is None and (ssh or spec.distributed)
    slots = "$nproc" if counted else str(spec.nproc or 1)
    out = sbatch_header(spec, opts, how)
    out += [
        f"launch={q(launch_dir(spec))}",
        f'state="$launch/{STATE_DIR}"',
        'rm -rf "$state"',
        'mkdir -m 0700 "$state"',
        "# The job's ssh keys never outlive it, however the script ends (scancel sends SIGTERM).",
        '# shellcheck disable=SC2317',
        'remove_keys() { rm -rf "$state/ssh"; }',
        "trap remove_keys EXIT",
        "trap 'exit 143' TERM INT HUP",
        "",
        *_identity_lines(),
        "",
        'mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
    ]
    if counted:  # the nodes of one job are alike: the first one's count is every node's
        out += ["# No --gpus-per-node: one rank per GPU of each node, as many as this (the first) node has.",
                *count_lines("nproc", "$(hostname)")]
    if ssh:
        out += [f"ssh_port={opts.ssh_port}", *_ssh_config_lines(spec),
                (f"printf '%s slots={slots}\\n' \"${{hosts[@]}}\" >\"$state/hostfile\"" if not counted else
                 'for h in "${hosts[@]}"; do printf \'%s slots=%s\\n\' "$h" "$nproc"; done >"$state/hostfile"')]
    out += [
        'GPUACCEPT_HOSTLIST=$(IFS=,; echo "${hosts[*]}")',
        f"GPUACCEPT_SLOTS_PER_NODE={slots}",
        f"GPUACCEPT_NP=$(( ${{#hosts[@]}} * {slots.lstrip('$')} ))",
        "export GPUACCEPT_HOSTLIST GPUACCEPT_SLOTS_PER_NODE GPUACCEPT_NP",
    ]
    if ssh:
        out += ['GPUACCEPT_HOSTFILE="$state/hostfile"', 'GPUACCEPT_SSH_CONFIG="$state/ssh_config"',
                "export GPUACCEPT_HOSTFILE GPUACCEPT_SSH_CONFIG"]
    out.append("")
    if ssh:
        out.append(f'echo "[LAUNCH] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: {opts.runtime} containers, '
                   f'sshd on port {opts.ssh_port} + node index"')
        job = [q(a) for a in node_argv(spec)]
    elif spec.distributed:
        out += rendezvous_lines()
        job = [f'"--nproc-per-node={slots}"' if w == PLACEHOLDER else w for w in torchrun_words(spec)]
    else:
        out.append(f'echo "[LAUNCH] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: {opts.runtime} containers"')
        job = [q(a) for a in node_argv(spec)]
    srun = ['--nodes="$SLURM_JOB_NUM_NODES"', "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if opts.cpus_per_task:
        srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
    srun.extend(_quoted(a) if "," in a else q(a) for a in opts.srun_args)
    out.append("srun_args=(")
    out.extend(f"  {a}" for a in srun)
    out.append(")")
    out.append("# In the background, so that scancel's SIGTERM runs the traps at once (bash defers them while a")
    out.append("# foreground command runs, and Slurm sends SIGKILL after KillWait).")
    out.append(_continued(["srun", '"${srun_args[@]}"', "bash", f'"$launch/{NODE_SCRIPT}"', *job]) + " &")
    out.append("rc=0")
    out.append("wait $! || rc=$?")
    out += failure_report_lines()
    if ssh:
        out += ["# The job's exit code is the command's (srun's is the highest of all tasks', and a failing",
                "# command makes srun end the other nodes' tasks with SIGTERM).",
                'done_rc=$(cat "$state/done" 2>/dev/null || true)',
                'case $done_rc in "" | *[!0-9]*) ;; *) rc=$done_rc ;; esac']
    out += [
        "# A task killed before it removed its container leaves it behind: remove any of this job's.",
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 bash "$launch/' + NODE_SCRIPT
        + '" --sweep || true',
        'exit "$rc"',
    ]
    return "\n".join(out) + "\n"


def _runtime_options(spec: JobSpec, opts: SlurmOptions) -> list[str]:
    """The container options every node's ``run`` gets, from the plan."""
    args = [f"--network={opts.network}"]
    if opts.ipc_host:
        args.append("--ipc=host")
    if opts.shm_size:
        args.append(f"--shm-size={opts.shm_size}")
    if opts.privileged:
        args.append("--privileged")
    args.extend(opts.runtime_args)
    return args


def _local_addr_lines() -> list[str]:
    """torchrun names each node by the address Slurm uses for it (``PET_LOCAL_ADDR``, torchrun's
    ``--local-addr``), which is also the address rank 0 publishes to the others. Its default, the FQDN
    with the agent's process id, is the same in two containers of one host (both agents are pid 1 with
    the host's name), and the rendezvous then waits forever for a second node it already counted."""
    return [
        "# torchrun's node identity and published address: this node's NodeAddr (see runtime_script.py).",
        'addr=$(scontrol show node "$node" -o 2>/dev/null | sed -n \'s/.* NodeAddr=\\([^ ]*\\).*/\\1/p\' || true)',
        '[ -z "$addr" ] || args+=(-e "PET_LOCAL_ADDR=$addr")',
    ]


FAILED_PREFIX = "failed."
"""``<state>/failed.<node>``: one line, why the node's task failed (written by the node, read by the job and the
launcher)."""


def _fail_lines() -> list[str]:
    """``fail``: say why on stderr, record it in ``failed.<node>`` (a new file renamed into place, so a reader
    sees the whole line or none; a name that is not a plain host name becomes ``task<index>``), exit 2. srun
    may drop a task's last output when ``--kill-on-bad-exit`` ends the others: the file is what the job and
    the launcher read."""
    return [
        "case $node in '' | .* | *[!A-Za-z0-9._-]*) node_file=task$index ;; *) node_file=$node ;; esac",
        "fail() {",
        '  say "$*"',
        f'  local tmp="$state/.{FAILED_PREFIX}$node_file.$$"',
        "  (set -C; printf '%s\\n' \"$*\" >\"$tmp\") 2>/dev/null &&",
        f'    mv -f "$tmp" "$state/{FAILED_PREFIX}$node_file"',
        "  exit 2",
        "}",
    ]


def failure_report_lines() -> list[str]:
    """Bash lines of the sbatch script, after the nodes' step: one line per ``failed.<node>`` file, written by
    the job itself (srun may have dropped the node's own line)."""
    return [
        "# Why each failed node failed, from its failed.<node> file (srun may drop a task's last output when",
        "# --kill-on-bad-exit ends the other tasks).",
        f'for f in "$state"/{FAILED_PREFIX}*; do',
        '  if [ -f "$f" ] && [ ! -L "$f" ]; then',
        f'    echo "[LAUNCH] ${{f##*/{FAILED_PREFIX}}} failed: $(head -c 1000 "$f" | head -n 1)"',
        "  fi",
        "done",
    ]


def render_node_script(spec: JobSpec, opts: SlurmOptions) -> str:
    """``container-node.sh``: one per node, run by srun (pure and deterministic)."""
    q = shlex.quote
    runtime = opts.runtime or "podman"
    mounts = _container_mounts(spec, opts)
    workdir = opts.container_workdir or spec.workdir or ""
    env_names = list(dict.fromkeys([*spec.env, *opts.container_env]))
    remove = f'"$runtime" rm -f{" -t 3" if runtime == "podman" else ""} "$name"'

    def array(name: str, items: list[str]) -> str:
        return f"{name}=(" + " ".join(q(i) for i in items) + ")"

    lines = [
        "#!/bin/bash",
        f"# gpuaccept launch slurm --runtime {runtime}: srun runs this once per node. It starts the node's container",
        "# as the calling user, waits for it, and removes it when the job ends, fails or is cancelled",
        "# (scancel sends SIGTERM). '--sweep' removes any container of this job that a killed task left.",
        "set -uo pipefail",
        f"runtime={runtime}",
        f"image={q(spec.image or '')}",
        f"launch={q(launch_dir(spec))}",
        f'state="$launch/{STATE_DIR}"',
        f"mode={'mpi' if uses_ssh(spec) else 'each'}",
        f"ssh_port={opts.ssh_port}",
        f"handshake_s={opts.handshake_timeout_s}",
        f"gpus={opts.container_gpus}",
        f"mount_home={1 if opts.container_mount_home else 0}",
        f"workdir={q(workdir)}",
        array("mounts", [str(m) for m in mounts]),
        array("env_names", env_names),
        array("options", _runtime_options(spec, opts)),
        "",
        'index=${SLURM_NODEID:?run this with srun}',
        'node=${SLURMD_NODENAME:-$(hostname -s)}',
        f'name="{CONTAINER_PREFIX}-$SLURM_JOB_ID-$index"',
        'say() { echo "[LAUNCH] $node: $*" >&2; }',
        *_fail_lines(),
        "",
        'if [ "${1:-}" = --sweep ]; then',
        f'  "$runtime" ps -aq --filter "name=^{CONTAINER_PREFIX}-$SLURM_JOB_ID-" 2>/dev/null | while read -r id; do',
        '    "$runtime" rm -f "$id" >/dev/null 2>&1 && say "removed a container left behind ($id)"',
        "  done",
        "  exit 0",
        "fi",
        "",
        'command -v "$runtime" >/dev/null || fail "$runtime is not installed on this node"',
        'if ! out=$("$runtime" info 2>&1 >/dev/null); then',
        '  fail "$runtime does not answer on this node: $(printf "%s" "$out" | tail -n 1)"',
        "fi",
        'for m in "${mounts[@]}"; do',
        '  [ -e "${m%%:*}" ] || fail "mount source ${m%%:*} does not exist on this node"',
        "done",
        'if ! "$runtime" image inspect "$image" >/dev/null 2>&1; then',
        '  say "pulling $image"',
        '  out=$("$runtime" pull "$image" 2>&1) || fail "image $image is not on this node and could not be pulled: '
        '$(printf "%s" "$out" | tail -n 1)"',
        "fi",
        "",
        'uid=$(id -u); gid=$(id -g); home=${HOME:-}',
        'args=(run --rm --name "$name" --entrypoint /bin/sh --user "$uid:$gid" "${options[@]}")',
    ]
    if runtime == "podman":
        lines.append('[ "$uid" = 0 ] || args+=(--userns=keep-id)  # rootless: the user keeps its ids in the container')
    else:
        lines += ['for g in $(id -G); do [ "$g" = "$gid" ] || args+=(--group-add "$g"); done']
    lines += [
        'args+=(-v "$state/passwd:/etc/passwd:ro" -v "$state/group:/etc/group:ro" -e "HOME=$home")',
        'if [ "$mount_home" = 1 ] && [ -n "$home" ] && [ -d "$home" ]; then args+=(-v "$home:$home"); fi',
        'for m in "${mounts[@]}"; do args+=(-v "$m"); done',
        'if [ -z "$workdir" ]; then workdir=$SLURM_SUBMIT_DIR; args+=(-v "$workdir:$workdir"); fi',
        'args+=(-w "$workdir")',
        "# GPUs: Slurm's binding (absolute indices) first, then CUDA_VISIBLE_DEVICES, else all of the node's.",
        'ids=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}}',
        'if [ "$gpus" = all ] || { [ "$gpus" = auto ] && [ -e /dev/nvidiactl ]; }; then',
    ]
    if runtime == "podman":
        lines += [
            '  if [ -n "$ids" ]; then for i in ${ids//,/ }; do args+=(--device "nvidia.com/gpu=$i"); done',
            "  else args+=(--device nvidia.com/gpu=all); fi",
        ]
    else:
        lines += ['  if [ -n "$ids" ]; then args+=(--gpus "\\"device=$ids\\""); else args+=(--gpus all); fi']
    lines += [
        'elif [ "$gpus" = auto ]; then',
        '  say "no NVIDIA device here (/dev/nvidiactl): the container gets no GPU"',
        "fi",
        "# Values come from this task's environment, never the command line (ps shows that).",
        'for n in "${env_names[@]}"; do args+=(-e "$n"); done',
        'args+=(-e "GPUACCEPT_HOSTNAME=$node" -e "GPUACCEPT_CT_MODE=$mode" -e "GPUACCEPT_CT_DIR=$state"',
        '       -e "GPUACCEPT_CT_INDEX=$index" -e "GPUACCEPT_CT_PORT=$((ssh_port + index))"',
        '       -e "GPUACCEPT_CT_HANDSHAKE_S=$handshake_s" -e "GPUACCEPT_CT_SSHD_CONFIG=$launch/' + SSHD_CONFIG + '"',
        "       -e GPUACCEPT_HOSTLIST -e GPUACCEPT_NP -e GPUACCEPT_SLOTS_PER_NODE)",
        '[ "$mode" = each ] || args+=(-e GPUACCEPT_HOSTFILE -e GPUACCEPT_SSH_CONFIG)',
        *(_local_addr_lines() if spec.distributed and not uses_ssh(spec) else []),
        "",
        "# shellcheck disable=SC2317",
        f"cleanup() {{ trap - TERM INT HUP; {remove} >/dev/null 2>&1 || true; }}",
        "trap 'cleanup; exit 143' TERM INT HUP",
        'say "$runtime ${args[*]} $image"',
        f'"$runtime" "${{args[@]}}" "$image" "$launch/{IN_CONTAINER}" "$@" &',
        "wait $!",
        "rc=$?",
        'case $rc in 0) ;; 125) say "$runtime could not start the container (exit 125; its error is above)" ;;',
        '  *) say "the container exited with $rc" ;; esac',
        "cleanup",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"
