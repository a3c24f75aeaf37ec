# Sourced (bash): bundle_python BUNDLE_DIR WORK_DIR sets `python` to the machine's own python3
# with the bundle's Python package (paramserver and libparamserver_c.so, deploy/gpu_bundle.sh)
# and `pylib` to the libraries it gets: the bundle's, less its libstdc++ and libgcc_s (PyTorch was
# built against the machine's, which a Debian 12 one must not shadow) unless the machine's are too
# old for libparamserver_c.so. The daemons a Python program starts (ps) inherit them.
bundle_python() {
  local bundle=$1 work=$2 f
  local lib=$bundle/python/paramserver/libparamserver_c.so
  [ -f "$lib" ] || { echo "bundle_python: $lib is missing (an older bundle?)" >&2; return 1; }
  pylib=$work/pylib
  rm -rf "$pylib" && mkdir -p "$pylib"
  for f in "$bundle"/lib/*; do
    [ -e "$f" ] || continue
    case "$(basename "$f")" in
      libstdc++.so.*|libgcc_s.so.*) ;;
      *) ln -s "$f" "$pylib/" ;;
    esac
  done
  if LD_LIBRARY_PATH=$pylib ldd -r "$lib" 2>&1 | grep -q "not found"; then
    echo "bundle_python: this machine's libstdc++ is older than Debian 12's; python3 gets the bundle's"
    ln -s "$bundle"/lib/libstdc++.so.* "$bundle"/lib/libgcc_s.so.* "$pylib/"
  fi
  python=(env "LD_LIBRARY_PATH=$pylib" "PYTHONPATH=$bundle/python" "PS_BIN_DIR=$bundle/bin" python3)
}
