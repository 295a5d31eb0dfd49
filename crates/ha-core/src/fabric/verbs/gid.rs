//! GID selection. InfiniBand ports use GID 0. RoCE ports pick, from the port's live GID table,
//! the best entry by (IPv4-mapped, RoCE v2, not link-local, lowest index) — NCCL's
//! defaults (`NCCL_IB_ADDR_FAMILY=AF_INET`, `NCCL_IB_ROCE_VERSION_NUM=2`) — unless
//! `NCCL_IB_GID_INDEX` names an index. The table is read again for every new queue pair,
//! because a port flap can re-register the same address at a different index.

use super::super::LinkLayer;

/// `ibv_gid_type` of a table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    Ib,
    RoceV1,
    RoceV2,
}

impl GidType {
    pub fn from_raw(t: u32) -> GidType {
        match t {
            1 => GidType::RoceV1,
            2 => GidType::RoceV2,
            _ => GidType::Ib,
        }
    }
}

/// One valid entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    pub gid_type: GidType,
}

/// Whether `gid` is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
pub(crate) fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Whether `gid` is link-local: `fe80::/10`, or `169.254.0.0/16` when IPv4-mapped.
pub(crate) fn is_link_local(gid: &[u8; 16]) -> bool {
    if is_ipv4_mapped(gid) {
        gid[12] == 169 && gid[13] == 254
    } else {
        gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
    }
}

/// Pick the GID for a new queue pair from `entries` (the port's valid entries).
pub fn select_gid(
    entries: &[GidEntry],
    link: LinkLayer,
    forced: Option<u32>,
) -> Result<GidEntry, String> {
    let valid = |e: &&GidEntry| e.gid.iter().any(|&b| b != 0);
    if let Some(i) = forced {
        return entries
            .iter()
            .filter(valid)
            .find(|e| e.index == i)
            .copied()
            .ok_or_else(|| format!("NCCL_IB_GID_INDEX={i}: no valid GID at that index"));
    }
    if link == LinkLayer::InfiniBand {
        return entries
            .iter()
            .find(|e| e.index == 0)
            .copied()
            .ok_or_else(|| "no GID at index 0".to_string());
    }
    entries
        .iter()
        .filter(valid)
        .max_by_key(|e| {
            (
                is_ipv4_mapped(&e.gid),
                e.gid_type == GidType::RoceV2,
                !is_link_local(&e.gid),
                std::cmp::Reverse(e.index),
            )
        })
        .copied()
        .ok_or_else(|| "no valid RoCE GID (is an IP address configured on the netdev?)".into())
}

/// `a.b.c.d` as the IPv4-mapped GID.
pub fn ipv4_gid(ip: std::net::Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn e(index: u32, gid: [u8; 16], gid_type: GidType) -> GidEntry {
        GidEntry {
            index,
            gid,
            gid_type,
        }
    }

    fn v6(s: &str) -> [u8; 16] {
        s.parse::<std::net::Ipv6Addr>().unwrap().octets()
    }

    #[test]
    fn classifies_addresses() {
        let v4 = ipv4_gid(Ipv4Addr::new(10, 10, 0, 1));
        assert!(is_ipv4_mapped(&v4) && !is_link_local(&v4));
        assert!(is_link_local(&ipv4_gid(Ipv4Addr::new(169, 254, 3, 4))));
        assert!(is_link_local(&v6("fe80::1")));
        assert!(is_link_local(&v6("febf::1")));
        assert!(!is_link_local(&v6("fec0::1")));
        assert!(!is_ipv4_mapped(&v6("fe80::1")));
        assert!(!is_ipv4_mapped(&v6("2001:db8::1")));
    }

    #[test]
    fn roce_prefers_v2_ipv4_not_link_local() {
        let ip = ipv4_gid(Ipv4Addr::new(10, 10, 0, 1));
        let table = [
            e(0, v6("fe80::5054:ff:fe12:3456"), GidType::RoceV1),
            e(1, v6("fe80::5054:ff:fe12:3456"), GidType::RoceV2),
            e(2, ip, GidType::RoceV1),
            e(3, ip, GidType::RoceV2),
            e(4, v6("2001:db8::1"), GidType::RoceV2),
        ];
        assert_eq!(
            select_gid(&table, LinkLayer::Ethernet, None).unwrap().index,
            3
        );
        // Without the v2 IPv4 entry: IPv4 (v1) beats an IPv6 v2 entry, as in NCCL.
        assert_eq!(
            select_gid(&table[..3], LinkLayer::Ethernet, None)
                .unwrap()
                .index,
            2
        );
        // Only IPv6: global v2 beats link-local v2.
        let t2 = [table[0], table[1], table[4]];
        assert_eq!(select_gid(&t2, LinkLayer::Ethernet, None).unwrap().index, 4);
        // IPv4 link-local loses to a routable IPv4.
        let t3 = [
            e(5, ipv4_gid(Ipv4Addr::new(169, 254, 1, 1)), GidType::RoceV2),
            e(7, ipv4_gid(Ipv4Addr::new(10, 0, 0, 7)), GidType::RoceV2),
        ];
        assert_eq!(select_gid(&t3, LinkLayer::Ethernet, None).unwrap().index, 7);
    }

    #[test]
    fn ties_go_to_the_lowest_index() {
        let ip = ipv4_gid(Ipv4Addr::new(10, 11, 0, 2));
        let table = [e(9, ip, GidType::RoceV2), e(4, ip, GidType::RoceV2)];
        assert_eq!(
            select_gid(&table, LinkLayer::Ethernet, None).unwrap().index,
            4
        );
    }

    #[test]
    fn override_and_ib() {
        let ip = ipv4_gid(Ipv4Addr::new(10, 10, 0, 1));
        let table = [
            e(0, v6("fe80::1"), GidType::RoceV2),
            e(1, ip, GidType::RoceV2),
        ];
        assert_eq!(
            select_gid(&table, LinkLayer::Ethernet, Some(0))
                .unwrap()
                .index,
            0
        );
        assert!(select_gid(&table, LinkLayer::Ethernet, Some(5)).is_err());
        let ib = [e(0, v6("fe80::2"), GidType::Ib), e(1, ip, GidType::Ib)];
        assert_eq!(
            select_gid(&ib, LinkLayer::InfiniBand, None).unwrap().index,
            0
        );
    }

    #[test]
    fn empty_table_is_an_error() {
        assert!(select_gid(&[], LinkLayer::Ethernet, None).is_err());
        let zero = [e(0, [0; 16], GidType::RoceV2)];
        assert!(select_gid(&zero, LinkLayer::Ethernet, None).is_err());
        assert!(select_gid(&zero, LinkLayer::Ethernet, Some(0)).is_err());
    }
}
