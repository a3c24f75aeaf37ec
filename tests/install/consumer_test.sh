#!/usr/bin/env bash
# A C++ user's own CMake project (consumer/) finds the installed C API with find_package, builds
# against it and runs: consumer_test.sh PREFIX BUILD_DIR WORK_DIR. The package names no path of
# the build tree and no static library of the project (paramserver::paramserver_c is a shared
# library alone).
set -euo pipefail
prefix=$1 build_tree=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)

config=$(find "$prefix" -path '*/cmake/paramserver/paramserverTargets.cmake')
[ -n "$config" ] || { echo "no paramserverTargets.cmake under $prefix"; exit 1; }
if grep -n "$build_tree\|ps_client\|absl::\|INTERFACE_LINK_LIBRARIES" \
  "$(dirname "$config")"/*.cmake; then
  echo "the installed package names the build tree or a private library (above)"; exit 1
fi

rm -rf "$work"
timeout 120 cmake -S "$here/consumer" -B "$work" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release
timeout 120 cmake --build "$work"
out=$("$work/consumer")
echo "$out"
grep -q '^api version [0-9]' <<< "$out"
grep -q '^refused with [1-9][0-9]*: .' <<< "$out"
