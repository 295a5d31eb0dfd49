#!/usr/bin/env bash
# The failover drills (crates/nccl-net-ha/tests/ha_netns) under a mixed load, as on a busy
# training host: one busy loop per core, a parallel cargo build of the workspace (cleaned and
# rebuilt in a loop, in a target folder of its own), and a rank paused at random in every
# drill (HA_PAUSE=1: kill -STOP for 0.5-3 s). Prints the drills' lines, the load it ran under
# (load average samples) and the totals: drills passed/failed, false standby losses from the
# stats. Needs root and iproute2 (the drills' network namespaces).
#
# usage: mixed-load.sh [--drills N] [--no-build-load] [--log FILE]
#   --drills N        drills per end (HA_DRILLS, default 50: 100 drills plus the double cut)
#   --no-build-load   skip the parallel cargo build (busy loops and pauses only)
#   --log FILE        also keep the whole output in FILE
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DRILLS=50 BUILD=1 LOG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --drills) DRILLS=$2; shift 2 ;;
    --no-build-load) BUILD=0; shift ;;
    --log) LOG=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "mixed-load: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "mixed-load: must run as root (network namespaces)" >&2; exit 2; }
cd "$ROOT"
# The drills' binary first, without load (so the build load below is the only build).
cargo test --release -p nccl-net-ha --test ha_netns --no-run >/dev/null 2>&1
BIN=$(ls -t target/release/deps/ha_netns-* | grep -v '\.d$' | head -n1)
LOADDIR=$(mktemp -d /tmp/mixed-load.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -- -"$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  rm -rf "$LOADDIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$(nproc)"); do
  setsid bash -c 'while :; do :; done' & PIDS+=($!)
done
if [ "$BUILD" = 1 ]; then
  setsid bash -c "while :; do CARGO_TARGET_DIR='$LOADDIR/target' cargo build -q --workspace >/dev/null 2>&1; rm -rf '$LOADDIR/target'; done" &
  PIDS+=($!)
fi
setsid bash -c 'while :; do echo "load: $(date +%T) $(cut -d" " -f1-3 /proc/loadavg)"; sleep 30; done' & PIDS+=($!)
echo "mixed-load: $(nproc) busy loops, build load $BUILD, HA_DRILLS=$DRILLS HA_PAUSE=1, commit $(git rev-parse --short HEAD), $(uname -r)"
run() { HA_DRILLS=$DRILLS HA_PAUSE=1 "$BIN"; }
if [ -n "$LOG" ]; then run 2>&1 | tee "$LOG"; else run; fi
