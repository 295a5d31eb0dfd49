#!/usr/bin/env bash
# Throughput before a cut, during it and after the restore, on `sock` rails that have their own
# bandwidth: two network namespaces (scripts/netns/rails.sh), each rail's veth ends shaped with
# `tc tbf` (rail 0 the preferred NIC at --rate0, rail 1 the neighbour's NIC, of which this rank
# gets --rate1). Per round: a verified stream (ha-harness stream, sender progress every 0.25 s),
# rail 0 cut at its near end, restored, and the stream's throughput measured in three windows:
# before the cut, during (after the failover), after (once traffic is back home). Rounds with
# return home on (the default) and, for comparison, off (HA_NCCL_RETURN_HOME=0: today's
# behaviour, traffic stays on rail 1). The anchor: raw TCP (python) through each shaped rail.
# Prints a markdown table; every stream must end clean (lost/duplicated/corrupted 0).
#
# usage: home-bench.sh [--rounds N] [--off-rounds N] [--rate0 R] [--rate1 R] [--max-size S]
#                      [--harness PATH] [--plugin PATH]
#   defaults: 3 rounds, 1 off-round, rate0 400mbit, rate1 200mbit, max size 256K.
# Needs root, iproute2 (ip, tc) and python3.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RAILS="$ROOT/scripts/netns/rails.sh"
PREFIX=${HA_RAILS_PREFIX:-hb$$-}
export HA_RAILS_PREFIX=$PREFIX
NS_A="${PREFIX}a" NS_B="${PREFIX}b"
ROUNDS=3 OFF_ROUNDS=1 RATE0=400mbit RATE1=200mbit MAX_SIZE=256K HARNESS="" PLUGIN=""
die() { echo "home-bench: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  [ $# -gt 1 ] || die "$1 needs a value"
  case "$1" in
    --rounds) ROUNDS=$2 ;; --off-rounds) OFF_ROUNDS=$2 ;; --rate0) RATE0=$2 ;; --rate1) RATE1=$2 ;;
    --max-size) MAX_SIZE=$2 ;; --harness) HARNESS=$2 ;; --plugin) PLUGIN=$2 ;;
    *) die "unknown option $1" ;;
  esac
  shift 2
done
[ "$(id -u)" -eq 0 ] || die "must run as root"
pick() { local p; for p in "$@"; do [ -e "$p" ] && { echo "$p"; return; }; done; echo "$1"; }
HARNESS=$(realpath -m "${HARNESS:-$(pick "$ROOT/dist/ha-harness" "$ROOT/target/release/ha-harness")}")
PLUGIN=$(realpath -m "${PLUGIN:-$(pick "$ROOT/dist/libnccl-net-ha.so" "$ROOT/target/release/libnccl_net_ha.so")}")
[ -x "$HARNESS" ] && [ -f "$PLUGIN" ] || die "harness or plugin missing ($HARNESS, $PLUGIN)"
WORK=$(mktemp -d /tmp/home-bench.XXXXXX)
HPID=""
cleanup() {
  if [ -n "$HPID" ] && kill -0 "$HPID" 2>/dev/null; then kill -KILL "$HPID" 2>/dev/null || true; fi
  bash "$RAILS" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
bash "$RAILS" up >/dev/null
for end in a b; do
  ns=$NS_A; [ $end = b ] && ns=$NS_B
  ip netns exec "$ns" tc qdisc replace dev "r0$end" root tbf rate "$RATE0" burst 512kb latency 100ms
  ip netns exec "$ns" tc qdisc replace dev "r1$end" root tbf rate "$RATE1" burst 512kb latency 100ms
done

# Anchor: raw TCP through rail R for 3 s (MB/s, as the receiver counts it).
anchor() {
  local r=$1 port=$((5600 + $1))
  ip netns exec "$NS_B" python3 - "$r" "$port" >"$WORK/anchor$r" <<'EOF' &
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((f"10.88.{sys.argv[1]}.2", int(sys.argv[2]))); s.listen(1)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.monotonic()
    n += len(b)
print(f"{n / (time.monotonic() - t0) / 1e6:.1f}")
EOF
  local spid=$!
  ip netns exec "$NS_A" python3 - "$r" "$port" <<'EOF'
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((f"10.88.{sys.argv[1]}.2", int(sys.argv[2]))); break
    except OSError: time.sleep(0.05)
buf = b"x" * (1 << 20); t_end = time.monotonic() + 3
while time.monotonic() < t_end: c.sendall(buf)
c.close()
EOF
  wait "$spid"; cat "$WORK/anchor$r"
}

now_ns() { "$HARNESS" now; }
count() { grep '"event":"switch"' "$1" 2>/dev/null | grep '"role":"send"' | grep -c "\"kind\":\"$2\"" || true; }
wait_for() { local until=$((SECONDS + $1)); shift
  until "$@"; do kill -0 "$HPID" 2>/dev/null || return 1; [ "$SECONDS" -lt "$until" ] || return 1; sleep 0.05; done; }
has() { [ "$(count "$1" "$2")" -ge 1 ]; }
# MB/s of the stream between seconds A and B of its clock (sender progress lines).
rate() { grep -E '^stream: t=' "$1" | sed -nE 's/^stream: t=([0-9.]+)s sent [0-9]+ messages, ([0-9.]+) MB/\1 \2/p' |
  awk -v a="$2" -v b="$3" '$1 >= a && t0 == "" { t0 = $1; m0 = $2 } $1 <= b { t1 = $1; m1 = $2 }
    END { if (t1 > t0) printf "%.1f", (m1 - m0) / (t1 - t0); else print "nan" }'; }

# round NAME RETURN_HOME: writes "before during after <the stream's result>" to WORK/NAME/result.
round() {
  local dir="$WORK/$1" home=$2 start cut fo back ret end
  mkdir -p "$dir"; : >"$dir/stats.json"
  bash "$RAILS" restore 0 >/dev/null; bash "$RAILS" restore 1 >/dev/null
  ip netns exec "$NS_A" env HA_NCCL_FABRIC=sock HA_NCCL_SOCK_RAILS=r0a,r1a NCCL_SOCKET_IFNAME=oa \
    HA_NCCL_STATS_FILE="$dir/stats.json" HA_NCCL_DRAIN_FILE="$dir/drain" NCCL_DEBUG=INFO \
    HA_NCCL_SOCK_RETRY_MS=300 HA_NCCL_HEARTBEAT_MS=200 HA_NCCL_KEEPALIVE_MS=200 \
    HA_NCCL_REARM_HOLD_MS=200 HA_NCCL_REARM_BACKOFF_MAX_MS=1000 HA_NCCL_RETURN_HOLD_MS=1000 \
    HA_NCCL_RETURN_HOME="$home" \
    "$HARNESS" stream --plugin "$PLUGIN" --mode procs --child-prefix "ip netns exec $NS_B" \
    --child-env HA_NCCL_SOCK_RAILS=r0b,r1b --child-env NCCL_SOCKET_IFNAME=ob \
    --duration 30 --max-size "$MAX_SIZE" --window 8 --timeout 15 --seed 25 --progress 0.25 \
    >"$dir/stream.log" 2>&1 &
  HPID=$!
  wait_for 20 grep -q '^stream: traffic started' "$dir/stream.log" || die "no traffic ($dir)"
  start=$(sed -nE 's/^stream: start monotonic_ns=([0-9]+)/\1/p' "$dir/stream.log")
  sec() { awk -v a="$1" -v s="$start" 'BEGIN { printf "%.2f", (a - s) / 1e9 }'; }
  sleep 6   # the "before" window: the wait is the measurement
  cut=$(sec "$(now_ns)"); ip -n "$NS_A" link set r0a down
  wait_for 10 has "$dir/stats.json" failover || die "no failover ($dir)"
  fo=$(sec "$(now_ns)")
  sleep 5   # the "during" window
  back=$(sec "$(now_ns)"); ip -n "$NS_A" link set r0a up
  if [ "$home" = 1 ]; then
    wait_for 20 has "$dir/stats.json" return || die "no return ($dir)"
  else
    wait_for 20 grep -q 're-armed as the standby' "$dir/stream.log" || die "no re-arm ($dir)"
  fi
  ret=$(sec "$(now_ns)")
  # The "after" window: to the stream's end (--duration), which must leave 5 s of it.
  local rc=0; wait "$HPID" || rc=$?; HPID=""
  end=$(grep -E '^stream: t=' "$dir/stream.log" | tail -n1 | sed -nE 's/^stream: t=([0-9.]+)s.*/\1/p')
  awk -v r="$ret" -v e="$end" 'BEGIN { exit !(e - r >= 5) }' || die "after window under 5 s ($dir)"
  grep -qE '^messages [0-9]+, bytes [0-9]+, lost 0, duplicated 0, corrupted 0, errors 0' "$dir/stream.log" &&
    [ "$rc" = 0 ] || die "stream not clean (exit $rc, $dir/stream.log)"
  CLEAN=$(grep -E '^messages [0-9]+' "$dir/stream.log" | sed -E 's/, max_stall.*//')
  local b d a
  b=$(rate "$dir/stream.log" "$(awk -v c="$cut" 'BEGIN { print c - 5 }')" "$cut")
  d=$(rate "$dir/stream.log" "$(awk -v f="$fo" 'BEGIN { print f + 0.5 }')" "$back")
  a=$(rate "$dir/stream.log" "$(awk -v r="$ret" 'BEGIN { print r + 0.5 }')" "$end")
  echo "$b $d $a $CLEAN" >"$dir/result"
}

echo "home-bench: rail 0 $RATE0, rail 1 $RATE1; harness $HARNESS, plugin $PLUGIN; work $WORK" >&2
tc0=$(anchor 0); tc1=$(anchor 1)
echo "| round | return home | before (MB/s) | during (MB/s) | after (MB/s) | after / before |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
echo "| anchor: raw TCP | - | rail 0: $tc0 | rail 1: $tc1 | - | - |"
ratios=()
for i in $(seq 1 "$ROUNDS"); do
  round "on$i" 1; read -r b d a clean <"$WORK/on$i/result"; echo "round on$i: $clean" >&2
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }'); ratios+=("$r")
  echo "| $i | on | $b | $d | $a | $r |"
done
for i in $(seq 1 "$OFF_ROUNDS"); do
  round "off$i" 0; read -r b d a clean <"$WORK/off$i/result"; echo "round off$i: $clean" >&2
  echo "| off $i | off (HA_NCCL_RETURN_HOME=0) | $b | $d | $a | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }') |"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END {
  printf "after/before with return home: median %.3f, min %.3f, max %.3f over %d rounds\n", v[int((NR + 1) / 2)], v[1], v[NR], NR }'
