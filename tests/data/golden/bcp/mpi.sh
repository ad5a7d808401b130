#!/bin/sh
# Submits the gpuaccept job to Base Command (written by gpuaccept launch bcp).
# shellcheck disable=SC2016 # the container's command line is passed on literally
exec ngc base-command job run \
  --name accept-h100 \
  --image nvcr.io/nvidia/pytorch:25.01-py3 \
  --instance dgxa100.80g.8.norm \
  --ace nv-us-west-2 \
  --replicas 4 \
  --array-type MPI \
  --result /results \
  --preempt RUNONCE \
  --priority HIGH \
  --total-runtime 1800s \
  --workspace datasets-ws:/data:RO \
  --workspace scratch:/scratch:RW \
  --datasetid 12345:/imagenet \
  --env-var NCCL_DEBUG:INFO \
  --env-var GPUACCEPT_RESULTS_DIR:/results/20260101T000000Z-accept-h100-ab12 \
  --env-var OMPI_ALLOW_RUN_AS_ROOT:1 \
  --env-var OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:1 \
  --env-var TERM:dumb \
  --label accept \
  --commandline 'sh -c '"'"'# gpuaccept Base Command launcher: check rank placement, run the job (the arguments), print the reports.
hostfile=/etc/mpi/hostfile
replicas=4
np=4
fail() {
  printf '"'"'"'"'"'"'"'"'gpuaccept: %s\n'"'"'"'"'"'"'"'"' "$*" >&2
  exit 97
}
[ -r "$hostfile" ] || fail "$hostfile is missing: is this an --array-type MPI job?"
listed=$(grep -c '"'"'"'"'"'"'"'"'[^[:space:]]'"'"'"'"'"'"'"'"' "$hostfile")
[ "$listed" -eq "$replicas" ] || fail "$hostfile lists $listed hosts, expected $replicas"
placement=$(mpirun --hostfile "$hostfile" -np 4 --map-by ppr:1:node cat /proc/sys/kernel/hostname) ||
  fail "mpirun could not start $np ranks on the $replicas replicas"
ranks=$(printf '"'"'"'"'"'"'"'"'%s\n'"'"'"'"'"'"'"'"' "$placement" | grep -c .)
hosts=$(printf '"'"'"'"'"'"'"'"'%s\n'"'"'"'"'"'"'"'"' "$placement" | sort -u | grep -c .)
[ "$ranks" -eq "$np" ] || fail "mpirun started $ranks ranks, expected $np"
[ "$hosts" -eq "$replicas" ] || fail "ranks ran on $hosts hosts, expected $replicas"
MASTER_ADDR=${MASTER_ADDR:-$(awk '"'"'"'"'"'"'"'"'NF {print $1; exit}'"'"'"'"'"'"'"'"' "$hostfile")}
MASTER_PORT=${MASTER_PORT:-29500}
LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export MASTER_ADDR MASTER_PORT LD_LIBRARY_PATH
rc=0
mpirun --hostfile "$hostfile" -np 4 --map-by ppr:1:node -x NCCL_DEBUG -x TERM -x GPUACCEPT_RESULTS_DIR -x MASTER_ADDR -x MASTER_PORT -x PATH -x LD_LIBRARY_PATH "$@" || rc=$?
# shellcheck disable=SC2016 # expanded on each replica, not here
emit='"'"'"'"'"'"'"'"'# gpuaccept: run the job (the arguments), then print its reports to the log.
rc=0
"$@" || rc=$?
dir="${GPUACCEPT_RESULTS_DIR:-}"
if [ -n "$dir" ] && [ -d "$dir" ]; then
  find "$dir" -type f -name report.json | sort | while IFS= read -r f; do
    printf "\n%s %s\n" "@@gpuaccept-report-begin@@" "$f"
    cat "$f"
    printf "\n%s\n" "@@gpuaccept-report-end@@"
  done
fi
exit "$rc"
'"'"'"'"'"'"'"'"'
awk '"'"'"'"'"'"'"'"'NF {print $1}'"'"'"'"'"'"'"'"' "$hostfile" | while IFS= read -r host; do
  mpirun --host "$host" -np 1 -x GPUACCEPT_RESULTS_DIR sh -c "$emit" gpuaccept true </dev/null || true
done
exit "$rc"
'"'"' gpuaccept-launcher python3 -m gpuaccept run --profile quick --no-history --report-dir /results/20260101T000000Z-accept-h100-ab12'
