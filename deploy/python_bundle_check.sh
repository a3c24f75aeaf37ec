#!/usr/bin/env bash
# The Python client and PyTorch adapter from an unpacked GPU bundle (deploy/gpu_bundle.sh), run by
# the machine's own python3 and PyTorch (on the GPU image: Python 3.12, PyTorch 2.11, no Debian
# packages): launch runs two Python workers and the Python evaluator (examples/pytorch/train.py)
# through two shards for 300 steps each, and the evaluator's last accuracy must reach 0.6.
#
#   bash deploy/python_bundle_check.sh BUNDLE_DIR DATA_DIR WORK_DIR
#
# The daemons get the bundle's libraries; python3 gets them too but not the bundle's libstdc++ and
# libgcc_s, unless the machine's are too old for libparamserver_c.so (deploy/bundle_python.sh).
# gpu_run.sh calls this; it also runs here with any python3 that has PyTorch first on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { echo "usage: $0 BUNDLE_DIR DATA_DIR WORK_DIR" >&2; exit 2; }
bundle=$1 data=$2 work=$3
source deploy/bundle_python.sh
mkdir -p "$work"
bundle_python "$bundle" "$work"
"${python[@]}" -c 'import sys, torch, paramserver.torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, paramserver from "
      f"{paramserver.__file__}")'
"${python[@]}" examples/pytorch/train.py --print_model_spec > "$work/cnn.json"

command="env LD_LIBRARY_PATH=$pylib python3 $PWD/examples/pytorch/train.py"
LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$bundle/bin/launch" \
  --model="$work/cnn.json" --shards=2 --workers=2 --steps=300 --max_seconds=0 \
  --optimizer=sgd --lr=0.05 --data_dir="$data" --run_dir="$work/run-python" \
  --worker_cmd="$command" --eval_cmd="$command --evaluate" --eval_interval_seconds=1
accuracy=$(tail -n 1 "$work/run-python/evaluator.csv" | cut -d, -f4)
echo "python_bundle_check: the Python evaluator's last test accuracy: $accuracy"
awk -v a="$accuracy" 'BEGIN {exit !(a >= 0.6)}' \
  || { echo "python_bundle_check: below 0.6: the model did not train" >&2; exit 1; }
echo "python_bundle_check: passed"
