#!/usr/bin/env bash
# Build the release plugin as dist/libnccl-net-ha.so (plus the ha-harness tool and the
# GPUDirect self-test ha-gdr-probe, see scripts/nccl/gdr-check.sh).
# Use it with: LD_LIBRARY_PATH=$PWD/dist NCCL_NET_PLUGIN=ha NCCL_NET=HA ...
#
# The installed library is stripped; its debug information (line tables, for backtraces and
# perf) goes to dist/libnccl-net-ha.so.debug, which gdb and perf find through the
# .gnu_debuglink section when it sits beside the library (or in /usr/lib/debug).
#
# usage: scripts/build.sh [--abi-variants]
#
#   HA_ABI_MAX=N scripts/build.sh   dist/libnccl-net-ha.so exports ext-net v8..vN only
#                                   (N = 8..12; default 12 = all five). NCCL uses the
#                                   newest ncclNetPlugin_vN symbol it finds, so this is how to
#                                   make it fall back to an older ABI.
#   --abi-variants                  also build dist/abi-v8/ ... dist/abi-v12/, each holding a
#                                   libnccl-net-ha.so whose newest ABI is that version (for
#                                   scripts/nccl/abi-versions.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
variants=0
for a in "$@"; do
  case "$a" in
    --abi-variants) variants=1 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
mkdir -p dist
build() { # $1 = max ABI; output: target/release/libnccl_net_ha.so
  HA_ABI_MAX="$1" cargo build --release --locked -p nccl-net-ha -p ha-harness -p ha-gdr-probe
}
# install_so SRC DST: DST stripped, DST.debug holding the debug info, linked by debuglink.
install_so() {
  local dir base
  dir=$(dirname "$2") base=$(basename "$2")
  objcopy --only-keep-debug "$1" "$2.debug"
  # --add-gnu-debuglink names the file; run from DST's folder so only the base name is stored.
  (cd "$dir" && objcopy --strip-debug --strip-unneeded --add-gnu-debuglink="$base.debug" \
     "$OLDPWD/$1" "$base.tmp" && mv -f "$base.tmp" "$base")
}
exports() { nm -D --defined-only "$1" | grep -o 'ncclNetPlugin_v[0-9]*' | sort -V | tr '\n' ' '; }
if [ "$variants" = 1 ]; then
  for v in 8 9 10 11 12; do
    build "$v"
    mkdir -p "dist/abi-v$v"
    install_so target/release/libnccl_net_ha.so "dist/abi-v$v/libnccl-net-ha.so"
    echo "built $(pwd)/dist/abi-v$v/libnccl-net-ha.so: $(exports "dist/abi-v$v/libnccl-net-ha.so")"
  done
fi
max=${HA_ABI_MAX:-12}
build "$max"
install_so target/release/libnccl_net_ha.so dist/libnccl-net-ha.so
# The tool without its debug information (most of its size; dist/ travels to GPU machines).
objcopy --strip-debug target/release/ha-harness dist/ha-harness
cp -f target/release/ha-gdr-probe dist/ha-gdr-probe
# A font for the PNG of `ha-harness timeline` on machines that have none (GPU images often
# lack fonts; ha-harness also looks in <its folder>/fonts): DejaVu Sans, if this machine has it.
for f in /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf /usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf; do
  if [ -f "$f" ]; then mkdir -p dist/fonts && cp -f "$f" dist/fonts/; fi
done
echo "built $(pwd)/dist/libnccl-net-ha.so ($(stat -c %s dist/libnccl-net-ha.so) bytes; debug info in" \
  "libnccl-net-ha.so.debug): $(exports dist/libnccl-net-ha.so)"
# The library exports the plugin tables and nothing else (what NCCL dlsyms).
extra=$(nm -D --defined-only dist/libnccl-net-ha.so | awk '{print $3}' | grep -v '^ncclNetPlugin_v[0-9]*$' || true)
if [ -n "$extra" ]; then
  echo "build.sh: dist/libnccl-net-ha.so exports more than the plugin tables: $extra" >&2
  exit 1
fi
