#!/usr/bin/env bash
# Run nccl-tests all_reduce_perf through the HA plugin and through NCCL's own Socket transport,
# two GPUs of one host forced onto the network path, and print both busbw columns side by side.
#
#   scripts/nccl/compare.sh NCCL_TESTS_BUILD_DIR [OUT_DIR]
#
# Needs dist/libnccl-net-ha.so (scripts/build.sh). Extra all_reduce_perf flags: $PERF_ARGS
# (default "-b 8 -e 1G -f 4 -g 2 -c 1").
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:?usage: compare.sh NCCL_TESTS_BUILD_DIR [OUT_DIR]}
out=${2:-$here/bench/out}
mkdir -p "$out"
args=${PERF_ARGS:--b 8 -e 1G -f 4 -g 2 -c 1}
common=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)
echo "== HA plugin (sock fabric)"
env "${common[@]}" LD_LIBRARY_PATH="$here/dist:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=ha NCCL_NET=HA \
  HA_NCCL_FABRIC=sock "$bin/all_reduce_perf" $args > "$out/allreduce-ha.log" 2>&1 || { tail -30 "$out/allreduce-ha.log"; exit 1; }
echo "== NCCL Socket"
env "${common[@]}" NCCL_NET=Socket "$bin/all_reduce_perf" $args > "$out/allreduce-socket.log" 2>&1 || { tail -30 "$out/allreduce-socket.log"; exit 1; }
grep -E "Using network|NET/HA :|Loaded net plugin" "$out/allreduce-ha.log" | sort -u | head -5
grep -E "Using network" "$out/allreduce-socket.log" | sort -u | head -2
python3 "$here/scripts/nccl/perf_table.py" "$out/allreduce-ha.log" "$out/allreduce-socket.log"
