#!/usr/bin/env bash
# Which ext-net ABI NCCL picks from the HA plugin, and that all_reduce is right through each:
# for the plugin variants exporting at most v12, v11, v10, v9 and v8 (dist/abi-vN/, built by
# `scripts/build.sh --abi-variants`), run all_reduce_perf on two GPUs of one host forced onto
# the network path, and print per variant the exit code, the NCCL log line naming the plugin
# version it loaded, and the #wrong count of every size. NCCL before 2.30 does not know v12:
# there the v12 variant is expected to load as v11 (the newest table that NCCL probes).
#
#   scripts/nccl/abi-versions.sh NCCL_TESTS_BUILD_DIR [OUT_DIR]
#
# Env: DIST (default <repo>/dist), PERF_ARGS (default "-b 8 -e 128M -f 4 -g 2 -c 1").
# Exit status: 0 when every variant ran clean (exit 0, the expected version loaded, #wrong 0).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:?usage: abi-versions.sh NCCL_TESTS_BUILD_DIR [OUT_DIR]}
out=${2:-$here/bench/out/abi-versions}
dist=${DIST:-$here/dist}
args=${PERF_ARGS:--b 8 -e 128M -f 4 -g 2 -c 1}
mkdir -p "$out"
[ -x "$bin/all_reduce_perf" ] || { echo "no $bin/all_reduce_perf" >&2; exit 2; }
bad=0
for v in 12 11 10 9 8; do
  dir="$dist/abi-v$v"
  log="$out/allreduce-abi-v$v.log"
  echo "== plugin variant with newest ABI v$v ($dir)"
  if [ ! -f "$dir/libnccl-net-ha.so" ]; then
    echo "   missing $dir/libnccl-net-ha.so (scripts/build.sh --abi-variants)"; bad=1; continue
  fi
  env LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=ha NCCL_NET=HA \
    HA_NCCL_FABRIC=sock NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
    NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    "$bin/all_reduce_perf" $args > "$log" 2>&1
  rc=$?
  # NCCL 2.28: "NET/Plugin: Loaded net plugin HA (v10)"; v11 prints "(v11)".
  loaded=$(grep -m1 -E "Loaded net plugin" "$log" || echo "(no 'Loaded net plugin' line)")
  # "NCCL version 2.28.9+cuda12.9": NCCL before 2.30 probes v11 at most.
  minor=$(grep -m1 -oE "NCCL version 2\.[0-9]+" "$log" | grep -oE "[0-9]+$" || echo 0)
  want=$v
  [ "$v" = 12 ] && [ "${minor:-0}" -lt 30 ] && want=11
  using=$(grep -m1 -E "Using network" "$log" || true)
  # all_reduce_perf rows: size count type redop root time algbw busbw #wrong (out of place),
  # then time algbw busbw #wrong (in place); #wrong are columns 9 and 13.
  wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { w += $9 + $13; n++ } END { printf "%d in %d rows", w, n }' "$log")
  echo "   exit code: $rc"
  echo "   loaded:    ${loaded#*NCCL INFO }"
  [ -n "$using" ] && echo "   network:   ${using#*NCCL INFO }"
  echo "   #wrong:    $wrong"
  echo "   expected:  v$want"
  case "$loaded" in *"(v$want)"*) ;; *) bad=1 ;; esac
  [ "$rc" = 0 ] || bad=1
  case "$wrong" in "0 in 0 rows"|[1-9]*) bad=1 ;; esac
  [ "$rc" = 0 ] || tail -20 "$log" | sed 's/^/   | /'
done
echo "logs in $out"
exit $bad
