#!/bin/sh
# Submits the gpuaccept job to Base Command (written by gpuaccept launch bcp).
# shellcheck disable=SC2016 # the container's command line is passed on literally
exec ngc base-command job run \
  --name train \
  --image registry.example.com/ml/train:1.0 \
  --instance dgxa100.80g.8.norm \
  --ace nv-us-west-2 \
  --org acme \
  --team gpu \
  --result /results \
  --preempt RUNONCE \
  --total-runtime 3600s \
  --workspace datasets-ws:/data:RO \
  --workspace scratch:/scratch:RW \
  --env-var NCCL_IB_HCA:mlx5 \
  --env-var GPUACCEPT_RESULTS_DIR:/results/20260101T000000Z-train-cd34 \
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
'"'"' gpuaccept python3 -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=8 --no-python python train.py --lr 3e-4'
