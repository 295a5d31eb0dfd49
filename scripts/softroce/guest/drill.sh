#!/bin/bash
# Failover drills on real kernel verbs (run inside the Soft-RoCE guest by drill-verbs.sh): for
# each MODE ("down far", "down near", "blackhole far"), a verified stream through the plugin
# between side A (rxe0a, rxe1a) and side B (rxe0b, rxe1b), primary on rail A, standby on rail B;
# rail A is broken mid-stream and repaired later; once repaired, re-armed and healthy for
# HA_NCCL_RETURN_HOLD_MS (3 s here), traffic must return home to rail A with a planned switch.
# Prints each stream's verdict, the failover and return lines, then `N passed, M failed`. With DRILL_OUT set (a folder on the job share), each drill
# leaves there, in <n>-<mode>/, what its timeline is drawn from: the stats file (periodic lines
# every 200 ms and events), the stream's JSON, the break/repair events and the NCCL log.
set -u
n=0
drill() {
MODE=$1
n=$((n + 1))
cd "$(dirname "$0")/../../.."
export HA_NCCL_FABRIC=verbs HA_NCCL_QP_TIMEOUT=14 HA_NCCL_QP_RETRY_CNT=6 HA_NCCL_RTO_MS=3000 \
       NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO HA_NCCL_REARM_HOLD_MS=1000 HA_NCCL_HEARTBEAT_MS=200 \
       HA_NCCL_RETURN_HOLD_MS=3000
A0=${SOFTROCE_A0%% *}; B0=${SOFTROCE_B0%% *}; A1=${SOFTROCE_A1%% *}; B1=${SOFTROCE_B1%% *}
log=/tmp/drill.log
# Written on the guest's tmpfs (two processes append to the stats file: not over 9p), copied
# to the share at the end.
o=/tmp/drill$n
rm -rf "$o"; mkdir -p "$o"
act() { # act EVENT LABEL COMMAND...: run a link command, record when it was issued and returned
  local e=$1 l=$2 u d; shift 2
  u=$(date +%s%3N); "$@"; d=$(date +%s%3N)
  printf '{"event":"%s","unix_ms":%s,"done_unix_ms":%s,"label":"%s"}\n' "$e" "$u" "$d" "$l" >> "$o/events.jsonl"
}
NCCL_IB_HCA="=$A0,$B0" HA_NCCL_STATS_FILE="$o/stats.jsonl" HA_NCCL_STATS_INTERVAL_MS=200 \
  dist/ha-harness stream --plugin "$PWD/dist/libnccl-net-ha.so" --mode procs \
  --child-env "NCCL_IB_HCA==$A1,$B1" --duration 40 --max-size 64K --json "$o/stream.json" > $log 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q "^stream: start" $log 2>/dev/null && break; sleep 0.1; done
sleep 8
echo "drill: break rail A ($MODE) at $(date +%s.%N)"
act cut "$MODE rail A" $SOFTROCE_LINK A $MODE
sleep 12
echo "drill: repair rail A at $(date +%s.%N)"
act restore "repair rail A" $SOFTROCE_LINK A up
wait $pid; rc=$?
cp $log "$o/nccl.log"
if [ -n "${DRILL_OUT:-}" ]; then mkdir -p "$DRILL_OUT/$n-${MODE// /-}" && cp "$o"/* "$DRILL_OUT/$n-${MODE// /-}/"; fi
grep -E "NET/HA : failover|NET/HA : return|re-armed|connection lost|^messages|FAIL|error" $log | sed 's/^HA NET //' | head -20
grep -q "lost 0, duplicated 0, corrupted 0, errors 0" $log && grep -q "NET/HA : failover" $log || rc=1
# Back home after the repair: a planned switch onto path 0 (rail A), no replay.
grep -q "NET/HA : return .*-> path 0 .*planned (back home, healthy again), replayed 0" $log ||
  { echo "drill ($MODE): no return home to rail A after the repair"; rc=1; }
echo "drill ($MODE): stream exit $rc"
return $rc
}
pass=0; fail=0
for m in "$@"; do
  if drill "$m"; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
echo "verbs drills (Soft-RoCE): $pass passed, $fail failed"
[ "$fail" = 0 ]
