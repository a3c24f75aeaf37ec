#!/usr/bin/env bash
# The installed tree (the `installed` fixture's PREFIX) runs alone:
#   installed_job_test.sh PREFIX BUILD_DIR PYTHON
# bin/ holds the front command alone, no RUNPATH names BUILD_DIR, the installed units pass
# systemd-analyze verify (PYTHON runs deploy/check_recipes.py). Then, in a private mount namespace
# where an empty tmpfs covers BUILD_DIR (the prefix, inside it, is first bound elsewhere) so that
# nothing is found through the build tree, the installed command prints its version and help,
# refuses an unknown verb, and runs a 1x2 job that trains.
set -euo pipefail
prefix=$(cd "$1" && pwd) build=$(cd "$2" && pwd) python=$3
here=$(cd "$(dirname "$0")" && pwd)

# Nothing but the front command in bin/; no RUNPATH names the build tree.
[ "$(ls "$prefix/bin")" = paramserver ] || { echo "bin/ holds: $(ls "$prefix/bin")"; exit 1; }
for f in "$prefix"/bin/* "$prefix"/libexec/paramserver/* "$prefix"/lib*/libparamserver_c.so*; do
  if readelf -d "$f" | grep -E 'R(UN)?PATH' | grep -F "$build"; then
    echo "$f: its RUNPATH names the build tree"; exit 1
  fi
done
# The units run the installed command, and verify.
unit=$prefix/lib/systemd/system/ps@.service
grep -qx "ExecStart=$prefix/bin/paramserver ps --cluster=.*" "$unit" \
  || { echo "$unit runs no $prefix/bin/paramserver"; exit 1; }
"$python" "$here/../../deploy/check_recipes.py" systemd --units="$prefix/lib/systemd/system"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/prefix"
as_root=()  # mounts need root, or root of a user namespace of one's own
[ "$(id -u)" = 0 ] || as_root=(--map-root-user)
# shellcheck disable=SC2016
timeout 400 unshare "${as_root[@]}" --mount --propagation private bash -euo pipefail -c '
  prefix=$1 build=$2 tmp=$3 here=$4
  mount --bind "$prefix" "$tmp/prefix"
  mount -t tmpfs hidden "$build"
  ps=$tmp/prefix/bin/paramserver
  source "$here/job_check.sh"

  version=$("$ps" --version)
  echo "$version"
  [[ $version == "paramserver "[0-9]*.[0-9]*.[0-9]* ]]
  grep -q "^  launch " <<< "$("$ps" --help)"
  grep -q -- "--port" <<< "$("$ps" help ps 2>&1 || true)"
  code=0
  "$ps" bogus 2> "$tmp/bogus.txt" || code=$?
  [ "$code" = 2 ] && grep -q "unknown verb .bogus.; the verbs: ps, worker" "$tmp/bogus.txt"

  ps_run_job "$tmp/run" "$ps"
  ps_check_job "$tmp/run"
' installed_job_test "$prefix" "$build" "$tmp" "$here"
