#!/usr/bin/env bash
# The PyTorch adapter on one GPU (issue 50), for a lent GPU machine: gpu_run.sh's `adapter` step
# runs it from the unpacked bundle (STEPS=adapter bash deploy/gpu_run.sh, about 6 minutes).
#
#   bash bench/torch_gpu_bench.sh BUNDLE_DIR WORK_DIR
#
# bench/pytorch_ddp_bench.py on synthetic data held on the GPU, batch $BATCH (128) per worker,
# $STEPS_PER_RUN (100) steps, 2 shards on this host, the workers sharing the GPU:
#   1. one worker: a plain PyTorch loop (local) against the adapter (async, sync): the example CNN,
#      and torchvision's ResNet-18 on 32x32x3 inputs where torchvision is installed
#   2. 2 and 4 workers, async and sync, against one process of their total batch (local)
# Each table row: examples/s (all workers together), the ratio to local, and worker 0's host time
# per step in forward (the adapter: waiting for each layer's weights and issuing their copies),
# backward and step (the adapter: waiting for the gradients' copies to land, the push and pull).
#
# SMOKE=1: the same on the CPU through the copy path (DistributedModel(staging=True)) with tiny
# sizes, so that the script is known to run end to end before a GPU comes:
#   SMOKE=1 bash bench/torch_gpu_bench.sh BUNDLE_DIR WORK_DIR  (BUNDLE_DIR: bin/ and python/ of a
#   build, e.g. a directory with bin -> build/bin and python -> build/python)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 BUNDLE_DIR WORK_DIR" >&2; exit 2; }
bundle=$1 work=$2
source deploy/bundle_python.sh
mkdir -p "$work"
bundle_python "$bundle" "$work"

if [ -n "${SMOKE:-}" ]; then
  device=cpu steps=${STEPS_PER_RUN:-4} batch=${BATCH:-8} modes=local,async-staging,sync-staging
else
  device=cuda steps=${STEPS_PER_RUN:-100} batch=${BATCH:-128} modes=local,async,sync
fi
"${python[@]}" -c 'import sys, torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {gpu}")'
archs=cnn
if "${python[@]}" -c "import torchvision" 2> /dev/null; then
  archs="cnn resnet18"
else
  echo "torch_gpu_bench: no torchvision: the example CNN only"
fi
for arch in $archs; do
  for workers in 1 2 4; do
    echo
    "${python[@]}" bench/pytorch_ddp_bench.py --device="$device" --synthetic --arch="$arch" \
      --workers="$workers" --batch_size="$batch" --steps="$steps" --seeds=1 --modes="$modes" \
      2>&1 | grep -v " I paramserver\]"
  done
done
