#!/usr/bin/env bash
# The main job on a machine without RDMA: install, build, move verified data through the
# plugin's C ABI on the `sock` fabric (two processes, like two NCCL ranks), print figures, and
# survive rail cuts in a failover drill.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export HA_NCCL_FABRIC=sock NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
echo "== functional check through dist/libnccl-net-ha.so (two processes)"
dist/ha-harness check --plugin dist/libnccl-net-ha.so --mode procs
echo "== latency / bandwidth sweep"
dist/ha-harness bench --plugin dist/libnccl-net-ha.so --mode procs --min 8 --max 64M --factor 8
# The point of the plugin: a rail dies mid-stream and nothing is lost. Two network namespaces
# joined by two veth rails; rail 0 is cut, restored (re-arm), then rail 1 is cut. The drill's
# timeline (throughput per path, cut, detection, switch, stall, re-arm) is drawn into
# dist/demo/drill1.png (and .svg).
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null 2>&1; then
  echo "== failover drill: cut rail 0, restore it, cut rail 1 (two processes, two namespaces)"
  bash scripts/drill/sock-drill.sh --drills 1 --restore 1 --second-cut 1 --pictures dist/demo \
    --env HA_NCCL_SOCK_RETRY_MS=300 --env HA_NCCL_REARM_HOLD_MS=200 --env HA_NCCL_HEARTBEAT_MS=100
  if [ -f dist/demo/drill1.png ]; then
    echo "== the drill as a picture: $PWD/dist/demo/drill1.png (and drill1.svg)"
  fi
else
  echo "== failover drill skipped: needs root and iproute2 (network namespaces)"
fi
