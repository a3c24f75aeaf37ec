#!/usr/bin/env bash
# Installs every dependency from Debian 12's packages (if missing) and builds in Release into
# build/. Idempotent: run it as often as you like. Extra CMake flags: PS_CMAKE_FLAGS="-DPS_CUDA=OFF".
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  clang  # clang++-14: the ThreadSafetyAnalysis test (tools/check_thread_safety.py)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgtest-dev libgmock-dev libopenblas-dev zlib1g-dev nlohmann-json3-dev libssl-dev openssl
  prometheus-cpp-dev prometheus curl
  dataset-fashion-mnist gnuplot-nox iperf3 iproute2 iptables systemd
  python3 python3-numpy python3-yaml  # for /usr/bin/python3: the tests' interpreter, PS_PYTHON
  python3-torch python3-torchvision python3-pytest  # the PyTorch adapter, its tests and examples
  patchelf python3-pip python3-setuptools python3-wheel python3-venv  # the pip wheel and its test
  libnetfilter-queue-dev
  dpkg-dev debootstrap  # cpack -G DEB (dpkg-shlibdeps) and its test on a clean Debian 12 root
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The CUDA toolkit is not a Debian package; when it is installed, build the CUDA backend too.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${PS_CMAKE_FLAGS:-} > build.log 2>&1 \
  || { cat build.log; echo "setup: cmake configure failed"; exit 1; }
cmake --build build -j"$(nproc)" >> build.log 2>&1 \
  || { tail -n 60 build.log; echo "setup: build failed (full log in build.log)"; exit 1; }
echo "setup: built into build/bin ($(grep -o 'CUDA backend: .*' build.log | head -n1))"
