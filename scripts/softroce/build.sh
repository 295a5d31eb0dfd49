#!/bin/bash
# Build (or reuse) what the Soft-RoCE guest needs, under $SR_WORK (default /tmp/softroce):
#   1. host packages (QEMU, static busybox, the rdma-core user space the guest borrows from
#      the host root, perftest, iproute2) through apt-get, if missing;
#   2. Debian's own kernel image package (the one linux-image-amd64 depends on, or $SR_KPKG),
#      downloaded and extracted -- never installed on the host -- and its ELF vmlinux, which
#      QEMU boots through the PVH entry (skips the bzImage decompressor: ~3.5 s under TCG);
#   3. a small initramfs: static busybox, the modules rxe and virtio-9p need, ./init.
# Idempotent: a second run costs ~0.1 s; the initramfs is rebuilt when ./init or this file change.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SR_WORK=${SR_WORK:-/tmp/softroce}
mkdir -p "$SR_WORK"
export DEBIAN_FRONTEND=noninteractive
# depmod and friends live in /usr/sbin, not on a normal user's PATH on Debian.
export PATH=$PATH:/usr/sbin:/sbin
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"  # apt-get install/update need root

PKGS=(qemu-system-x86 busybox-static libibverbs1 ibverbs-providers ibverbs-utils perftest
      iproute2 kmod cpio python3)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "softroce/build: installing ${missing[*]}" >&2
  if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >"$SR_WORK/apt.log" 2>&1; then
    $SUDO apt-get update >>"$SR_WORK/apt.log" 2>&1
    $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >>"$SR_WORK/apt.log" 2>&1 ||
      { echo "softroce/build: apt-get failed, see $SR_WORK/apt.log" >&2; exit 1; }
  fi
fi

# --- kernel
kpkg_of_meta() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
KPKG=${SR_KPKG:-}
if [ -z "$KPKG" ] && [ -f "$SR_WORK/kpkg" ]; then KPKG=$(<"$SR_WORK/kpkg"); fi
if [ -z "$KPKG" ]; then
  KPKG=$(kpkg_of_meta)
  if [ -z "$KPKG" ]; then $SUDO apt-get update >/dev/null 2>&1; KPKG=$(kpkg_of_meta); fi
  [ -n "$KPKG" ] || { echo "softroce/build: cannot find Debian's kernel package" >&2; exit 1; }
fi
KVER=${KPKG#linux-image-}
KROOT=$SR_WORK/kernel
if [ ! -f "$KROOT/boot/vmlinuz-$KVER" ]; then
  echo "softroce/build: fetching $KPKG" >&2
  rm -rf "$KROOT" "$KROOT.tmp" "$SR_WORK"/linux-image-*.deb
  (cd "$SR_WORK" && { apt-get download "$KPKG" >/dev/null 2>&1 ||
                      { $SUDO apt-get update >/dev/null 2>&1; apt-get download "$KPKG" >/dev/null; }; })
  # Extract and index aside, then move into place: an interrupted run leaves no half kernel.
  dpkg-deb -x "$SR_WORK"/linux-image-*.deb "$KROOT.tmp"
  depmod -b "$KROOT.tmp" "$KVER"
  mv "$KROOT.tmp" "$KROOT"
  rm -f "$SR_WORK"/linux-image-*.deb
fi
echo "$KPKG" > "$SR_WORK/kpkg"
if [ ! -s "$SR_WORK/vmlinux" ] || [ "$SR_WORK/vmlinux" -ot "$KROOT/boot/vmlinuz-$KVER" ]; then
  python3 - "$KROOT/boot/vmlinuz-$KVER" "$SR_WORK/vmlinux" <<'PY' || rm -f "$SR_WORK/vmlinux"
import lzma, sys
d = open(sys.argv[1], "rb").read()
i = d.find(b"\xfd7zXZ\x00")
if i < 0: sys.exit("no XZ payload in the bzImage")
out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d[i:])
if out[:4] != b"\x7fELF": sys.exit("payload is not ELF")
open(sys.argv[2], "wb").write(out)
PY
fi
[ -s "$SR_WORK/vmlinux" ] || ln -sf "$KROOT/boot/vmlinuz-$KVER" "$SR_WORK/vmlinux"

# --- initramfs
STAMP=$(cat "$HERE/init" "$HERE/build.sh" | sha256sum | cut -c1-16)-$KVER
if [ -f "$SR_WORK/initrd.img" ] && [ "$(cat "$SR_WORK/initrd.stamp" 2>/dev/null)" = "$STAMP" ]; then
  exit 0
fi
echo "softroce/build: initramfs for $KVER" >&2
IR=$SR_WORK/initramfs
rm -rf "$IR"; mkdir -p "$IR"/{bin,sbin,dev,proc,sys,newroot,lib/modules/$KVER}
cp /bin/busybox "$IR/bin/busybox"
for a in sh mount umount mkdir modprobe cat echo poweroff chroot sync cut ln; do
  ln -sf busybox "$IR/bin/$a"
done
ln -sf ../bin/busybox "$IR/sbin/modprobe"   # the kernel's request_module() helper
MODS="virtio_pci 9pnet_virtio 9p veth rdma_rxe ib_uverbs crc32_generic crc32-pclmul sch_netem"
for m in $MODS; do
  modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r f; do
  rel=${f#"$KROOT"/lib/modules/$KVER/}
  mkdir -p "$IR/lib/modules/$KVER/$(dirname "$rel")"
  cp "$f" "$IR/lib/modules/$KVER/$rel"
done
cp "$KROOT/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$IR/lib/modules/$KVER/"
depmod -b "$IR" "$KVER"
cp "$HERE/init" "$IR/init"; chmod +x "$IR/init"
echo "$MODS" > "$IR/modules.list"
(cd "$IR" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$SR_WORK/initrd.img"
echo "$STAMP" > "$SR_WORK/initrd.stamp"
