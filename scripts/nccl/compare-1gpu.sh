#!/usr/bin/env bash
# nccl-tests all_reduce_perf on ONE GPU with two ranks, through the network path, side by side:
# the HA plugin (standby on, and off), optionally a second build of the plugin (BASE_DIR), NCCL
# Socket default and NCCL Socket tuned (NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4), all in
# one call, ROUNDS rounds interleaved (so load changes hit every column alike), then one table
# of median times and ratios (scripts/nccl/compare_table.py).
#
#   scripts/nccl/compare-1gpu.sh NCCL_TESTS_BUILD_DIR OUT_DIR
#
# How two ranks share one GPU: each rank gets its own hostname (unshare --uts), so NCCL sees two
# hosts; MPS is started so the ranks' kernels do not time-slice (else every step waits ~4.5 ms).
# The plugin's rails are loopback addresses (HA_RAILS, default 127.0.0.1,127.0.0.2); Socket runs
# on lo. Env: PLUGIN_DIR (default dist/), BASE_DIR (a second plugin build, column "base"),
# ROUNDS (default 2), SIDES (default "ha ha-off base socket tuned", base only with BASE_DIR;
# `ha+VAR=VALUE` is the plugin with one more variable, e.g. ha+HA_NCCL_SOCK_INLINE=0;
# `socket+VAR=VALUE` the same for NCCL Socket, e.g. socket+NCCL_PROTO=Simple; several as
# `ha+A=1+B=2`),
# PERF_ARGS (default "-b 8 -e 256M -f 8 -g 1 -c 1 -w 5 -n 20"). Needs root (unshare), mpirun.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:?usage: compare-1gpu.sh NCCL_TESTS_BUILD_DIR OUT_DIR}
out=${2:?usage: compare-1gpu.sh NCCL_TESTS_BUILD_DIR OUT_DIR}
mkdir -p "$out"
plugin=$(cd "${PLUGIN_DIR:-$here/dist}" && pwd)
rounds=${ROUNDS:-2}
sides=${SIDES:-"ha ha-off ${BASE_DIR:+base} socket tuned"}
args=${PERF_ARGS:--b 8 -e 256M -f 8 -g 1 -c 1 -w 5 -n 20}
rails=${HA_RAILS:-127.0.0.1,127.0.0.2}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d 2>/dev/null || true
trap 'echo quit | nvidia-cuda-mps-control 2>/dev/null' EXIT
uts=$out/uts-rank.sh
cat > "$uts" <<'R'
#!/bin/sh
exec unshare --uts /bin/sh -c "echo rank$OMPI_COMM_WORLD_RANK >/proc/sys/kernel/hostname && exec \"\$@\"" sh "$@"
R
chmod +x "$uts"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --allow-run-as-root -np 2 --oversubscribe --bind-to none --mca btl self,tcp
     --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
     -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_NVLS_ENABLE=0 -x NCCL_SOCKET_IFNAME=lo
     -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_VISIBLE_DEVICES=0 -x NCCL_DEBUG=WARN)
ha_env() { echo -x NCCL_NET=HA -x NCCL_NET_PLUGIN=ha -x LD_LIBRARY_PATH="$1:${LD_LIBRARY_PATH:-}" \
  -x HA_NCCL_FABRIC=sock -x HA_NCCL_SOCK_RAILS="$rails"; }
# `A=1+B=2` -> -x A=1 -x B=2 (values without spaces or '+')
extra() { local kv; IFS=+ read -ra kv <<< "$1"; for v in "${kv[@]}"; do echo -x "$v"; done; }
fail=0
for r in $(seq 1 "$rounds"); do
  for s in $sides; do
    case "$s" in
      ha) env=($(ha_env "$plugin")) ;;
      ha-off) env=($(ha_env "$plugin") -x HA_NCCL_ENABLE_BACKUP=0) ;;
      ha+*=*) env=($(ha_env "$plugin") $(extra "${s#ha+}")) ;;
      base) env=($(ha_env "$(cd "$BASE_DIR" && pwd)")) ;;
      socket) env=(-x NCCL_NET=Socket) ;;
      socket+*=*) env=(-x NCCL_NET=Socket $(extra "${s#socket+}")) ;;
      tuned) env=(-x NCCL_NET=Socket -x NCCL_SOCKET_NTHREADS=4 -x NCCL_NSOCKS_PERTHREAD=4) ;;
      *) echo "compare-1gpu: unknown side $s" >&2; exit 2 ;;
    esac
    log=$out/${s//[^A-Za-z0-9_.+-]/_}.r$r.log
    if ! timeout 600 "${mpi[@]}" "${env[@]}" "$uts" "$bin/all_reduce_perf" $args >"$log" 2>&1; then
      echo "compare-1gpu: $s round $r failed:"; tail -15 "$log"; fail=1
    fi
    echo "== $s round $r: $(grep -c '^ *[0-9]' "$log") rows, $(grep -o 'Avg bus bandwidth.*' "$log")"
  done
done
cols=()
for s in $sides; do cols+=("${s//=/:}=$(ls "$out/${s//[^A-Za-z0-9_.+-]/_}".r*.log | paste -sd,)"); done
python3 "$here/scripts/nccl/compare_table.py" "${cols[@]}"
exit $fail
