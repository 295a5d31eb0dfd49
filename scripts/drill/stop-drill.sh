#!/usr/bin/env bash
# The stop drill: a peer that stops running for a while is not a dead link. Verified traffic
# (ha-harness stream --mode procs: the receiver is a child process), then `kill -STOP` of the
# receiver child, `kill -CONT` after S seconds. The stream must resume and end clean: 0 lost,
# 0 duplicated, 0 corrupted, 0 errors — with the standby on or off (as NCCL's Socket transport
# and RC hardware survive such a pause: the kernel / the NIC keep acknowledging).
#
#   stop drill: S=<s> standby=<on|off> [cut=<rail0/end> during the pause] → PASS: <counts>
#                                                                        | FAIL: <why>
#
# usage: stop-drill.sh [options]
#   --stop S           seconds the receiver stays stopped (default 2; decimals allowed)
#   --stop-at T        stop it T seconds after traffic started (default 2.5)
#   --after T          seconds of traffic after the pause (default 3)
#   --standby on|off   HA_NCCL_ENABLE_BACKUP (default on)
#   --cut near|far     also cut rail 0 (the paths' primary) 1 s into the pause, at ha-a's (near)
#                      or ha-b's (far) end: the failover must happen once the peer runs again.
#                      Needs root + iproute2: runs between two network namespaces
#                      (scripts/netns/rails.sh, names unique to this run); needs --standby on.
#   --max-size SIZE    largest message (default 256K)
#   --env K=V          extra environment for both sides (repeatable)
#   --harness PATH     ha-harness (default dist/ha-harness, else target/release/ha-harness)
#   --plugin PATH      plugin (default dist/libnccl-net-ha.so, else target/release/...)
#   --keep DIR         keep the stream's log in DIR (default: temporary, kept on failure)
# Without --cut both sides run on this host with two loopback rails (127.0.0.1, 127.0.0.2), no
# root needed. Exit status: 0 = PASS, 1 = FAIL, 2 = bad usage or setup.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RAILS="$ROOT/scripts/netns/rails.sh"
STOP=2 STOP_AT=2.5 AFTER=3 STANDBY=on CUT="" MAX_SIZE=256K KEEP="" HARNESS="" PLUGIN="" ENVS=()

die() { echo "stop-drill: $*" >&2; exit 2; }
usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  opt=$1; shift
  case "$opt" in -h|--help) usage 0 ;; esac
  [ $# -gt 0 ] || die "$opt needs a value"
  val=$1; shift
  case "$opt" in
    --stop) STOP=$val ;;
    --stop-at) STOP_AT=$val ;;
    --after) AFTER=$val ;;
    --standby) STANDBY=$val ;;
    --cut) CUT=$val ;;
    --max-size) MAX_SIZE=$val ;;
    --env) ENVS+=("$val") ;;
    --harness) HARNESS=$val ;;
    --plugin) PLUGIN=$val ;;
    --keep) KEEP=$val ;;
    *) die "unknown option $opt (see --help)" ;;
  esac
done
isnum() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
for v in "$STOP" "$STOP_AT" "$AFTER"; do isnum "$v" || die "'$v' is not a number"; done
[[ $STANDBY =~ ^(on|off)$ ]] || die "--standby is on or off"
[[ $CUT =~ ^(|near|far)$ ]] || die "--cut is near or far"
[ -z "$CUT" ] || [ "$STANDBY" = on ] || die "--cut needs --standby on (one path cannot survive a cut)"
for e in "${ENVS[@]}"; do [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env '$e' is not K=V"; done
pick() { local p; for p in "$@"; do [ -e "$p" ] && { echo "$p"; return; }; done; echo "$1"; }
HARNESS=$(realpath -m "${HARNESS:-$(pick "$ROOT/dist/ha-harness" "$ROOT/target/release/ha-harness")}")
PLUGIN=$(realpath -m "${PLUGIN:-$(pick "$ROOT/dist/libnccl-net-ha.so" "$ROOT/target/release/libnccl_net_ha.so")}")
[ -x "$HARNESS" ] || die "no harness at $HARNESS (run scripts/build.sh, or --harness)"
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN (run scripts/build.sh, or --plugin)"

if [ -n "$KEEP" ]; then WORK=$KEEP; mkdir -p "$WORK"; else WORK=$(mktemp -d /tmp/stop-drill.XXXXXX); fi
LOG="$WORK/stream.log"
HPID="" CHILD="" PASSED=0 NETNS=0
cleanup() {
  [ -z "$CHILD" ] || kill -CONT "$CHILD" 2>/dev/null || true
  if [ -n "$HPID" ] && kill -0 "$HPID" 2>/dev/null; then kill -KILL "$HPID" 2>/dev/null || true; fi
  [ "$NETNS" = 0 ] || bash "$RAILS" down >/dev/null 2>&1 || true
  if [ -z "$KEEP" ] && [ "$PASSED" = 1 ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ms_of() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 + 0.5 }'; }
sleep_s() { sleep "$1"; }
# The stream outlives the pause by --after seconds; the harness's no-progress timeout must
# outlast the pause itself (a stopped receiver makes no progress, by design of this drill).
DURATION=$(awk -v a="$STOP_AT" -v s="$STOP" -v b="$AFTER" 'BEGIN { printf "%.3f", a + s + b }')
TIMEOUT=$(awk -v s="$STOP" 'BEGIN { printf "%d", s + 30 }')
KILL_AFTER=$(awk -v d="$DURATION" -v t="$TIMEOUT" 'BEGIN { printf "%d", d + t + 30 }')
BACKUP=1; [ "$STANDBY" = on ] || BACKUP=0

ENV_BOTH=(HA_NCCL_FABRIC=sock HA_NCCL_ENABLE_BACKUP=$BACKUP "${ENVS[@]}")
if [ -z "$CUT" ]; then
  PREFIX_CMD=()
  SIDE_A=(NCCL_SOCKET_IFNAME=lo HA_NCCL_SOCK_RAILS=127.0.0.1,127.0.0.2)
  CHILD_ARGS=(--child-env NCCL_SOCKET_IFNAME=lo --child-env HA_NCCL_SOCK_RAILS=127.0.0.1,127.0.0.2)
else
  [ "$(id -u)" -eq 0 ] || die "--cut must run as root (network namespaces)"
  # A namespace pair of our own: concurrent drills on one host never touch each other's.
  export HA_RAILS_PREFIX="stop$$-"
  NETNS=1
  bash "$RAILS" up >/dev/null
  PREFIX_CMD=(ip netns exec "${HA_RAILS_PREFIX}a")
  SIDE_A=(NCCL_SOCKET_IFNAME=oa HA_NCCL_SOCK_RAILS=r0a,r1a)
  CHILD_ARGS=(--child-prefix "ip netns exec ${HA_RAILS_PREFIX}b"
    --child-env NCCL_SOCKET_IFNAME=ob --child-env HA_NCCL_SOCK_RAILS=r0b,r1b)
fi
for e in "${ENVS[@]}" "HA_NCCL_ENABLE_BACKUP=$BACKUP"; do CHILD_ARGS+=(--child-env "$e"); done

what="S=${STOP} standby=$STANDBY${CUT:+ cut=rail0/$CUT during the pause}"
echo "stop-drill: $what, stream ${DURATION}s max-size $MAX_SIZE, log $LOG"
"${PREFIX_CMD[@]}" env "${ENV_BOTH[@]}" "${SIDE_A[@]}" NCCL_DEBUG=INFO \
  "$HARNESS" stream --plugin "$PLUGIN" --mode procs "${CHILD_ARGS[@]}" \
  --duration "$DURATION" --max-size "$MAX_SIZE" --timeout "$TIMEOUT" --seed 11 \
  --progress 1 >"$LOG" 2>&1 &
HPID=$!
alive() { kill -0 "$HPID" 2>/dev/null; }
fail() { echo "stop drill: $what → FAIL: $*"; echo "  (log: $LOG)"; exit 1; }

t0=$SECONDS
until grep -q '^stream: traffic started' "$LOG" 2>/dev/null; do
  alive || fail "the stream ended before traffic started: $(tail -n3 "$LOG" | tr '\n' ' ')"
  [ $((SECONDS - t0)) -le 30 ] || fail "no traffic after 30 s"
  sleep 0.02
done
sleep_s "$STOP_AT"
# The receiver: the harness's child (through `ip netns exec`, which execs it).
for _ in $(seq 100); do
  CHILD=$(pgrep -P "$HPID" -f -- '--child' | head -n1 || true)
  [ -z "$CHILD" ] || break
  sleep 0.02
done
[ -n "$CHILD" ] || fail "receiver child of $HPID not found"
alive || fail "stream ended before the pause: $(grep -m1 'error' "$LOG" || tail -n1 "$LOG")"
kill -STOP "$CHILD"
echo "stop-drill: receiver $CHILD stopped"
if [ -n "$CUT" ]; then
  sleep_s 1
  if [ "$CUT" = near ]; then ip -n "${HA_RAILS_PREFIX}a" link set r0a down
  else ip -n "${HA_RAILS_PREFIX}b" link set r0b down; fi
  echo "stop-drill: rail0 cut at the $CUT end during the pause"
  sleep_s "$(awk -v s="$STOP" 'BEGIN { printf "%.3f", (s > 1) ? s - 1 : 0 }')"
else
  sleep_s "$STOP"
fi
kill -CONT "$CHILD"
CHILD=""
echo "stop-drill: receiver resumed"
t0=$SECONDS
while alive && [ $((SECONDS - t0)) -le "$KILL_AFTER" ]; do sleep 0.1; done
alive && fail "stream did not end within ${KILL_AFTER}s (hang)"
rc=0; wait "$HPID" || rc=$?
HPID=""
result=$(grep -E '^messages [0-9]+, bytes [0-9]+' "$LOG" | tail -n1 || true)
[ -n "$result" ] || fail "no result line (exit $rc): $(grep -m1 -E 'error' "$LOG" || tail -n1 "$LOG")"
read -r msgs lost dup corrupt errors stall <<<"$(sed -E \
  's/messages ([0-9]+), bytes [0-9]+, lost ([0-9]+), duplicated ([0-9]+), corrupted ([0-9]+), errors ([0-9]+), max_stall_ms ([0-9]+)/\1 \2 \3 \4 \5 \6/' <<<"$result")"
counts="$msgs messages, lost $lost, duplicated $dup, corrupted $corrupt, errors $errors, max stall ${stall} ms"
if [ "$rc" != 0 ] || [ "$errors" != 0 ] || [ $((lost + dup + corrupt)) != 0 ]; then
  fail "$counts, exit $rc: $(grep -m1 '^stream: error' "$LOG" || grep -m1 'connection lost' "$LOG" || true)"
fi
# Traffic must have resumed after the pause: the longest stall covers the pause, and the
# stream went on for --after seconds (the stall is shorter than the whole stream).
stop_ms=$(ms_of "$STOP")
[ "$stall" -ge $((stop_ms / 2)) ] || fail "$counts: no stall during the pause (was the receiver stopped?)"
# Occurrences, not lines: a plugin whose lines two processes fused still counts right.
failovers=$({ grep -o 'NET/HA : failover [a-z]' "$LOG" || true; } | wc -l)
lost_sb=$({ grep -o 'standby path [0-9]* lost' "$LOG" || true; } | wc -l)
echo "stop drill: $what → PASS: $counts, failovers logged $failovers, standby losses logged $lost_sb"
PASSED=1
