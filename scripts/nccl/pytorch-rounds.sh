#!/usr/bin/env bash
# Communicators re-created in one process through the HA plugin, once per remedy for NCCL
# 2.28/2.29's plugin reload (see README "Re-creating communicators"): two PyTorch ranks on ONE
# GPU (distinct NCCL hosts via NCCL_HOSTID, MPS on), forced onto the network path
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=HA NCCL_NVLS_ENABLE=0; sock fabric on two
# loopback rails, so every connection has a standby path),
# each running scripts/nccl/pytorch-rounds.py: ROUNDS x (init_process_group -> all_reduce,
# broadcast, send/recv, all_to_all, sub-group -> destroy_process_group), results checked.
#
#   scripts/nccl/pytorch-rounds.sh LOG_DIR [PLUGIN_DIR]
#
# PLUGIN_DIR holds libnccl-net-ha.so (default <repo>/dist). Remedies (REMEDIES, default all):
#   none          NCCL_NET_PLUGIN=ha only. On NCCL 2.28/2.29 round 1 is expected to fail
#                 ("Could not find: libnccl-net.so", "Failed to initialize any NET plugin"),
#                 and the plugin's WARN naming NCCL_NET_PLUGIN_REF_COUNT to be in round 0's log.
#   ref-count     NCCL_NET_PLUGIN_REF_COUNT=1: NCCL never unloads the plugin.
#   default-name  the library also reachable as libnccl-net.so (symlinks in a folder on
#                 LD_LIBRARY_PATH): NCCL's unnamed reload finds it.
# Prints one line per remedy: PASS (every round passed) or FAIL, what was expected on this
# NCCL, rounds passed, whether the plugin's WARN was logged, and the first error. Logs:
# LOG_DIR/<remedy>/rank{0,1}.log. Exit 0 when every remedy did what it is expected to do.
#
# Env: PYTHON (python3), ROUNDS (3), ROUND_TIMEOUT (seconds per round, 120), REMEDIES,
# MASTER_PORT (base port, 29600; each remedy and round uses its own), DEVICE (GPU index, 0).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: pytorch-rounds.sh LOG_DIR [PLUGIN_DIR]}
plugin=${2:-$here/dist}
[ -f "$plugin/libnccl-net-ha.so" ] || { echo "no $plugin/libnccl-net-ha.so (scripts/build.sh)" >&2; exit 2; }
plugin=$(cd "$plugin" && pwd)
py=${PYTHON:-python3}
rounds=${ROUNDS:-3}
round_timeout=${ROUND_TIMEOUT:-120}
remedies=${REMEDIES:-none ref-count default-name}
base_port=${MASTER_PORT:-29600}
device=${DEVICE:-0}
mkdir -p "$out"
out=$(cd "$out" && pwd)

nccl=$("$py" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null) ||
  { echo "cannot import torch with $py" >&2; exit 2; }
minor=$(echo "$nccl" | cut -d. -f2)
# NCCL 2.28.x and 2.29.x forget the plugin's name when they unload it (fixed in 2.30).
if [ "$(echo "$nccl" | cut -d. -f1)" = 2 ] && [ "$minor" -ge 28 ] && [ "$minor" -lt 30 ]; then
  expect_none=FAIL
else
  expect_none=PASS
fi
echo "PyTorch's NCCL: $nccl; plugin: $plugin/libnccl-net-ha.so; $rounds rounds per remedy; logs in $out"

# MPS: without it the two ranks' kernels time-slice the GPU (slow, not wrong).
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mpslog}
mps_started=0
if command -v nvidia-cuda-mps-control >/dev/null; then
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! pgrep -x nvidia-cuda-mps >/dev/null 2>&1 && nvidia-cuda-mps-control -d; then
    mps_started=1
  fi
fi
cleanup() {
  [ "$mps_started" = 1 ] && echo quit | nvidia-cuda-mps-control
}
trap cleanup EXIT

status=0
i=0
for remedy in $remedies; do
  dir="$out/$remedy"
  rm -rf "$dir"; mkdir -p "$dir"
  libdir=$plugin
  extra=()
  case "$remedy" in
    none) ;;
    ref-count) extra=(NCCL_NET_PLUGIN_REF_COUNT=1) ;;
    default-name)
      libdir="$dir/lib"; mkdir -p "$libdir"
      ln -s "$plugin/libnccl-net-ha.so" "$libdir/libnccl-net-ha.so"
      ln -s "$plugin/libnccl-net-ha.so" "$libdir/libnccl-net.so" ;;
    *) echo "unknown remedy $remedy (none, ref-count, default-name)" >&2; exit 2 ;;
  esac
  port=$((base_port + 10 * i)); i=$((i + 1))
  pids=()
  for r in 0 1; do
    env -u NCCL_NET_PLUGIN_REF_COUNT \
      LD_LIBRARY_PATH="$libdir:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=ha NCCL_NET=HA \
      HA_NCCL_FABRIC=sock HA_NCCL_SOCK_RAILS=127.0.0.1,127.0.0.2 NCCL_SOCKET_IFNAME=lo \
      NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      NCCL_NVLS_ENABLE=0 NCCL_HOSTID="ha-rounds-rank$r" CUDA_VISIBLE_DEVICES="$device" DEVICE=0 \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
      RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      ROUNDS=$rounds ROUND_TIMEOUT=$round_timeout "${extra[@]}" \
      timeout -k 10 $((rounds * round_timeout + 60)) "$py" -u "$here/scripts/nccl/pytorch-rounds.py" \
      > "$dir/rank$r.log" 2>&1 &
    pids+=($!)
  done
  rcs=()
  for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
  passed=$(grep -c '^round [0-9]*: ok' "$dir/rank0.log")
  if [ "${rcs[0]}" = 0 ] && [ "${rcs[1]}" = 0 ] &&
     grep -q "^ROUNDS PASSED $rounds/$rounds" "$dir/rank0.log" &&
     grep -q "^ROUNDS PASSED $rounds/$rounds" "$dir/rank1.log"; then
    result=PASS
  else
    result=FAIL
  fi
  expect=PASS
  [ "$remedy" = none ] && expect=$expect_none
  warned=no
  grep -q "NET/HA : NCCL .* unloads a net plugin" "$dir/rank0.log" "$dir/rank1.log" && warned=yes
  # The first error: the round's own report, else NCCL's complaint, else a hang or an exit code.
  err=$(grep -h -m1 -E '^round [0-9]+: (FAILED|WRONG)' "$dir/rank0.log" "$dir/rank1.log" | head -1)
  [ -z "$err" ] && err=$(grep -h -m1 -E 'Could not find: libnccl-net.so|Failed to initialize any NET plugin' \
    "$dir/rank0.log" "$dir/rank1.log" | head -1 | sed 's/^.*NCCL WARN //')
  [ -z "$err" ] && grep -qh '^Timeout (' "$dir/rank0.log" "$dir/rank1.log" && err="a round hung (stacks in the logs)"
  [ -z "$err" ] && [ "$result" = FAIL ] && err="exit codes ${rcs[*]}"
  nccl_msg=$(grep -h -m1 -E 'Could not find: libnccl-net.so|Failed to initialize any NET plugin' \
    "$dir/rank0.log" | head -1 | sed 's/^.*NCCL \(WARN\|INFO\) //')
  line=$(printf '%-13s %s (expected %s on NCCL %s)  rounds passed %s/%s  plugin WARN: %s' \
    "$remedy" "$result" "$expect" "$nccl" "$passed" "$rounds" "$warned")
  [ -n "$err" ] && line="$line  first error: ${err:0:300}"
  [ -n "$nccl_msg" ] && [ "$nccl_msg" != "$err" ] && line="$line  NCCL: ${nccl_msg:0:200}"
  echo "$line"
  [ "$result" = "$expect" ] || status=1
  # The remedies must silence the WARN; without one (on 2.28/2.29) it must be there.
  if [ "$remedy" = none ] && [ "$expect_none" = FAIL ]; then
    [ "$warned" = yes ] || { echo "   (the plugin's WARN about NCCL_NET_PLUGIN_REF_COUNT is missing)"; status=1; }
  elif [ "$warned" = yes ]; then
    echo "   (unexpected WARN about NCCL_NET_PLUGIN_REF_COUNT)"; status=1
  fi
done
echo "logs in $out"
exit $status
