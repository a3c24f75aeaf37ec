#!/usr/bin/env bash
# The .deb on a clean Debian 12 root: deb_clean_root_test.sh BUILD_DIR. Builds the package
# (cpack -G DEB), bootstraps a minimal bookworm (debootstrap --variant=minbase, from this machine's
# Debian mirror) into a temporary directory, installs the package there with apt (which resolves
# its Depends from the mirror), copies Fashion-MNIST in and runs a 1x2 job with the installed
# command; the mounts live in a private mount namespace and go with it, the root is removed on
# any exit. Needs root, debootstrap and the mirror; takes 1.5 minutes on a 2-core machine with a
# fast mirror, most of it debootstrap and apt (its CTest label: clean_root).
set -euo pipefail
build=$(cd "$1" && pwd)
[ "$(id -u)" = 0 ] || { echo "debootstrap and chroot need root"; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
data=/usr/share/datasets/fashion-mnist

(cd "$build" && timeout 300 cpack -G DEB)
deb=$(ls "$build"/paramserver_*_amd64.deb)
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
if grep -E -- '-dev\b' <<< "$depends"; then echo "Depends names a -dev package"; exit 1; fi

# This machine's Debian mirror (one-line or deb822 sources), not the security archive.
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
  /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -oE '^(deb|URIs:)[[:space:]]+[a-z]+://[^[:space:]]+' | awk '{ print $2 }' \
  | grep -v security | head -n 1 || true)
[ -n "$mirror" ] || { echo "no Debian mirror in /etc/apt/sources.list*"; exit 1; }

root=$(mktemp -d /var/tmp/paramserver-clean-root.XXXXXX)
trap 'rm -rf --one-file-system "$root"' EXIT
timeout 900 debootstrap --variant=minbase bookworm "$root" "$mirror" > "$root.debootstrap.log" \
  || { tail -n 30 "$root.debootstrap.log"; rm -f "$root.debootstrap.log"; exit 1; }
rm -f "$root.debootstrap.log"
cp "$deb" "$root/tmp/"
mkdir -p "$root$data"
cp "$data"/* "$root$data/"
cp "$here/job_check.sh" "$root/tmp/"

# shellcheck disable=SC2016
timeout 900 unshare --mount --propagation private bash -euo pipefail -c '
  root=$1 deb=$2
  mount -t proc proc "$root/proc"
  in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
  in_root apt-get update -qq
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "/tmp/$deb" > "$root/tmp/apt.log" || { tail -n 30 "$root/tmp/apt.log"; exit 1; }
  in_root paramserver --version
  in_root bash -c "source /tmp/job_check.sh && ps_run_job /tmp/run paramserver \
    && ps_check_job /tmp/run"
' deb_clean_root_test "$root" "$(basename "$deb")"
