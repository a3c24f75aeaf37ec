#!/usr/bin/env bash
# Builds the pip wheel of the Python client (the `wheel` target runs it: python/CMakeLists.txt).
#
#   bash python/make_wheel.sh PYTHON PACKAGE_DIR PYPROJECT STAGE_DIR DIST_DIR
#
# PACKAGE_DIR is build/python/paramserver (the modules and libparamserver_c.so); PYPROJECT the
# configured pyproject.toml. The wheel carries every library libparamserver_c.so loads in
# paramserver/_libs/, with RUNPATH $ORIGIN (the C API library's: $ORIGIN/_libs), so nothing needs
# LD_LIBRARY_PATH; all but glibc's own and the C++ runtime (libstdc++, libgcc_s), which stay the
# system's as in every manylinux wheel: PyTorch was built against the system's, and a process holds
# one libstdc++.so.6, whichever loads first (as earlier GPU image runs found).
# The libraries keep their sonames, so a process that already loaded one (Debian's PyTorch loads
# libprotobuf.so.32) shares it rather than holding two.
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 PYTHON PACKAGE_DIR PYPROJECT STAGE_DIR DIST_DIR" >&2; exit 2; }
python=$1 package=$2 pyproject=$3 stage=$4 dist=$5
die() { echo "make_wheel: $*" >&2; exit 1; }
command -v patchelf > /dev/null || die "patchelf is missing (deploy/setup.sh installs Debian's)"

is_system() {
  case "$1" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|linux-vdso*) return 0 ;;
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}

# A fresh stage each time: setuptools' own build/ there would keep files of an earlier wheel.
rm -rf "$stage"
mkdir -p "$stage/paramserver/_libs" "$dist"
cp "$pyproject" "$stage/pyproject.toml"
cp "$package"/*.py "$package/libparamserver_c.so" "$stage/paramserver/"
lib=$stage/paramserver/libparamserver_c.so
strip --strip-unneeded "$lib"
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] || continue  # the loader and the vDSO have no "=>"
  [ "$path" = "not" ] && die "libparamserver_c.so: ldd finds no $name"
  is_system "$name" && continue
  cp -L "$path" "$stage/paramserver/_libs/$name"
  chmod u+w "$stage/paramserver/_libs/$name"
  patchelf --set-rpath '$ORIGIN' "$stage/paramserver/_libs/$name"
done < <(env -u LD_LIBRARY_PATH ldd "$lib")
patchelf --set-rpath '$ORIGIN/_libs' "$lib"

# Debian's setuptools and wheel (python3-setuptools, python3-wheel): nothing from PyPI.
"$python" -m pip wheel --quiet --no-deps --no-build-isolation --no-index --no-cache-dir \
  --wheel-dir "$dist" "$stage"
