#!/usr/bin/env bash
# Failover drills of the `sock` fabric: verified traffic (ha-harness stream) between two
# network namespaces joined by two rails (scripts/netns/rails.sh), a rail cut with
# `ip link set ... down` at a random moment, and a verdict per drill:
#   drill <n>: cut=<rail>/<end> at <ms> → recovered after <ms> ... | FAILED: <reason>
# then a summary (recovery p50/p99, lost/duplicated/corrupted/reordered totals) and
# `N passed, M failed`. Needs root, iproute2, and a built plugin + harness (scripts/build.sh).
#
# usage: sock-drill.sh [options]
#   --drills N         drills to run (default 1)
#   --rail R           rail cut first: 0 or 1 (default 0; the plugin's device 0 is rail 0)
#   --end E            near (ha-a's end), far (ha-b's end), random per drill (default) or
#                      alternate (near, far, near, ...)
#   --kind K           how the rail fails: down (default: `ip link set` the end down), blackhole
#                      (links stay up, both ends route the other's rail address to a blackhole:
#                      nothing gets through either way, no port event) or oneway (only the
#                      chosen end's packets are dropped: near = a→b lost, far = b→a lost);
#                      a restore removes the blackhole routes
#   --cut-at A-B       cut at a random moment A..B seconds after traffic started (default 0.5-1.5)
#   --restore T        bring the cut rail back up T seconds after the cut (re-arm)
#   --second-cut T     T seconds after the restore, cut the other rail too (needs --restore)
#   --flap SECS        instead of one cut: toggle the rail down/up at random 0.5-3 s
#                      intervals for SECS seconds (the rail ends up)
#   --no-cut           baseline: stream without cutting anything
#   --expect pass|error  pass (default): every cut must be survived with traffic resuming
#                      and the stream clean; error: the plugin has one path per connection,
#                      so the stream must end with a request error (ncclResult) within
#                      --error-within ms of the cut, with nothing lost/duplicated/corrupted
#   --error-within MS  bound for --expect error (default 5000)
#   --duration SECS    stream length (default 4; raised to cover the cut sequence)
#   --max-size SIZE    largest message (default 1M)
#   --window N         requests in flight per side (default 32; 1 with a small --max-size:
#                      one small segment in flight at a time, as NCCL's small all_reduce steps)
#   --timeout SECS     harness no-progress timeout (default 10)
#   --seed N           seed of the random choices and of the streams (default: random)
#   --env K=V          extra environment for both sides (repeatable), e.g.
#                      --env HA_NCCL_SOCK_RETRY_MS=300 --env HA_NCCL_KEEPALIVE_MS=200
#   --harness PATH     ha-harness (default dist/ha-harness, else target/release/ha-harness)
#   --plugin PATH      plugin (default dist/libnccl-net-ha.so, else target/release/...)
#   --keep DIR         keep every drill's log, events and JSON in DIR (default: temporary;
#                      kept only when a drill failed)
#   --detect FILE      append one line per cut: kind, end, and when each side's first failover
#                      after it was detected (ms after the cut, from the stats file), or "-"
#   --pictures DIR     draw each drill's timeline (ha-harness timeline: throughput per path,
#                      cut, detection, switch, stall, re-arm) as DIR/drill<n>.svg and .png
#   --stats-ms MS      HA_NCCL_STATS_INTERVAL_MS of both sides (default 100): each drill's
#                      stats file (stats.jsonl beside its log) gets a line per connection
#                      this often
# Environment: HA_RAILS_PREFIX (namespaces <prefix>a/<prefix>b, default drill<pid>-: unique to
# this run, so concurrent drills on one host never touch each other's namespaces).
# Everything is bounded: each stream ends by itself (duration, harness timeout and watchdog)
# and is killed after duration + timeout + 30 s at the latest; the namespaces are removed on
# exit. Timestamps of cuts and completions are CLOCK_MONOTONIC (`ha-harness now`).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RAILS="$ROOT/scripts/netns/rails.sh"
PREFIX=${HA_RAILS_PREFIX:-drill$$-}
export HA_RAILS_PREFIX=$PREFIX
NS_A="${PREFIX}a"
NS_B="${PREFIX}b"

DRILLS=1 RAIL=0 END=random KIND=down DETECT="" CUT_AT=0.5-1.5 RESTORE="" SECOND="" FLAP="" NOCUT=0
EXPECT=pass ERROR_WITHIN=5000 DURATION=4 MAX_SIZE=1M TIMEOUT=10 SEED="" KEEP="" PICTURES="" STATS_MS=100 WINDOW=32
HARNESS="" PLUGIN="" ENVS=()

die() { echo "sock-drill: $*" >&2; exit 2; }
usage() { sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

while [ $# -gt 0 ]; do
  opt=$1; shift
  case "$opt" in
    -h|--help) usage 0 ;;
    --no-cut) NOCUT=1; continue ;;
  esac
  [ $# -gt 0 ] || die "$opt needs a value"
  val=$1; shift
  case "$opt" in
    --drills) DRILLS=$val ;;
    --rail) RAIL=$val ;;
    --end) END=$val ;;
    --kind) KIND=$val ;;
    --detect) DETECT=$val ;;
    --cut-at) CUT_AT=$val ;;
    --restore) RESTORE=$val ;;
    --second-cut) SECOND=$val ;;
    --flap) FLAP=$val ;;
    --expect) EXPECT=$val ;;
    --error-within) ERROR_WITHIN=$val ;;
    --duration) DURATION=$val ;;
    --max-size) MAX_SIZE=$val ;;
    --window) [[ $val =~ ^[1-9][0-9]*$ ]] || die "--window is a number of requests, 1 or more"; WINDOW=$val ;;
    --timeout) TIMEOUT=$val ;;
    --seed) SEED=$val ;;
    --env) ENVS+=("$val") ;;
    --harness) HARNESS=$val ;;
    --plugin) PLUGIN=$val ;;
    --keep) KEEP=$val ;;
    --pictures) PICTURES=$val ;;
    --stats-ms) STATS_MS=$val ;;
    *) die "unknown option $opt (see --help)" ;;
  esac
done

isnum() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
[[ $DRILLS =~ ^[1-9][0-9]*$ ]] || die "--drills must be >= 1"
[[ $RAIL =~ ^[01]$ ]] || die "--rail is 0 or 1"
[[ $END =~ ^(near|far|random|alternate)$ ]] || die "--end is near, far, random or alternate"
[[ $KIND =~ ^(down|blackhole|oneway)$ ]] || die "--kind is down, blackhole or oneway"
[[ $EXPECT =~ ^(pass|error)$ ]] || die "--expect is pass or error"
[[ $CUT_AT =~ ^([0-9]+([.][0-9]+)?)-([0-9]+([.][0-9]+)?)$ ]] || die "--cut-at is A-B (seconds)"
for v in "$DURATION" "$TIMEOUT" "$ERROR_WITHIN" ${RESTORE:+"$RESTORE"} ${SECOND:+"$SECOND"} ${FLAP:+"$FLAP"}; do
  isnum "$v" || die "'$v' is not a number"
done
[ -z "$SECOND" ] || [ -n "$RESTORE" ] || die "--second-cut needs --restore"
[ -z "$FLAP" ] || [ -z "$RESTORE" ] || die "--flap and --restore do not mix"
[ "$NOCUT" = 0 ] || { [ -z "$FLAP$RESTORE" ] || die "--no-cut and --flap/--restore do not mix"; }
[[ $STATS_MS =~ ^[0-9]+$ ]] || die "--stats-ms takes milliseconds"
for e in "${ENVS[@]}"; do [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env '$e' is not K=V"; done

[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces)"
command -v ip >/dev/null 2>&1 || die "iproute2 ('ip') not found"
pick() { local p; for p in "$@"; do [ -e "$p" ] && { echo "$p"; return; }; done; echo "$1"; }
HARNESS=$(realpath -m "${HARNESS:-$(pick "$ROOT/dist/ha-harness" "$ROOT/target/release/ha-harness")}")
PLUGIN=$(realpath -m "${PLUGIN:-$(pick "$ROOT/dist/libnccl-net-ha.so" "$ROOT/target/release/libnccl_net_ha.so")}")
[ -x "$HARNESS" ] || die "no harness at $HARNESS (run scripts/build.sh, or --harness)"
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN (run scripts/build.sh, or --plugin)"
[ -z "$PICTURES" ] || { mkdir -p "$PICTURES" && PICTURES=$(realpath "$PICTURES"); } || die "cannot create $PICTURES"

ms_of() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 + 0.5 }'; }
sleep_ms() { [ "$1" -gt 0 ] && sleep "$(awk -v m="$1" 'BEGIN { printf "%.3f", m / 1000 }')" || true; }
rand_between() { echo $(( $1 + (RANDOM * 32768 + RANDOM) % ($2 - $1 + 1) )); }
now_ns() { "$HARNESS" now; }

[ -n "$SEED" ] || SEED=$(( (RANDOM * 32768 + RANDOM) % 1000000 ))
RANDOM=$SEED
CUT_MIN=$(ms_of "${CUT_AT%-*}") CUT_MAX=$(ms_of "${CUT_AT#*-}")
[ "$CUT_MIN" -le "$CUT_MAX" ] || die "--cut-at: A must not exceed B"

# One drill at a time per namespace pair.
LOCKDIR=/run/lock; [ -d "$LOCKDIR" ] || LOCKDIR=/tmp
exec 9>"$LOCKDIR/ha-drill-${PREFIX}.lock"
flock -w 600 9 || die "another drill holds $LOCKDIR/ha-drill-${PREFIX}.lock"

if [ -n "$KEEP" ]; then WORK=$KEEP; mkdir -p "$WORK"; else WORK=$(mktemp -d /tmp/sock-drill.XXXXXX); fi
HPID=""
FAILED_ANY=0
cleanup() {
  if [ -n "$HPID" ] && kill -0 "$HPID" 2>/dev/null; then kill -KILL "$HPID" 2>/dev/null || true; fi
  bash "$RAILS" down >/dev/null 2>&1 || true
  if [ -z "$KEEP" ] && [ "$FAILED_ANY" = 0 ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash "$RAILS" up >/dev/null

# Stream length: long enough for the whole cut sequence.
need_s=$(awk -v c="$CUT_MAX" -v r="${RESTORE:-0}" -v s="${SECOND:-0}" -v f="${FLAP:-0}" \
  'BEGIN { printf "%.3f", c / 1000 + r + s + f + 2 }')
STREAM_S=$(awk -v a="$DURATION" -v b="$need_s" 'BEGIN { printf "%.3f", (a > b) ? a : b }')
KILL_AFTER=$(awk -v d="$STREAM_S" -v t="$TIMEOUT" 'BEGIN { printf "%d", d + t + 30 }')

mode="cut ($KIND) rail$RAIL end $END at ${CUT_AT}s"
[ -z "$RESTORE" ] || mode+=", restore after ${RESTORE}s"
[ -z "$SECOND" ] || mode+=", second cut after ${SECOND}s"
[ -z "$FLAP" ] || mode="flap rail$RAIL end $END for ${FLAP}s"
[ "$NOCUT" = 0 ] || mode="no cut"
echo "sock-drill: $DRILLS drill(s), $mode, expect $EXPECT, stream ${STREAM_S}s max-size $MAX_SIZE window $WINDOW, seed $SEED${ENVS[*]:+, env ${ENVS[*]}}"
echo "sock-drill: harness $HARNESS, plugin $PLUGIN, logs $WORK"

# Field K=V of an `event` line.
field() { sed -nE "s/.* $1=([^ ]+).*/\1/p" <<<"$2"; }
alive() { [ -n "$HPID" ] && kill -0 "$HPID" 2>/dev/null; }

# Cuts (or restores) a rail and records the moment in the events file: CLOCK_MONOTONIC taken
# just before `ip` runs (the link goes down a few ms later; recovery is measured from here),
# and the same moment on the wall clock as a JSON line in EVENTS.jsonl (for the timeline), with
# when `ip` returned (on a loaded host it can take a while: the link went down in between).
act() { # act EVENTS cut|restore RAIL [END]
  local t u d
  t=$(now_ns)
  u=$(date +%s%3N)
  case "$KIND/$2/${4:-}" in
    down/cut/near) ip -n "$NS_A" link set "r$3a" down ;;
    down/cut/far) ip -n "$NS_B" link set "r$3b" down ;;
    blackhole/cut/*) ip -n "$NS_A" route add blackhole "10.88.$3.2/32"
                     ip -n "$NS_B" route add blackhole "10.88.$3.1/32" ;;
    oneway/cut/near) ip -n "$NS_A" route add blackhole "10.88.$3.2/32" ;;
    oneway/cut/far) ip -n "$NS_B" route add blackhole "10.88.$3.1/32" ;;
    */restore/*) ip -n "$NS_A" route del blackhole "10.88.$3.2/32" 2>/dev/null || true
                 ip -n "$NS_B" route del blackhole "10.88.$3.1/32" 2>/dev/null || true
                 ip -n "$NS_A" link set "r$3a" up; ip -n "$NS_B" link set "r$3b" up ;;
  esac
  d=$(date +%s%3N)
  if [ "$2" = cut ]; then echo "$t cut rail$3/$4" >>"$1"; else echo "$t restore rail$3" >>"$1"; fi
  printf '{"event":"%s","unix_ms":%s,"done_unix_ms":%s,"rail":%s%s}\n' "$2" "$u" "$d" "$3" "${4:+,\"end\":\"$4\"}" >>"$1.jsonl"
}

# One line for the --detect file: per side, how long after the first cut its first failover
# was detected (the stats file's detect_unix_ms against the cut's unix_ms), and why.
detection() { # detection DIR END
  python3 - "$1/events.jsonl" "$1/stats.jsonl" "$KIND" "$2" <<'PY'
import json, sys
def lines(p):
    try:
        return [json.loads(l) for l in open(p) if l.strip()]
    except (OSError, ValueError):
        return []
cuts = [e for e in lines(sys.argv[1]) if e.get("event") == "cut"]
if not cuts:
    print(f"kind={sys.argv[3]} end={sys.argv[4]} no-cut"); sys.exit(0)
cut = cuts[0]["unix_ms"]
first = {}
for e in lines(sys.argv[2]):
    if e.get("event") == "failover" and e.get("detect_unix_ms", 0) >= cut - 5:
        r = e.get("role", "?")
        if r not in first or e["detect_unix_ms"] < first[r]["detect_unix_ms"]:
            first[r] = e
out = [f"kind={sys.argv[3]}", f"end={sys.argv[4]}"]
for r in ("send", "recv"):
    out.append(f"{r}={first[r]['detect_unix_ms'] - cut}" if r in first else f"{r}=-")
for r in ("send", "recv"):
    if r in first:
        out.append(f"{r}_cause=\"{first[r].get('cause', '')}\"")
print(" ".join(out))
PY
}

# Draws drill N's timeline into $PICTURES (if asked); a failure to draw is said, not fatal.
picture() { # picture N DIR
  [ -n "$PICTURES" ] || return 0
  local ev=() out="$PICTURES/drill$1"
  [ -s "$2/events.jsonl" ] && ev=(--events "$2/events.jsonl")
  if "$HARNESS" timeline --stats "$2/stats.jsonl" --stream-timeline "$2/stream.json" "${ev[@]}" \
      --title "sock drill $1 ($mode, seed $SEED)" -o "$out.svg" --png "$out.png" >"$2/timeline.log" 2>&1; then
    echo "  timeline: $out.png ($out.svg)"
  else
    echo "  timeline: not drawn: $(tail -n1 "$2/timeline.log")"
  fi
}

RECOVERY=() BACK=() ERRAFTER=()
TOTAL_LOST=0 TOTAL_DUP=0 TOTAL_CORRUPT=0 TOTAL_REORD=0
PASSED=0 FAILED=0

run_drill() {
  local n=$1 dir="$WORK/drill$n" end=$END seed=$((SEED * 1000 + n)) rc=0
  mkdir -p "$dir"
  local ev="$dir/events" log="$dir/stream.log" js="$dir/stream.json"
  : >"$ev"; : >"$ev.jsonl"; rm -f "$dir/stats.jsonl"
  bash "$RAILS" restore 0; bash "$RAILS" restore 1
  local r; for r in 0 1; do
    ip -n "$NS_A" route del blackhole "10.88.$r.2/32" 2>/dev/null || true
    ip -n "$NS_B" route del blackhole "10.88.$r.1/32" 2>/dev/null || true
  done
  [ "$end" != random ] || { if [ $((RANDOM % 2)) = 0 ]; then end=near; else end=far; fi; }
  [ "$end" != alternate ] || { if [ $((n % 2)) = 1 ]; then end=near; else end=far; fi; }
  ip netns exec "$NS_A" env HA_NCCL_FABRIC=sock HA_NCCL_SOCK_RAILS=r0a,r1a NCCL_SOCKET_IFNAME=oa \
    HA_NCCL_STATS_FILE="$dir/stats.jsonl" HA_NCCL_STATS_INTERVAL_MS="$STATS_MS" \
    "${ENVS[@]}" "$HARNESS" stream --plugin "$PLUGIN" --mode procs \
    --child-prefix "ip netns exec $NS_B" \
    --child-env HA_NCCL_SOCK_RAILS=r0b,r1b --child-env NCCL_SOCKET_IFNAME=ob \
    --duration "$STREAM_S" --max-size "$MAX_SIZE" --window "$WINDOW" --seed "$seed" --timeout "$TIMEOUT" \
    --events "$ev" --json "$js" >"$log" 2>&1 &
  HPID=$!
  local t0=$SECONDS
  until grep -q '^stream: traffic started' "$log" 2>/dev/null; do
    alive || break
    [ $((SECONDS - t0)) -le "$TIMEOUT" ] || break
    sleep 0.02
  done
  local toggles=0
  if grep -q '^stream: traffic started' "$log" && [ "$NOCUT" = 0 ]; then
    if [ -n "$FLAP" ]; then
      local until_ms=$(( $(ms_of "$FLAP") )) spent=0 down=0 d
      while [ "$spent" -lt "$until_ms" ] && alive; do
        d=$(rand_between 500 3000)
        [ $((spent + d)) -le "$until_ms" ] || d=$((until_ms - spent))
        sleep_ms "$d"; spent=$((spent + d))
        alive || break
        if [ "$down" = 0 ]; then act "$ev" cut "$RAIL" "$end"; down=1; else act "$ev" restore "$RAIL"; down=0; fi
        toggles=$((toggles + 1))
      done
      [ "$down" = 0 ] || act "$ev" restore "$RAIL"
    else
      sleep_ms "$(rand_between "$CUT_MIN" "$CUT_MAX")"
      if alive; then act "$ev" cut "$RAIL" "$end"; fi
      if [ -n "$RESTORE" ]; then
        sleep_ms "$(ms_of "$RESTORE")"
        if alive; then act "$ev" restore "$RAIL"; fi
        if [ -n "$SECOND" ]; then
          sleep_ms "$(ms_of "$SECOND")"
          if alive; then act "$ev" cut $((1 - RAIL)) "$end"; fi
        fi
      fi
    fi
  fi
  t0=$SECONDS
  while alive && [ $((SECONDS - t0)) -le "$KILL_AFTER" ]; do sleep 0.05; done
  local hung=0
  if alive; then
    hung=1
    kill -KILL "$HPID" 2>/dev/null || true
    local p; for p in $(ip netns pids "$NS_B" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  fi
  wait "$HPID" || rc=$?
  HPID=""
  verdict "$n" "$end" "$log" "$rc" "$hung" "$toggles"
  [ -z "$DETECT" ] || detection "$dir" "$end" >>"$DETECT"
  picture "$n" "$dir"
}

# Judges one drill from its log and prints its line.
verdict() {
  local n=$1 end=$2 log=$3 rc=$4 hung=$5 toggles=$6
  local result msgs lost dup corrupt errors stall reord err err_at
  local head="drill $n:"
  fail() { echo "$head FAILED: $*"; FAILED=$((FAILED + 1)); FAILED_ANY=1; echo "  (log: $log)"; }
  if [ "$hung" = 1 ]; then fail "stream did not end within ${KILL_AFTER}s of its end (killed)"; return; fi
  result=$(grep -E '^messages [0-9]+, bytes [0-9]+' "$log" | tail -n1 || true)
  if [ -z "$result" ]; then
    fail "no result (exit $rc): $(grep -E 'error' "$log" | head -n1 || tail -n1 "$log")"
    return
  fi
  read -r msgs lost dup corrupt errors stall <<<"$(sed -E \
    's/messages ([0-9]+), bytes [0-9]+, lost ([0-9]+), duplicated ([0-9]+), corrupted ([0-9]+), errors ([0-9]+), max_stall_ms ([0-9]+)/\1 \2 \3 \4 \5 \6/' <<<"$result")"
  reord=$(sed -nE 's/^stream: sent .*, reordered ([0-9]+),.*/\1/p' "$log" | tail -n1)
  reord=${reord:-0}
  TOTAL_LOST=$((TOTAL_LOST + lost)) TOTAL_DUP=$((TOTAL_DUP + dup))
  TOTAL_CORRUPT=$((TOTAL_CORRUPT + corrupt)) TOTAL_REORD=$((TOTAL_REORD + reord))
  err=$(grep -m1 '^stream: error: ' "$log" | sed 's/^stream: error: //' || true)
  err_at=$(sed -nE 's/^side .* at ([0-9.]+) ms: .*/\1/p' <<<"$err")
  local counts="lost $lost, duplicated $dup, corrupted $corrupt, reordered $reord"
  if [ $((lost + dup + corrupt + reord)) -gt 0 ]; then
    fail "$counts ($(grep -m1 '^stream: first problem' "$log" || true))"
    return
  fi
  local cuts ev_lines
  ev_lines=$(grep '^event ' "$log" || true)
  cuts=$(grep ' label=cut ' <<<"$ev_lines" || true)
  if [ "$NOCUT" = 1 ] || [ -n "$FLAP" ]; then
    local what="no cut"
    [ -z "$FLAP" ] || what="flap rail$RAIL/$end x$toggles in ${FLAP}s"
    if [ "$errors" = 0 ] && [ "$rc" = 0 ]; then
      echo "$head $what → clean: $msgs messages, max stall ${stall} ms"
      PASSED=$((PASSED + 1))
    elif [ "$EXPECT" = error ] && [ -n "$FLAP" ] && grep -q 'nccl[A-Za-z]*Error' <<<"$err"; then
      echo "$head $what → clean error: $err"
      PASSED=$((PASSED + 1))
    else
      fail "$what: exit $rc, errors $errors: ${err:-see log}"
    fi
    return
  fi
  if [ -z "$cuts" ]; then fail "no cut happened (stream ended early? exit $rc: ${err:-})"; return; fi
  local first at rec stall_ms back recovered label which line="$head" c
  # The cut an error belongs to: the last one before it (else the first one).
  first=$(head -n1 <<<"$cuts")
  if [ -n "$err_at" ]; then
    while read -r c; do
      awk -v a="$(field at_ms "$c")" -v e="$err_at" 'BEGIN { exit !(a <= e) }' && first=$c
    done <<<"$cuts"
  fi
  at=$(field at_ms "$first")
  which=$(sed -nE 's/.* label=cut (.*)$/\1/p' <<<"$first")
  if [ "$EXPECT" = error ]; then
    if [ -z "$err" ] || [ "$errors" = 0 ]; then
      fail "cut=$which at ${at%.*} ms: expected the stream to fail, it passed"; return
    fi
    if ! grep -q 'nccl[A-Za-z]*Error' <<<"$err"; then
      fail "cut=$which at ${at%.*} ms: not a clean request error: $err"; return
    fi
    local after
    after=$(awk -v e="$err_at" -v c="$at" 'BEGIN { printf "%d", e - c + 0.5 }')
    if [ "$after" -lt 0 ] || [ "$after" -gt "$ERROR_WITHIN" ]; then
      fail "cut=$which at ${at%.*} ms: error after ${after} ms (bound ${ERROR_WITHIN}): $err"; return
    fi
    echo "$head cut=$which at ${at%.*} ms → error after ${after} ms (single path, expected): $err"
    ERRAFTER+=("$after")
    PASSED=$((PASSED + 1))
    return
  fi
  if [ "$errors" != 0 ] || [ "$rc" != 0 ]; then
    if [ -n "$err_at" ]; then
      fail "cut=$which at ${at%.*} ms: error after $(awk -v e="$err_at" -v c="$at" 'BEGIN { printf "%d", e - c + 0.5 }') ms: $err"
    else
      fail "cut=$which at ${at%.*} ms: ${err:-exit $rc}"
    fi
    return
  fi
  while read -r ev; do
    [ -n "$ev" ] || continue
    label=$(sed -nE 's/.* label=(.*)$/\1/p' <<<"$ev")
    at=$(field at_ms "$ev"); rec=$(field first_after_ms "$ev"); stall_ms=$(field stall_ms "$ev")
    back=$(field back_ms "$ev"); recovered=$(field recovered "$ev")
    case "$label" in
      cut\ *)
        which=${label#cut }
        if [ "$recovered" != yes ] || [ "$rec" = - ] || [ "$back" = - ]; then
          fail "cut=$which at ${at%.*} ms: traffic did not come back (stall ${stall_ms} ms)"; return
        fi
        line+=" cut=$which at ${at%.*} ms → recovered after ${rec} ms (longest stall ${stall_ms} ms, traffic back +${back} ms);"
        RECOVERY+=("$rec"); BACK+=("$back")
        ;;
      restore\ *)
        line+=" ${label} at ${at%.*} ms;"
        ;;
    esac
  done <<<"$ev_lines"
  echo "${line%;}"
  PASSED=$((PASSED + 1))
}

pct() { # pct P values... (nearest rank)
  local p=$1; shift
  [ $# -gt 0 ] || { echo "-"; return; }
  printf '%s\n' "$@" | sort -g | awk -v p="$p" '{ v[NR] = $1 } END { i = int((p * NR + 99) / 100); if (i < 1) i = 1; printf "%.1f", v[i] }'
}

for n in $(seq "$DRILLS"); do run_drill "$n"; done

if [ "${#RECOVERY[@]}" -gt 0 ]; then
  echo "summary: recovery (first completion after a cut) p50 $(pct 50 "${RECOVERY[@]}") ms, p99 $(pct 99 "${RECOVERY[@]}") ms; traffic back (end of the stall the cut caused) p50 $(pct 50 "${BACK[@]}") ms, p99 $(pct 99 "${BACK[@]}") ms (${#RECOVERY[@]} cuts)"
fi
if [ "${#ERRAFTER[@]}" -gt 0 ]; then
  echo "summary: cut → request error p50 $(pct 50 "${ERRAFTER[@]}") ms, p99 $(pct 99 "${ERRAFTER[@]}") ms (${#ERRAFTER[@]} drills)"
fi
echo "summary: lost $TOTAL_LOST, duplicated $TOTAL_DUP, corrupted $TOTAL_CORRUPT, reordered $TOTAL_REORD"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
