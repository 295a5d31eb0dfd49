#!/usr/bin/env bash
# After-the-storm drills of the `sock` fabric: a verified stream (ha-harness stream) between two
# network namespaces (scripts/netns/rails.sh), the plugin's switch events in HA_NCCL_STATS_FILE,
# and one verdict line per scenario:
#   return  cut rail 0 (the rail in use, near end), restore it: traffic fails over to rail 1,
#           rail 0 is re-armed and traffic returns to it with a planned switch after
#           HA_NCCL_RETURN_HOLD_MS; rail 1 carries no data after the return (bytes per path in
#           the events and at close).
#   drain   `ha-harness drain r0a` under traffic, cut rail 0, restore it, `ha-harness undrain
#           r0a`: traffic leaves rail 0 with a planned switch and comes back after the undrain;
#           rail 0 carries no data exactly while drained; no failover, no replay.
#   outage  cut rail 0 for --outage SECS with the re-arm backoff compressed (hold 20 ms, cap
#           100 ms): attempts never stop, one log line per state change (not per attempt), RSS
#           and CPU time of both processes sampled; restore: re-arm and return.
#   skew    both ends of rail 0 down; one end (--first near|far) back --gap SECS before the
#           other: re-arm and return converge.
# Each checks: the stream clean (lost 0, duplicated 0, corrupted 0, reordered 0, no error),
# the switches in the stats, and prints the stall of each planned switch: the harness's
# longest completion gap starting within 100 ms of the switch's start (taken from the plugin's
# event line: wall-clock time and duration). Needs root, iproute2 and a built plugin + harness.
#
# usage: home-drill.sh [options] SCENARIO...     (return, drain, outage, skew; default: all)
#   --gap SECS       skew: seconds between the two ends coming back (default 3)
#   --first END      skew: near (ha-a's end, the sender's) or far back first (default near)
#   --outage SECS    outage: how long rail 0 stays down (default 20)
#   --max-size SIZE  largest message (default 256K)
#   --env K=V        extra environment for both sides (repeatable)
#   --harness PATH   ha-harness (default dist/ha-harness, else target/release/ha-harness)
#   --plugin PATH    plugin (default dist/libnccl-net-ha.so, else target/release/...)
#   --keep DIR       keep logs, stats and events in DIR (default: temporary, kept on failure)
# Environment: HA_RAILS_PREFIX (namespaces <prefix>a/<prefix>b; default home<pid>-).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RAILS="$ROOT/scripts/netns/rails.sh"
PREFIX=${HA_RAILS_PREFIX:-home$$-}
export HA_RAILS_PREFIX=$PREFIX
NS_A="${PREFIX}a" NS_B="${PREFIX}b"
GAP=3 FIRST=near OUTAGE=20 MAX_SIZE=256K KEEP="" HARNESS="" PLUGIN="" ENVS=() SCEN=()

die() { echo "home-drill: $*" >&2; exit 2; }
usage() { sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage 0 ;;
    return|drain|outage|skew) SCEN+=("$1"); shift; continue ;;
  esac
  [ $# -gt 1 ] || die "$1 needs a value (see --help)"
  case "$1" in
    --gap) GAP=$2 ;; --first) FIRST=$2 ;; --outage) OUTAGE=$2 ;; --max-size) MAX_SIZE=$2 ;;
    --env) ENVS+=("$2") ;; --harness) HARNESS=$2 ;; --plugin) PLUGIN=$2 ;; --keep) KEEP=$2 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
[ "${#SCEN[@]}" -gt 0 ] || SCEN=(return drain outage skew)
[[ $GAP =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--gap is seconds"
[[ $OUTAGE =~ ^[0-9]+$ ]] || die "--outage is whole seconds"
[[ $FIRST =~ ^(near|far)$ ]] || die "--first is near or far"
[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces)"
command -v ip >/dev/null 2>&1 || die "iproute2 ('ip') not found"
pick() { local p; for p in "$@"; do [ -e "$p" ] && { echo "$p"; return; }; done; echo "$1"; }
HARNESS=$(realpath -m "${HARNESS:-$(pick "$ROOT/dist/ha-harness" "$ROOT/target/release/ha-harness")}")
PLUGIN=$(realpath -m "${PLUGIN:-$(pick "$ROOT/dist/libnccl-net-ha.so" "$ROOT/target/release/libnccl_net_ha.so")}")
[ -x "$HARNESS" ] || die "no harness at $HARNESS (run scripts/build.sh, or --harness)"
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN (run scripts/build.sh, or --plugin)"

if [ -n "$KEEP" ]; then WORK=$KEEP; mkdir -p "$WORK"; else WORK=$(mktemp -d /tmp/home-drill.XXXXXX); fi
HPID="" FAILED_ANY=0 PASSED=0 FAILED=0 STREAM_EXTRA=()
cleanup() {
  if [ -n "$HPID" ] && kill -0 "$HPID" 2>/dev/null; then kill -KILL "$HPID" 2>/dev/null || true; fi
  bash "$RAILS" down >/dev/null 2>&1 || true
  if [ -z "$KEEP" ] && [ "$FAILED_ANY" = 0 ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bash "$RAILS" up >/dev/null
echo "home-drill: ${SCEN[*]}; harness $HARNESS, plugin $PLUGIN, logs $WORK"

now_ns() { "$HARNESS" now; }
# CLOCK_MONOTONIC minus the wall clock, ns (the plugin's events carry wall-clock ms).
clock_offset() { local w0 m w1; w0=$(date +%s%N); m=$(now_ns); w1=$(date +%s%N)
  echo $(( m - (w0 + w1) / 2 )); }
# mark_switch DIR ROLE KIND LABEL: a harness event at the start of ROLE's first KIND switch
# (its wall-clock time minus its duration, 1 ms early for the clocks' rounding).
mark_switch() {
  local line ms us
  line=$(events "$1/stats.json" "$2" "$3" | head -n1)
  ms=$(sed -nE 's/.*"unix_ms":([0-9]+).*/\1/p' <<<"$line"); us=$(sed -nE 's/.*"took_us":([0-9]+).*/\1/p' <<<"$line")
  [ -n "$ms" ] || return 0
  echo "$(( ms * 1000000 - ${us:-0} * 1000 - 1000000 + OFFSET )) $4" >>"$1/events"
}
alive() { [ -n "$HPID" ] && kill -0 "$HPID" 2>/dev/null; }
mark() { echo "$(now_ns) $2" >>"$1"; }   # mark EVENTS LABEL
link() { # link a|b RAIL up|down
  local ns=$NS_A; [ "$1" = b ] && ns=$NS_B
  ip -n "$ns" link set "r$2$1" "$3"
}
# Switch events of ROLE and KIND in the stats file (one line each).
events() { grep '"event":"switch"' "$1" 2>/dev/null | grep "\"role\":\"$2\"" | grep "\"kind\":\"$3\"" || true; }
count() { events "$@" | grep -c . || true; }
# bytes[PATH] of the Nth (1-based; -1 = last) event line on stdin.
bytes_of() { awk -v n="$1" -v p="$2" '{ l[NR] = $0 } END { i = (n < 0) ? NR : n; s = l[i];
  sub(/.*"bytes":\[/, "", s); split(s, b, /[],]/); print b[p + 1] + 0 }'; }
# Field K of the closing stats lines of ROLE, summed over its connections (the stream's and
# any idle one the harness opened).
closing() { grep '"event":"closed"' "$1" 2>/dev/null | grep "\"role\":\"$2\"" |
  sed -nE "s/.*\"$3\":([0-9]+).*/\1/p" | awk '{ t += $1 } END { print t + 0 }'; }
# bytes[PATH] of ROLE's closing stats lines, summed.
closing_bytes() { grep '"event":"closed"' "$1" 2>/dev/null | grep "\"role\":\"$2\"" |
  awk -v p="$3" '{ s = $0; sub(/.*"bytes":\[/, "", s); split(s, b, /[],]/); t += b[p + 1] } END { print t + 0 }'; }
# Wait up to SECS for a command to succeed.
wait_for() { local until=$((SECONDS + $1)); shift
  until "$@"; do alive || return 1; [ "$SECONDS" -lt "$until" ] || return 1; sleep 0.05; done; }
both() { [ "$(count "$1" send "$2")" -ge "$3" ] && [ "$(count "$1" recv "$2")" -ge "$3" ]; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
cpu_ticks() { awk '{ sub(/.*\) /, ""); split($0, f, " "); print f[12] + f[13] }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# Messages the sender had sent at its last progress line (--progress 1).
sent_so_far() { grep -E '^stream: t=[0-9.]+s sent [0-9]+ messages' "$1/stream.log" | tail -n1 |
  sed -nE 's/.* sent ([0-9]+) messages.*/\1/p' | awk '{ print $1 + 0 } END { if (NR == 0) print 0 }'; }
child_pid() { ip netns pids "$NS_B" 2>/dev/null | head -n1; }

# start_stream DIR DURATION [K=V...]: the stream in the background (HPID), waits for traffic.
start_stream() {
  local dir=$1 dur=$2; shift 2
  mkdir -p "$dir"; : >"$dir/events"; : >"$dir/stats.json"; : >"$dir/drain"
  bash "$RAILS" restore 0 >/dev/null; bash "$RAILS" restore 1 >/dev/null
  ip netns exec "$NS_A" env HA_NCCL_FABRIC=sock HA_NCCL_SOCK_RAILS=r0a,r1a NCCL_SOCKET_IFNAME=oa \
    NCCL_DEBUG=INFO HA_NCCL_STATS_FILE="$dir/stats.json" HA_NCCL_DRAIN_FILE="$dir/drain" \
    HA_NCCL_SOCK_RETRY_MS=300 HA_NCCL_HEARTBEAT_MS=200 HA_NCCL_KEEPALIVE_MS=200 \
    HA_NCCL_REARM_HOLD_MS=200 HA_NCCL_REARM_BACKOFF_MAX_MS=1000 HA_NCCL_RETURN_HOLD_MS=1000 \
    "$@" "${ENVS[@]}" "$HARNESS" stream --plugin "$PLUGIN" --mode procs \
    --child-prefix "ip netns exec $NS_B" \
    --child-env HA_NCCL_SOCK_RAILS=r0b,r1b --child-env NCCL_SOCKET_IFNAME=ob \
    --duration "$dur" --max-size "$MAX_SIZE" --window 8 --timeout 15 --seed 18 \
    --events "$dir/events" --json "$dir/stream.json" "${STREAM_EXTRA[@]}" >"$dir/stream.log" 2>&1 &
  HPID=$!
  OFFSET=$(clock_offset)
  wait_for 20 grep -q '^stream: traffic started' "$dir/stream.log"
}

# end_stream DIR: waits for the stream's end; sets RESULT (the harness's result line) and RC.
end_stream() {
  local dir=$1 t0=$SECONDS
  while alive && [ $((SECONDS - t0)) -lt 120 ]; do sleep 0.1; done
  if alive; then kill -KILL "$HPID" 2>/dev/null || true; fi
  RC=0; wait "$HPID" || RC=$?
  HPID=""
  RESULT=$(grep -E '^messages [0-9]+, bytes' "$dir/stream.log" | tail -n1 || true)
}

# The stall (ms) the harness measured after event LABEL.
stall_of() { grep '^event ' "$1/stream.log" | grep " label=$2\$" | sed -nE 's/.* stall_ms=([^ ]+).*/\1/p' | head -n1; }

PROBLEMS=()
need() { "$@" || PROBLEMS+=("$WHAT"); }
verdict() { # verdict NAME DIR DETAILS
  local name=$1 dir=$2 details=$3
  [[ "$RESULT" =~ lost\ 0,\ duplicated\ 0,\ corrupted\ 0,\ errors\ 0 ]] || PROBLEMS+=("stream: ${RESULT:-no result} (exit $RC)")
  grep -qE '^stream: sent .*, reordered 0,' "$dir/stream.log" || PROBLEMS+=("reordered messages")
  [ "$RC" = 0 ] || PROBLEMS+=("stream exit $RC")
  if [ "${#PROBLEMS[@]}" -eq 0 ]; then
    echo "$name: passed: $details"; PASSED=$((PASSED + 1))
  else
    echo "$name: FAILED: $(IFS=';'; echo "${PROBLEMS[*]}") ($details; log $dir/stream.log)"
    FAILED=$((FAILED + 1)); FAILED_ANY=1
  fi
  PROBLEMS=()
}

scenario_return() {
  local dir="$WORK/return" s="$WORK/return/stats.json"
  start_stream "$dir" 12 || { PROBLEMS+=("no traffic"); end_stream "$dir"; verdict return "$dir" "-"; return; }
  sleep 1.5
  mark "$dir/events" "cut rail0/near"; link a 0 down
  WHAT="no failover" need wait_for 10 both "$s" failover 1
  sleep 1.5
  mark "$dir/events" "restore rail0"; link a 0 up
  WHAT="no return within 15 s of the restore" need wait_for 15 both "$s" return 1
  mark_switch "$dir" send return "return"
  end_stream "$dir"
  local b1_ret b1_end
  b1_ret=$(events "$s" send return | bytes_of -1 1)
  b1_end=$(closing_bytes "$s" send 1)
  WHAT="rail 1 carried data after the return ($b1_ret at the return, $b1_end at close)" need [ "$b1_ret" = "$b1_end" ]
  local role
  for role in send recv; do
    WHAT="$role: returns $(closing "$s" $role returns), expected 1" need [ "$(closing "$s" $role returns)" = 1 ]
    WHAT="$role: failovers $(closing "$s" $role failovers), expected 1" need [ "$(closing "$s" $role failovers)" = 1 ]
    WHAT="$role: planned switches aborted $(closing "$s" $role plans_aborted)" need [ "$(closing "$s" $role plans_aborted)" = 0 ]
    local r1=$(events "$s" $role return | bytes_of -1 1) e1=$(closing_bytes "$s" $role 1)
    WHAT="$role: rail 1 carried data after the return ($r1 at the return, $e1 at close)" need [ "$r1" = "$e1" ]
  done
  verdict return "$dir" "failover then return; rail 1 bytes at the return $b1_ret = at close $b1_end; longest completion gap at the return $(stall_of "$dir" return) ms"
}

scenario_drain() {
  local dir="$WORK/drain" s="$WORK/drain/stats.json" ds
  start_stream "$dir" 16 || { PROBLEMS+=("no traffic"); end_stream "$dir"; verdict drain "$dir" "-"; return; }
  sleep 1.5
  HA_NCCL_DRAIN_FILE="$dir/drain" "$HARNESS" drain r0a >/dev/null
  WHAT="no drain switch" need wait_for 10 both "$s" drain 1
  mark_switch "$dir" send drain "drain"
  sleep 0.5
  link a 0 down
  WHAT="rail 0 not lost as the standby" need wait_for 10 grep -q 'standby path 0 lost' "$dir/stream.log"
  sleep 1
  link a 0 up
  WHAT="rail 0 not re-armed" need wait_for 15 grep -q 're-armed as the standby' "$dir/stream.log"
  sleep 1.5
  HA_NCCL_DRAIN_FILE="$dir/drain" "$HARNESS" undrain r0a >/dev/null
  WHAT="no return after the undrain" need wait_for 10 both "$s" return 1
  mark_switch "$dir" send return "undrain"
  end_stream "$dir"
  local role b0d b0r
  for role in send recv; do
    b0d=$(events "$s" $role drain | bytes_of 1 0); b0r=$(events "$s" $role return | bytes_of 1 0)
    WHAT="$role: rail 0 carried data while drained ($b0d at the drain, $b0r at the undrain)" need [ "$b0d" = "$b0r" ]
    WHAT="$role: failovers $(closing "$s" $role failovers)" need [ "$(closing "$s" $role failovers)" = 0 ]
    WHAT="$role: replays $(closing "$s" $role replays)" need [ "$(closing "$s" $role replays)" = 0 ]
    WHAT="$role: drains $(closing "$s" $role drains), expected 1" need [ "$(closing "$s" $role drains)" = 1 ]
    WHAT="$role: returns $(closing "$s" $role returns), expected 1" need [ "$(closing "$s" $role returns)" = 1 ]
    WHAT="$role: planned switches aborted $(closing "$s" $role plans_aborted)" need [ "$(closing "$s" $role plans_aborted)" = 0 ]
  done
  verdict drain "$dir" "rail 0 idle while drained ($b0d bytes at drain and undrain, receiver side), no failover, no replay; longest completion gap at the drain $(stall_of "$dir" drain) ms, at the undrain $(stall_of "$dir" undrain) ms"
}

scenario_outage() {
  local dir="$WORK/outage" s="$WORK/outage/stats.json" pa pb n0 nm n1 log_kib all_kib r0a r0b rma rmb c0a c0b r1a r1b c1a c1b t0 t1
  # The fabric's shortest retry window: a failed attempt (nothing gets through on the cut rail)
  # ends after ~250 ms, so the outage holds ~2 attempts a second.
  STREAM_EXTRA=(--progress 1)
  start_stream "$dir" $((OUTAGE + 12)) HA_NCCL_REARM_HOLD_MS=20 HA_NCCL_REARM_BACKOFF_MAX_MS=100 \
    HA_NCCL_SOCK_RETRY_MS=250 ||
    { PROBLEMS+=("no traffic"); end_stream "$dir"; verdict outage "$dir" "-"; return; }
  sleep 1.5
  mark "$dir/events" "cut rail0/near"; link a 0 down
  WHAT="no failover" need wait_for 10 both "$s" failover 1
  sleep 2   # the first attempts: allocator and thread pools warm
  pa=$HPID; pb=$(child_pid)
  r0a=$(rss_kib "$pa"); r0b=$(rss_kib "$pb"); c0a=$(cpu_ticks "$pa"); c0b=$(cpu_ticks "$pb"); t0=$(now_ns)
  n0=$(sent_so_far "$dir")
  # Half-way: the growth of the second half (after the allocator's arenas and thread stacks
  # are warm) is the per-attempt cost.
  sleep "$(( (OUTAGE - 2) / 2 ))"
  rma=$(rss_kib "$pa"); rmb=$(rss_kib "$pb"); nm=$(sent_so_far "$dir")
  sleep "$(( OUTAGE - 2 - (OUTAGE - 2) / 2 ))"
  r1a=$(rss_kib "$pa"); r1b=$(rss_kib "$pb"); c1a=$(cpu_ticks "$pa"); c1b=$(cpu_ticks "$pb"); t1=$(now_ns)
  n1=$(sent_so_far "$dir"); STREAM_EXTRA=()
  # The receiving harness keeps a 24-byte record of every completion (its stall timeline):
  # that much growth is the harness's, not the plugin's.
  # Counted over each window: the message rate changes with the host's load.
  log_kib=$(( (n1 - nm) * 24 / 1024 )); all_kib=$(( (n1 - n0) * 24 / 1024 ))
  mark "$dir/events" "restore rail0"; link a 0 up
  WHAT="no return after the outage" need wait_for 20 both "$s" return 1
  end_stream "$dir"
  local attempts lines rearmed span
  attempts=$(closing "$s" send rearm_attempts)
  # Occurrences, not lines: both processes append to one log, and two lines written at the
  # same moment (both sides verify the re-armed path together) can land on one line.
  lines=$(grep 'NET/HA' "$dir/stream.log" | grep -o 're-arm of path 0' | wc -l)
  rearmed=$(grep 'NET/HA' "$dir/stream.log" | grep -o 'path 0 re-armed as the standby' | wc -l)
  span=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  WHAT="only ${attempts:-0} re-arm attempts" need [ "${attempts:-0}" -ge $((OUTAGE * 2)) ]
  WHAT="$lines 're-arm of path 0 ...' lines for one outage (1 expected: the first failure)" need [ "$lines" = 1 ]
  WHAT="$rearmed 're-armed' lines (2 expected: one per side)" need [ "$rearmed" = 2 ]
  WHAT="returns $(closing "$s" send returns), expected 1" need [ "$(closing "$s" send returns)" = 1 ]
  WHAT="sender RSS grew $((r1a - rma)) KiB in the second half" need [ $((r1a - rma)) -le 1024 ]
  WHAT="receiver RSS grew $((r1b - rmb)) KiB in the second half ($log_kib KiB of it the harness's completion log)" need [ $((r1b - rmb - log_kib)) -le 1024 ]
  WHAT="sender RSS grew $((r1a - r0a)) KiB" need [ $((r1a - r0a)) -le 8192 ]
  WHAT="receiver RSS grew $((r1b - r0b)) KiB ($all_kib KiB of it the harness's completion log)" need [ $((r1b - r0b - all_kib)) -le 8192 ]
  verdict outage "$dir" "$attempts attempts over ${OUTAGE}s down, 1 'failed' line and 1 're-armed' line per side; over ${span}s: RSS sender $r0a->$rma->$r1a KiB, receiver $r0b->$rmb->$r1b KiB (start, half-way, end; the receiver's completion log grew $log_kib KiB in the second half); CPU sender $(awk -v c=$((c1a - c0a)) -v s="$span" 'BEGIN { printf "%.1f", c / s }')%, receiver $(awk -v c=$((c1b - c0b)) -v s="$span" 'BEGIN { printf "%.1f", c / s }')% (traffic on rail 1 included)"
}

scenario_skew() {
  local dir="$WORK/skew-$FIRST" s="$WORK/skew-$FIRST/stats.json" first=a second=b
  [ "$FIRST" = far ] && { first=b; second=a; }
  start_stream "$dir" "$(awk -v g="$GAP" 'BEGIN { printf "%d", g + 14 }')" ||
    { PROBLEMS+=("no traffic"); end_stream "$dir"; verdict "skew $FIRST" "$dir" "-"; return; }
  sleep 1.5
  mark "$dir/events" "cut rail0/both"; link a 0 down; link b 0 down
  WHAT="no failover" need wait_for 10 both "$s" failover 1
  sleep 1
  link "$first" 0 up
  sleep "$GAP"
  WHAT="returned with one end down" need [ "$(count "$s" send return)" = 0 ]
  local back; back=$(date +%s%3N)
  mark "$dir/events" "restore rail0/$second"; link "$second" 0 up
  WHAT="no return within 20 s of the second end" need wait_for 20 both "$s" return 1
  end_stream "$dir"
  local ret role; ret=$(events "$s" send return | head -n1 | sed -nE 's/.*"unix_ms":([0-9]+).*/\1/p')
  for role in send recv; do
    WHAT="$role: returns $(closing "$s" $role returns), expected 1" need [ "$(closing "$s" $role returns)" = 1 ]
    WHAT="$role: failovers $(closing "$s" $role failovers), expected 1" need [ "$(closing "$s" $role failovers)" = 1 ]
  done
  verdict "skew $FIRST first, ${GAP}s" "$dir" "$(closing "$s" send rearm_attempts) re-arm attempts; traffic home $(( ${ret:-$back} - back )) ms after the second end came back"
}

for sc in "${SCEN[@]}"; do "scenario_$sc"; done
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
