#!/bin/bash
# gpuaccept launch slurm --runtime docker: srun runs this once per node. It starts the node's container
# as the calling user, waits for it, and removes it when the job ends, fails or is cancelled
# (scancel sends SIGTERM). '--sweep' removes any container of this job that a killed task left.
set -uo pipefail
runtime=docker
image=registry.example.com/ml/multinode:26.01
launch=/shared/gpuaccept/20260101T000000Z-allreduce-0000/launch
state="$launch/container"
mode=mpi
ssh_port=2222
handshake_s=120
gpus=all
mount_home=1
workdir=/home/alice/job
mounts=(/datasets:/datasets /scratch:/scratch:ro /shared/gpuaccept:/shared/gpuaccept /home/alice/job:/home/alice/job)
env_names=(NCCL_DEBUG)
options=(--network=host --ipc=host --privileged)

index=${SLURM_NODEID:?run this with srun}
node=${SLURMD_NODENAME:-$(hostname -s)}
name="gpuaccept-$SLURM_JOB_ID-$index"
say() { echo "[LAUNCH] $node: $*" >&2; }
case $node in '' | .* | *[!A-Za-z0-9._-]*) node_file=task$index ;; *) node_file=$node ;; esac
fail() {
  say "$*"
  local tmp="$state/.failed.$node_file.$$"
  (set -C; printf '%s\n' "$*" >"$tmp") 2>/dev/null &&
    mv -f "$tmp" "$state/failed.$node_file"
  exit 2
}

if [ "${1:-}" = --sweep ]; then
  "$runtime" ps -aq --filter "name=^gpuaccept-$SLURM_JOB_ID-" 2>/dev/null | while read -r id; do
    "$runtime" rm -f "$id" >/dev/null 2>&1 && say "removed a container left behind ($id)"
  done
  exit 0
fi

command -v "$runtime" >/dev/null || fail "$runtime is not installed on this node"
if ! out=$("$runtime" info 2>&1 >/dev/null); then
  fail "$runtime does not answer on this node: $(printf "%s" "$out" | tail -n 1)"
fi
for m in "${mounts[@]}"; do
  [ -e "${m%%:*}" ] || fail "mount source ${m%%:*} does not exist on this node"
done
if ! "$runtime" image inspect "$image" >/dev/null 2>&1; then
  say "pulling $image"
  out=$("$runtime" pull "$image" 2>&1) || fail "image $image is not on this node and could not be pulled: $(printf "%s" "$out" | tail -n 1)"
fi

uid=$(id -u); gid=$(id -g); home=${HOME:-}
args=(run --rm --name "$name" --entrypoint /bin/sh --user "$uid:$gid" "${options[@]}")
for g in $(id -G); do [ "$g" = "$gid" ] || args+=(--group-add "$g"); done
args+=(-v "$state/passwd:/etc/passwd:ro" -v "$state/group:/etc/group:ro" -e "HOME=$home")
if [ "$mount_home" = 1 ] && [ -n "$home" ] && [ -d "$home" ]; then args+=(-v "$home:$home"); fi
for m in "${mounts[@]}"; do args+=(-v "$m"); done
if [ -z "$workdir" ]; then workdir=$SLURM_SUBMIT_DIR; args+=(-v "$workdir:$workdir"); fi
args+=(-w "$workdir")
# GPUs: Slurm's binding (absolute indices) first, then CUDA_VISIBLE_DEVICES, else all of the node's.
ids=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}}
if [ "$gpus" = all ] || { [ "$gpus" = auto ] && [ -e /dev/nvidiactl ]; }; then
  if [ -n "$ids" ]; then args+=(--gpus "\"device=$ids\""); else args+=(--gpus all); fi
elif [ "$gpus" = auto ]; then
  say "no NVIDIA device here (/dev/nvidiactl): the container gets no GPU"
fi
# Values come from this task's environment, never the command line (ps shows that).
for n in "${env_names[@]}"; do args+=(-e "$n"); done
args+=(-e "GPUACCEPT_HOSTNAME=$node" -e "GPUACCEPT_CT_MODE=$mode" -e "GPUACCEPT_CT_DIR=$state"
       -e "GPUACCEPT_CT_INDEX=$index" -e "GPUACCEPT_CT_PORT=$((ssh_port + index))"
       -e "GPUACCEPT_CT_HANDSHAKE_S=$handshake_s" -e "GPUACCEPT_CT_SSHD_CONFIG=$launch/sshd_config"
       -e GPUACCEPT_HOSTLIST -e GPUACCEPT_NP -e GPUACCEPT_SLOTS_PER_NODE)
[ "$mode" = each ] || args+=(-e GPUACCEPT_HOSTFILE -e GPUACCEPT_SSH_CONFIG)

# shellcheck disable=SC2317
cleanup() { trap - TERM INT HUP; "$runtime" rm -f "$name" >/dev/null 2>&1 || true; }
trap 'cleanup; exit 143' TERM INT HUP
say "$runtime ${args[*]} $image"
"$runtime" "${args[@]}" "$image" "$launch/in-container.sh" "$@" &
wait $!
rc=$?
case $rc in 0) ;; 125) say "$runtime could not start the container (exit 125; its error is above)" ;;
  *) say "the container exited with $rc" ;; esac
cleanup
exit "$rc"
