"""What runs inside each node's container under ``launch slurm --runtime``: one POSIX sh script, the same
for every job (its settings come from the environment that container-node.sh passes).

Mode ``each`` runs the job in every container (the suite per node, or torchrun per node). Mode ``mpi``
is the pattern for a script that calls ``mpirun``:

1. The first node (the master) makes the job's ssh keys in ``<launch>/container/ssh`` (mode 0700,
   removed when the job ends) and says so with a ``ready`` file; the others wait for it.
2. Every node (master included) starts a user-mode sshd on its own port (base port + its index in the
   allocation), with ``SetEnv`` for PATH, the CUDA/NCCL/MPI variables and GPUACCEPT_HOSTNAME. A node
   whose sshd does not start writes ``failed.<node>`` with sshd's last line (a new file renamed into
   place: the master reads the whole line or nothing).
3. The master waits until every node's sshd answers (``ssh true`` through the job's ssh_config), for at
   most the handshake bound; its error names the nodes that never answered.
4. The master runs the job with GPUACCEPT_HOSTLIST, GPUACCEPT_NP, GPUACCEPT_SLOTS_PER_NODE,
   GPUACCEPT_HOSTFILE and GPUACCEPT_SSH_CONFIG set, and mpirun's ssh agent pointed at the ssh_config
   (``OMPI_MCA_plm_rsh_agent``; ``HYDRA_LAUNCHER_EXTRA_ARGS`` for MPICH and Intel MPI). It writes
   ``done`` with the job's exit code, stops its sshd and exits with that code; each worker stops its
   sshd and exits when it sees ``done``.

Where the image has NGC's ``/opt/nvidia/nvidia_entrypoint.sh``, the job runs through it (it sets up
CUDA's compatibility libraries), as it would with the image's own entrypoint.
"""

from __future__ import annotations

IN_CONTAINER = "in-container.sh"

IN_CONTAINER_SCRIPT = r"""#!/bin/sh
# gpuaccept launch slurm --runtime: runs inside each node's container as the calling user; see
# gpuaccept/launch/slurm/incontainer.py. Settings: GPUACCEPT_CT_MODE (each|mpi), GPUACCEPT_CT_DIR,
# GPUACCEPT_CT_INDEX, GPUACCEPT_CT_PORT, GPUACCEPT_CT_HANDSHAKE_S, GPUACCEPT_CT_SSHD_CONFIG,
# GPUACCEPT_HOSTNAME, GPUACCEPT_HOSTLIST, GPUACCEPT_HOSTFILE, GPUACCEPT_SSH_CONFIG.
set -u
node="${GPUACCEPT_HOSTNAME:?}"

say() {
    echo "[LAUNCH] $node: $*" >&2
}

if [ "${GPUACCEPT_CT_MODE:-each}" = each ]; then
    if [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
        exec /opt/nvidia/nvidia_entrypoint.sh "$@"
    fi
    exec "$@"
fi

dir="${GPUACCEPT_CT_DIR:?}"
keys="$dir/ssh"
index="${GPUACCEPT_CT_INDEX:?}"
port="${GPUACCEPT_CT_PORT:?}"
bound="${GPUACCEPT_CT_HANDSHAKE_S:-120}"
deadline=$(($(date +%s) + bound))
sshd_pid=""
nl="$(printf '\nx')"
nl="${nl%x}"

stop_sshd() {
    if [ -n "$sshd_pid" ]; then
        kill "$sshd_pid" 2>/dev/null
        wait "$sshd_pid" 2>/dev/null
        sshd_pid=""
    fi
}
# shellcheck disable=SC2317
on_signal() {
    stop_sshd
    if [ "$index" = 0 ]; then
        rm -rf "$keys"  # the job's private keys go with it (the sbatch script removes them too)
    fi
    exit 143
}
trap on_signal TERM INT HUP

# failed.<node>: written whole (a new file renamed into place), so the master never reads half a line; a node
# name that is not a plain host name becomes task<index>.
case $node in '' | .* | *[!A-Za-z0-9._-]*) node_file="task$index" ;; *) node_file=$node ;; esac
failed() {
    say "$*"
    tmp="$dir/.failed.$node_file.$$"
    (set -C && printf '%s\n' "$*" >"$tmp") 2>/dev/null && mv -f "$tmp" "$dir/failed.$node_file"
}

make_keys() {
    (
        umask 077
        mkdir -p "$keys" &&
            ssh-keygen -q -t ed25519 -N '' -C gpuaccept-host -f "$keys/ssh_host_ed25519_key" &&
            ssh-keygen -q -t ed25519 -N '' -C gpuaccept-client -f "$keys/id_ed25519" &&
            cp "$keys/id_ed25519.pub" "$keys/authorized_keys" &&
            printf '* %s\n' "$(cut -d' ' -f1,2 "$keys/ssh_host_ed25519_key.pub")" >"$keys/known_hosts" &&
            : >"$keys/ready"
    )
}

# The SetEnv line of this node's sshd (one line: sshd keeps only the first SetEnv it reads): the
# variables a job started over ssh needs, values sshd can quote.
session_environment() {
    words=$(environment_words)
    if [ -n "$words" ]; then
        printf 'SetEnv%s\n' "$words"
    fi
}

environment_words() {
    env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' | sort -u | while read -r name; do
        case "$name" in
            PATH | LD_LIBRARY_PATH | LIBRARY_PATH | CUDA_* | NCCL_* | NVIDIA_* | NV_* | OMPI_* | OPAL_* | PMIX_* \
                | UCX_* | HPCX_* | MPI_* | PYTHON* | TORCH_* | GPUACCEPT_* | HOME) ;;
            *) continue ;;
        esac
        case "$name" in GPUACCEPT_CT_*) continue ;; esac
        value="$(printenv "$name")" || continue
        case "$value" in
            *[\"\\]* | *"$nl"*) continue ;;
        esac
        printf ' "%s=%s"' "$name" "$value"
    done
}

start_sshd() {
    config="$dir/sshd_config.$node"
    {
        session_environment
        echo "PidFile $dir/sshd.$node.pid"
        echo "Include ${GPUACCEPT_CT_SSHD_CONFIG:?}"
    } >"$config" || return 1
    sshd_bin=$(command -v sshd || echo /usr/sbin/sshd)
    "$sshd_bin" -D -e -f "$config" -p "$port" 2>>"$dir/sshd.$node.log" &
    sshd_pid=$!
    sleep 1
    if ! kill -0 "$sshd_pid" 2>/dev/null; then
        sshd_pid=""
        failed "sshd did not start on port $port: $(tail -n 1 "$dir/sshd.$node.log" 2>/dev/null)"
        return 1
    fi
}

# Every node's sshd answers, or the names of those that did not (within the bound).
handshake() {
    pending=$(printf '%s' "$GPUACCEPT_HOSTLIST" | tr ',' ' ')
    while :; do
        left=""
        for host in $pending; do
            if [ -s "$dir/failed.$host" ]; then
                say "gave up: $host: $(cat "$dir/failed.$host")"
                return 1
            fi
            if ! ssh -F "$GPUACCEPT_SSH_CONFIG" -o BatchMode=yes -o ConnectTimeout=5 "$host" true \
                >/dev/null 2>"$dir/handshake.$host.log"; then
                left="$left $host"
            fi
        done
        pending="${left# }"
        if [ -z "$pending" ]; then
            return 0
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            last=""
            for host in $pending; do
                last="$last; $host: $(tail -n 1 "$dir/handshake.$host.log" 2>/dev/null)"
            done
            say "gave up after ${bound} s: the sshd of $(echo "$pending" | tr ' ' ',') never answered${last}"
            return 1
        fi
        sleep 1
    done
}

if [ "$index" = 0 ]; then
    if ! make_keys; then
        failed "could not make the job's ssh keys in $keys (does the image have ssh-keygen?)"
        exit 2
    fi
else
    while [ ! -e "$keys/ready" ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            failed "the first node made no ssh keys within ${bound} s"
            exit 2
        fi
        sleep 1
    done
fi

if ! start_sshd; then
    # The master names this node; stay until it says the job is over.
    while [ "$index" != 0 ] && [ ! -e "$dir/done" ] && [ "$(date +%s)" -lt "$((deadline + 30))" ]; do
        sleep 1
    done
    exit 2
fi

if [ "$index" != 0 ]; then
    while [ ! -e "$dir/done" ]; do
        if ! kill -0 "$sshd_pid" 2>/dev/null; then
            sshd_pid=""
            failed "sshd stopped: $(tail -n 1 "$dir/sshd.$node.log" 2>/dev/null)"
            exit 2
        fi
        sleep 1
    done
    stop_sshd
    exit 0
fi

if ! handshake; then
    echo 2 >"$dir/done"
    stop_sshd
    exit 2
fi
say "sshd answers on every node ($GPUACCEPT_HOSTLIST); running the job"
export OMPI_MCA_plm_rsh_agent="ssh -F $GPUACCEPT_SSH_CONFIG"
export HYDRA_LAUNCHER_EXTRA_ARGS="-F $GPUACCEPT_SSH_CONFIG"
export I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS="-F $GPUACCEPT_SSH_CONFIG"
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
if [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
    /opt/nvidia/nvidia_entrypoint.sh "$@"
else
    "$@"
fi
rc=$?
echo "$rc" >"$dir/done"
stop_sshd
exit "$rc"
"""
