#!/usr/bin/env bash
# Run nccl-tests all_reduce_perf through the HA plugin and through NCCL's own Socket transport,
# default and tuned (NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4), the GPUs forced onto the
# network path, and print the three side by side (scripts/nccl/compare_table.py).
#
#   scripts/nccl/compare.sh NCCL_TESTS_BUILD_DIR [OUT_DIR]
#
# COMPARE_MODE=g2 (default): one process, two GPUs (-g 2), loopback.
# COMPARE_MODE=2proc: two ranks in two network namespaces (scripts/nccl/mpi-netns.sh; the build
#   dir must be an MPI=1 build): the plugin on the two `sock` rails, NCCL Socket on the
#   out-of-band veth pair (same kind of link).
# COMPARE_ONLY=ha|socket|tuned runs one side (the table uses whichever logs are in OUT_DIR).
# NCCL_DEBUG_SUBSYS (default INIT,NET): add TUNING to log each collective's algorithm, protocol
#   and channels (rank 0).
# One GPU only: scripts/nccl/compare-1gpu.sh (two ranks share it).
# PLUGIN_DIR: the folder holding libnccl-net-ha.so (default dist/).
# Needs dist/libnccl-net-ha.so (scripts/build.sh). Extra all_reduce_perf flags: $PERF_ARGS
# (default "-b 8 -e 1G -f 4 -c 1" plus -g 2 or -g 1).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:?usage: compare.sh NCCL_TESTS_BUILD_DIR [OUT_DIR]}
out=${2:-$here/bench/out}
mkdir -p "$out"
mode=${COMPARE_MODE:-g2}
only=${COMPARE_ONLY:-both}
common=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO "NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET}")
case "$mode" in
  g2) launch=(); args=${PERF_ARGS:--b 8 -e 1G -f 4 -g 2 -c 1}; common+=(NCCL_SOCKET_IFNAME=lo) ;;
  2proc) launch=("$here/scripts/nccl/mpi-netns.sh"); args=${PERF_ARGS:--b 8 -e 1G -f 4 -g 1 -c 1} ;;
  *) echo "compare: COMPARE_MODE is g2 or 2proc" >&2; exit 2 ;;
esac
ha_log="$out/allreduce-$mode-ha.log"
so_log="$out/allreduce-$mode-socket.log"
tu_log="$out/allreduce-$mode-socket-tuned.log"
if [ "$only" = both ] || [ "$only" = ha ]; then
  echo "== HA plugin (sock fabric), $mode"
  env "${common[@]}" LD_LIBRARY_PATH="${PLUGIN_DIR:-$here/dist}:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=ha NCCL_NET=HA \
    HA_NCCL_FABRIC=sock "${launch[@]}" "$bin/all_reduce_perf" $args > "$ha_log" 2>&1 || { tail -30 "$ha_log"; exit 1; }
  grep -hE "Using network|Loaded net plugin" "$ha_log" | sed 's/^[^ ]* [^ ]* //' | sort -u | head -5
fi
if [ "$only" = both ] || [ "$only" = socket ]; then
  echo "== NCCL Socket, $mode"
  env "${common[@]}" NCCL_NET=Socket "${launch[@]}" "$bin/all_reduce_perf" $args > "$so_log" 2>&1 || { tail -30 "$so_log"; exit 1; }
  grep -hE "Using network" "$so_log" | sed 's/^[^ ]* [^ ]* //' | sort -u | head -2
fi
if [ "$only" = both ] || [ "$only" = tuned ]; then
  echo "== NCCL Socket tuned (4 threads x 4 sockets), $mode"
  env "${common[@]}" NCCL_NET=Socket NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 "${launch[@]}" \
    "$bin/all_reduce_perf" $args > "$tu_log" 2>&1 || { tail -30 "$tu_log"; exit 1; }
fi
cols=()
[ -f "$ha_log" ] && cols+=("ha=$ha_log")
[ -f "$so_log" ] && cols+=("socket=$so_log")
[ -f "$tu_log" ] && cols+=("tuned=$tu_log")
[ "${#cols[@]}" -gt 0 ] && python3 "$here/scripts/nccl/compare_table.py" "${cols[@]}"
exit 0
