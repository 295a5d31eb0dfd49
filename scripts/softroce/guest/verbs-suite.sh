#!/bin/bash
# Guest side of test-verbs.sh: the whole verbs suite in one boot.
#
#   verbs-suite.sh FABRIC_BIN "ABI_BIN ABI_BIN ..." [TEST ARGS...]
#
# 1. FABRIC_BIN (crates/ha-core/tests/verbs_rxe/): the fabric on real verbs, both rails.
# 2. Every ABI_BIN (crates/nccl-net-ha/tests/abi_*.rs: the C-ABI suite through the built .so) once per rail,
#    with HA_NCCL_FABRIC=verbs and NCCL_IB_HCA naming exactly that rail's two ports; the
#    receiver listens on one port and the sender connects from the other, so every byte
#    crosses the rail's veth. Single path: HA_NCCL_ENABLE_BACKUP=0 (the failover drills
#    live elsewhere), so nothing of the other rail is opened.
# TEST ARGS (a name filter, for example) go to every binary. Each run is framed by
#   == LABEL ==  ...its output...  suite: LABEL rc=N
# and test-verbs.sh adds up the `test result:` lines and checks every rc.
set -u
fabric_bin=$1
abi_bins=$2
shift 2
status=0

run() { # LABEL CMD...
  local label=$1 rc
  shift
  echo "== $label =="
  "$@" 2>&1
  rc=$?
  echo "suite: $label rc=$rc"
  [ "$rc" -eq 0 ] || status=1
}

run "fabric" "$fabric_bin" --test-threads=1 --show-output "$@"

# A rail end is "<dev> <gid_index> <ip> <netdev>" (guest/rails.sh).
export HA_NCCL_FABRIC=verbs NCCL_SOCKET_IFNAME=lo HA_NCCL_ENABLE_BACKUP=0
# rxe treats 7 retries as infinite; 268 ms x 7 tries bounds a dead peer to about 2 s while
# a TCG guest under load never misses an ACK by that much.
export HA_NCCL_QP_TIMEOUT=16 HA_NCCL_QP_RETRY_CNT=6
export HA_TEST_LISTEN_DEV=1 HA_TEST_CONNECT_DEV=0
# rxe ports take messages of at most 8 MiB (port max_msg_sz; the plugin refuses larger sends up
# front and advertises maxP2pBytes 8 MiB): the sweep stops at 8 MiB - 5, odd and unaligned.
export HA_TEST_MAX_SIZE=$(( (8 << 20) - 5 ))
for rail in A B; do
  near=SOFTROCE_${rail}0 far=SOFTROCE_${rail}1
  read -r dev0 _ <<< "${!near}"
  read -r dev1 _ <<< "${!far}"
  export NCCL_IB_HCA="=$dev0:1,$dev1:1"
  for bin in $abi_bins; do
    name=${bin##*/}
    run "rail $rail ($NCCL_IB_HCA): ${name%-*}" "$bin" --test-threads=1 "$@"
  done
done
exit $status
