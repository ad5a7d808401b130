#!/bin/sh
# Submits the gpuaccept job to Run:ai (written by gpuaccept launch runai).
# shellcheck disable=SC2016 # the container's script is passed on literally
exec runai training pytorch submit accept-h100 \
  --project gpu-team \
  --image nvcr.io/nvidia/pytorch:25.01-py3 \
  --image-pull-policy IfNotPresent \
  --workers 4 \
  --no-master \
  --gpu-devices-request 8 \
  --large-shm \
  --node-pools h100 \
  --node-pools h100-spot \
  --toleration operator=Exists,key=nvidia.com/gpu,effect=NoSchedule \
  --host-path path=/data,mount=/data \
  --existing-pvc claimname=datasets,path=/datasets \
  -e NCCL_DEBUG=INFO \
  -e GPUACCEPT_RESULTS_DIR=/tmp/gpuaccept-results/20260101T000000Z-accept-h100-ab12 \
  --command \
  -- sh -c '# gpuaccept: run the job (the arguments), then print its reports to the log.
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
' gpuaccept python3 -m gpuaccept run --profile quick --no-history --report-dir /tmp/gpuaccept-results/20260101T000000Z-accept-h100-ab12
