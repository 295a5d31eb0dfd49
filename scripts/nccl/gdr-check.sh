#!/usr/bin/env bash
# GPUDirect RDMA check of the HA plugin: the first thing to run on a GPU cluster node.
#
#   scripts/nccl/gdr-check.sh [DIST_DIR] [ALL_REDUCE_PERF]
#
#   DIST_DIR         folder with libnccl-net-ha.so and ha-gdr-probe (scripts/build.sh → dist/;
#                    default: dist/ of this checkout)
#   ALL_REDUCE_PERF  nccl-tests' all_reduce_perf (default: the one on PATH)
#
# 1. Detection as the plugin does it, per RDMA NIC ("GPU Direct RDMA enabled via ... /
#    disabled: why"), from `ha-gdr-probe --detect-only`.
# 2. all_reduce_perf through the plugin on the verbs fabric with NCCL_NET_GDR_LEVEL=SYS (GDR
#    whatever the PCI distance), NCCL_DEBUG=INFO; then the log is searched for NCCL's
#    "GPU Direct RDMA Enabled for GPU ..." line, the channels that say ".../GDRDMA", and the
#    #wrong columns of every size (must all be 0).
#
# Launch: by default one process drives every local GPU with NCCL_P2P_DISABLE=1 and
# NCCL_SHM_DISABLE=1, so the GPUs of this node talk through the NICs (needs >= 2 GPUs). To
# run across nodes set LAUNCH, e.g.
#   LAUNCH="mpirun -np 2 --host n1,n2 -x LD_LIBRARY_PATH -x NCCL_NET -x NCCL_NET_PLUGIN \
#           -x HA_NCCL_FABRIC -x NCCL_NET_GDR_LEVEL -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS" \
#     scripts/nccl/gdr-check.sh dist ~/nccl-tests/build/all_reduce_perf
# PERF_ARGS overrides the sizes ("-b 8 -e 256M -f 4 -w 5 -n 20 -c 1"); extra HA_NCCL_* / NCCL_*
# settings in the environment pass through.
#
# Outcomes (exit status):
#   0  PASS: NCCL enabled GPU Direct RDMA on the plugin's NICs and every size has #wrong 0.
#   1  FAIL: see the verdict line. "disabled: ..." on a NIC says what is missing (load
#      nvidia-peermem, or use a driver/kernel/NIC with dma-buf: CUDA >= 11.7, open GPU kernel
#      modules, Linux >= 5.12, rdma-core >= 34); NCCL's "GPU Direct RDMA Disabled ... (distance
#      d > l)" means the topology ruled it out; a non-zero #wrong is corruption (report it; a
#      rerun with NCCL_NET_FORCE_FLUSH=1 tells whether a missing flush is the cause).
#   2  bad usage, or the binaries are missing.
#   3  this host has no RDMA NIC: GPUDirect RDMA cannot be used here. The plugin is still
#      checked: loaded by NCCL with HA_NCCL_FABRIC=verbs it must fail cleanly ("no RDMA
#      device") after finding the CUDA driver, which is printed (an unclean failure is exit 1).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
dist=$(cd "${1:-$here/dist}" 2>/dev/null && pwd) || { echo "gdr-check: no folder ${1:-$here/dist}"; exit 2; }
perf=${2:-$(command -v all_reduce_perf || true)}
probe="$dist/ha-gdr-probe"
[ -x "$probe" ] && [ -f "$dist/libnccl-net-ha.so" ] ||
  { echo "gdr-check: $dist lacks ha-gdr-probe or libnccl-net-ha.so (run scripts/build.sh)"; exit 2; }
out=${OUT:-$(mktemp -d /tmp/gdr-check.XXXXXX)}
mkdir -p "$out"
export LD_LIBRARY_PATH="$dist:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=ha NCCL_NET=HA
export HA_NCCL_FABRIC=verbs NCCL_NET_GDR_LEVEL=SYS NCCL_DEBUG=INFO
export NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET,GRAPH}

echo "== 1. detection (ha-gdr-probe --detect-only)"
"$probe" --detect-only | tee "$out/detect.txt"
det=${PIPESTATUS[0]}
if [ "$det" -eq 3 ]; then
  echo "gdr-check: THIS HOST HAS NO RDMA NIC: GPUDirect RDMA cannot be used or checked here."
  if [ -n "$perf" ] && [ -x "$perf" ]; then
    echo "== 2. the plugin under NCCL without a NIC: it must fail init cleanly"
    timeout 120 "$perf" -b 8 -e 8 -g 1 -c 1 -w 0 -n 1 >"$out/nccl-nonic.log" 2>&1
    rc=$?
    grep -E 'NET/HA|NET/Plugin|Failed to initialize' "$out/nccl-nonic.log" | head -20
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
       grep -q 'NET/HA verbs: GPUDirect: ' "$out/nccl-nonic.log" &&
       grep -q 'no RDMA device' "$out/nccl-nonic.log"; then
      echo "gdr-check: plugin init failed cleanly under NCCL (exit $rc, no RDMA device); log $out/nccl-nonic.log"
    else
      echo "gdr-check: FAIL: expected a clean init failure naming 'no RDMA device' (exit $rc; 124 = hung); log $out/nccl-nonic.log"
      exit 1
    fi
  fi
  exit 3
fi
[ "$det" -eq 0 ] || { echo "gdr-check: ha-gdr-probe failed ($det)"; exit 1; }
if ! grep -q 'GPU Direct RDMA enabled' "$out/detect.txt"; then
  echo "gdr-check: FAIL: no NIC has GPU Direct RDMA (the 'disabled:' lines above say why)"
  exit 1
fi

[ -n "$perf" ] && [ -x "$perf" ] || { echo "gdr-check: all_reduce_perf not found (second argument)"; exit 2; }
args=${PERF_ARGS:--b 8 -e 256M -f 4 -w 5 -n 20 -c 1}
log="$out/all_reduce.log"
if [ -n "${LAUNCH:-}" ]; then
  echo "== 2. all_reduce_perf via: $LAUNCH"
  # shellcheck disable=SC2086
  $LAUNCH "$perf" $args -g 1 >"$log" 2>&1
else
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "${ngpu:-0}" -lt 2 ]; then
    echo "gdr-check: one GPU on this node: set LAUNCH to run across nodes (see the header)"
    exit 2
  fi
  echo "== 2. all_reduce_perf, one process, $ngpu GPUs through the NICs (P2P and SHM off)"
  # shellcheck disable=SC2086
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$perf" $args -g "$ngpu" >"$log" 2>&1
fi
rc=$?
echo "== 3. what NCCL did (log: $log)"
grep -E 'NET/HA verbs: .*GPU Direct RDMA|GPU Direct RDMA (Enabled|Disabled)' "$log" | sort | uniq -c | head -20
gdrdma=$(grep -c 'via NET/HA/[0-9]*/GDRDMA' "$log")
plain=$(grep -E 'via NET/HA/[0-9]+' "$log" | grep -vc 'GDRDMA')
echo "channels via NET/HA: $gdrdma with GDRDMA, $plain without"
# all_reduce_perf rows: size count type redop root time algbw busbw #wrong (out of place),
# then time algbw busbw #wrong (in place): #wrong are columns 9 and 13.
wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { w += ($9 == "N/A" ? 0 : $9) + ($13 == "N/A" ? 0 : $13); n++ }
             END { printf "%d %d", w, n }' "$log")
read -r nwrong nrows <<<"$wrong"
echo "#wrong: $nwrong over $nrows sizes"
if [ "$rc" -ne 0 ]; then
  echo "gdr-check: FAIL: all_reduce_perf exited $rc"; tail -20 "$log"; exit 1
elif ! grep -q 'GPU Direct RDMA Enabled' "$log"; then
  echo "gdr-check: FAIL: NCCL did not enable GPU Direct RDMA (see the lines above)"; exit 1
elif [ "$gdrdma" -eq 0 ]; then
  echo "gdr-check: FAIL: no channel runs via NET/HA/.../GDRDMA"; exit 1
elif [ "$nrows" -eq 0 ] || [ "$nwrong" -ne 0 ]; then
  echo "gdr-check: FAIL: #wrong $nwrong over $nrows sizes"; exit 1
fi
echo "gdr-check: PASS: GPU Direct RDMA Enabled, $gdrdma GDRDMA channel line(s), #wrong 0 over $nrows sizes"
