#!/usr/bin/env bash
# Install the package into a throwaway root and check that NCCL's way of loading the plugin
# works there: dlopen("libnccl-net-ha.so") by name, with no LD_LIBRARY_PATH, finds the
# installed library and initialises it (ha-harness check drives it through its C ABI, two
# endpoints in one process, every byte verified).
#
# The throwaway root is an overlay of this machine's / in a private mount namespace: dpkg
# installs for real (its database, ldconfig's cache) into the overlay's upper layer, which
# is deleted afterwards; the host is not touched. Needs root and overlayfs.
#
# usage: scripts/check-deb.sh DEB
set -euo pipefail
deb=$(realpath "${1:?usage: check-deb.sh DEB}")
[ "$(id -u)" = 0 ] || { echo "check-deb: needs root (mount namespace, overlay)"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/upper" "$work/work" "$work/root"
cp "$deb" "$work/pkg.deb"
if dpkg -s nccl-net-ha >/dev/null 2>&1; then
  echo "check-deb: note: nccl-net-ha is installed on this host; the overlay hides nothing of it"
fi
unshare --mount --propagation private bash -euo pipefail -c '
  w=$1
  mount -t overlay overlay -o "lowerdir=/,upperdir=$w/upper,workdir=$w/work" "$w/root"
  for d in proc sys dev tmp; do mount --rbind "/$d" "$w/root/$d"; done
  chroot "$w/root" /bin/bash -euo pipefail -c "
    dpkg -i \"$w/pkg.deb\" >/dev/null
    ldconfig
    echo \"check-deb: installed: \$(dpkg -L nccl-net-ha | grep -E \"\\.so\$|ha-harness\$|\\.h\$\" | tr \"\\n\" \" \")\"
    ldconfig -p | grep -q \"libnccl-net-ha.so \" || { echo \"check-deb: ldconfig does not list libnccl-net-ha.so\"; exit 1; }
    cd /
    env -u LD_LIBRARY_PATH HA_NCCL_FABRIC=sock NCCL_SOCKET_IFNAME=lo \
      ha-harness check --plugin libnccl-net-ha.so --mode threads --max-size 1M
  "
' _ "$work"
echo "check-deb: PASS (dlopen(\"libnccl-net-ha.so\") found the installed library with no LD_LIBRARY_PATH)"
