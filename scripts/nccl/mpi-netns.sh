#!/usr/bin/env bash
# Runs a command as two MPI ranks, rank 0 in network namespace ha-a and rank 1 in ha-b
# (scripts/netns/rails.sh), so that each rank has its own plugin instance and its own ends of
# the two `sock` rails, which can then be cut from outside the processes
# (`scripts/netns/rails.sh cut 0 near`).
#
#   scripts/nccl/mpi-netns.sh COMMAND [ARGS...]        e.g. .../all_reduce_perf -b 8 -e 1G -g 1
#
# How: mpirun runs inside ha-a; the second "host" is ha-b's out-of-band address 10.88.9.2, and
# the rsh agent (this script, called with --agent) starts the remote daemon inside ha-b with its
# own hostname (UTS namespace), so MPI and NCCL see two nodes. MPI itself talks over the
# out-of-band link only (10.88.9.0/24), never over the rails. Each rank gets its side's plugin
# environment (`rails.sh env a|b`), CUDA_VISIBLE_DEVICES=<rank> (override with HA_RANK_GPUS="0 1")
# and whatever the caller exported (every NCCL_*, HA_NCCL_*, LD_LIBRARY_PATH, PATH is forwarded).
# HA_MPI_TAG=1 prefixes every output line with its rank ([1,R]<stdout>:).
# Needs root, iproute2 (`ip`), `unshare`, OpenMPI's mpirun; brings the namespaces up if needed
# (left up: `scripts/netns/rails.sh down` removes them).
set -euo pipefail
# These GPU-machine scripts name the namespaces ha-a/ha-b (one run per machine at a time):
# rails.sh needs the prefix said explicitly.
export HA_RAILS_PREFIX=${HA_RAILS_PREFIX:-ha-}
here=$(cd "$(dirname "$0")/../.." && pwd)
self="$here/scripts/nccl/mpi-netns.sh"
rails="$here/scripts/netns/rails.sh"

case "${1:-}" in
  --agent)
    # Called by mpirun as: AGENT HOST REMOTE-COMMAND... (run through sh on the "remote" node).
    shift
    host=$1; shift
    case "$host" in
      10.88.9.2|ha-b) ns=ha-b; name=ha-b ;;
      10.88.9.1|ha-a) ns=ha-a; name=ha-a ;;
      *) echo "mpi-netns: unknown host $host" >&2; exit 1 ;;
    esac
    exec ip netns exec "$ns" unshare --uts /bin/sh -c "echo $name >/proc/sys/kernel/hostname && $*"
    ;;
  --rank)
    # Runs on each rank: the side's environment, then the command.
    shift
    r=${OMPI_COMM_WORLD_RANK:?not started by mpirun}
    if [ "$r" = 0 ]; then side=a; else side=b; fi
    gpus=(${HA_RANK_GPUS:-0 1})
    export CUDA_VISIBLE_DEVICES=${gpus[$r]}
    for kv in $("$rails" env "$side"); do export "$kv"; done
    exec "$@"
    ;;
esac

[ $# -ge 1 ] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
ip netns list 2>/dev/null | grep -qw ha-a || "$rails" up >/dev/null
fwd=()
for v in $(env | sed -n 's/^\(\(NCCL_\|HA_NCCL_\|HA_RANK_\|LD_LIBRARY_PATH\|PATH\|CUDA_\)[A-Za-z0-9_]*\)=.*/\1/p'); do
  case "$v" in HA_NCCL_SOCK_RAILS|NCCL_SOCKET_IFNAME|CUDA_VISIBLE_DEVICES) continue ;; esac
  fwd+=(-x "$v")
done
unset OMPI_MCA_plm  # some images force the "isolated" launcher (local processes only)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec ip netns exec ha-a unshare --uts /bin/sh -c 'echo ha-a >/proc/sys/kernel/hostname && exec "$@"' sh \
  mpirun --allow-run-as-root -np 2 --host 10.88.9.1:1,10.88.9.2:1 \
  --mca plm rsh --mca plm_rsh_agent "$self --agent" --mca plm_rsh_no_tree_spawn 1 \
  --mca oob_tcp_if_include 10.88.9.0/24 --mca btl self,tcp --mca btl_tcp_if_include 10.88.9.0/24 \
  --mca pml ob1 --bind-to none ${HA_MPI_TAG:+--tag-output} \
  "${fwd[@]}" "$self" --rank "$@"
