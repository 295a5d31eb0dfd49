#!/usr/bin/env bash
# Two network namespaces joined by two veth "rails" plus an out-of-band pair, for failover
# drills of the `sock` fabric. Needs root and iproute2; touches nothing outside the two
# namespaces (every veth is created directly inside them).
#
#   namespace <prefix>a                  namespace <prefix>b
#   r0a 10.88.0.1/24  <-- rail 0 -->  r0b 10.88.0.2/24
#   r1a 10.88.1.1/24  <-- rail 1 -->  r1b 10.88.1.2/24
#   oa  10.88.9.1/24  <-- OOB    -->  ob  10.88.9.2/24   (drills never cut it)
#
# usage: rails.sh up                 create (after removing leftovers of the same prefix), print
#                                    the env
#        rails.sh down               remove everything (idempotent; also ends processes still
#                                    running inside the namespaces, e.g. after a crashed drill)
#        rails.sh cut RAIL near|far  link down: near = <prefix>a's end, far = <prefix>b's end
#        rails.sh restore RAIL       both ends of RAIL up again
#        rails.sh status             links and addresses
#        rails.sh env a|b            the environment of a plugin side, as K=V words
#        rails.sh list               rail namespace pairs on this host
# RAIL is 0, 1, rail0 or rail1. HA_RAILS_PREFIX names the namespaces <prefix>a and <prefix>b.
# Names are unique per run, so two runs on one host never tear down each other's pair: `up`
# without HA_RAILS_PREFIX makes a fresh prefix (ha<pid>-) and prints the `export` to use for
# the other commands, which refuse to guess one.
set -euo pipefail

PREFIX=${HA_RAILS_PREFIX:-}
if [ -z "$PREFIX" ]; then
  case "${1:-}" in
    up) PREFIX="ha$$-" ;;
    env|list|-h|--help|help|"") PREFIX="ha-" ;;
    *) echo "rails: HA_RAILS_PREFIX is not set (\`rails.sh up\` printed it; \`rails.sh list\` shows the pairs)" >&2; exit 2 ;;
  esac
fi
NS_A="${PREFIX}a"
NS_B="${PREFIX}b"
# name-a name-b subnet (first three octets)
LINKS=("r0a r0b 10.88.0" "r1a r1b 10.88.1" "oa ob 10.88.9")

die() { echo "rails: $*" >&2; exit 1; }

usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

need() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces)"
  command -v ip >/dev/null 2>&1 || die "iproute2 ('ip') not found"
}

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$1"; }

rail_index() {
  case "$1" in
    0|rail0|r0) echo 0 ;;
    1|rail1|r1) echo 1 ;;
    *) die "unknown rail '$1' (0 or 1)" ;;
  esac
}

env_of() {
  case "$1" in
    a|A) echo "HA_NCCL_FABRIC=sock HA_NCCL_SOCK_RAILS=r0a,r1a NCCL_SOCKET_IFNAME=oa" ;;
    b|B) echo "HA_NCCL_FABRIC=sock HA_NCCL_SOCK_RAILS=r0b,r1b NCCL_SOCKET_IFNAME=ob" ;;
    *) die "env: side is a or b" ;;
  esac
}

# Ends processes still inside namespace $1 (TERM, then KILL after 2 s).
end_pids() {
  local ns=$1 pids i
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [ -n "$pids" ] || return 0
  echo "rails: ending processes left in $ns: $(echo $pids)" >&2
  kill -TERM $pids 2>/dev/null || true
  for i in $(seq 20); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  kill -KILL $pids 2>/dev/null || true
}

down() {
  local ns
  for ns in "$NS_A" "$NS_B"; do
    if ns_exists "$ns"; then
      end_pids "$ns"
      ip netns del "$ns"
    fi
  done
}

up() {
  down
  ip netns add "$NS_A"
  ip netns add "$NS_B"
  ip -n "$NS_A" link set lo up
  ip -n "$NS_B" link set lo up
  local l a b net
  for l in "${LINKS[@]}"; do
    read -r a b net <<<"$l"
    ip -n "$NS_A" link add "$a" type veth peer name "$b" netns "$NS_B"
    ip -n "$NS_A" addr add "$net.1/24" dev "$a"
    ip -n "$NS_B" addr add "$net.2/24" dev "$b"
    ip -n "$NS_A" link set "$a" up
    ip -n "$NS_B" link set "$b" up
  done
  wait_carrier
  echo "rails up: $NS_A <-> $NS_B (rail0 r0a/r0b 10.88.0.0/24, rail1 r1a/r1b 10.88.1.0/24, OOB oa/ob 10.88.9.0/24)"
  echo "export HA_RAILS_PREFIX=$PREFIX   # for rails.sh cut/restore/down/status"
  echo "side A: ip netns exec $NS_A env $(env_of a) <command>"
  echo "side B: ip netns exec $NS_B env $(env_of b) <command>"
}

# Waits (up to 5 s) until every link of both namespaces has carrier.
wait_carrier() {
  local i l a b net ok
  for i in $(seq 50); do
    ok=1
    for l in "${LINKS[@]}"; do
      read -r a b net <<<"$l"
      ip -n "$NS_A" -o link show "$a" | grep -q LOWER_UP || ok=0
      ip -n "$NS_B" -o link show "$b" | grep -q LOWER_UP || ok=0
    done
    [ "$ok" = 1 ] && return 0
    sleep 0.1
  done
  die "links did not come up"
}

cut() {
  local i end
  i=$(rail_index "${1:-}")
  end=${2:-}
  ns_exists "$NS_A" || die "not up (run: rails.sh up)"
  case "$end" in
    near) ip -n "$NS_A" link set "r${i}a" down ;;
    far) ip -n "$NS_B" link set "r${i}b" down ;;
    *) die "cut: end is near or far" ;;
  esac
}

restore() {
  local i
  i=$(rail_index "${1:-}")
  ns_exists "$NS_A" || die "not up (run: rails.sh up)"
  ip -n "$NS_A" link set "r${i}a" up
  ip -n "$NS_B" link set "r${i}b" up
}

status() {
  local ns
  for ns in "$NS_A" "$NS_B"; do
    if ns_exists "$ns"; then
      echo "== $ns"
      ip -n "$ns" -br addr show
    else
      echo "== $ns: absent"
    fi
  done
}

# Namespace pairs that look like ours (<p>a with a <p>b beside it and an r0a link inside).
list() {
  local ns p
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep 'a$' || true); do
    p=${ns%a}
    ns_exists "${p}b" || continue
    ip -n "$ns" link show r0a >/dev/null 2>&1 || continue
    echo "$p   ($(ip netns pids "$ns" 2>/dev/null | wc -l) processes in ${p}a)"
  done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) need; up ;;
  down) need; down ;;
  cut) need; cut "$@" ;;
  restore) need; restore "$@" ;;
  status) need; status ;;
  env) env_of "${1:-}" ;;
  list) need; list ;;
  -h|--help|help) usage 0 ;;
  *) usage 2 ;;
esac
