# Sourced inside the guest: the one-VM, two-rail RoCE v2 topology.
#   rail A: p0a 10.10.0.1 rxe0a  <== veth ==>  p0b 10.10.0.2 rxe0b
#   rail B: p1a 10.11.0.1 rxe1a  <== veth ==>  p1b 10.11.0.2 rxe1b
# rxe on Linux 6.1 works only in the initial network namespace, so all four addresses live
# there and policy routing makes 10.10.0.1 -> 10.10.0.2 leave through p0a instead of `lo`:
#  * the `local` table rule moves from pref 0 to pref 100;
#  * pref 10 "oif pXY lookup <table of that netdev>" rules (rxe resolves routes with
#    flowi4_oif = its netdev), each table holding the /32 route to the peer out of that veth;
#  * permanent neighbour entries (no ARP between two local addresses; they survive carrier
#    loss), accept_local=1 and rp_filter=0 so the receiver accepts a local source address.
# IPv6 is off to keep the GID tables small. Writes /run/softroce.env for the job.
HERE_RAILS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE_RAILS/lib.sh"
ip link set lo up
for k in all default; do
  sysctl -qw net.ipv4.conf.$k.rp_filter=0 net.ipv4.conf.$k.accept_local=1
done
sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
ip rule add pref 100 lookup local && ip rule del pref 0 lookup local
for i in 0 1; do
  ip link add p${i}a type veth peer name p${i}b
  ip addr add 10.1$i.0.1/32 dev p${i}a
  ip addr add 10.1$i.0.2/32 dev p${i}b
  ip link set p${i}a up
  ip link set p${i}b up
  ip rule add pref 10 oif p${i}a lookup 1${i}0
  ip rule add pref 10 oif p${i}b lookup 1${i}1
  rail_routes $i
  rdma link add rxe${i}a type rxe netdev p${i}a
  rdma link add rxe${i}b type rxe netdev p${i}b
done
G0A=$(gid_idx rxe0a 10.10.0.1); G0B=$(gid_idx rxe0b 10.10.0.2)
G1A=$(gid_idx rxe1a 10.11.0.1); G1B=$(gid_idx rxe1b 10.11.0.2)
cat > /run/softroce.env <<ENV
# rail end: "device gid_index ip netdev"; 0 = near end, 1 = far end of the rail
SOFTROCE_A0="rxe0a $G0A 10.10.0.1 p0a"
SOFTROCE_A1="rxe0b $G0B 10.10.0.2 p0b"
SOFTROCE_B0="rxe1a $G1A 10.11.0.1 p1a"
SOFTROCE_B1="rxe1b $G1B 10.11.0.2 p1b"
# break / repair a rail: \$SOFTROCE_LINK A|B down|blackhole [near|far] ; \$SOFTROCE_LINK A|B up
SOFTROCE_LINK="$HERE_RAILS/link.sh"
ENV
