//! The verbs endpoint blob: everything a peer needs to move its queue pair to RTR against
//! ours. Fixed 32 bytes, little-endian:
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 1 | magic `0xB7` |
//! | 1 | 1 | version `1` |
//! | 2 | 1 | link layer (`1` InfiniBand, `2` Ethernet) |
//! | 3 | 1 | active MTU (`ibv_mtu`, 1..=5) |
//! | 4 | 4 | QP number (24 bit) |
//! | 8 | 4 | first PSN (24 bit) |
//! | 12 | 2 | LID (InfiniBand) |
//! | 14 | 1 | RDMA READs this side accepts in flight (`max_dest_rd_atomic`, ≥ 1) |
//! | 15 | 1 | reserved, 0 |
//! | 16 | 16 | GID |

use super::super::{FabricError, LinkLayer, Result};

pub const ENDPOINT_LEN: usize = 32;
const MAGIC: u8 = 0xB7;
const VERSION: u8 = 1;

/// A decoded endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub link_layer: LinkLayer,
    /// `ibv_mtu` enum value.
    pub mtu: u32,
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub rd_atomic: u8,
    pub gid: [u8; 16],
}

impl Endpoint {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ENDPOINT_LEN];
        b[0] = MAGIC;
        b[1] = VERSION;
        b[2] = match self.link_layer {
            LinkLayer::InfiniBand => 1,
            LinkLayer::Ethernet => 2,
        };
        b[3] = self.mtu as u8;
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[12..14].copy_from_slice(&self.lid.to_le_bytes());
        b[14] = self.rd_atomic;
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Endpoint> {
        let bad = |why: String| {
            Err(FabricError::BadPeerAddress(format!(
                "verbs endpoint: {why}"
            )))
        };
        if b.len() != ENDPOINT_LEN {
            return bad(format!("{} bytes, expected {ENDPOINT_LEN}", b.len()));
        }
        if b[0] != MAGIC || b[1] != VERSION {
            return bad(format!("bad magic/version {:#04x}/{}", b[0], b[1]));
        }
        let link_layer = match b[2] {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            x => return bad(format!("unknown link layer {x}")),
        };
        let mtu = u32::from(b[3]);
        if !(1..=5).contains(&mtu) {
            return bad(format!("bad MTU code {mtu}"));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let qpn = u32_at(4);
        if !(2..=0xFF_FFFF).contains(&qpn) {
            return bad(format!("bad QP number {qpn:#x}"));
        }
        let psn = u32_at(8);
        if psn > 0xFF_FFFF {
            return bad(format!("bad PSN {psn:#x}"));
        }
        let lid = u16::from_le_bytes([b[12], b[13]]);
        let rd_atomic = b[14];
        if rd_atomic == 0 {
            return bad("zero RDMA READ credits".into());
        }
        if b[15] != 0 {
            return bad("reserved byte set".into());
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        match link_layer {
            LinkLayer::Ethernet if gid.iter().all(|&x| x == 0) => {
                return bad("RoCE endpoint without a GID".into())
            }
            LinkLayer::InfiniBand if lid == 0 || lid >= 0xC000 => {
                return bad(format!("bad unicast LID {lid:#x}"))
            }
            _ => {}
        }
        Ok(Endpoint {
            link_layer,
            mtu,
            qpn,
            psn,
            lid,
            rd_atomic,
            gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Endpoint {
        Endpoint {
            link_layer: LinkLayer::Ethernet,
            mtu: 3,
            qpn: 0x11,
            psn: 0xABCDE,
            lid: 0,
            rd_atomic: 16,
            gid: super::super::gid::ipv4_gid(std::net::Ipv4Addr::new(10, 10, 0, 1)),
        }
    }

    #[test]
    fn roundtrip_and_layout() {
        let e = sample();
        let b = e.encode();
        assert_eq!(b.len(), ENDPOINT_LEN);
        assert!(b.len() <= 64, "the trait allows at most 64 bytes");
        assert_eq!(&b[..4], &[0xB7, 1, 2, 3]);
        assert_eq!(&b[4..8], &0x11u32.to_le_bytes());
        assert_eq!(Endpoint::decode(&b).unwrap(), e);
        let ib = Endpoint {
            link_layer: LinkLayer::InfiniBand,
            lid: 7,
            gid: [0; 16],
            ..e
        };
        assert_eq!(Endpoint::decode(&ib.encode()).unwrap(), ib);
    }

    #[test]
    fn rejects_garbage() {
        let good = sample().encode();
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            good[..31].to_vec(),
            [good.clone(), vec![0]].concat(),
            b"sock-endpoint-of-32-bytes-here!!".to_vec(),
        ];
        let patch = |at: usize, v: &[u8]| {
            let mut b = good.clone();
            b[at..at + v.len()].copy_from_slice(v);
            b
        };
        cases.push(patch(0, &[0]));
        cases.push(patch(1, &[2]));
        cases.push(patch(2, &[3]));
        cases.push(patch(3, &[0]));
        cases.push(patch(3, &[6]));
        cases.push(patch(4, &1u32.to_le_bytes()));
        cases.push(patch(4, &0x100_0000u32.to_le_bytes()));
        cases.push(patch(8, &0x100_0000u32.to_le_bytes()));
        cases.push(patch(14, &[0]));
        cases.push(patch(15, &[1]));
        cases.push(patch(16, &[0; 16]));
        cases.push(patch(2, &[1])); // InfiniBand with LID 0
        for (i, c) in cases.iter().enumerate() {
            assert!(
                matches!(Endpoint::decode(c), Err(FabricError::BadPeerAddress(_))),
                "case {i}: {c:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Endpoint::decode(&bytes);
        }

        #[test]
        fn valid_roundtrips(qpn in 2u32..=0xFF_FFFF, psn in 0u32..=0xFF_FFFF, mtu in 1u32..=5,
                            rd in 1u8..=255, gid in any::<[u8; 16]>()) {
            prop_assume!(gid.iter().any(|&x| x != 0));
            let e = Endpoint { link_layer: LinkLayer::Ethernet, mtu, qpn, psn, lid: 0,
                               rd_atomic: rd, gid };
            prop_assert_eq!(Endpoint::decode(&e.encode()).unwrap(), e);
        }
    }
}
