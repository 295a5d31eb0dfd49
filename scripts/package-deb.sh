#!/usr/bin/env bash
# Build the Debian/Ubuntu package of the plugin from dist/ (run scripts/build.sh first, or
# pass --build): dist/nccl-net-ha_<version>_<arch>.deb, installing
#   /usr/lib/<multiarch>/libnccl-net-ha.so      the plugin, where NCCL's dlopen("libnccl-net-ha.so")
#                                               finds it with no LD_LIBRARY_PATH
#   /usr/lib/debug/usr/lib/<multiarch>/libnccl-net-ha.so.debug   its debug information
#                                               (gdb and perf find it through the debuglink)
#   /usr/bin/ha-harness                         checks, benchmarks, drills, `ha-harness stats`
#                                               (live state) and `ha-harness timeline` (pictures;
#                                               recommends fonts-dejavu-core for the PNG's text)
#   /usr/include/nccl_net_ha.h                  the exported ABI
#   /usr/share/doc/nccl-net-ha/                 README.md, copyright
# Uses dpkg-deb only (no debhelper, no cargo-deb): the package is five files and a control
# file, and dpkg-deb is on every Debian/Ubuntu machine.
#
# usage: scripts/package-deb.sh [--build] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=0 out=dist
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=1 ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "package-deb.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$build" = 1 ] && bash scripts/build.sh
for f in dist/libnccl-net-ha.so dist/libnccl-net-ha.so.debug dist/ha-harness; do
  [ -f "$f" ] || { echo "package-deb.sh: $f missing: run scripts/build.sh first (or --build)" >&2; exit 2; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
[ -n "$version" ] && [ -n "$multiarch" ] || { echo "package-deb.sh: no version or multiarch triplet" >&2; exit 2; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/nccl-net-ha
install -D -m 0644 dist/libnccl-net-ha.so "$root/usr/lib/$multiarch/libnccl-net-ha.so"
install -D -m 0644 dist/libnccl-net-ha.so.debug \
  "$root/usr/lib/debug/usr/lib/$multiarch/libnccl-net-ha.so.debug"
install -D -m 0755 dist/ha-harness "$root/usr/bin/ha-harness"
strip --strip-unneeded "$root/usr/bin/ha-harness"
install -D -m 0644 include/nccl_net_ha.h "$root/usr/include/nccl_net_ha.h"
install -D -m 0644 README.md "$root/usr/share/doc/nccl-net-ha/README.md"
cat > "$root/usr/share/doc/nccl-net-ha/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: nccl-net-ha
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
size=$(du -sk "$root" | cut -f1)
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CONTROL
Package: nccl-net-ha
Version: $version
Architecture: $arch
Maintainer: nccl-net-ha developers <nccl-net-ha@localhost>
Installed-Size: $size
Depends: libc6, libgcc-s1, libibverbs1
Recommends: fonts-dejavu-core
Section: libs
Priority: optional
Homepage: https://github.com/nccl-net-ha/nccl-net-ha
Description: NCCL network plugin that survives NIC, cable and switch-port failures
 libnccl-net-ha.so is an NCCL ext-net plugin (v8-v12, name HA) for InfiniBand/RoCE
 clusters: every connection has a primary and a standby RC path on different NICs, and
 a failover engine moves traffic to the standby, replaying exactly what the peer did not
 receive. Load it with NCCL_NET_PLUGIN=ha NCCL_NET=HA. Also ships ha-harness (checks,
 benchmarks, failover drills, live statistics, failover timeline pictures) and the C
 header of the exported ABI.
CONTROL
# ldconfig runs from the trigger libc-bin declares for /usr/lib/<multiarch>; say it explicitly.
printf 'activate-noawait ldconfig\n' > "$root/DEBIAN/triggers"
mkdir -p "$out"
deb=$out/nccl-net-ha_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "built $(realpath "$deb") ($(stat -c %s "$deb") bytes)"
