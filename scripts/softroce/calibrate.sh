#!/usr/bin/env bash
# The detection calibration curve on real kernel verbs (#19 item 2; a benchmark, not a test):
# in one Soft-RoCE guest boot, for each impairment of the primary rail (netem: delay and
# jitter, random loss, flaps) and each setting (soft timeout HA_NCCL_RTO_MS x the QP's
# hardware window HA_NCCL_QP_TIMEOUT with 6 retries), a verified two-way stream through the
# plugin runs IMPAIR_S seconds under the impairment — every failover then is a false one — and
# then the rail is blackholed: the failovers after it give the detection time. Prints a table
# and saves it, with a picture (SVG + PNG, drawn by scripts/calibration_plot.py and
# `ha-harness svg2png`), to bench/results/<date>-softroce-detection-calibration.* (CAL_OUT
# overrides the stem). Needs dist/ (scripts/build.sh).
#
#   scripts/softroce/calibrate.sh                 # the default grid (~20 min)
#   CAL_IMPAIR="none delay:20:10" CAL_SETTINGS="1000/14" scripts/softroce/calibrate.sh
#
# Knobs: CAL_IMPAIR (impairments: none, delay:<ms>:<jitter ms> (netem's default queue reorders
# packets), jitter:<ms>:<jitter ms> (the same delays in order), loss:<percent>,
# flap:<down ms>:<period ms>), CAL_SETTINGS (RTO_MS/QP_TIMEOUT pairs), IMPAIR_S (20),
# AFTER_S (10), CAL_BREAK (how rail A fails after the impairment: blackhole-far, the default,
# blackhole-near, blackhole-both, down-far, down-near). The hardware window of QP_TIMEOUT t
# with 6 retries is 7 x 4.096 us x 2^t (12: 117 ms, 14: 470 ms, 16: 1.9 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
impairs=${CAL_IMPAIR:-none delay:5:2 jitter:5:2 delay:20:10 jitter:20:10 jitter:60:30 loss:2 loss:10 flap:150:2000}
settings=${CAL_SETTINGS:-300/12 300/14 1000/14 1000/16 3000/16}
stem=${CAL_OUT:-bench/results/$(date +%F)-softroce-detection-calibration}
[ -x dist/ha-harness ] || bash scripts/build.sh
points=()
for s in $settings; do for i in $impairs; do points+=("$i/$s"); done; done
share=${SR_WORK:-/tmp/softroce}/share/calibrate.$$
mkdir -p "$share"
trap 'rm -rf "$share"' EXIT
log=$(mktemp)
t0=$SECONDS
load0=$(cut -d' ' -f1-3 /proc/loadavg)
IMPAIR_S=${IMPAIR_S:-20} AFTER_S=${AFTER_S:-10} SR_PASSENV="IMPAIR_S AFTER_S CAL_BREAK ${SR_PASSENV:-}" \
  SR_TIMEOUT=${SR_TIMEOUT:-3000} bash scripts/softroce/run-in-vm.sh \
  bash scripts/softroce/guest/calibrate.sh "$share" "${points[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
load1=$(cut -d' ' -f1-3 /proc/loadavg)
grep '^POINT ' "$log" > "$stem.tsv" || { echo "calibrate: no points measured (rc=$rc)"; exit 1; }
mkdir -p "$stem.d"
cp "$share"/* "$stem.d/" 2> /dev/null || true
python3 scripts/calibration_plot.py "$stem.tsv" "$stem.svg" "$stem.d" > "$stem.table.md"
tar czf "$stem-points.tgz" -C "$(dirname "$stem")" "$(basename "$stem").d" && rm -rf "$stem.d"
dist/ha-harness svg2png "$stem.svg" "$stem.png"
{
  echo "# Detection calibration on Soft-RoCE: impairments of the primary rail x settings (#19 item 2)"
  echo
  echo "$(date -u '+%F %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' + uncommitted changes in crates/')."
  echo
  echo '```'
  echo "CAL_IMPAIR=\"$impairs\" CAL_SETTINGS=\"$settings\" IMPAIR_S=${IMPAIR_S:-20} AFTER_S=${AFTER_S:-10} scripts/softroce/calibrate.sh"
  echo '```'
  echo
  echo "* Guest: the Soft-RoCE QEMU/TCG guest (rdma_rxe), primary rail A (rxe0a <-> rxe0b), standby rail B; a two-way \`ha-harness stream --mode procs --max-size 64K\` (every message verified) per point, HA_NCCL_QP_RETRY_CNT=6, HA_NCCL_RTO_ADAPTIVE=0, heartbeats 200 ms."
  echo "* Per point: IMPAIR_S s under the impairment (netem on both ends of rail A; flap = 100 % loss for the first number of ms every second number of ms) — every failover there is **false** (rail A works, only worse); then rail A blackholed (netem loss 100 % at the far end, no port event) for AFTER_S s: the failovers from rail A after it give the **detection** time (from the blackhole to the failover's detection, per connection that failed over)."
  echo "* Host load average $load0 before, $load1 after; guest run $((SECONDS - t0)) s (rc=$rc)."
  echo
  cat "$stem.table.md"
  echo
  echo "Picture: $(basename "$stem").png (and .svg). Raw lines: $(basename "$stem").tsv; per point k (line k of the .tsv), the stats file and the failover/re-arm lines: $(basename "$stem")-points.tgz."
} > "$stem.md"
rm -f "$stem.table.md"
cat "$stem.md"
exit "$rc"
