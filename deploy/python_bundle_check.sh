#!/usr/bin/env bash
# The Python client's wheel from an unpacked GPU bundle (deploy/gpu_bundle.sh), installed for the
# machine's own python3 and PyTorch (on the GPU image: Python 3.12, PyTorch 2.11, no Debian
# packages): launch runs two Python workers and the Python evaluator (examples/pytorch/train.py)
# through two shards for 300 steps each, and the evaluator's last accuracy must reach 0.6.
#
#   bash deploy/python_bundle_check.sh BUNDLE_DIR DATA_DIR WORK_DIR
#
# The daemons get the bundle's libraries (LD_LIBRARY_PATH); python3 gets none: the wheel finds its
# own through RUNPATH and takes the machine's libstdc++, the one PyTorch was built against.
# gpu_run.sh calls this; it also runs here with any python3 that has PyTorch and pip first on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { echo "usage: $0 BUNDLE_DIR DATA_DIR WORK_DIR" >&2; exit 2; }
bundle=$1 data=$2 work=$3
site=$work/site
rm -rf "$site" && mkdir -p "$site"
python3 -m pip --version > /dev/null \
  || { echo "python_bundle_check: this python3 has no pip to install the wheel with" >&2; exit 1; }
python3 -m pip install --quiet --no-index --no-deps --target "$site" "$bundle"/paramserver-*.whl
# launch puts its own ../python first on the workers' PYTHONPATH: this one replaces it.
python="env -u LD_LIBRARY_PATH PYTHONPATH=$site python3"
$python -c 'import sys, torch, paramserver.torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, paramserver from "
      f"{paramserver.__file__}")'
$python examples/pytorch/train.py --print_model_spec > "$work/cnn.json"

command="$python $PWD/examples/pytorch/train.py"
LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$bundle/bin/launch" \
  --model="$work/cnn.json" --shards=2 --workers=2 --steps=300 --max_seconds=0 \
  --optimizer=sgd --lr=0.05 --data_dir="$data" --run_dir="$work/run-python" \
  --worker_cmd="$command" --eval_cmd="$command --evaluate" --eval_interval_seconds=1
accuracy=$(tail -n 1 "$work/run-python/evaluator.csv" | cut -d, -f4)
echo "python_bundle_check: the Python evaluator's last test accuracy: $accuracy"
awk -v a="$accuracy" 'BEGIN {exit !(a >= 0.6)}' \
  || { echo "python_bundle_check: below 0.6: the model did not train" >&2; exit 1; }
echo "python_bundle_check: passed"
