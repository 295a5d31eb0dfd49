#!/usr/bin/env bash
# Soak test of the `sock` fabric: several verified streams (ha-harness stream, random sizes
# 0..--max-size, multi-receives, one connection each) run concurrently between two network
# namespaces (scripts/netns/rails.sh) for SECONDS while the rails flap at random: a random rail
# is cut at a random end (near = side A, far = side B), restored after a random time, and cut
# again (either rail) only once both rails have been up for --settle seconds (the re-arm of the
# standby has to finish first; both rails are never down at once). Every few seconds the
# resident memory (VmRSS) of every harness process (senders in A, receivers in B) is sampled.
#
# Verdict: PASS when every stream ended cleanly (exit 0, no request error) with 0 lost,
# duplicated, corrupted and reordered messages, and memory stayed flat: from the first sample
# after warm-up (10% of the run) to the last sample while traffic ran, a sender grew by at most
# 8 MiB + 10%, a receiver by at most that plus its completion log (the harness keeps 24 bytes
# per completed receive operation by design; see scripts/drill/README.md).
#
# usage: soak.sh [SECONDS] [options]          (root, iproute2; build first: scripts/build.sh)
#   SECONDS          length of the traffic (default 60)
#   --streams N      concurrent connections (stream process pairs), default 3
#   --max-size SIZE  largest message (default 4M)
#   --window N       requests in flight per side and stream, 1..32 (default 32; lower it to
#                    cap the rate on a shared machine)
#   --sample SECS    RSS sampling interval (default 5)
#   --settle SECS    both rails up this long before the next cut (default 6)
#   --down A-B       a cut rail stays down A..B seconds (default 0.5-4)
#   --gap A-B        wait A..B seconds (after the settle) before the next cut (default 0-3)
#   --timeout SECS   harness no-progress timeout (default 30)
#   --seed N         seed of the flap schedule and the streams (default: random)
#   --env K=V        extra plugin environment for both sides (repeatable)
#   --report FILE    also write the summary as markdown to FILE
#   --keep DIR       keep logs, events, JSON and the RSS samples in DIR (default: temporary,
#                    kept when the soak failed)
#   --harness PATH / --plugin PATH   (default dist/..., else target/release/...)
# Environment: HA_RAILS_PREFIX (namespaces <prefix>a/<prefix>b, default soak<pid>-: unique to
# this run).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RAILS="$ROOT/scripts/netns/rails.sh"
export HA_RAILS_PREFIX=${HA_RAILS_PREFIX:-soak$$-}
NS_A="${HA_RAILS_PREFIX}a"
NS_B="${HA_RAILS_PREFIX}b"

SECS=60 STREAMS=3 MAX_SIZE=4M WINDOW=32 SAMPLE=5 SETTLE=6 DOWN=0.5-4 GAP=0-3 TIMEOUT=30
SEED="" REPORT="" KEEP="" HARNESS="" PLUGIN="" ENVS=()

die() { echo "soak: $*" >&2; exit 2; }
usage() { sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then SECS=$1; shift; fi
while [ $# -gt 0 ]; do
  opt=$1; shift
  case "$opt" in -h|--help) usage 0 ;; esac
  [ $# -gt 0 ] || die "$opt needs a value"
  val=$1; shift
  case "$opt" in
    --streams) STREAMS=$val ;;
    --max-size) MAX_SIZE=$val ;;
    --window) WINDOW=$val ;;
    --sample) SAMPLE=$val ;;
    --settle) SETTLE=$val ;;
    --down) DOWN=$val ;;
    --gap) GAP=$val ;;
    --timeout) TIMEOUT=$val ;;
    --seed) SEED=$val ;;
    --env) ENVS+=("$val") ;;
    --report) REPORT=$val ;;
    --keep) KEEP=$val ;;
    --harness) HARNESS=$val ;;
    --plugin) PLUGIN=$val ;;
    *) die "unknown option $opt (see --help)" ;;
  esac
done

[[ $SECS =~ ^[1-9][0-9]*$ ]] && [ "$SECS" -ge 20 ] || die "SECONDS must be >= 20"
[[ $STREAMS =~ ^[1-9][0-9]*$ ]] || die "--streams must be >= 1"
[[ $SAMPLE =~ ^[1-9][0-9]*$ ]] || die "--sample is whole seconds >= 1"
range() { [[ $1 =~ ^([0-9]+([.][0-9]+)?)-([0-9]+([.][0-9]+)?)$ ]] || die "$2 is A-B (seconds)"; }
range "$DOWN" --down
range "$GAP" --gap
[[ $SETTLE =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--settle is seconds"
[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces)"
command -v ip >/dev/null 2>&1 || die "iproute2 ('ip') not found"
pick() { for p in "$@"; do [ -x "$p" ] && { echo "$p"; return; }; done; echo "$1"; }
HARNESS=${HARNESS:-$(pick "$ROOT/dist/ha-harness" "$ROOT/target/release/ha-harness")}
PLUGIN=${PLUGIN:-$(pick "$ROOT/dist/libnccl-net-ha.so" "$ROOT/target/release/libnccl_net_ha.so")}
[ -x "$HARNESS" ] || die "no harness at $HARNESS (run scripts/build.sh)"
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN (run scripts/build.sh)"
SEED=${SEED:-$((RANDOM * 32768 + RANDOM))}
RANDOM=$((SEED % 32768))

LOCKDIR=/run/lock; [ -d "$LOCKDIR" ] || LOCKDIR=/tmp
exec 9>"$LOCKDIR/ha-drill-${HA_RAILS_PREFIX}.lock"
flock -w 600 9 || die "another drill holds $LOCKDIR/ha-drill-${HA_RAILS_PREFIX}.lock"

if [ -n "$KEEP" ]; then WORK=$KEEP; mkdir -p "$WORK"; else WORK=$(mktemp -d /tmp/soak.XXXXXX); fi
PIDS=() FAILED=0
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  bash "$RAILS" down >/dev/null 2>&1 || true
  if [ -z "$KEEP" ] && [ "$FAILED" = 0 ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ns() { "$HARNESS" now; }
ms_of() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 }'; }
rand_ms() { # rand_ms A-B (seconds) -> ms in [A, B]
  local a=${1%-*} b=${1#*-} lo hi
  lo=$(ms_of "$a"); hi=$(ms_of "$b")
  echo $((lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1)))
}
sleep_ms() { sleep "$(awk -v m="$1" 'BEGIN { printf "%.3f", m / 1000 }')"; }
alive_any() { local p; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }

bash "$RAILS" up >/dev/null
echo "soak: ${SECS}s, $STREAMS streams, max-size $MAX_SIZE, window $WINDOW, settle ${SETTLE}s, down ${DOWN}s, gap ${GAP}s, seed $SEED${ENVS[*]:+, env ${ENVS[*]}}"
echo "soak: harness $HARNESS, plugin $PLUGIN, logs $WORK"

# One event line (CLOCK_MONOTONIC just before `ip` runs) into every stream's events file.
note() { local i; for i in $(seq "$STREAMS"); do echo "$1" >>"$WORK/events$i"; done; }
act() { # act cut|restore RAIL [near|far]
  local t
  t=$(now_ns)
  case "$1/${3:-}" in
    cut/near) ip -n "$NS_A" link set "r$2a" down ;;
    cut/far) ip -n "$NS_B" link set "r$2b" down ;;
    restore/*) ip -n "$NS_A" link set "r$2a" up; ip -n "$NS_B" link set "r$2b" up ;;
  esac
  if [ "$1" = cut ]; then note "$t cut rail$2/$3"; else note "$t restore rail$2"; fi
}

for i in $(seq "$STREAMS"); do
  : >"$WORK/events$i"
  ip netns exec "$NS_A" env HA_NCCL_FABRIC=sock HA_NCCL_SOCK_RAILS=r0a,r1a NCCL_SOCKET_IFNAME=oa \
    "${ENVS[@]}" "$HARNESS" stream --plugin "$PLUGIN" --mode procs \
    --child-prefix "ip netns exec $NS_B" \
    --child-env HA_NCCL_SOCK_RAILS=r0b,r1b --child-env NCCL_SOCKET_IFNAME=ob \
    --duration "$SECS" --max-size "$MAX_SIZE" --window "$WINDOW" --seed "$((SEED + i))" \
    --timeout "$TIMEOUT" --progress "$SAMPLE" --events "$WORK/events$i" --json "$WORK/stream$i.json" \
    >"$WORK/stream$i.log" 2>&1 &
  PIDS+=($!)
done

# RSS of every harness process in both namespaces: "<elapsed s> <pid> <side> <VmRSS kB>".
T0=$SECONDS
sampler() {
  local ns side p rss
  while alive_any; do
    for ns in "$NS_A" "$NS_B"; do
      side=A; [ "$ns" = "$NS_B" ] && side=B
      for p in $(ip netns pids "$ns" 2>/dev/null); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ha-harness ] || continue
        rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
        [ -n "$rss" ] && echo "$((SECONDS - T0)) $p $side $rss"
      done
    done >>"$WORK/rss.tsv"
    sleep "$SAMPLE"
  done
}
: >"$WORK/rss.tsv"
sampler &
SPID=$!

# Wait for traffic on every stream, then flap until 5 s before the end.
for i in $(seq "$STREAMS"); do
  until grep -q '^stream: traffic started' "$WORK/stream$i.log" 2>/dev/null; do
    alive_any || break
    [ $((SECONDS - T0)) -le "$TIMEOUT" ] || break
    sleep 0.05
  done
done
CUTS=0 LAST_UP_MS=$(( $(now_ns) / 1000000 ))
END_MS=$(( LAST_UP_MS + SECS * 1000 - 5000 ))
settle_ms=$(ms_of "$SETTLE")
while alive_any; do
  # Both rails up: wait the settle time since the last restore, plus a random gap.
  wait_until=$(( LAST_UP_MS + settle_ms + $(rand_ms "$GAP") ))
  now=$(( $(now_ns) / 1000000 ))
  [ "$now" -ge "$wait_until" ] || sleep_ms $((wait_until - now))
  down_ms=$(rand_ms "$DOWN")
  now=$(( $(now_ns) / 1000000 ))
  [ $((now + down_ms)) -lt "$END_MS" ] || break
  alive_any || break
  rail=$((RANDOM % 2)); end=near; [ $((RANDOM % 2)) = 0 ] || end=far
  act cut "$rail" "$end"
  CUTS=$((CUTS + 1))
  sleep_ms "$down_ms"
  act restore "$rail"
  LAST_UP_MS=$(( $(now_ns) / 1000000 ))
done
echo "soak: $CUTS cuts; waiting for the streams to end"

KILL_AFTER=$((SECS + TIMEOUT + 60))
while alive_any && [ $((SECONDS - T0)) -le "$KILL_AFTER" ]; do sleep 0.2; done
HUNG=0
if alive_any; then
  HUNG=1
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in $(ip netns pids "$NS_B" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
fi
RCS=()
for p in "${PIDS[@]}"; do rc=0; wait "$p" || rc=$?; RCS+=("$rc"); done
PIDS=()
wait "$SPID" 2>/dev/null || true

# Per stream: counts from the result lines.
OUT=()
say() { OUT+=("$*"); echo "$*"; }
T_MSGS=0 T_BYTES=0 T_LOST=0 T_DUP=0 T_CORRUPT=0 T_REORD=0 T_ERR=0 T_OPS=0 MAX_STALL=0
RECOVERED=0 NOT_RECOVERED=0 BACKS=()
for i in $(seq "$STREAMS"); do
  log="$WORK/stream$i.log" rc=${RCS[$((i - 1))]}
  res=$(grep -E '^messages [0-9]+, bytes [0-9]+' "$log" | tail -n1 || true)
  if [ -z "$res" ]; then
    say "stream $i: FAILED: no result (exit $rc): $(grep -m1 -E 'error' "$log" || tail -n1 "$log")"
    FAILED=1; continue
  fi
  read -r msgs bytes lost dup corrupt errors stall <<<"$(sed -E \
    's/messages ([0-9]+), bytes ([0-9]+), lost ([0-9]+), duplicated ([0-9]+), corrupted ([0-9]+), errors ([0-9]+), max_stall_ms ([0-9]+)/\1 \2 \3 \4 \5 \6 \7/' <<<"$res")"
  reord=$(sed -nE 's/^stream: sent .*, reordered ([0-9]+),.*/\1/p' "$log" | tail -n1)
  ops=$(sed -nE 's/^stream: sent [0-9]+ messages \([0-9]+ bytes, ([0-9]+) operations\).*/\1/p' "$log" | tail -n1)
  reord=${reord:-0} ops=${ops:-0}
  T_MSGS=$((T_MSGS + msgs)) T_BYTES=$((T_BYTES + bytes)) T_LOST=$((T_LOST + lost))
  T_DUP=$((T_DUP + dup)) T_CORRUPT=$((T_CORRUPT + corrupt)) T_REORD=$((T_REORD + reord))
  T_ERR=$((T_ERR + errors)) T_OPS=$((T_OPS + ops))
  [ "$stall" -le "$MAX_STALL" ] || MAX_STALL=$stall
  while read -r ev; do
    [ -n "$ev" ] || continue
    if grep -q ' recovered=yes' <<<"$ev"; then
      RECOVERED=$((RECOVERED + 1))
      b=$(sed -nE 's/.* back_ms=([0-9.]+) .*/\1/p' <<<"$ev"); [ -z "$b" ] || BACKS+=("$b")
    else NOT_RECOVERED=$((NOT_RECOVERED + 1)); fi
  done < <(grep '^event .* label=cut ' "$log" || true)
  line="stream $i: $msgs messages, $bytes bytes, $ops operations, lost $lost, duplicated $dup, corrupted $corrupt, reordered $reord, errors $errors, max stall ${stall} ms, exit $rc"
  if [ "$rc" != 0 ] || [ "$errors" != 0 ] || [ $((lost + dup + corrupt + reord)) -gt 0 ]; then
    say "$line: FAILED ($(grep -m1 -E '^stream: (error|first problem)' "$log" || echo see log))"
    FAILED=1
  else say "$line"; fi
done
[ "$HUNG" = 0 ] || { say "soak: FAILED: streams still running ${KILL_AFTER}s after the start (killed)"; FAILED=1; }

pct() { # pct P values... (nearest rank)
  local p=$1; shift
  [ $# -gt 0 ] || { echo "-"; return; }
  printf '%s\n' "$@" | sort -g | awk -v p="$p" '{ v[NR] = $1 } END { i = int((p * NR + 99) / 100); if (i < 1) i = 1; printf "%.1f", v[i] }'
}

say "total: $T_MSGS messages, $(awk -v b="$T_BYTES" 'BEGIN { printf "%.2f", b / 1e9 }') GB, $T_OPS operations in ${SECS}s; lost $T_LOST, duplicated $T_DUP, corrupted $T_CORRUPT, reordered $T_REORD, errors $T_ERR; longest stall ${MAX_STALL} ms"
say "rails: $CUTS cuts (random rail and end, down ${DOWN}s, settle ${SETTLE}s); per stream and cut: traffic back $RECOVERED times (p50 $(pct 50 "${BACKS[@]}") ms, p99 $(pct 99 "${BACKS[@]}") ms after the cut), not back before the next event $NOT_RECOVERED times"

# Memory: per process, first / warm (first sample at >= 10% of the run) / last during traffic /
# max over the whole run. Receivers are allowed their completion log (24 B per operation).
WARM=$((SECS / 10)); [ "$WARM" -ge "$SAMPLE" ] || WARM=$SAMPLE
OPS_PER_S=$(awk -v o="$T_OPS" -v s="$SECS" -v n="$STREAMS" 'BEGIN { printf "%.1f", o / s / n }')
while read -r pid side first warm twarm last tlast max n; do
  grow=$((last - warm))
  allow=$(awk -v w="$warm" -v side="$side" -v r="$OPS_PER_S" -v dt=$((tlast - twarm)) \
    'BEGIN { a = 8192 + w / 10; if (side == "B") a += r * dt * 24 / 1024; printf "%d", a }')
  verdict=flat
  if [ "$grow" -gt "$allow" ]; then verdict="GROWING (allowed ${allow} kB)"; FAILED=1; fi
  role=sender; [ "$side" = B ] && role=receiver
  say "rss $role pid $pid: first $((first / 1024)) MiB, at ${twarm}s $((warm / 1024)) MiB, last (${tlast}s) $((last / 1024)) MiB, max $((max / 1024)) MiB, growth after warm-up ${grow} kB over $((tlast - twarm)) s ($n samples): $verdict"
done < <(awk -v warm="$WARM" -v end="$SECS" '
  { t = $1; k = $2 " " $3; if (!(k in first)) { first[k] = $4; order[++n] = k }
    if (t >= warm && !(k in wv)) { wv[k] = $4; wt[k] = t }
    if (t <= end) { last[k] = $4; lt[k] = t }
    if ($4 > max[k]) max[k] = $4; cnt[k]++ }
  END { for (i = 1; i <= n; i++) { k = order[i]; if (!(k in wv)) { wv[k] = first[k]; wt[k] = 0 }
          if (!(k in last)) { last[k] = wv[k]; lt[k] = wt[k] }
          print k, first[k], wv[k], wt[k], last[k], lt[k], max[k], cnt[k] } }' "$WORK/rss.tsv")

if [ "$FAILED" = 0 ]; then say "soak: PASS"; else say "soak: FAILED (logs: $WORK)"; fi
if [ -n "$REPORT" ]; then
  {
    echo '```'
    printf '%s\n' "${OUT[@]}"
    echo '```'
  } >"$REPORT"
fi
[ "$FAILED" = 0 ]
