#!/usr/bin/env bash
# Instructions per call of the plugin's hot entry points (isend, irecv, test) and per round
# trip, counted by valgrind's callgrind over one 8 B `ha-harness bench` ping-pong (threads
# mode: both sides in one process) on the `sock` fabric over two loopback rails. Counted, not
# timed: a build gives the same figures on any x86-64 machine, busy or idle, up to the timer
# duties (they run by the clock, and valgrind runs the code ~50x slower, so they run far more
# often per call here than natively). Give several libraries to compare them in one table.
#
# Repeat a build (base=A new=B base2=A new2=B) to see the spread: isend and irecv per call
# repeat within about 1 %, test() within about 7 % (its empty polls depend on timing).
#
# usage: scripts/bench/call-cost.sh [--iters N] [--keep DIR] NAME=LIB [NAME=LIB ...]
#   NAME=LIB   a label and a plugin library with symbols (target/release/libnccl_net_ha.so;
#              dist/'s is stripped)
# Needs valgrind (apt-get install -y valgrind) and dist/ha-harness (scripts/build.sh).
set -euo pipefail
usage() { sed -n '2,16p' "$0"; }
ITERS=3000 KEEP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --iters) [ $# -ge 2 ] || { usage; exit 2; }; ITERS=$2; shift 2 ;;
    --keep) [ $# -ge 2 ] || { usage; exit 2; }; KEEP=$(realpath -m "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { usage; exit 2; }
specs=()
for spec in "$@"; do
  case "$spec" in *=*) ;; *) echo "call-cost: $spec: expected NAME=LIB" >&2; exit 2 ;; esac
  lib=${spec#*=}
  [ -f "$lib" ] || { echo "call-cost: $lib: no such library" >&2; exit 2; }
  # Resolved before the cd below (a relative path names a file where the caller is).
  specs+=("${spec%%=*}=$(realpath "$lib")")
done
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "call-cost: valgrind is missing (apt-get install -y valgrind)" >&2; exit 2; }
[ -x dist/ha-harness ] || { echo "call-cost: dist/ha-harness is missing (scripts/build.sh)" >&2; exit 2; }
dir=${KEEP:-$(mktemp -d)}
[ -n "$KEEP" ] || trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir"
cols=()
for spec in "${specs[@]}"; do
  name=${spec%%=*} lib=${spec#*=}
  rm -f "$dir/$name".cg.*
  HA_NCCL_FABRIC=sock NCCL_SOCKET_IFNAME=lo HA_NCCL_SOCK_RAILS=127.0.0.1,127.0.0.2 \
    valgrind --tool=callgrind --callgrind-out-file="$dir/$name.cg.%p" \
    dist/ha-harness bench --plugin "$lib" --mode threads --min 8 --max 8 --iters "$ITERS" \
    --bw-bytes 8K --bw-max-msgs 100 --timeout 300 > "$dir/$name.log" 2>&1 ||
    { tail -20 "$dir/$name.log"; echo "call-cost: $name failed" >&2; exit 1; }
  cols+=("$name=$(ls "$dir/$name".cg.* | paste -sd,)")
  echo "$name: $lib (md5 $(md5sum < "$lib" | cut -c1-8)), $(grep -E '^ +8 \|' "$dir/$name.log" | tr -s ' ')"
done
python3 scripts/bench/callgrind_cost.py "${cols[@]}"
