#!/usr/bin/env bash
# PyTorch DDP (scripts/nccl/ddp_train.py) as two ranks, one per network namespace, through the HA
# plugin on the `sock` fabric over two rails (scripts/netns/rails.sh), optionally cutting
# rails mid-run from outside the processes:
#
#   CUT=0 scripts/nccl/ddp-failover.sh OUT_DIR     # uncut reference run
#   CUT=1 scripts/nccl/ddp-failover.sh OUT_DIR     # cut rail0 at step CUT_AT, restore it at
#                                                  # RESTORE_AT, then (after the re-arm) cut rail1
#
# Prints rank 0's final line (loss + weights checksum), the failover WARN lines and stats, and
# draws the run's timeline (`ha-harness timeline`) as OUT_DIR/<tag>-timeline.png and .svg from
# both ranks' stats files (periodic lines every STATS_MS, default 500), the cuts and the logs.
# Needs dist/libnccl-net-ha.so and dist/ha-harness, root, iproute2 (`ip` on PATH), and 2 GPUs —
# or one: HA_RANK_GPUS="0 0" puts both ranks on GPU 0 (each rank is its own NCCL host through
# NCCL_HOSTID; start MPS first, or every step waits for a GPU time slice).
set -euo pipefail
# These GPU-machine scripts name the namespaces ha-a/ha-b (one run per machine at a time):
# rails.sh needs the prefix said explicitly.
export HA_RAILS_PREFIX=${HA_RAILS_PREFIX:-ha-}
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: ddp-failover.sh OUT_DIR}; mkdir -p "$out"
pair="$here/scripts/netns/rails.sh"
tag=${TAG:-cut$CUT}
export STEPS=${STEPS:-2000}
CUT_AT=${CUT_AT:-400}; RESTORE_AT=${RESTORE_AT:-800}; CUT2_AT=${CUT2_AT:-1400}
events="$out/$tag-events.jsonl"; : >"$events"
# Runs a link command and records it for the timeline: when it was issued and when it returned.
act() { # act EVENT LABEL COMMAND...
  local e=$1 l=$2 u d; shift 2
  u=$(date +%s%3N); "$@" | tee -a "$out/$tag-cuts.log"; d=$(date +%s%3N)
  printf '{"event":"%s","unix_ms":%s,"done_unix_ms":%s,"label":"%s"}\n' "$e" "$u" "$d" "$l" >>"$events"
}
rm -f "$out"/stats-"$tag"-rank*.json
"$pair" up >/dev/null
gpus=(${HA_RANK_GPUS:-0 1})
rank() {  # rank side gpu
  local envs; envs=$("$pair" env "$2")
  ip netns exec "ha-$2" env $envs RANK="$1" LOCAL_RANK=0 WORLD_SIZE=2 CUDA_VISIBLE_DEVICES="$3" \
    NCCL_HOSTID="ha-ddp-rank$1" \
    MASTER_ADDR=10.88.9.1 MASTER_PORT=29511 \
    LD_LIBRARY_PATH="$here/dist" NCCL_NET_PLUGIN=ha NCCL_NET=HA NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
    NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    HA_NCCL_STATS_FILE="$out/stats-$tag-rank$1.json" HA_NCCL_STATS_INTERVAL_MS="${STATS_MS:-500}" CUBLAS_WORKSPACE_CONFIG=:4096:8 \
    python3 "$here/scripts/nccl/ddp_train.py" > "$out/$tag-rank$1.log" 2>&1
}
rank 0 a "${gpus[0]}" & p0=$!
rank 1 b "${gpus[1]}" & p1=$!
wait_for() {  # pattern file pid
  until grep -q "$1" "$2" 2>/dev/null; do kill -0 "$3" 2>/dev/null || return 1; sleep 0.05; done
}
if [ "${CUT:-0}" = 1 ]; then
  wait_for "^step $CUT_AT " "$out/$tag-rank0.log" $p0 && act cut "cut rail 0 (near)" "$pair" cut 0 near
  wait_for "^step $RESTORE_AT " "$out/$tag-rank0.log" $p0 && act restore "restore rail 0" "$pair" restore 0
  if wait_for "re-armed as the standby" "$out/$tag-rank0.log" $p0 && wait_for "^step $CUT2_AT " "$out/$tag-rank0.log" $p0; then
    act cut "cut rail 1 (far)" "$pair" cut 1 far
  fi
fi
rc=0; wait $p0 || rc=$?; wait $p1 || rc=$((rc ? rc : $?))
"$pair" down >/dev/null
echo "== $tag: exit $rc"
grep -hE "^final loss|NET/HA : failover|re-armed|Using network" "$out/$tag-rank0.log" "$out/$tag-rank1.log" | sed 's/^[^ ]* [^ ]* //' | sort -u | head -20
stats=(); for f in "$out"/stats-"$tag"-rank*.json; do [ -f "$f" ] && stats+=(--stats "$f"); done
if [ "${#stats[@]}" -gt 0 ]; then
  for f in "$out"/stats-"$tag"-rank*.json; do "$here/dist/ha-harness" stats --all "$f" | head -8 || true; done
  "$here/dist/ha-harness" timeline "${stats[@]}" --events "$events" \
    --nccl-log "$out/$tag-rank0.log" --nccl-log "$out/$tag-rank1.log" \
    --title "PyTorch DDP, 2 ranks ($tag, $(hostname))" \
    -o "$out/$tag-timeline.svg" --png "$out/$tag-timeline.png" || echo "(timeline not drawn)"
fi
exit $rc
