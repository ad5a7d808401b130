#!/bin/sh
# Submits the gpuaccept job to Run:ai (written by gpuaccept launch runai).
# shellcheck disable=SC2016 # the container's script is passed on literally
exec runai training mpi submit accept-h100 \
  --project gpu-team \
  --image nvcr.io/nvidia/pytorch:25.01-py3 \
  --image-pull-policy IfNotPresent \
  --workers 4 \
  --slots-per-worker 8 \
  --gpu-devices-request 8 \
  --large-shm \
  --node-pools h100 \
  --node-pools h100-spot \
  --toleration operator=Exists,key=nvidia.com/gpu,effect=NoSchedule \
  --host-path path=/data,mount=/data \
  --existing-pvc claimname=datasets,path=/datasets \
  -e NCCL_DEBUG=INFO \
  -e GPUACCEPT_RESULTS_DIR=/tmp/gpuaccept-results/20260101T000000Z-accept-h100-ab12 \
  --master-environment OMPI_ALLOW_RUN_AS_ROOT=1 \
  --master-environment OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  --master-environment TERM=dumb \
  --master-environment 'GPUACCEPT_MPI_LAUNCHER=set -- python3 -m gpuaccept run --profile quick --no-history --report-dir /tmp/gpuaccept-results/20260101T000000Z-accept-h100-ab12
# gpuaccept MPIJob launcher: check rank placement, run the job (the arguments), print the reports.
hostfile=/etc/mpi/hostfile
workers=4
np=4
fail() {
  printf '"'"'gpuaccept: %s\n'"'"' "$$*" >&2
  exit 97
}
[ -r "$$hostfile" ] || fail "$$hostfile is missing: the MPI operator did not mount the hostfile"
listed=$$(grep -c '"'"'[^[:space:]]'"'"' "$$hostfile")
[ "$$listed" -eq "$$workers" ] || fail "$$hostfile lists $$listed hosts, expected $$workers"
launcher=$$(cat /proc/sys/kernel/hostname)
placement=$$(mpirun --hostfile "$$hostfile" -np 4 --map-by ppr:1:node cat /proc/sys/kernel/hostname) ||
  fail "mpirun could not start $$np ranks on the $$workers workers"
ranks=$$(printf '"'"'%s\n'"'"' "$$placement" | grep -c .)
hosts=$$(printf '"'"'%s\n'"'"' "$$placement" | sort -u | grep -c .)
[ "$$ranks" -eq "$$np" ] || fail "mpirun started $$ranks ranks, expected $$np"
if printf '"'"'%s\n'"'"' "$$placement" | grep -qxF "$$launcher"; then
  fail "ranks ran on the launcher $$launcher, not on the workers (is --hostfile ignored?)"
fi
[ "$$hosts" -eq "$$workers" ] || fail "ranks ran on $$hosts hosts, expected $$workers"
# Rank 0 runs on the first host of the hostfile: the ranks meet there.
MASTER_ADDR=$${MASTER_ADDR:-$$(awk '"'"'NF {print $$1; exit}'"'"' "$$hostfile")}
MASTER_PORT=$${MASTER_PORT:-29500}
LD_LIBRARY_PATH=$${LD_LIBRARY_PATH:-}
export MASTER_ADDR MASTER_PORT LD_LIBRARY_PATH
rc=0
mpirun --hostfile "$$hostfile" -np 4 --map-by ppr:1:node -x NCCL_DEBUG -x TERM -x GPUACCEPT_RESULTS_DIR -x MASTER_ADDR -x MASTER_PORT -x PATH -x LD_LIBRARY_PATH "$$@" || rc=$$?
# shellcheck disable=SC2016 # expanded on each worker, not here
emit='"'"'dir="$${GPUACCEPT_RESULTS_DIR:-}"
if [ -n "$$dir" ] && [ -d "$$dir" ]; then
  find "$$dir" -type f -name report.json | sort | while IFS= read -r f; do
    printf "\n%s %s\n" "@@gpuaccept-report-begin@@" "$$f"
    cat "$$f"
    printf "\n%s\n" "@@gpuaccept-report-end@@"
  done
fi'"'"'
awk '"'"'NF {print $$1}'"'"' "$$hostfile" | while IFS= read -r host; do
  mpirun --host "$$host" -np 1 -x GPUACCEPT_RESULTS_DIR sh -c "$$emit" </dev/null || true
done
exit "$$rc"
' \
  --master-command 'sh -c $(GPUACCEPT_MPI_LAUNCHER)' \
  --command \
  -- /usr/sbin/sshd -De
