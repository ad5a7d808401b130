#!/bin/sh
# Submits the gpuaccept job to Run:ai (written by gpuaccept launch runai).
# shellcheck disable=SC2016 # the container's script is passed on literally
exec runai training pytorch submit train \
  --image registry.example.com/ml/train:1.0 \
  --workers 2 \
  --no-master \
  --gpu-devices-request 8 \
  --large-shm \
  -e NCCL_IB_HCA=mlx5 \
  -e GPUACCEPT_RESULTS_DIR=/tmp/gpuaccept-results/20260101T000000Z-train-cd34 \
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
' gpuaccept python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=8 --no-python python train.py --lr 3e-4
