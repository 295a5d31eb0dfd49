# Sourced by the guest scripts. Under TCG every fork+exec costs ~0.2 s, so these helpers use
# bash builtins and sysfs reads only.

# fsleep SECS: sleep without fork+exec (read with a timeout on a private fifo)
fsleep() {
  if [ -z "${_FSFD:-}" ]; then
    local f=/tmp/.fsleep.$$.$RANDOM; mkfifo "$f"; exec {_FSFD}<>"$f"; rm -f "$f"
  fi
  read -r -t "$1" -u "$_FSFD" || true
}

# mac IFACE
mac() { local m; read -r m < "/sys/class/net/$1/address"; echo "$m"; }

# port_state DEV -> ACTIVE / DOWN / ... (port 1)
port_state() { local s; read -r s < "/sys/class/infiniband/$1/ports/1/state"; echo "${s#*: }"; }

# gid_idx DEV IPV4 -> index of the RoCE v2 GID ::ffff:IPV4 on port 1 (waits up to 10 s)
gid_idx() {
  local dev=$1 ip=$2 want g i v t n a b c d
  IFS=. read -r a b c d <<< "$ip"
  printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"
  for ((n = 0; n < 100; n++)); do
    for g in /sys/class/infiniband/$dev/ports/1/gids/*; do
      i=${g##*/}
      read -r v 2>/dev/null < "$g" || continue
      [ "$v" = "$want" ] || continue
      read -r t 2>/dev/null < "/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$i"
      [ "$t" = "RoCE v2" ] && { echo "$i"; return 0; }
    done
    fsleep 0.1
  done
  return 1
}

# rail_routes I: the /32 routes (per-netdev tables) and permanent neighbours of rail I
# (0 = A, 1 = B). An admin-down flushes them, so link.sh re-runs this after `up`.
rail_routes() {
  local i=$1
  ip route replace 10.1$i.0.2/32 dev p${i}a src 10.1$i.0.1 table 1${i}0
  ip route replace 10.1$i.0.1/32 dev p${i}b src 10.1$i.0.2 table 1${i}1
  ip neigh replace 10.1$i.0.2 lladdr "$(mac p${i}b)" dev p${i}a nud permanent
  ip neigh replace 10.1$i.0.1 lladdr "$(mac p${i}a)" dev p${i}b nud permanent
}
