#!/usr/bin/env bash
# Builds here and packs what the lent GPU machine needs into .gpu-bundle/ (ignored by git), for the
# device tool to carry: that machine has CUDA, PyTorch, CMake and ninja, but no gRPC, Abseil,
# protobuf or OpenBLAS, and no network.
#
#   bash deploy/gpu_bundle.sh [--no-build]
#
# .gpu-bundle/
#   bundle.tar.xz   bin/  every build/bin executable but the tests gpu_run.sh does not run (it
#                         runs cuda_backend_test and network_test), stripped, and the CUDA
#                         backend plugin (libparamserver_cuda.so), loaded from beside the programs
#                   lib/  every shared library they load, except glibc's own (libc, libm,
#                         libpthread, libdl, librt, the loader) and the CUDA toolkit's (cuBLAS):
#                         gRPC, protobuf, Abseil, OpenBLAS + libgfortran/libquadmath, libstdc++...
#                   tools/ iperf3, ip and tc (Debian's: the TCP ceiling of transport_bench, the
#                         network namespaces and shaped links of wan_bench), their libraries in lib/
#                   paramserver-*.whl  the Python client's wheel (build target `wheel`: its
#                         libraries inside), for deploy/python_bundle_check.sh
#                   torch_mlp_bench.py
#   data/           the Fashion-MNIST .gz files
#   MANIFEST.txt    commit, date, sizes, file list
# Uncompressed, bin/ + lib/ + data/ are about 100 MB (OpenBLAS alone is 36 MB), over the device
# tool's 64 MiB limit on what travels; xz brings bin/ + lib/ to about 15 MB. deploy/gpu_run.sh
# unpacks the tarball on the GPU machine.
#
# Fails if a library cannot be resolved, if the unpacked bundle does not run here with
# LD_LIBRARY_PATH=<bundle>/lib, or if .gpu-bundle/ (or everything that would travel) exceeds 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
for arg in "$@"; do
  case "$arg" in
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle: unknown argument '$arg' (expected --no-build)" >&2; exit 1 ;;
  esac
done
die() { echo "gpu_bundle: $*" >&2; exit 1; }

limit=$((64 * 1024 * 1024))
data_src=/usr/share/datasets/fashion-mnist
if ((build)); then bash deploy/setup.sh; fi

required=(ps worker evaluator launch transport_bench compute_bench cuda_backend_test network_test
          libparamserver_cuda.so)
for b in "${required[@]}"; do
  [ -x "build/bin/$b" ] || die "build/bin/$b is missing: build first (bash deploy/setup.sh)"
done
cmake --build build --target wheel > /dev/null || die "the build target wheel failed"
wheel=$(ls -t build/dist/paramserver-*.whl | head -n 1)
[[ "$(ldd build/bin/libparamserver_cuda.so)" == *libcublas.so* ]] \
  || die "build/bin/libparamserver_cuda.so does not load cuBLAS: configure with nvcc present"
# Only the plugin (and cuda_backend_test, which links the backend) may need cuBLAS: the GPU machine
# runs the other programs from the bundle as shipped.
for f in build/bin/*; do
  case "$(basename "$f")" in libparamserver_cuda.so|cuda_backend_test) continue ;; esac
  if [ -f "$f" ] && [ -x "$f" ] && [[ "$(ldd "$f" 2>&1)" == *libcublas* ]]; then
    die "$f loads cuBLAS: only the CUDA plugin may (rebuild: ninja -C build)"
  fi
done
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
         t10k-labels-idx1-ubyte.gz; do
  [ -f "$data_src/$f" ] || die "$data_src/$f is missing (apt-get install dataset-fashion-mnist)"
done

stage=$(mktemp -d /tmp/gpu-bundle-stage.XXXXXX)
check=$(mktemp -d /tmp/gpu-bundle-check.XXXXXX)
trap 'rm -rf "$stage" "$check"' EXIT
mkdir -p "$stage/bin" "$stage/lib"

# Binaries: the daemons, tools, benches, the CUDA plugin and the two tests gpu_run.sh runs, stripped
# (the other test binaries would take the bundle over the device tool's 64 MiB).
binaries=()
for f in build/bin/*; do
  if [ ! -f "$f" ] || [ ! -x "$f" ]; then continue; fi
  case "$(basename "$f")" in cuda_backend_test|network_test) ;; *_test) continue ;; esac
  cp "$f" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$(basename "$f")"
  binaries+=("$f")
done

# Tools the GPU image may lack: gpu_run.sh links those it lacks into /usr/bin (its own win).
mkdir -p "$stage/tools"
tools=()
for t in iperf3 ip tc; do
  path=$(command -v "$t") || die "$t is missing here (apt-get install iperf3 iproute2)"
  cp "$path" "$stage/tools/"
  tools+=("$path")
done

# Libraries: what ldd resolves, copied under the name the binaries ask for (the soname), with
# symlinks such as Debian's /etc/alternatives for OpenBLAS resolved (cp -L).
is_base() {  # glibc's own libraries and the CUDA toolkit: the GPU machine has its own
  case "$1" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|linux-vdso*) return 0 ;;
  esac
  case "$2" in /usr/local/cuda*) return 0 ;; esac
  return 1
}
declare -A copied=()
for f in "${binaries[@]}" "${tools[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue  # the loader and the vDSO have no "=>"
    [ "$path" = "not" ] && die "$f: $name is not found by ldd"
    is_base "$name" "$path" && continue
    [ -n "${copied[$name]:-}" ] && continue
    cp -L "$path" "$stage/lib/$name"
    copied[$name]=$path
  done < <(ldd "$f")
done
cp bench/torch_mlp_bench.py "$wheel" "$stage/"

rm -rf .gpu-bundle
mkdir -p .gpu-bundle/data
cp "$data_src"/*.gz .gpu-bundle/data/
echo "gpu_bundle: compressing $(du -sh "$stage" | cut -f1) of binaries and libraries (xz)"
tar -C "$stage" -cf - bin lib tools "$(basename "$wheel")" torch_mlp_bench.py \
  | xz -T0 -6 > .gpu-bundle/bundle.tar.xz

# Self-check on the unpacked copy: every library the binaries load, other than glibc's and the
# CUDA toolkit's, must come from the bundle; and the binaries must run from it.
tar -C "$check" -xJf .gpu-bundle/bundle.tar.xz
for f in "$check"/bin/* "$check"/tools/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [ "$path" = "not" ] && die "bundle check: $(basename "$f"): $name not found"
    is_base "$name" "$path" && continue
    case "$path" in
      "$check/lib/"*) ;;
      *) die "bundle check: $(basename "$f") loads $path from outside the bundle" ;;
    esac
  done < <(LD_LIBRARY_PATH="$check/lib" ldd "$f")
done
[[ "$(LD_LIBRARY_PATH="$check/lib" "$check/bin/ps" --help 2>&1)" == *"--shard_index"* ]] \
  || die "bundle check: bin/ps --help did not print its flags"
LD_LIBRARY_PATH="$check/lib" "$check/bin/compute_bench" --device=cpu --iters=2 --warmup=1 \
  --configs=784-256-128-10:256 > "$check/compute_bench.txt" 2>&1 \
  || { cat "$check/compute_bench.txt"; die "bundle check: bin/compute_bench --device=cpu failed"; }

dirty=""
[ -z "$(git status --porcelain 2>/dev/null)" ] || dirty=" (plus uncommitted changes)"
{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$dirty"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "unpacked: $(du -sb "$check/bin" | cut -f1) bytes bin/," \
    "$(du -sb "$check/lib" | cut -f1) bytes lib/"
  echo "bin: $(cd "$check/bin" && echo *)"
  echo "lib: $(cd "$check/lib" && echo *)"
  echo "data: $(cd .gpu-bundle/data && echo *)"
} > .gpu-bundle/MANIFEST.txt

bundle_bytes=$(du -sb .gpu-bundle | cut -f1)
# What the device tool sends: tracked and untracked-not-ignored files, plus the carried bundle.
tree_bytes=$({ git ls-files -z -c -o --exclude-standard | xargs -0 -r stat -c %s || true; } \
  2>/dev/null | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu_bundle: .gpu-bundle/ is $(mib "$bundle_bytes")" \
  "(bundle.tar.xz $(mib "$(stat -c %s .gpu-bundle/bundle.tar.xz)")," \
  "data/ $(mib "$(du -sb .gpu-bundle/data | cut -f1)")); with the working tree" \
  "($(mib "$tree_bytes")) $(mib $((bundle_bytes + tree_bytes))) travels, limit 64 MiB"
((bundle_bytes <= limit)) || die ".gpu-bundle/ is over 64 MiB"
((bundle_bytes + tree_bytes <= limit)) || die "the working tree plus .gpu-bundle/ is over 64 MiB"
echo "gpu_bundle: ${#binaries[@]} binaries, ${#copied[@]} libraries; checked here: all load from" \
  "the bundle, ps --help and compute_bench --device=cpu run"
echo "gpu_bundle: on the GPU machine: device run with carry [\".gpu-bundle\"]," \
  "command \"bash deploy/gpu_run.sh\", timeout_s 600"
