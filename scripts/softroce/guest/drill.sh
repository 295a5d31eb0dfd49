#!/bin/bash
# Failover drills on real kernel verbs (run inside the Soft-RoCE guest by drill-verbs.sh): for
# each MODE ("down far", "down near", "blackhole far"), a verified stream through the plugin
# between side A (rxe0a, rxe1a) and side B (rxe0b, rxe1b), primary on rail A, standby on rail B;
# rail A is broken mid-stream and repaired later. Prints each stream's verdict and the failover
# lines, then `N passed, M failed`.
set -u
drill() {
MODE=$1
cd "$(dirname "$0")/../../.."
export HA_NCCL_FABRIC=verbs HA_NCCL_QP_TIMEOUT=14 HA_NCCL_QP_RETRY_CNT=6 HA_NCCL_RTO_MS=3000 \
       NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO HA_NCCL_REARM_HOLD_MS=1000 HA_NCCL_HEARTBEAT_MS=200
A0=${SOFTROCE_A0%% *}; B0=${SOFTROCE_B0%% *}; A1=${SOFTROCE_A1%% *}; B1=${SOFTROCE_B1%% *}
log=/tmp/drill.log
NCCL_IB_HCA="=$A0,$B0" dist/ha-harness stream --plugin "$PWD/dist/libnccl-net-ha.so" --mode procs \
  --child-env "NCCL_IB_HCA==$A1,$B1" --duration 40 --max-size 64K > $log 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q "^stream: start" $log 2>/dev/null && break; sleep 0.1; done
sleep 8
echo "drill: break rail A ($MODE) at $(date +%s.%N)"
$SOFTROCE_LINK A $MODE
sleep 12
echo "drill: repair rail A at $(date +%s.%N)"
$SOFTROCE_LINK A up
wait $pid; rc=$?
grep -E "NET/HA : failover|re-armed|connection lost|^messages|FAIL|error" $log | sed 's/^HA NET //' | head -20
grep -q "lost 0, duplicated 0, corrupted 0, errors 0" $log && grep -q "NET/HA : failover" $log || rc=1
echo "drill ($MODE): stream exit $rc"
return $rc
}
pass=0; fail=0
for m in "$@"; do
  if drill "$m"; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
echo "verbs drills (Soft-RoCE): $pass passed, $fail failed"
[ "$fail" = 0 ]
