#!/bin/sh
# Submits the gpuaccept job to Run:ai (written by gpuaccept launch runai).
# shellcheck disable=SC2016 # the container's script is passed on literally
exec runai training mpi submit train \
  --image registry.example.com/ml/train:1.0 \
  --workers 2 \
  --slots-per-worker 8 \
  --gpu-devices-request 8 \
  --large-shm \
  -e NCCL_IB_HCA=mlx5 \
  -e GPUACCEPT_RESULTS_DIR=/tmp/gpuaccept-results/20260101T000000Z-train-cd34 \
  --master-environment OMPI_ALLOW_RUN_AS_ROOT=1 \
  --master-environment OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  --master-environment TERM=dumb \
  --master-environment 'GPUACCEPT_MPI_LAUNCHER=set -- python train.py --lr 3e-4
# gpuaccept MPIJob launcher: check rank placement, run the job (the arguments), print the reports.
hostfile=/etc/mpi/hostfile
workers=2
np=16
fail() {
  printf '"'"'gpuaccept: %s\n'"'"' "$$*" >&2
  exit 97
}
[ -r "$$hostfile" ] || fail "$$hostfile is missing: the MPI operator did not mount the hostfile"
listed=$$(grep -c '"'"'[^[:space:]]'"'"' "$$hostfile")
[ "$$listed" -eq "$$workers" ] || fail "$$hostfile lists $$listed hosts, expected $$workers"
launcher=$$(cat /proc/sys/kernel/hostname)
placement=$$(mpirun --hostfile "$$hostfile" -np 16 --map-by ppr:8:node cat /proc/sys/kernel/hostname) ||
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
mpirun --hostfile "$$hostfile" -np 16 --map-by ppr:8:node -x NCCL_IB_HCA -x TERM -x GPUACCEPT_RESULTS_DIR -x MASTER_ADDR -x MASTER_PORT -x PATH -x LD_LIBRARY_PATH "$$@" || rc=$$?
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
