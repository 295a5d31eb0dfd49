#!/usr/bin/env bash
# nccl-tests correctness matrix through the HA plugin: five collectives x three protocols, every
# run with -c 1, one summary row per run (exit status, sizes checked, #wrong summed over sizes and
# both in/out-of-place columns, average busbw).
#
#   scripts/nccl/matrix.sh 2proc NCCL_TESTS_MPI_BUILD_DIR OUT_DIR   # two ranks, two namespaces
#   scripts/nccl/matrix.sh g2    NCCL_TESTS_BUILD_DIR     OUT_DIR   # one process, -g 2
#
# 2proc runs through scripts/nccl/mpi-netns.sh (rails in namespaces, `sock` fabric, a standby on
# every connection); g2 uses two loopback rails (127.0.0.1,127.0.0.2). Size range and iterations:
# $MATRIX_ARGS (default "-b 8 -e 1G -f 8 -w 1 -n 3"); collectives: $MATRIX_COLLS; protocols:
# $MATRIX_PROTOS. Needs dist/libnccl-net-ha.so. Exit status: 0 when every run exited 0 with
# #wrong 0.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
mode=${1:?usage: matrix.sh 2proc|g2 BUILD_DIR OUT_DIR}
bin=${2:?build dir}
out=${3:?out dir}
mkdir -p "$out"
args=${MATRIX_ARGS:--b 8 -e 1G -f 8 -w 1 -n 3}
colls=${MATRIX_COLLS:-all_reduce all_gather reduce_scatter sendrecv alltoall}
protos=${MATRIX_PROTOS:-LL LL128 Simple}
per_run_timeout=${MATRIX_TIMEOUT:-300}
deadline=${MATRIX_DEADLINE:-0}   # seconds for the whole matrix (0: none); later runs are skipped
export LD_LIBRARY_PATH="$here/dist${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NET_PLUGIN=ha NCCL_NET=HA \
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
  HA_NCCL_FABRIC=sock
case "$mode" in
  2proc) launch=("$here/scripts/nccl/mpi-netns.sh"); gpus="-g 1" ;;
  g2) launch=(); gpus="-g 2"; export HA_NCCL_SOCK_RAILS=127.0.0.1,127.0.0.2 NCCL_SOCKET_IFNAME=lo ;;
  *) echo "matrix: mode is 2proc or g2" >&2; exit 2 ;;
esac
echo "| collective | protocol | exit | sizes checked | #wrong (sum) | avg busbw GB/s | seconds |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
bad=0
for c in $colls; do
  for p in $protos; do
    log="$out/$mode-$c-$p.log"
    if [ "$deadline" -gt 0 ] && [ "$SECONDS" -ge "$deadline" ]; then
      echo "| $c | $p | skipped (MATRIX_DEADLINE) | | | | |"; bad=1; continue
    fi
    t0=$SECONDS
    NCCL_PROTO=$p HA_NCCL_STATS_FILE="$out/$mode-$c-$p.stats.json" \
      timeout "$per_run_timeout" "${launch[@]}" "$bin/${c}_perf" $args $gpus -c 1 >"$log" 2>&1
    rc=$?
    # Result rows: size count type redop root time algbw busbw #wrong time algbw busbw #wrong
    read -r n wrong < <(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { n++; w += $9 + $13 } END { print n+0, w+0 }' "$log")
    bw=$(sed -n 's/.*Avg bus bandwidth *: *\([0-9.e+-]*\).*/\1/p' "$log" | tail -1)
    [ "$rc" = 0 ] && [ "$wrong" = 0 ] && [ "$n" -gt 0 ] || bad=1
    echo "| $c | $p | $rc | $n | $wrong | ${bw:-?} | $((SECONDS - t0)) |"
  done
done
exit $bad
