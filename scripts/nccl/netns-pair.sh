#!/usr/bin/env bash
# Two network namespaces (ha-a, ha-b) joined by two veth rails and an out-of-band link, for
# running two NCCL ranks whose plugin rails can be cut from outside the processes.
#
#   netns-pair.sh up | down | cut RAIL near|far | restore RAIL | env a|b
#
# rail0: r0a 10.88.0.1 <-> r0b 10.88.0.2     rail1: r1a 10.88.1.1 <-> r1b 10.88.1.2
# OOB:   ooa 10.88.9.1 <-> oob 10.88.9.2     (never cut; NCCL bootstrap and the plugin's handshake)
# `env a` prints the plugin environment of the rank in ha-a. Needs root and iproute2 (`IP=` to
# point at another `ip` binary).
set -euo pipefail
IP=${IP:-ip}
case "${1:-}" in
  up)
    "$0" down >/dev/null 2>&1 || true
    $IP netns add ha-a; $IP netns add ha-b
    $IP -n ha-a link set lo up; $IP -n ha-b link set lo up
    for pair in "r0 0" "r1 1" "oo 9"; do
      set -- $pair
      $IP -n ha-a link add "${1}a" type veth peer name "${1}b" netns ha-b
      $IP -n ha-a addr add "10.88.$2.1/24" dev "${1}a"; $IP -n ha-b addr add "10.88.$2.2/24" dev "${1}b"
      $IP -n ha-a link set "${1}a" up; $IP -n ha-b link set "${1}b" up
    done ;;
  down) $IP netns del ha-a 2>/dev/null || true; $IP netns del ha-b 2>/dev/null || true ;;
  cut|restore)
    r=${2:?rail}; end=${3:-near}; ns=ha-a; dev="r${r}a"
    if [ "$end" = far ]; then ns=ha-b; dev="r${r}b"; fi
    state=down; [ "$1" = restore ] && state=up
    if [ "$1" = restore ]; then $IP -n ha-a link set "r${r}a" up; $IP -n ha-b link set "r${r}b" up
    else $IP -n "$ns" link set "$dev" $state; fi
    echo "$(date +%s.%N) rail$r $1 ($end)" ;;
  env)
    s=${2:?a|b}; n=1; [ "$s" = b ] && n=2
    echo "HA_NCCL_FABRIC=sock HA_NCCL_SOCK_RAILS=10.88.0.$n,10.88.1.$n NCCL_SOCKET_IFNAME=oo$s" ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
