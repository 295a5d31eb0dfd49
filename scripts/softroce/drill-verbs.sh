#!/usr/bin/env bash
# Failover drills on real kernel verbs: boots the Soft-RoCE guest once and runs
# guest/drill.sh for each mode (far-end down -> PORT_ERR + RETRY_EXC path, near-end down ->
# PORT_ERR, blackhole -> retry/RTO path with no event). Needs dist/ (scripts/build.sh).
#
# usage: drill-verbs.sh [--pictures DIR] [MODE...]     (MODE: "down far", "down near",
#                                                      "blackhole far"; default all three)
# --pictures DIR: draw each drill's timeline (ha-harness timeline) as DIR/verbs-<n>-<mode>.png
# and .svg, from the stats file, stream JSON, events and NCCL log the guest leaves on the share;
# the stats file and events are kept beside them (.stats.jsonl, .events.jsonl).
set -euo pipefail
cd "$(dirname "$0")/../.."
pictures=""
if [ "${1:-}" = --pictures ]; then pictures=${2:?--pictures needs a folder}; shift 2; fi
[ $# -gt 0 ] || set -- "down far" "down near" "blackhole far"
[ -x dist/ha-harness ] || bash scripts/build.sh
rc=0
if [ -z "$pictures" ]; then
  SR_TIMEOUT=${SR_TIMEOUT:-900} bash scripts/softroce/run-in-vm.sh \
    bash scripts/softroce/guest/drill.sh "$@" || rc=$?
  exit $rc
fi
mkdir -p "$pictures"
out=${SR_WORK:-/tmp/softroce}/share/drill-verbs.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
DRILL_OUT=$out SR_PASSENV="DRILL_OUT ${SR_PASSENV:-}" SR_TIMEOUT=${SR_TIMEOUT:-900} \
  bash scripts/softroce/run-in-vm.sh bash scripts/softroce/guest/drill.sh "$@" || rc=$?
for d in "$out"/*/; do
  d=${d%/}
  [ -f "$d/stats.jsonl" ] || continue
  name=verbs-$(basename "$d")
  cp "$d/stats.jsonl" "$pictures/$name.stats.jsonl"
  [ -f "$d/events.jsonl" ] && cp "$d/events.jsonl" "$pictures/$name.events.jsonl"
  if dist/ha-harness timeline --stats "$d/stats.jsonl" --stream-timeline "$d/stream.json" \
      --events "$d/events.jsonl" --nccl-log "$d/nccl.log" --title "Soft-RoCE verbs drill: $(basename "$d")" \
      -o "$pictures/$name.svg" --png "$pictures/$name.png" > "$d/timeline.log" 2>&1; then
    echo "timeline: $pictures/$name.png ($pictures/$name.svg)"
  else
    echo "timeline of $(basename "$d") not drawn: $(tail -n1 "$d/timeline.log")"
  fi
done
exit $rc
