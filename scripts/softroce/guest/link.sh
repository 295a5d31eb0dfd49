#!/bin/bash
# Break or repair one rail of the Soft-RoCE guest (for failover tests; run inside the guest).
#
#   link.sh A|B down      [far|near]   admin-down one end's veth (default: far = p0b/p1b).
#                                      far: the near QPs fail with RETRY_EXC_ERR (12) after
#                                      ~(retry_cnt+1) x timeout; both ports go DOWN (PORT_ERR).
#                                      near: PORT_ERR always; the QP fails with LOC_QP_OP_ERR
#                                      (2) or, on rxe 6.1, sometimes never completes.
#   link.sh A|B blackhole [far|near]   drop everything that end sends (netem loss 100%);
#                                      ports stay ACTIVE, no event, QPs -> RETRY_EXC_ERR.
#   link.sh A|B up                     undo all of the above: both ends up, no netem, routes and
#                                      neighbours back; returns once both ports are ACTIVE and
#                                      both RoCE v2 GIDs are present again (or fails after 10 s).
# "near" is the *0 end (rxe0a / rxe1a), "far" the *1 end (rxe0b / rxe1b).
set -e
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
usage() { echo "usage: $0 A|B down|blackhole [far|near] | $0 A|B up" >&2; exit 2; }
case ${1:-} in A|a) i=0 ;; B|b) i=1 ;; *) usage ;; esac
case ${3:-far} in far) end=b ;; near) end=a ;; *) usage ;; esac
case ${2:-} in
  down)      ip link set p${i}${end} down ;;
  blackhole) tc qdisc replace dev p${i}${end} root netem loss 100% ;;
  up)
    for e in a b; do
      tc qdisc del dev p${i}$e root 2>/dev/null || true
      ip link set p${i}$e up
    done
    rail_routes $i
    for ((n = 0; n < 100; n++)); do
      [ "$(port_state rxe${i}a)" = ACTIVE ] && [ "$(port_state rxe${i}b)" = ACTIVE ] && break
      fsleep 0.1
    done
    [ "$(port_state rxe${i}a)" = ACTIVE ] && [ "$(port_state rxe${i}b)" = ACTIVE ] ||
      { echo "link.sh: rail $1 ports not ACTIVE after 10 s" >&2; exit 1; }
    gid_idx rxe${i}a 10.1$i.0.1 >/dev/null && gid_idx rxe${i}b 10.1$i.0.2 >/dev/null ||
      { echo "link.sh: rail $1 RoCE v2 GIDs missing after up" >&2; exit 1; } ;;
  *) usage ;;
esac
