#!/bin/sh
# Submits the gpuaccept job to Base Command (written by gpuaccept launch bcp).
# shellcheck disable=SC2016 # the container's command line is passed on literally
exec ngc base-command job run \
  --name accept-h100 \
  --image nvcr.io/nvidia/pytorch:25.01-py3 \
  --instance dgxa100.80g.8.norm \
  --ace nv-us-west-2 \
  --replicas 4 \
  --array-type PYTORCH \
  --result /results \
  --preempt RUNONCE \
  --priority HIGH \
  --total-runtime 1800s \
  --workspace datasets-ws:/data:RO \
  --workspace scratch:/scratch:RW \
  --datasetid 12345:/imagenet \
  --env-var NCCL_DEBUG:INFO \
  --env-var GPUACCEPT_RESULTS_DIR:/results/20260101T000000Z-accept-h100-ab12 \
  --label accept \
  --commandline 'sh -c '"'"'# gpuaccept: run the job (the arguments), then print its reports to the log.
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
'"'"' gpuaccept python3 -m gpuaccept run --profile quick --no-history --report-dir /results/20260101T000000Z-accept-h100-ab12'
