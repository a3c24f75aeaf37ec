#!/usr/bin/env bash
# Runs ON the lent GPU machine, from the repository root, with .gpu-bundle/ (made here by
# deploy/gpu_bundle.sh) carried by the device tool:
#
#   device run: command "bash deploy/gpu_run.sh", carry [".gpu-bundle"], timeout_s 600
#
# STEPS (comma-separated) picks steps 2-9 by name; the default, tests,compute,torch,e2e,python,
# takes about 8 minutes (E2E_SECONDS=60 shortens the training runs);
# STEPS=tests,transport,wan about 5; STEPS=adapter about 4.
#   1. check glibc (the bundle's libstdc++ is Debian 12's: glibc >= 2.36), unpack the bundle into
#      $BUNDLE_DIR (default /tmp/ps-gpu-bundle; outside the checkout, so a local run never makes
#      .gpu-bundle/ too big to travel), find cuBLAS for the CUDA plugin (bin/libparamserver_cuda.so,
#      which the programs load from beside them on --device=cuda/auto), print nvidia-smi
#   2. tests: cuda_backend_test and network_test (gtest binaries: no ctest there); a skipped
#      test counts as a failure, since it means the GPU was not usable
#   3. compute: compute_bench on cuda with PS_CUDA_MATH=fp32 (CUDA graphs on and off), tf32, bf16, and on
#      cpu with all threads (again with OPENBLAS_CORETYPE where AVX2/AVX-512 allow), over
#      $CONFIGS: the crossover table; and on cpu with 1 thread over the two default configs
#   4. torch: torch_mlp_bench.py on cuda (fp32, tf32, bf16) and on cpu (all threads), same configs
#   5. e2e: launch --shards=2 --workers=4 to test accuracy $TARGET (at most E2E_SECONDS) on
#      --device=cuda, with --prefetch, under CUDA MPS where nvidia-cuda-mps-control exists, and on
#      --device=cpu without and with --prefetch, on the bundle's Fashion-MNIST (--data_dir); all
#      of it E2E_REPEATS times (default 1), as far as the 10 minutes allow
#   6. python: the Python client and PyTorch adapter in the machine's own python3 and PyTorch
#      (deploy/python_bundle_check.sh: Python workers and evaluator under launch, 300 steps)
#   7. transport: transport_bench at 64 KiB, 1 and 38 MiB over loopback (push and pull over gRPC, the
#      data plane and shared memory against iperf3's single stream), $TRANSPORT_RUNS times (2)
#      each of $TRANSPORT_VARIANTS (transport_bench flags, one word each, taken in turn; default
#      the data plane with 1, 2 and 4 lanes), then apply_bench at 10M parameters: the 16 cores
#      keep client, receive and apply off each other's cores; iperf3 over 1, 2 and 4 streams first
#   8. wan: wan_bench, 4 workers x 2 shards on network namespaces at $WAN_RATE_GBIT Gbit/s (10), a
#      20M-parameter MLP, each step schedule (serial, overlap, prefetch, both), workers on
#      $WAN_DEVICE (cpu), $WAN_REPEATS time(s), $WAN_SHARDS_PER_HOST ps processes on each of the
#      two shard hosts (1); skipped when network namespaces cannot be made
#   9. adapter (not in the default STEPS; about 4 minutes): bench/torch_gpu_bench.sh, the PyTorch
#      adapter with a module on the GPU against a plain PyTorch loop (the example CNN, ResNet-18),
#      1, 2 and 4 workers sharing the GPU, async and sync
# Independent steps go on after a failure; the script then exits 1 naming every failed step.
#
# Output, in ${OUT:-/tmp/gpu-out} (the device tool returns at most 8 files, 2 folders deep, so the
# run directories and logs travel as one tarball): results.csv (both benches, one row per config),
# gpu_run.log (this script's whole output), artifacts.tar.gz (every step's log, both run dirs).
# Our binaries get LD_LIBRARY_PATH=<bundle>/lib; nvidia-smi and python3 do not (the bundle's older
# libstdc++ must not shadow the one PyTorch was built against).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

OUT=${OUT:-/tmp/gpu-out}
BUNDLE_DIR=${BUNDLE_DIR:-/tmp/ps-gpu-bundle}
E2E_SECONDS=${E2E_SECONDS:-90}
TARGET=${TARGET:-0.88}
CONFIGS=${CONFIGS:-784-256-128-10:64,784-256-128-10:256,784-256-128-10:1024,784-1024-1024-10:256,784-1024-1024-10:1024,784-4096-4096-10:256,784-4096-4096-10:1024}
STEPS=${STEPS:-tests,compute,torch,e2e,python}
TRANSPORT_RUNS=${TRANSPORT_RUNS:-2}
TRANSPORT_VARIANTS=${TRANSPORT_VARIANTS:---ps_flags=--data_plane_lanes=1 --ps_flags=--data_plane_lanes=2 --ps_flags=--data_plane_lanes=4}
WAN_RATE_GBIT=${WAN_RATE_GBIT:-10}
WAN_STEPS=${WAN_STEPS:-30}
WAN_DEVICE=${WAN_DEVICE:-cpu}
WAN_REPEATS=${WAN_REPEATS:-1}
WAN_SHARDS_PER_HOST=${WAN_SHARDS_PER_HOST:-1}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu-run.XXXXXX)
mkdir -p "$WORK/logs" "$WORK/wan"

die() { echo "gpu_run: FATAL: $*"; exit 1; }
failed=()
want() { [[ ",$STEPS," == *",$1,"* ]]; }
fail() { echo "gpu_run: FAILED: $*"; failed+=("$1"); }

# run_step NAME SECONDS CMD...: runs CMD with a time limit, its output in $WORK/logs/NAME.log and on
# the console (QUIET=1: only gtest's result lines); records NAME as failed on a non-zero exit.
run_step() {
  local name=$1 limit=$2 rc
  shift 2
  echo
  echo "=== $name ($(date -u +%H:%M:%S), ${SECONDS}s in)"
  if [ -n "${QUIET:-}" ]; then
    timeout --kill-after=10 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
    rc=$?
    grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\]|tests? ran' "$WORK/logs/$name.log" | tail -n 30
  else
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$WORK/logs/$name.log"
    rc=${PIPESTATUS[0]}
  fi
  if ((rc == 124 || rc == 137)); then
    fail "$name" "timed out after ${limit}s"
  elif ((rc != 0)); then
    fail "$name" "exit status $rc (log: logs/$name.log in artifacts.tar.gz)"
  fi
  return "$rc"
}

# "${ours[@]}" CMD runs one of our binaries with the bundle's libraries first, then wherever
# cuBLAS was found (an env command, not a function, so that timeout can run it).
ours=()
set_ours() {
  ours=(env "LD_LIBRARY_PATH=$BUNDLE_DIR/lib${CUBLAS_DIR:+:$CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
}

main() {
  echo "gpu_run: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), output in $OUT, work in $WORK"
  [ -f .gpu-bundle/bundle.tar.xz ] \
    || die ".gpu-bundle/bundle.tar.xz is missing: run deploy/gpu_bundle.sh here and carry .gpu-bundle"
  head -n 3 .gpu-bundle/MANIFEST.txt 2>/dev/null

  # The bundle's libstdc++ and libraries come from Debian 12, which needs glibc 2.36 or newer.
  local glibc
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [ -z "$glibc" ] || [ "$(printf '%s\n' 2.36 "$glibc" | sort -V | head -n 1)" != 2.36 ]; then
    die "this machine's glibc is ${glibc:-unknown}; the bundle (built on Debian 12) needs 2.36 or newer"
  fi
  echo "glibc: $glibc (>= 2.36)"

  # 1. Unpack (xz may be missing from the image: Python's tarfile reads .tar.xz too).
  { rm -rf "$BUNDLE_DIR" && mkdir -p "$BUNDLE_DIR"; } || die "cannot create $BUNDLE_DIR"
  if command -v xz > /dev/null; then
    tar -C "$BUNDLE_DIR" -xJf .gpu-bundle/bundle.tar.xz || die "cannot unpack the bundle"
  else
    python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[1]); t.extractall(sys.argv[2],
      **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' \
      .gpu-bundle/bundle.tar.xz "$BUNDLE_DIR" || die "cannot unpack the bundle"
  fi
  local bin=$BUNDLE_DIR/bin

  # cuBLAS, which only the CUDA plugin (and cuda_backend_test) loads, comes from the machine's
  # CUDA toolkit (the plugin's RUNPATH says /usr/local/cuda/lib), else from PyTorch's
  # nvidia-cublas wheel.
  CUBLAS_DIR=""
  set_ours
  local plugin=$bin/libparamserver_cuda.so
  [ -f "$plugin" ] || die "$plugin is missing: the bundle was built without the CUDA backend"
  if [[ "$("${ours[@]}" ldd "$plugin")" == *"not found"* ]]; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
             $(python3 -c 'import nvidia, os; print(" ".join(os.path.dirname(p) for p in
               __import__("glob").glob(os.path.join(list(nvidia.__path__)[0], "**",
               "libcublas.so.*"), recursive=True)))' 2>/dev/null); do
      if [ -e "$d/libcublas.so.13" ]; then CUBLAS_DIR=$d; break; fi
    done
    set_ours
  fi
  local libs
  libs=$("${ours[@]}" ldd "$plugin")
  if [[ "$libs" == *"not found"* ]]; then
    echo "$libs"
    die "the CUDA plugin cannot find the libraries marked 'not found' (cuBLAS 13 of CUDA 13 is expected)"
  fi
  echo "cuBLAS: $(awk '/libcublas\.so/ {print $3}' <<< "$libs")"

  # Leave the card's settings alone: queries only.
  run_step nvidia-smi 30 nvidia-smi || die "nvidia-smi failed: no usable GPU"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,temperature.gpu \
    --format=csv 2>&1 | tee "$WORK/logs/gpu-state-before.csv"
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)," \
    "$(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"

  # iperf3, ip and tc from the bundle where the machine has none (linked into /usr/bin: the
  # benchmarks run /usr/bin/iperf3; they load their libraries from the bundle, under "${ours[@]}").
  local tool
  for tool in "$BUNDLE_DIR"/tools/*; do
    command -v "$(basename "$tool")" > /dev/null || ln -s "$tool" "/usr/bin/$(basename "$tool")" \
      || die "cannot link $tool into /usr/bin"
  done

  # 2. GPU tests.
  local t
  want tests && for t in cuda_backend_test network_test; do
    if QUIET=1 run_step "$t" 180 "${ours[@]}" "$bin/$t" --gtest_color=no; then
      grep -q '\[  SKIPPED \]' "$WORK/logs/$t.log" \
        && fail "$t" "some tests were SKIPPED on a GPU machine (the GPU was not usable by them)"
    fi
  done

  local csv=$OUT/results.csv math
  local coretype=""
  if grep -qw avx512f /proc/cpuinfo; then
    coretype=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then
    coretype=Haswell
  fi

  # 7. Transport over loopback, where client and shard have cores of their own.
  local run variant
  if want transport; then
    # The ceiling striping is up against: loopback TCP over 1, 2 and 4 streams at once.
    for streams in 1 2 4; do
      run_step "iperf3-P$streams" 30 "${ours[@]}" bash -c "iperf3 -s -1 -p 5399 > /dev/null &
        sleep 0.5; iperf3 -c 127.0.0.1 -p 5399 -t 2 -P $streams -f g | tail -n 4"
    done
    for run in $(seq 1 "$TRANSPORT_RUNS"); do
      for variant in $TRANSPORT_VARIANTS; do
        run_step "transport-$run-${variant##*-}" 150 "${ours[@]}" "$bin/transport_bench" \
          --sizes_mib=0.0625,1,38 --repeats=11 --tcp_seconds=2 "$variant"
      done
    done
    run_step apply_bench 120 "${ours[@]}" "$bin/apply_bench" --params=10000000 \
      --threads=1,2,4,8 --optimizers=sgd,momentum --repeats=7
  fi

  # 8. Step schedules across network namespaces (root; the kernel must allow them).
  if want wan; then
    if "${ours[@]}" ip netns add ps-gpu-probe 2> "$WORK/logs/netns-probe.log" \
        && "${ours[@]}" ip netns del ps-gpu-probe 2>> "$WORK/logs/netns-probe.log"; then
      # The workers read Fashion-MNIST from where Debian's package puts it.
      mkdir -p /usr/share/datasets/fashion-mnist
      for f in .gpu-bundle/data/*.gz; do
        [ -e "/usr/share/datasets/fashion-mnist/${f##*/}" ] || cp "$f" /usr/share/datasets/fashion-mnist/
      done
      run_step wan 400 "${ours[@]}" ${coretype:+"OPENBLAS_CORETYPE=$coretype"} "$bin/wan_bench" \
        --latencies_ms=0 --modes=async --workers=4 --shards=2 --rate_gbit="$WAN_RATE_GBIT" \
        --shards_per_host="$WAN_SHARDS_PER_HOST" \
        --hidden=2560,2048,2048,2048,2048 --steps="$WAN_STEPS" --eval_interval_seconds=60 \
        --target=0.5 --lr=0.002 --schedules=serial,overlap,prefetch,overlap+prefetch \
        --device="$WAN_DEVICE" --repeats="$WAN_REPEATS" \
        --run_dir="$WORK/wan" --json="$OUT/wan.json"
    else
      fail wan "no network namespaces here: $(head -c 300 "$WORK/logs/netns-probe.log")"
    fi
  fi

  # 3. compute_bench. The CPU runs get a shorter budget: the big model is ~1 s/step per core.
  want compute && for math in fp32 tf32 bf16; do
    run_step "compute_bench-cuda-$math" 120 "${ours[@]}" "PS_CUDA_MATH=$math" \
      "$bin/compute_bench" --device=cuda --iters=100 --warmup=5 --configs="$CONFIGS" --csv="$csv"
  done
  want compute && run_step "compute_bench-cuda-fp32-nographs" 120 "${ours[@]}" PS_CUDA_GRAPHS=0 \
    "$bin/compute_bench" --device=cuda --iters=100 --warmup=5 --configs="$CONFIGS" \
    --csv="$OUT/nographs.csv"
  want compute && run_step "compute_bench-cpu-1thr" 120 "${ours[@]}" "$bin/compute_bench" --device=cpu \
    --threads=1 --iters=20 --budget_seconds=4 --csv="$csv"
  want compute && run_step "compute_bench-cpu-$(nproc)thr" 150 "${ours[@]}" "$bin/compute_bench" --device=cpu \
    --threads="$(nproc)" --iters=20 --warmup=1 --budget_seconds=2 --configs="$CONFIGS" \
    --csv="$csv"
  # OpenBLAS 0.3.21 may not know this processor and fall back to SSE3 kernels: measure the CPU
  # again with the kernels its instruction set allows.
  if want compute && [ -n "$coretype" ]; then
    run_step "compute_bench-cpu-$(nproc)thr-$coretype" 150 "${ours[@]}" \
      "OPENBLAS_CORETYPE=$coretype" "$bin/compute_bench" --device=cpu --threads="$(nproc)" \
      --iters=20 --warmup=1 --budget_seconds=2 --configs="$CONFIGS" --csv="$OUT/coretype.csv"
  fi

  # 4. PyTorch, same models, batches and work per step.
  local torch_bench=$BUNDLE_DIR/torch_mlp_bench.py variant
  export PYTHONUNBUFFERED=1
  want torch && for variant in "fp32:" "tf32:--tf32" "bf16:--bf16"; do
    # shellcheck disable=SC2086
    run_step "torch-cuda-${variant%%:*}" 150 python3 "$torch_bench" --device=cuda --iters=100 \
      --warmup=5 --configs="$CONFIGS" --csv="$csv" ${variant#*:}
  done
  want torch && run_step "torch-cpu-$(nproc)thr" 150 python3 "$torch_bench" --device=cpu --threads="$(nproc)" \
    --iters=20 --warmup=1 --budget_seconds=2 --configs="$CONFIGS" --csv="$csv"

  # 5. End to end, on the bundle's data, to the target accuracy.
  local data_flag=("--data_dir=$PWD/.gpu-bundle/data")
  local runs=() repeat
  want e2e && for repeat in $(seq 1 "${E2E_REPEATS:-1}"); do
    runs+=("cuda:$repeat" "cuda-prefetch:$repeat" "cuda-mps:$repeat" "cpu:$repeat"
      "cpu-prefetch:$repeat")
  done
  for run in "${runs[@]}"; do
    repeat=${run#*:}
    run=${run%:*}
    # Keep the whole script inside the device tool's 10 minutes.
    # A step may take E2E_SECONDS + 60 + 10 (kill-after); then the summary and the tarball.
    if ((SECONDS + E2E_SECONDS + 90 > 590)); then
      fail "e2e-$run-$repeat" "skipped: ${SECONDS}s spent, too little time left for a ${E2E_SECONDS}s run"
      continue
    fi
    local device=cuda extra=() mps=0
    case "$run" in
      cpu) device=cpu ;;
      cpu-prefetch) device=cpu extra=(--worker_flags=--prefetch) ;;
      cuda-prefetch) extra=(--worker_flags=--prefetch) ;;
      cuda-mps)
        if ! command -v nvidia-cuda-mps-control > /dev/null; then
          echo "=== e2e-cuda-mps-$repeat: no nvidia-cuda-mps-control on this machine, not run"
          continue
        fi
        export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps-pipe CUDA_MPS_LOG_DIRECTORY=$WORK/mps-log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        if ! nvidia-cuda-mps-control -d; then
          fail "e2e-cuda-mps-$repeat" "nvidia-cuda-mps-control -d failed"
          continue
        fi
        mps=1
        ;;
    esac
    run_step "e2e-$run-$repeat" $((E2E_SECONDS + 60)) "${ours[@]}" "$bin/launch" --shards=2 \
      --workers=4 --device="$device" --target_accuracy="$TARGET" --max_seconds="$E2E_SECONDS" \
      --run_dir="$WORK/run-$run-$repeat" "${data_flag[@]}" "${extra[@]}"
    if ((mps)); then
      echo quit | nvidia-cuda-mps-control
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  done
  nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv \
    > "$WORK/logs/gpu-state-after.csv" 2>&1

  # 6. The Python client beside the machine's PyTorch.
  if ! want python; then
    :
  elif ((SECONDS + 200 > 590)); then
    fail "python" "skipped: ${SECONDS}s spent, too little time left"
  else
    run_step python 190 bash deploy/python_bundle_check.sh "$BUNDLE_DIR" \
      "$PWD/.gpu-bundle/data" "$WORK"
  fi

  # 9. The PyTorch adapter with its module on the GPU.
  if want adapter; then
    run_step adapter 400 bash bench/torch_gpu_bench.sh "$BUNDLE_DIR" "$WORK/adapter"
  fi

  # Summary last: the device tool's reply carries the end of the output.
  (cd "$WORK" && shopt -s nullglob && tar -czf "$OUT/artifacts.tar.gz" \
    --exclude='run-*/checkpoints' --exclude='wan/*/checkpoints' logs run-* wan) \
    || fail "artifacts" "cannot write $OUT/artifacts.tar.gz"
  echo
  echo "=== summary (${SECONDS}s)"
  if [ -f "$csv" ]; then
    column -s, -t < "$csv" 2>/dev/null || cat "$csv"
  fi
  if [ -f "$OUT/coretype.csv" ]; then
    echo "CPU with OPENBLAS_CORETYPE set:"
    column -s, -t < "$OUT/coretype.csv" 2>/dev/null || cat "$OUT/coretype.csv"
  fi
  if [ -f "$OUT/nographs.csv" ]; then
    echo "CUDA graphs off (PS_CUDA_GRAPHS=0):"
    column -s, -t < "$OUT/nographs.csv" 2>/dev/null || cat "$OUT/nographs.csv"
  fi
  local log
  grep -h "relative L2 error" "$WORK/logs/network_test.log" 2>/dev/null
  grep -h "CPU backend:" "$WORK/logs/compute_bench-cpu-1thr.log" 2>/dev/null | head -n 1
  grep -h "^python \|accuracy:" "$WORK/logs/python.log" 2>/dev/null
  grep -h "^| \|workers x" "$WORK/logs/adapter.log" 2>/dev/null
  for log in "$WORK"/logs/iperf3-P*.log; do
    [ -f "$log" ] && echo "$(basename "$log" .log): $(grep receiver "$log" | tail -n 1)"
  done
  for log in "$WORK"/logs/transport-*.log; do
    [ -f "$log" ] || continue
    echo "$(basename "$log" .log):"
    grep -h -A4 "^single-stream" "$log"
  done
  [ -f "$WORK/logs/apply_bench.log" ] && tail -n 12 "$WORK/logs/apply_bench.log"
  [ -f "$WORK/logs/wan.log" ] && tail -n 25 "$WORK/logs/wan.log"
  for log in "$WORK"/logs/e2e-*.log; do
    [ -f "$log" ] || continue
    echo "$(basename "$log" .log): $(grep -h '^finished:' "$log" || echo 'no result')"
  done
  if ((${#failed[@]})); then
    echo "gpu_run: ${#failed[@]} step(s) failed: ${failed[*]}"
    return 1
  fi
  echo "gpu_run: all steps passed"
}

main "$@" 2>&1 | tee "$OUT/gpu_run.log"
exit "${PIPESTATUS[0]}"
