#!/usr/bin/env bash
# Failover drills on real kernel verbs: boots the Soft-RoCE guest once and runs
# guest/drill.sh for each mode (far-end down -> PORT_ERR + RETRY_EXC path, near-end down ->
# PORT_ERR, blackhole -> retry/RTO path with no event). Needs dist/ (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x dist/ha-harness ] || bash scripts/build.sh
SR_TIMEOUT=${SR_TIMEOUT:-900} exec bash scripts/softroce/run-in-vm.sh \
  bash scripts/softroce/guest/drill.sh "down far" "down near" "blackhole far"
