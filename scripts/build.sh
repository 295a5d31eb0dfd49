#!/usr/bin/env bash
# Build the release plugin as dist/libnccl-net-ha.so (plus the ha-harness tool).
# Use it with: LD_LIBRARY_PATH=$PWD/dist NCCL_NET_PLUGIN=ha NCCL_NET=HA ...
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --lib --bin ha-harness
mkdir -p dist
cp -f target/release/libnccl_net_ha.so dist/libnccl-net-ha.so
cp -f target/release/ha-harness dist/ha-harness
echo "built $(pwd)/dist/libnccl-net-ha.so"
