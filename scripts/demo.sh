#!/usr/bin/env bash
# The main job on a machine without RDMA: install, build, then move verified data through the
# plugin's C ABI on the `sock` fabric (two processes, like two NCCL ranks) and print figures.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export HA_NCCL_FABRIC=sock NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
echo "== functional check through dist/libnccl-net-ha.so (two processes)"
dist/ha-harness check --plugin dist/libnccl-net-ha.so --mode procs
echo "== latency / bandwidth sweep"
dist/ha-harness bench --plugin dist/libnccl-net-ha.so --mode procs --min 8 --max 64M --factor 8
