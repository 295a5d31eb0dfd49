#!/usr/bin/env bash
# all_reduce_perf through the HA plugin as two ranks in two network namespaces
# (scripts/nccl/mpi-netns.sh), with rails cut from outside the processes on a schedule of
# nccl-tests cycles (-N: one result row per cycle, -I 1: per-iteration times, so a stall shows
# in that cycle's i_max).
#
#   scripts/nccl/allreduce-failover.sh single NCCL_TESTS_MPI_BUILD_DIR OUT_DIR
#       cut rail0 (near) at cycle CUT_AT, restore it at RESTORE_AT, wait for the re-arm, cut
#       rail1 (far) at CUT2_AT; expected: exit 0, #wrong 0 in every cycle.
#   scripts/nccl/allreduce-failover.sh double NCCL_TESTS_MPI_BUILD_DIR OUT_DIR
#       cut both rails at cycle CUT_AT; expected: nccl-tests reports an NCCL error and exits
#       (non-zero) within DOUBLE_LIMIT seconds of the cut, no hang.
#
# Knobs: CYCLES (120), CUT_AT (15), RESTORE_AT (40), CUT2_AT (80), PERF_ARGS
# ("-b 64M -e 64M -w 2 -n 5 -c 1 -I 1"), DOUBLE_LIMIT (60), STATS_MS (500: the plugin's
# periodic stats lines, HA_NCCL_STATS_INTERVAL_MS). Prints the cut log, the cycles around each
# cut, the WARN failover lines, the per-connection stats (`ha-harness stats`) and the verdict,
# and draws the run's timeline (`ha-harness timeline`: throughput per path, cuts, detection,
# switch, stall, re-arm) as OUT_DIR/failover-MODE.timeline.png and .svg, from the stats file,
# the cut/restore events (OUT_DIR/failover-MODE.events.jsonl, written by this script) and the
# NCCL logs.
#
# On a real cluster (verbs fabric, two hosts, two NICs each) set the launcher and the link
# commands; everything else is the same:
#   LAUNCH="mpirun -np 2 --host n1,n2 -x LD_LIBRARY_PATH -x NCCL_NET_PLUGIN -x NCCL_NET -x NCCL_DEBUG \
#           -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE -x HA_NCCL_STATS_FILE -x HA_NCCL_STATS_INTERVAL_MS" \
#   CUT_CMD="ssh n1 ip link set ens1f0np0 down" RESTORE_CMD="ssh n1 ip link set ens1f0np0 up" \
#   CUT2_CMD="ssh n2 ip link set ens2f0np0 down" HA_NCCL_FABRIC=verbs \
#     scripts/nccl/allreduce-failover.sh single ~/nccl-tests/build OUT
# (DOUBLE_CMD for the double cut; OUT must be on a shared filesystem for the per-process NCCL
# logs and stats, or collect them from each host; CUT_LABEL, RESTORE_LABEL, CUT2_LABEL name the
# cuts in the picture.) Default: the two namespaces of
# scripts/netns/rails.sh, launched by scripts/nccl/mpi-netns.sh, on the `sock` fabric.
set -uo pipefail
# These GPU-machine scripts name the namespaces ha-a/ha-b (one run per machine at a time):
# rails.sh needs the prefix said explicitly.
export HA_RAILS_PREFIX=${HA_RAILS_PREFIX:-ha-}
here=$(cd "$(dirname "$0")/../.." && pwd)
mode=${1:?usage: allreduce-failover.sh single|double BUILD_DIR OUT_DIR}
bin=${2:?build dir}
out=${3:?out dir}
mkdir -p "$out"
rails="$here/scripts/netns/rails.sh"
CYCLES=${CYCLES:-120}; CUT_AT=${CUT_AT:-15}; RESTORE_AT=${RESTORE_AT:-40}; CUT2_AT=${CUT2_AT:-80}
DOUBLE_LIMIT=${DOUBLE_LIMIT:-60}
args=${PERF_ARGS:--b 64M -e 64M -w 2 -n 5 -c 1 -I 1}
log="$out/failover-$mode.log"
cuts="$out/failover-$mode-cuts.log"
events="$out/failover-$mode.events.jsonl"
: >"$cuts"; : >"$events"
harness="$here/dist/ha-harness"
# Runs a link command and records it for the timeline: when it was issued and when it returned.
act() { # act EVENT LABEL COMMAND
  local u d
  u=$(date +%s%3N); eval "$3" >/dev/null; d=$(date +%s%3N)
  printf '{"event":"%s","unix_ms":%s,"done_unix_ms":%s,"label":"%s"}\n' "$1" "$u" "$d" "$2" >>"$events"
}
netns=0
if [ -z "${LAUNCH:-}" ]; then
  netns=1
  "$rails" up >/dev/null
  LAUNCH="$here/scripts/nccl/mpi-netns.sh"
  export HA_NCCL_FABRIC=sock NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
fi
CUT_CMD=${CUT_CMD:-$rails cut 0 near}
RESTORE_CMD=${RESTORE_CMD:-$rails restore 0}
CUT2_CMD=${CUT2_CMD:-$rails cut 1 far}
DOUBLE_CMD=${DOUBLE_CMD:-$rails cut 0 near; $rails cut 1 near}
CUT_LABEL=${CUT_LABEL:-cut rail 0 (near)}; RESTORE_LABEL=${RESTORE_LABEL:-restore rail 0}
CUT2_LABEL=${CUT2_LABEL:-cut rail 1 (far)}
export LD_LIBRARY_PATH="$here/dist${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NET_PLUGIN=ha NCCL_NET=HA \
  NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
  HA_NCCL_STATS_FILE="$out/failover-$mode.stats.json" HA_NCCL_STATS_INTERVAL_MS=${STATS_MS:-500} \
  NCCL_DEBUG_FILE="$out/failover-$mode.nccl.%h.%p.log"
# NCCL's log goes to per-process files: interleaved with stdout it would split result rows.
rm -f "$HA_NCCL_STATS_FILE" "$out"/failover-$mode.nccl.*.log
nccl_logs() { cat "$out"/failover-$mode.nccl.*.log 2>/dev/null; }
t0=$SECONDS
$LAUNCH "$bin/all_reduce_perf" $args -g 1 -N "$CYCLES" >"$log" 2>&1 &
pid=$!

cycles() { awk '$1 ~ /^[0-9]+$/ && NF >= 13' "$log" 2>/dev/null | wc -l; }
wait_cycle() {  # N: until N result rows were printed (or the run ended)
  while [ "$(cycles)" -lt "$1" ]; do kill -0 $pid 2>/dev/null || return 1; sleep 0.1; done
}
note() { echo "[$((SECONDS - t0)) s, cycle $(cycles)] $*" | tee -a "$cuts"; }

if [ "$mode" = single ]; then
  wait_cycle "$CUT_AT" && { act cut "$CUT_LABEL" "$CUT_CMD"; note "cut: $CUT_CMD"; }
  wait_cycle "$RESTORE_AT" && { act restore "$RESTORE_LABEL" "$RESTORE_CMD"; note "restore: $RESTORE_CMD"; }
  # Rail 1 is cut only once rail 0 is back as the standby (the plugin logs the verified re-arm).
  until nccl_logs | grep -q "re-armed as the standby"; do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  wait_cycle "$CUT2_AT" && { act cut "$CUT2_LABEL" "$CUT2_CMD"; note "cut: $CUT2_CMD"; }
  wait $pid; rc=$?
  note "exit $rc"
  [ $netns = 1 ] && { "$rails" restore 1 >/dev/null 2>&1 || true; }
else
  wait_cycle "$CUT_AT" && { act cut "${CUT_LABEL/rail 0*/both rails}" "$DOUBLE_CMD"; note "double cut: $DOUBLE_CMD"; }
  tc=$SECONDS
  while kill -0 $pid 2>/dev/null && [ $((SECONDS - tc)) -lt "$DOUBLE_LIMIT" ]; do sleep 0.2; done
  if kill -0 $pid 2>/dev/null; then
    note "HANG: still running $DOUBLE_LIMIT s after the double cut; killing"
    if [ $netns = 1 ]; then "$rails" down >/dev/null 2>&1; else kill -KILL $pid 2>/dev/null; fi
    wait $pid; rc=124
  else
    wait $pid; rc=$?
    note "exit $rc, $((SECONDS - tc)) s after the double cut"
  fi
  [ $netns = 1 ] && { "$rails" restore 0 >/dev/null 2>&1; "$rails" restore 1 >/dev/null 2>&1; } || true
fi

echo "== result rows around the cuts (size count type redop root time algbw busbw #wrong i_min i_max i_p99 i_cv% | in-place ...)"
awk '$1 ~ /^[0-9]+$/ && NF >= 13 { n++; printf "cycle %3d: %s\n", n, $0 }' "$log" |
  awk -v a="$CUT_AT" -v b="$RESTORE_AT" -v c="$CUT2_AT" '{ n=$2+0; if ((n>=a-1&&n<=a+2)||(n>=b-1&&n<=b+2)||(n>=c-1&&n<=c+2)) print }'
rows=$(cycles)
wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { w += $9 + $(NF >= 21 ? 17 : 13) } END { print w+0 }' "$log")
worst=$(awk '$1 ~ /^[0-9]+$/ && NF >= 21 { if ($11 > m) m = $11 } END { print m+0 }' "$log")
echo "== WARN lines"
{ nccl_logs; cat "$log"; } | grep -E "NCCL WARN|re-armed|error" | grep -v ' stats {' |
  sed -E 's/^.*NCCL WARN /WARN /; s/^.*NCCL INFO /INFO /; s/\[dev [0-9]+ qp [0-9]+ \| dev [0-9]+ qp [0-9]+\]/[...]/; s/took [0-9]+ us/took N us/; s/replayed [0-9]+/replayed N/' |
  sort | uniq -c | sort -rn | head -14
echo "== failover times (us) from the WARN lines"
nccl_logs | sed -n 's/.*failover .*took \([0-9]*\) us.*/\1/p' | sort -n | awk '{ a[NR] = $1 } END { if (NR) printf "%d failovers: min %d, median %d, max %d us\n", NR, a[1], a[int((NR+1)/2)], a[NR] }'
echo "== stats (ha-harness stats)"
"$harness" stats --all "$HA_NCCL_STATS_FILE" 2>&1 | head -24
echo "== timeline"
nlogs=(); for f in "$out"/failover-$mode.nccl.*.log; do [ -f "$f" ] && nlogs+=(--nccl-log "$f"); done
"$harness" timeline --stats "$HA_NCCL_STATS_FILE" --events "$events" "${nlogs[@]}" \
  --title "all_reduce_perf, 2 ranks, $mode cut ($(hostname))" \
  -o "$out/failover-$mode.timeline.svg" --png "$out/failover-$mode.timeline.png" 2>&1 | sed 's/^/  /' ||
  echo "  (timeline not drawn)"
echo "== $mode: exit $rc, $rows cycles, #wrong $wrong, worst i_max ${worst} us"
if [ "$mode" = single ]; then [ "$rc" = 0 ] && [ "$wrong" = 0 ] && [ "$rows" -ge "$CYCLES" ]; else [ "$rc" != 0 ] && [ "$rc" != 124 ]; fi
