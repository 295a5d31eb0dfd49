#!/bin/bash
# Guest side of calibrate.sh (#19 item 2): for each POINT, a verified two-way stream through
# the plugin (primary rail A, standby rail B, as guest/drill.sh) under an impairment of rail A
# for IMPAIR_S seconds, then rail A blackholed (no event: only the timers and the QP's retries
# can see it) for the rest of the stream — or broken as CAL_BREAK says (see break_rail). Per point it prints one line for the host:
#
#   POINT <impair> <rto_ms> <qp_timeout> false=<failovers before the blackhole> \
#         impaired_s=<s> detect_ms=<detection of each connection that failed over from rail A
#         after the blackhole, comma-separated, or -> stream=<ok|FAILED>
#
# (counted from the sending side's stats lines: one per connection and failover)
#
#   calibrate.sh OUT_DIR POINT...     POINT = IMPAIR/RTO_MS/QP_TIMEOUT, IMPAIR one of
#     none | delay:<ms>:<jitter ms> (netem reorders) | jitter:<ms>:<jitter ms> (in order) |
#     loss:<percent> | flap:<down ms>:<period ms>
#
# The impairment is a netem qdisc on both ends of rail A (p0a, p0b: both directions); `flap`
# toggles 100 % loss for <down ms> every <period ms>. The adaptive soft timeout is off
# (HA_NCCL_RTO_ADAPTIVE=0): the point measures the setting itself.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out=$1; shift
cd "$(dirname "$0")/../../.."
IMPAIR_S=${IMPAIR_S:-20} AFTER_S=${AFTER_S:-10}
A0=${SOFTROCE_A0%% *}; B0=${SOFTROCE_B0%% *}; A1=${SOFTROCE_A1%% *}; B1=${SOFTROCE_B1%% *}
mkdir -p "$out"

impair() { # impair SPEC: the netem of both ends of rail A
  local kind a b e
  IFS=: read -r kind a b <<< "$1"
  for e in p0a p0b; do
    case $kind in
      none) tc qdisc del dev $e root 2> /dev/null || true ;;
      delay) tc qdisc replace dev $e root netem delay "${a}ms" "${b}ms" ;;
      # The same delay variation without reordering: a FIFO under netem keeps the order.
      jitter)
        tc qdisc replace dev $e root handle 1: netem delay "${a}ms" "${b}ms"
        tc qdisc add dev $e parent 1:1 pfifo limit 10000 ;;
      loss) tc qdisc replace dev $e root netem loss "${a}%" ;;
      flap) tc qdisc replace dev $e root netem loss 0% ;;
    esac
  done
}

# How rail A fails after the impairment (CAL_BREAK): blackhole-far (default: the far end drops
# all it sends, b->a), blackhole-near (a->b), blackhole-both, down-far, down-near (admin down:
# PORT_ERR on both ends).
break_rail() {
  case ${CAL_BREAK:-blackhole-far} in
    blackhole-far) tc qdisc replace dev p0b root netem loss 100% ;;
    blackhole-near) tc qdisc replace dev p0a root netem loss 100% ;;
    blackhole-both) for e in p0a p0b; do tc qdisc replace dev $e root netem loss 100%; done ;;
    down-far) ip link set p0b down ;;
    down-near) ip link set p0a down ;;
    *) echo "calibrate: unknown CAL_BREAK=$CAL_BREAK" >&2; tc qdisc replace dev p0b root netem loss 100% ;;
  esac
}

secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

flapper() { # flapper DOWN_MS PERIOD_MS: until killed
  local down=$1 period=$2 e
  while :; do
    fsleep "$(secs $((period - down)))"
    for e in p0a p0b; do tc qdisc change dev $e root netem loss 100%; done
    fsleep "$(secs "$down")"
    for e in p0a p0b; do tc qdisc change dev $e root netem loss 0%; done
  done
}

n=0
for point in "$@"; do
  n=$((n + 1))
  IFS=/ read -r spec rto qpt <<< "$point"
  o=/tmp/cal$n
  rm -rf "$o"; mkdir -p "$o"
  export HA_NCCL_FABRIC=verbs HA_NCCL_QP_TIMEOUT=$qpt HA_NCCL_QP_RETRY_CNT=6 HA_NCCL_RTO_MS=$rto \
    HA_NCCL_RTO_ADAPTIVE=0 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO HA_NCCL_REARM_HOLD_MS=1000 \
    HA_NCCL_HEARTBEAT_MS=200
  impair "$spec"
  fl=
  NCCL_IB_HCA="=$A0,$B0" HA_NCCL_STATS_FILE="$o/stats.jsonl" \
    dist/ha-harness stream --plugin "$PWD/dist/libnccl-net-ha.so" --mode procs \
    --child-env "NCCL_IB_HCA==$A1,$B1" --duration $((IMPAIR_S + AFTER_S)) --max-size 64K \
    --json "$o/stream.json" > "$o/nccl.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q "^stream: start" "$o/nccl.log" 2> /dev/null && break; fsleep 0.1; done
  t0=$(date +%s%3N)
  if [[ $spec == flap:* ]]; then
    IFS=: read -r _ down period <<< "$spec"
    flapper "$down" "$period" &
    fl=$!
  fi
  fsleep "$IMPAIR_S"
  [ -n "$fl" ] && { kill "$fl"; wait "$fl" 2> /dev/null; }
  t1=$(date +%s%3N)
  break_rail
  wait $pid
  rc=$?
  $SOFTROCE_LINK A up > /dev/null 2>&1 || echo "calibrate: rail A did not come back"
  # Failovers (every comm of both processes) from the stats file: before the blackhole they
  # are false; after it, from path 0, their detection time.
  false_n=0 detect=
  while read -r line; do
    # The sender's line per connection (the receiver logs the same failover again).
    [[ $line == *'"event":"failover"'* && $line == *'"role":"send"'* ]] || continue
    [[ $line =~ \"unix_ms\":([0-9]+) ]] && at=${BASH_REMATCH[1]}
    [[ $line =~ \"detect_unix_ms\":([0-9]+) ]] && det=${BASH_REMATCH[1]} || det=$at
    [[ $line =~ \"from\":([0-9]+) ]] && from=${BASH_REMATCH[1]}
    if ((det < t1)); then
      false_n=$((false_n + 1))
    elif [ "$from" = 0 ]; then
      detect+="${detect:+,}$((det - t1))"
    fi
  done < "$o/stats.jsonl"
  ok=ok
  { [ $rc -eq 0 ] && grep -q "lost 0, duplicated 0, corrupted 0, errors 0" "$o/nccl.log"; } || ok=FAILED
  echo "POINT $spec $rto $qpt false=$false_n impaired_s=$(((t1 - t0) / 1000)) detect_ms=${detect:--} stream=$ok"
  [ $ok = ok ] || grep -E "FAIL|error|lost" "$o/nccl.log" | head -5
  cp "$o/stats.jsonl" "$out/$n.stats.jsonl" 2> /dev/null
  grep -E "NET/HA : (failover|return)|standby path|re-armed" "$o/nccl.log" > "$out/$n.events.log" 2> /dev/null
done
impair none
