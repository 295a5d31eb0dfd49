//! The connect handle: the ≤128 bytes `listen` writes and NCCL ships to the peer, which
//! passes them to `connect`. Layout (little-endian):
//!
//! | off | field |
//! |---|---|
//! | 0 | magic `HAN1` (u32) |
//! | 4 | version (u16) |
//! | 6 | flags (u16) |
//! | 8 | token (u64, random, proves the connector got the handle through NCCL) |
//! | 16 | address family (u8: 4 or 6), then 16 address bytes, then port (u16) |
//! | 35 | FNV-1a checksum of bytes 0..35 (u32) |
//! | 64 | connector scratch (u64): NCCL calls `connect` repeatedly with the same handle buffer; the connector keeps its in-progress state id here, as NCCL's own IB transport does |

use super::wire::{fnv1a32, Reader, WireError, Writer};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const HANDLE_SIZE: usize = 128;
pub const HANDLE_MAGIC: u32 = 0x314e_4148; // "HAN1" little-endian
/// 2: CTS FIFO banked by path epoch (epoch carried in each clear-to-send), re-arm attempts.
/// 3: a send to a single receive is one WRITE_WITH_IMM whose fast immediate is the record.
/// 4: the receiver answers a re-arm's `RearmDone` over the new path (two-way verification).
/// 5: a `sock` responder waiting for a receive sends a keep-alive every 10 ms (was 50), which
///    the sender's 25 ms silence floor relies on: an older peer would look silent for 40 ms.
/// 6: the `sock` eager ring (immediate bit 29).
/// 7: `sock` frames of unsignaled WRITEs carry `QUIET` (an older responder refuses the bit);
///    `sock` lanes: WRITEs of 512 KiB or more striped over extra streams (lane hellos,
///    `STRIPED` and `LANE` frames).
/// 8: a clear-to-send of `n` receives fills the last `n` entry places of its FIFO slot and is
///    written as those and the two tail words only (`layout::cts_span`), not the whole slot.
/// 9: `sock` ACK and keep-alive frames may carry `PROMPT` (the responder's kernel caps its
///    delayed ACK; an older requester refuses the bit).
pub const PROTOCOL_VERSION: u16 = 9;
const BODY_LEN: usize = 35;
const SCRATCH_OFF: usize = 64;

/// Capability flags carried in the handle and the handshake.
pub mod flags {
    /// The side can run a standby path (HA).
    pub const HA: u16 = 1;
    /// Handshake only: bits 8..16 carry the side's traffic class.
    pub const TRAFFIC_CLASS: u16 = 2;
    /// Handshake only (the acceptor): its region ends with an eager ring, and it takes one
    /// buffer per receive (see the layout).
    pub const EAGER: u16 = 4;

    /// The traffic class a handshake's flags carry, if any.
    pub fn traffic_class(flags: u16) -> Option<u8> {
        (flags & TRAFFIC_CLASS != 0).then_some((flags >> 8) as u8)
    }

    /// `flags` with traffic class `tc` (or none) recorded.
    pub fn with_traffic_class(flags: u16, tc: Option<u8>) -> u16 {
        match tc {
            Some(tc) => (flags & 0xff & !TRAFFIC_CLASS) | TRAFFIC_CLASS | (u16::from(tc) << 8),
            None => flags & 0xff & !TRAFFIC_CLASS,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectHandle {
    pub flags: u16,
    pub token: u64,
    pub addr: SocketAddr,
}

impl ConnectHandle {
    /// Write the handle into NCCL's buffer (scratch zeroed).
    pub fn encode(&self, out: &mut [u8; HANDLE_SIZE]) {
        let mut w = Writer::new();
        w.u32(HANDLE_MAGIC)
            .u16(PROTOCOL_VERSION)
            .u16(self.flags)
            .u64(self.token);
        match self.addr.ip() {
            IpAddr::V4(a) => {
                w.u8(4);
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&a.octets());
                w.raw(&b);
            }
            IpAddr::V6(a) => {
                w.u8(6).raw(&a.octets());
            }
        }
        w.u16(self.addr.port());
        debug_assert_eq!(w.len(), BODY_LEN);
        let sum = fnv1a32(w.as_slice());
        w.u32(sum);
        out.fill(0);
        out[..w.len()].copy_from_slice(w.as_slice());
    }

    /// Read a handle; any corruption is an error naming what was wrong.
    pub fn decode(buf: &[u8]) -> Result<ConnectHandle, WireError> {
        if buf.len() < BODY_LEN + 4 {
            return Err(WireError::Truncated {
                what: "connect handle",
                needed: BODY_LEN + 4 - buf.len(),
            });
        }
        let mut r = Reader::new(buf);
        let magic = r.u32("magic")?;
        if magic != HANDLE_MAGIC {
            return Err(WireError::BadMagic {
                found: magic,
                expected: HANDLE_MAGIC,
            });
        }
        let version = r.u16("version")?;
        if version != PROTOCOL_VERSION {
            return Err(WireError::BadVersion {
                got: version,
                ours: PROTOCOL_VERSION,
            });
        }
        let flags = r.u16("flags")?;
        let token = r.u64("token")?;
        let family = r.u8("address family")?;
        let ab = r.raw(16, "address")?;
        let port = r.u16("port")?;
        let sum = r.u32("checksum")?;
        if sum != fnv1a32(&buf[..BODY_LEN]) {
            return Err(WireError::BadChecksum);
        }
        let ip = match family {
            4 => IpAddr::V4(Ipv4Addr::new(ab[0], ab[1], ab[2], ab[3])),
            6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ab).expect("16"))),
            f => {
                return Err(WireError::BadValue {
                    what: "address family",
                    value: f as u64,
                })
            }
        };
        if port == 0 {
            return Err(WireError::BadValue {
                what: "port",
                value: 0,
            });
        }
        Ok(ConnectHandle {
            flags,
            token,
            addr: SocketAddr::new(ip, port),
        })
    }
}

/// The connector's scratch word inside NCCL's handle buffer (0 = no connect in progress).
pub fn scratch(buf: &[u8; HANDLE_SIZE]) -> u64 {
    u64::from_le_bytes(buf[SCRATCH_OFF..SCRATCH_OFF + 8].try_into().expect("8"))
}

pub fn set_scratch(buf: &mut [u8; HANDLE_SIZE], v: u64) {
    buf[SCRATCH_OFF..SCRATCH_OFF + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConnectHandle {
        ConnectHandle {
            flags: flags::HA,
            token: 0xdead_beef_1234_5678,
            addr: "127.0.0.1:45678".parse().unwrap(),
        }
    }

    #[test]
    fn roundtrip_v4_and_v6() {
        let mut b = [0xffu8; HANDLE_SIZE];
        sample().encode(&mut b);
        assert_eq!(ConnectHandle::decode(&b).unwrap(), sample());
        assert_eq!(scratch(&b), 0);
        let h6 = ConnectHandle {
            addr: "[::1]:9".parse().unwrap(),
            ..sample()
        };
        h6.encode(&mut b);
        assert_eq!(ConnectHandle::decode(&b).unwrap(), h6);
    }

    /// A peer of another build is refused naming both versions and what to do.
    #[test]
    fn another_protocol_version_is_refused_by_name() {
        let e = WireError::BadVersion {
            got: PROTOCOL_VERSION - 1,
            ours: PROTOCOL_VERSION,
        }
        .to_string();
        assert!(
            e.contains(&format!("version {}", PROTOCOL_VERSION - 1))
                && e.contains(&format!("this plugin {PROTOCOL_VERSION}"))
                && e.contains("same plugin build"),
            "{e}"
        );
    }

    #[test]
    fn scratch_does_not_disturb_handle() {
        let mut b = [0u8; HANDLE_SIZE];
        sample().encode(&mut b);
        set_scratch(&mut b, 77);
        assert_eq!(scratch(&b), 77);
        assert_eq!(ConnectHandle::decode(&b).unwrap(), sample());
    }

    #[test]
    fn wrong_magic_truncated_and_corrupt_are_errors() {
        let mut b = [0u8; HANDLE_SIZE];
        sample().encode(&mut b);
        let mut bad = b;
        bad[0] ^= 1;
        assert!(matches!(
            ConnectHandle::decode(&bad),
            Err(WireError::BadMagic { .. })
        ));
        assert!(matches!(
            ConnectHandle::decode(&b[..20]),
            Err(WireError::Truncated { .. })
        ));
        let mut bad = b;
        bad[20] ^= 0x40; // inside the address: checksum catches it
        assert_eq!(ConnectHandle::decode(&bad), Err(WireError::BadChecksum));
        // An all-zero handle (never written by listen) is rejected.
        assert!(ConnectHandle::decode(&[0u8; HANDLE_SIZE]).is_err());
    }
}
