#!/bin/bash
# Guest side of bench-verbs.sh: on rail A, per message size, `ha-harness bench` through the
# plugin, then perftest's ib_write_lat and ib_write_bw between the same two rxe ports, with
# the same iteration counts and writes in flight. Sizes are interleaved (plugin, perftest,
# next size) so both tools see the same machine load.
#
#   bench.sh HARNESS PLUGIN_SO MIN MAX FACTOR LAT_ITERS LAT_BYTES BW_BYTES BW_MAX_MSGS WINDOW ROUNDS [PEER_SO]
#
# PEER_SO: another ext-net plugin (a hand-built nccl-rdma-sharp-plugins libnccl-net.so, say)
# driven by the same ha-harness command on the same two ports right after ours, per size.
#
# The whole sweep runs ROUNDS times (the host keeps the best of each): a burst of load on the
# shared host then spoils one round of some sizes, not the result.
#
# Both sides of every run are pinned, the sender to CPU 0 and the receiver to CPU 1: two
# busy-polling processes that the scheduler puts on one vCPU take turns per tick (4 ms), for
# perftest as much as for the plugin. The plugin's receiver is ha-harness's child process,
# re-pinned (all its threads) as soon as it exists; the plugin's own threads start later,
# from the pinned threads, and inherit the CPU.
#
# BENCH_STANDBY=1: also the plugin with its standby on (the normal mode), right after the
# single-path run, per size: both sides list all four ports and take rail B's port on their
# own side as the standby (HA_NCCL_STANDBY_MAP), the traffic stays on rail A.
#
# Prints the tools' own output and, for the host to tabulate, lines
#   RESULT plugin SIZE LAT_US BW_GBPS        (1 GB = 1e9 bytes)
#   RESULT standby SIZE LAT_US BW_GBPS       (with BENCH_STANDBY=1)
#   RESULT peer SIZE LAT_US BW_GBPS          (with PEER_SO)
#   RESULT ib_write_lat SIZE T_TYPICAL_US
#   RESULT ib_write_bw SIZE BW_AVG_MIBPS     (perftest's MB = 2^20 bytes)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
harness=$1 so=$2 min=$3 max=$4 factor=$5 lat_iters=$6 lat_bytes=$7 bw_bytes=$8
bw_max=$9 window=${10} rounds=${11} peer_so=${12:-}
read -r dev0 gid0 ip0 _ <<< "$SOFTROCE_A0"
read -r dev1 gid1 ip1 _ <<< "$SOFTROCE_A1"

# The plugin: single path on rail A; side A (the measuring side, the sender of the bandwidth
# test) on device 0 of the two the filter offers, side B on device 1, in a child process.
export HA_NCCL_FABRIC=verbs NCCL_IB_HCA="=$dev0:1,$dev1:1" NCCL_SOCKET_IFNAME=lo
export HA_NCCL_ENABLE_BACKUP=0 HA_NCCL_QP_RETRY_CNT=6 HA_NCCL_QP_TIMEOUT=16
# The peer plugin reads NCCL's own knobs: the same devices (NCCL_IB_HCA above), the same QP
# timeout and retry count.
export NCCL_IB_TIMEOUT=16 NCCL_IB_RETRY_CNT=6
echo "== NCCL_IB_HCA=$NCCL_IB_HCA; other knobs: $(compgen -e | grep '^HA_NCCL_' | grep -v 'FABRIC\|BACKUP\|RETRY_CNT\|QP_TIMEOUT' | tr '\n' ' ')"
echo "== clocksource $(< /sys/devices/system/clocksource/clocksource0/current_clocksource), $(nproc) vCPUs"

# The standby column's devices: the plugin numbers the ports the filter passes in the verbs
# device list's order (ibv_devices prints that order).
standby_env=()
if [ "${BENCH_STANDBY:-0}" = 1 ]; then
  read -r devb0 _ <<< "$SOFTROCE_B0"
  read -r devb1 _ <<< "$SOFTROCE_B1"
  mapfile -t order < <(ibv_devices | awk 'NR > 2 && ($1 == "'"$dev0"'" || $1 == "'"$dev1"'" || $1 == "'"$devb0"'" || $1 == "'"$devb1"'") { print $1 }')
  idx() { local i; for i in "${!order[@]}"; do [ "${order[$i]}" = "$1" ] && echo "$i"; done; return 0; }
  ia0=$(idx "$dev0") ia1=$(idx "$dev1") ib0=$(idx "$devb0") ib1=$(idx "$devb1")
  [ -n "$ia0" ] && [ -n "$ia1" ] && [ -n "$ib0" ] && [ -n "$ib1" ] ||
    { echo "bench: BENCH_STANDBY: ports ${order[*]} lack one of $dev0 $dev1 $devb0 $devb1"; exit 1; }
  standby_env=(NCCL_IB_HCA="=$dev0:1,$dev1:1,$devb0:1,$devb1:1" HA_NCCL_ENABLE_BACKUP=1
    HA_NCCL_STANDBY_MAP="$ia0:$ib0,$ia1:$ib1")
  echo "== standby column: ports ${order[*]}, --dev $ia0 --peer-dev $ia1, ${standby_env[*]}"
fi

wrap=() # a command the plugin runs go through (perf stat, for BENCH_COUNTS)

# plugin SIZE [LABEL SO [DEV PEER_DEV [VAR=VALUE...]]]: one ha-harness run for SIZE through SO
# (ours by default) on devices DEV and PEER_DEV (0 and 1) with the extra environment; RESULT
# line (LABEL, default plugin) from its JSON (full precision).
plugin() {
  local size=$1 label=${2:-plugin} lib=${3:-$so} d0=${4:-0} d1=${5:-1} out=/tmp/harness.out json=/tmp/harness.json pid child n line rc
  local extra=("${@:6}")
  rm -f "$json"
  "${wrap[@]}" env "${extra[@]}" taskset -c 0 "$harness" bench --plugin "$lib" --mode procs --dev "$d0" --peer-dev "$d1" \
    --min "$size" --max "$size" --iters "$lat_iters" --lat-bytes "$lat_bytes" \
    --bw-bytes "$bw_bytes" --bw-max-msgs "$bw_max" --window "$window" --timeout 120 \
    --json "$json" > "$out" 2>&1 &
  pid=$!
  # Under a wrapper (perf stat) the harness is the wrapper's child.
  local top=$pid
  if [ ${#wrap[@]} -gt 0 ]; then
    top= n=0
    while [ -z "$top" ] && ((n++ < 500)); do
      read -r top 2>/dev/null < "/proc/$pid/task/$pid/children" || fsleep 0.01
    done
  fi
  child= n=0
  while [ -n "$top" ] && [ -z "$child" ] && ((n++ < 500)); do
    read -r child 2>/dev/null < "/proc/$top/task/$top/children" || fsleep 0.01
  done
  [ -n "$child" ] && taskset -a -p -c 1 "$child" > /dev/null
  wait "$pid"
  rc=$?
  cat "$out"
  [ "$rc" -eq 0 ] || { echo "bench: ha-harness ($label) failed for $size B (rc=$rc)"; return 1; }
  local re='"size": ([0-9]+), "lat_us": ([-0-9.e]+), "bw_GBps": ([-0-9.e]+)'
  while read -r line; do
    [[ $line =~ $re ]] && echo "RESULT $label ${BASH_REMATCH[1]} ${BASH_REMATCH[2]} ${BASH_REMATCH[3]}"
  done < "$json"
  return 0
}

# wait_listen PORT: until a TCP socket listens on PORT (fork-free, /proc/net/tcp).
wait_listen() {
  local hex n line
  printf -v hex ':%04X ' "$1"
  for ((n = 0; n < 300; n++)); do
    while read -r line; do
      [[ $line == *"$hex"00000000:0000\ 0A* ]] && return 0
    done < /proc/net/tcp
    fsleep 0.05
  done
  return 1
}

port=18600
# perf TOOL SIZE ITERS FIELD EXTRA...: server (receiver) on $dev1 / CPU 1, client (sender)
# on $dev0 / CPU 0; prints the client's output and RESULT TOOL SIZE <field FIELD of its row>.
perf() {
  local tool=$1 size=$2 iters=$3 field=$4 sout=/tmp/perf.server cout=/tmp/perf.client spid rc f
  shift 4
  port=$((port + 1))
  taskset -c 1 "$tool" -d "$dev1" -x "$gid1" -s "$size" -n "$iters" -p "$port" -F "$@" \
    > "$sout" 2>&1 &
  spid=$!
  wait_listen "$port" || { echo "bench: $tool server did not listen"; cat "$sout"; return 1; }
  taskset -c 0 "$tool" -d "$dev0" -x "$gid0" -s "$size" -n "$iters" -p "$port" -F "$@" \
    "$ip1" > "$cout" 2>&1
  rc=$?
  wait "$spid"
  cat "$cout"
  [ "$rc" -eq 0 ] || { echo "bench: $tool -s $size failed (rc=$rc)"; cat "$sout"; return 1; }
  while read -r -a f; do
    [ "${#f[@]}" -gt "$field" ] && [ "${f[0]}" = "$size" ] && [[ ${f[1]} =~ ^[0-9]+$ ]] &&
      echo "RESULT $tool $size ${f[$field]}"
  done < "$cout"
  return 0
}

# Iteration counts as ha-harness computes them (crates/ha-harness/src/bench.rs), except that perftest
# needs at least 5 where ha-harness takes at least 3.
status=0
for ((round = 1; round <= rounds; round++)); do
  for ((size = min; size <= max; size *= factor)); do
    echo "== round $round, $size B, load $(< /proc/loadavg)"
    plugin "$size" || status=1
    if [ ${#standby_env[@]} -gt 0 ]; then
      plugin "$size" standby "$so" "$ia0" "$ia1" "${standby_env[@]}" || status=1
    fi
    if [ -n "$peer_so" ]; then plugin "$size" peer "$peer_so" || status=1; fi
    n=$((lat_bytes / size)); ((n > lat_iters)) && n=$lat_iters; ((n < 5)) && n=5
    perf ib_write_lat "$size" "$n" 4 || status=1
    n=$((bw_bytes / size)); ((n < 8)) && n=8; ((n > bw_max)) && n=$bw_max
    perf ib_write_bw "$size" "$n" 3 -t "$window" || status=1
  done
done

# BENCH_COUNTS=1: what a round trip costs both processes of each plugin run (ours single path,
# ours with the standby, the peer), counted rather than timed: system calls
# other than `sched_yield` (raw_syscalls:sys_enter less syscalls:sys_enter_sched_yield: a
# waiting poller's yields count how long it waited, not work), yields and context switches
# (CPU time is not counted: the pollers spin, so it measures waiting too), from `perf stat` (the program: `perf` is the perftest runner above) over two runs
# of C and 4C round trips (C = BENCH_COUNT_ITERS, 300): the difference over 3C, so start-up,
# tear-down and the bandwidth test's few messages cancel. The guest has no PMU: no
# instruction counts.
#   COUNT LABEL SIZE SYSCALLS_PER_RT YIELDS_PER_RT CSW_PER_RT
# count LABEL SIZE ITERS ARGS...: "syscalls yields csw" of one perf-stat'd plugin run
count() {
  local label=$1 size=$2 n=$3 st=/tmp/count.stat v e sc=0 y=0 cs=0
  shift 3
  wrap=(command perf stat -x, -o "$st" -e raw_syscalls:sys_enter,syscalls:sys_enter_sched_yield,context-switches --)
  lat_iters=$n lat_bytes=$((1 << 40)) bw_bytes=64 plugin "$size" "$label" "$@" > /tmp/count.out ||
    { wrap=(); echo "bench: counting $label at $size B failed: $(tail -n 3 /tmp/count.out)" >&2; return 1; }
  wrap=()
  while IFS=, read -r v _ e _; do
    case $e in
      raw_syscalls:sys_enter) sc=$v ;; syscalls:sys_enter_sched_yield) y=$v ;;
      context-switches) cs=$v ;;
    esac
  done < "$st"
  echo "$((sc - y)) $y $cs"
}
if [ "${BENCH_COUNTS:-0}" = 1 ]; then
  [ -d /sys/kernel/tracing/events/raw_syscalls ] || mount -t tracefs nodev /sys/kernel/tracing
  c=${BENCH_COUNT_ITERS:-300}
  for ((size = min; size <= max; size *= factor)); do
    runs=("plugin|$so|0|1")
    [ ${#standby_env[@]} -gt 0 ] && runs+=("standby|$so|$ia0|$ia1")
    [ -n "$peer_so" ] && runs+=("peer|$peer_so|0|1")
    for r in "${runs[@]}"; do
      IFS='|' read -r label lib d0 d1 <<< "$r"
      extra=(); [ "$label" = standby ] && extra=("${standby_env[@]}")
      a=$(count "$label" "$size" "$c" "$lib" "$d0" "$d1" "${extra[@]}") &&
        b=$(count "$label" "$size" $((4 * c)) "$lib" "$d0" "$d1" "${extra[@]}") || { status=1; continue; }
      read -r sa ya ca <<< "$a"
      read -r sb yb cb <<< "$b"
      echo "COUNT $label $size $(awk -v s="$((sb - sa))" -v y="$((yb - ya))" -v c="$((cb - ca))" \
        -v n="$((3 * c))" 'BEGIN { printf "%.2f %.1f %.2f", s / n, y / n, c / n }')"
    done
  done
fi
exit $status
