#!/bin/sh
# Entrypoint of the gpuaccept multi-node image, run by tini (PID 1, which forwards signals to the
# command and exits with its exit code). Starts sshd, then runs the command.
#
#   SSH_PORT             port of sshd (default 2222; 22 and 222 work too)
#   SSH_AUTHORIZED_KEYS  public keys that may log in as root (written to /etc/ssh/authorized_keys/root)
#   SSH_LISTEN_ADDRESS   address sshd listens on (default: all)
#
# Host keys are generated here at first start. sshd writes its log to /var/log/sshd.log. Sessions
# get the container's PATH, LD_LIBRARY_PATH and CUDA/NCCL/MPI/Python variables (sshd's SetEnv), so
# 'ssh node gpuaccept run' and mpirun see what 'docker exec' sees. Without root, sshd is not started.
set -eu

die() {
    echo "gpuaccept-entrypoint: $*" >&2
    exit 2
}

port="${SSH_PORT:-2222}"
case "$port" in
    '' | *[!0-9]*) die "SSH_PORT='$port' is not a port number (1-65535)" ;;
esac
if [ "${#port}" -gt 5 ] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    die "SSH_PORT='$port' is not a port number (1-65535)"
fi

nl="$(printf '\nx')"
nl="${nl%x}"

# The SetEnv line for sshd (one line: sshd keeps only the first SetEnv it reads): the variables a job
# run over ssh needs, values sshd can quote.
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
                | UCX_* | HPCX_* | MPI_* | PYTHON* | TORCH_* | GPUACCEPT_*) ;;
            *) continue ;;
        esac
        value="$(printenv "$name")" || continue
        case "$value" in
            *[\"\\]* | *"$nl"*) continue ;;
        esac
        printf ' "%s=%s"' "$name" "$value"
    done
}

start_sshd() {
    ssh-keygen -A >/dev/null
    mkdir -p /run/sshd /etc/ssh/authorized_keys
    chmod 0755 /run/sshd
    if [ -n "${SSH_AUTHORIZED_KEYS:-}" ]; then
        printf '%s\n' "$SSH_AUTHORIZED_KEYS" >/etc/ssh/authorized_keys/root
        chmod 0600 /etc/ssh/authorized_keys/root
    fi
    # sshd refuses even key logins to an account whose password is locked ('!'); '*' only
    # disables password logins, which sshd_config does anyway.
    if grep -q '^root:!' /etc/shadow 2>/dev/null; then
        usermod -p '*' root
    fi
    session_environment >/etc/ssh/sshd_environment.conf
    set -- -p "$port" -E /var/log/sshd.log
    if [ -n "${SSH_LISTEN_ADDRESS:-}" ]; then
        set -- "$@" -o "ListenAddress=${SSH_LISTEN_ADDRESS}"
    fi
    /usr/sbin/sshd "$@" || die "sshd did not start on port $port (see /var/log/sshd.log)"
}

if [ "$(id -u)" = 0 ]; then
    start_sshd
else
    echo "gpuaccept-entrypoint: not root, sshd not started" >&2
fi

if [ "$#" -eq 0 ]; then
    set -- sleep infinity
fi
# NGC images set up CUDA compatibility libraries and such in their own entrypoint.
if [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
    exec /opt/nvidia/nvidia_entrypoint.sh "$@"
fi
exec "$@"
