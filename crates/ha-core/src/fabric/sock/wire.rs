//! Wire format of the `sock` fabric: the stream hello and the fixed 36-byte frame header.
//!
//! Pure code (no I/O): everything a peer sends is decoded here into typed values or a typed
//! [`WireError`], so garbage from the network can never reach memory placement.
//!
//! Frame header, little endian, [`HEADER_LEN`] bytes, followed by `len` payload bytes:
//!
//! | offset | size | field    | meaning                                                     |
//! |-------:|-----:|----------|-------------------------------------------------------------|
//! | 0      | 1    | op       | [`Op`]                                                      |
//! | 1      | 1    | flags    | [`flags`] bits allowed for that op                          |
//! | 2      | 2    | reserved | must be 0                                                   |
//! | 4      | 4    | rkey     | remote key (WRITE, READ_REQ)                                |
//! | 8      | 4    | psn      | packet sequence number (see the requester/responder docs)  |
//! | 12     | 8    | raddr    | WRITE: address of this segment; READ_RESP: offset in read   |
//! | 20     | 8    | total    | length of the whole work request                            |
//! | 28     | 4    | len      | payload bytes of this frame                                 |
//! | 32     | 4    | imm      | WRITE with `IMM`: immediate; NAK: syndrome                  |

use std::fmt;

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 36;
/// Bytes of the stream hello.
pub const HELLO_LEN: usize = 24;
/// Largest payload a frame may carry, whatever the sender's segment size.
pub const MAX_SEGMENT_BYTES: usize = 16 << 20;
/// First 8 bytes of every stream ("HASOCK1\0").
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"HASOCK1\0");

/// Frame operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Requester → responder: one segment of an RDMA WRITE (payload = the bytes).
    Write = 1,
    /// Requester → responder: RDMA READ request of `total` bytes at `raddr`.
    ReadReq = 2,
    /// Responder → requester: every frame up to and including `psn` is done.
    Ack = 3,
    /// Responder → requester: frame `psn` was refused (syndrome in `imm`); all before it done.
    Nak = 4,
    /// Responder → requester: `len` bytes of the READ `psn`, at offset `raddr` of it.
    ReadResp = 5,
    /// Responder → requester: still alive (waiting for a receive); keeps the retry timer off.
    KeepAlive = 6,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Write,
            2 => Op::ReadReq,
            3 => Op::Ack,
            4 => Op::Nak,
            5 => Op::ReadResp,
            6 => Op::KeepAlive,
            _ => return None,
        })
    }

    /// Flag bits this op may carry.
    fn allowed_flags(self) -> u8 {
        match self {
            Op::Write => flags::FIRST | flags::LAST | flags::IMM | flags::QUIET,
            Op::ReadResp => flags::FIRST | flags::LAST,
            Op::Ack => flags::WR_DONE,
            Op::ReadReq | Op::Nak | Op::KeepAlive => 0,
        }
    }

    /// Whether a requester sends it (else a responder does).
    pub fn is_request(self) -> bool {
        matches!(self, Op::Write | Op::ReadReq)
    }
}

/// Frame flag bits.
pub mod flags {
    /// First segment of a work request.
    pub const FIRST: u8 = 1;
    /// Last segment of a work request.
    pub const LAST: u8 = 2;
    /// WRITE carries an immediate and consumes a receive (LAST segment only).
    pub const IMM: u8 = 4;
    /// ACK: the acknowledged frame ended a work request.
    pub const WR_DONE: u8 = 8;
    /// WRITE (LAST segment, no immediate): the work request is unsignaled, so no completion
    /// waits for its ACK: the responder may leave it to the next ACK it sends (cumulative),
    /// as an RC NIC completes unsignaled work only through a later signaled completion.
    pub const QUIET: u8 = 16;
}

/// NAK syndromes (in the `imm` field).
pub mod syndrome {
    /// Bad rkey, access rights or range.
    pub const REMOTE_ACCESS: u32 = 1;
    /// Malformed request.
    pub const INVALID_REQUEST: u32 = 2;
}

/// Why a header or hello was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("short buffer: {got} bytes, need {need}")]
    Short { got: usize, need: usize },
    #[error("unknown op {0}")]
    UnknownOp(u8),
    #[error("flags {flags:#x} not allowed for {op:?}")]
    BadFlags { op: Op, flags: u8 },
    #[error("reserved field is {0:#x}, must be 0")]
    Reserved(u16),
    #[error("payload length {len} above the maximum {max}")]
    TooLong { len: u32, max: usize },
    #[error("payload length {len} above the request total {total}")]
    LenAboveTotal { len: u32, total: u64 },
    #[error("{op:?} must have field {field} zero")]
    NonzeroField { op: Op, field: &'static str },
    #[error("address range overflows: {raddr:#x} + {total}")]
    Overflow { raddr: u64, total: u64 },
    #[error("bad hello magic {0:#x}")]
    BadMagic(u64),
}

/// A decoded frame header.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub op: Op,
    pub flags: u8,
    pub rkey: u32,
    pub psn: u32,
    pub raddr: u64,
    pub total: u64,
    pub len: u32,
    pub imm: u32,
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} fl={:#x} rkey={:#x} psn={} raddr={:#x} total={} len={} imm={:#x}",
            self.op, self.flags, self.rkey, self.psn, self.raddr, self.total, self.len, self.imm
        )
    }
}

impl Header {
    /// A header with every field but `op` zero.
    pub fn new(op: Op) -> Header {
        Header {
            op,
            flags: 0,
            rkey: 0,
            psn: 0,
            raddr: 0,
            total: 0,
            len: 0,
            imm: 0,
        }
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Encode into `out`.
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        out[0] = self.op as u8;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&0u16.to_le_bytes());
        out[4..8].copy_from_slice(&self.rkey.to_le_bytes());
        out[8..12].copy_from_slice(&self.psn.to_le_bytes());
        out[12..20].copy_from_slice(&self.raddr.to_le_bytes());
        out[20..28].copy_from_slice(&self.total.to_le_bytes());
        out[28..32].copy_from_slice(&self.len.to_le_bytes());
        out[32..36].copy_from_slice(&self.imm.to_le_bytes());
    }

    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.encode(&mut b);
        b
    }

    /// Decode and check a header; `max_len` bounds the payload length.
    pub fn decode(b: &[u8], max_len: usize) -> Result<Header, WireError> {
        if b.len() < HEADER_LEN {
            return Err(WireError::Short {
                got: b.len(),
                need: HEADER_LEN,
            });
        }
        let op = Op::from_u8(b[0]).ok_or(WireError::UnknownOp(b[0]))?;
        let flags = b[1];
        let reserved = u16::from_le_bytes([b[2], b[3]]);
        let h = Header {
            op,
            flags,
            rkey: u32_at(b, 4),
            psn: u32_at(b, 8),
            raddr: u64_at(b, 12),
            total: u64_at(b, 20),
            len: u32_at(b, 28),
            imm: u32_at(b, 32),
        };
        if flags & !op.allowed_flags() != 0 {
            return Err(WireError::BadFlags { op, flags });
        }
        if reserved != 0 {
            return Err(WireError::Reserved(reserved));
        }
        if h.len as usize > max_len {
            return Err(WireError::TooLong {
                len: h.len,
                max: max_len,
            });
        }
        let zero = |field: &'static str, v: u64| {
            if v != 0 {
                Err(WireError::NonzeroField { op, field })
            } else {
                Ok(())
            }
        };
        match op {
            Op::Write => {
                if h.has(flags::IMM) && !h.has(flags::LAST)
                    || h.has(flags::QUIET) && (!h.has(flags::LAST) || h.has(flags::IMM))
                {
                    return Err(WireError::BadFlags { op, flags });
                }
                if !h.has(flags::IMM) {
                    zero("imm", h.imm as u64)?;
                }
                h.check_len_total()?;
                h.check_range()?;
            }
            Op::ReadReq => {
                zero("len", h.len as u64)?;
                zero("imm", h.imm as u64)?;
                h.check_range()?;
            }
            Op::ReadResp => {
                zero("rkey", h.rkey as u64)?;
                zero("imm", h.imm as u64)?;
                h.check_len_total()?;
                h.check_range()?;
            }
            Op::Ack | Op::KeepAlive => {
                zero("rkey", h.rkey as u64)?;
                zero("raddr", h.raddr)?;
                zero("total", h.total)?;
                zero("len", h.len as u64)?;
                zero("imm", h.imm as u64)?;
            }
            Op::Nak => {
                zero("rkey", h.rkey as u64)?;
                zero("raddr", h.raddr)?;
                zero("total", h.total)?;
                zero("len", h.len as u64)?;
            }
        }
        Ok(h)
    }

    fn check_len_total(&self) -> Result<(), WireError> {
        if self.len as u64 > self.total {
            return Err(WireError::LenAboveTotal {
                len: self.len,
                total: self.total,
            });
        }
        Ok(())
    }

    fn check_range(&self) -> Result<(), WireError> {
        if self.raddr.checked_add(self.total).is_none() {
            return Err(WireError::Overflow {
                raddr: self.raddr,
                total: self.total,
            });
        }
        Ok(())
    }
}

/// First bytes a requester sends on a new stream: which queue pair it wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub target_qpn: u32,
    pub source_qpn: u32,
    pub target_nonce: u64,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&self.target_qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.source_qpn.to_le_bytes());
        b[16..24].copy_from_slice(&self.target_nonce.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Hello, WireError> {
        if b.len() < HELLO_LEN {
            return Err(WireError::Short {
                got: b.len(),
                need: HELLO_LEN,
            });
        }
        let magic = u64_at(b, 0);
        if magic != HELLO_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        Ok(Hello {
            target_qpn: u32_at(b, 8),
            source_qpn: u32_at(b, 12),
            target_nonce: u64_at(b, 16),
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// `a` is at or before `b` in wrapping PSN order.
pub fn psn_le(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) < (1 << 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn write_hdr() -> Header {
        Header {
            op: Op::Write,
            flags: flags::FIRST | flags::LAST | flags::IMM,
            rkey: 0xdead_beef,
            psn: 7,
            raddr: 0x1000,
            total: 64,
            len: 64,
            imm: 0x1234_5678,
        }
    }

    #[test]
    fn roundtrip_and_layout() {
        let h = write_hdr();
        let b = h.to_bytes();
        assert_eq!(b[0], 1);
        assert_eq!(b[1], 7);
        assert_eq!(&b[4..8], &0xdead_beefu32.to_le_bytes());
        assert_eq!(&b[32..36], &0x1234_5678u32.to_le_bytes());
        assert_eq!(Header::decode(&b, 1 << 20).unwrap(), h);
    }

    #[test]
    fn rejects_malformed() {
        let good = write_hdr().to_bytes();
        let dec = |b: &[u8]| Header::decode(b, 1 << 20);
        assert_eq!(
            dec(&good[..10]),
            Err(WireError::Short { got: 10, need: 36 })
        );
        let mut b = good;
        b[0] = 0;
        assert_eq!(dec(&b), Err(WireError::UnknownOp(0)));
        b[0] = 99;
        assert_eq!(dec(&b), Err(WireError::UnknownOp(99)));
        let mut b = good;
        b[1] = 0x20;
        assert!(matches!(dec(&b), Err(WireError::BadFlags { .. })));
        // QUIET only on a LAST segment without an immediate.
        for f in [
            flags::QUIET,
            flags::QUIET | flags::FIRST,
            flags::QUIET | flags::LAST | flags::IMM,
        ] {
            let mut b = good;
            b[1] = f;
            assert!(matches!(dec(&b), Err(WireError::BadFlags { .. })), "{f:#x}");
        }
        let mut h = write_hdr();
        (h.flags, h.imm) = (flags::QUIET | flags::LAST | flags::FIRST, 0);
        assert_eq!(dec(&h.to_bytes()).map(|d| d.flags), Ok(h.flags));
        let mut b = good;
        b[1] = flags::IMM; // IMM without LAST
        assert!(matches!(dec(&b), Err(WireError::BadFlags { .. })));
        let mut b = good;
        b[2] = 1;
        assert_eq!(dec(&b), Err(WireError::Reserved(1)));
        let mut h = write_hdr();
        h.len = 65;
        assert!(matches!(
            dec(&h.to_bytes()),
            Err(WireError::LenAboveTotal { .. })
        ));
        h.total = 1 << 30;
        h.len = (1 << 20) + 1;
        assert!(matches!(dec(&h.to_bytes()), Err(WireError::TooLong { .. })));
        let mut h = write_hdr();
        h.raddr = u64::MAX - 3;
        assert!(matches!(
            dec(&h.to_bytes()),
            Err(WireError::Overflow { .. })
        ));
        let mut h = Header::new(Op::Ack);
        h.len = 1;
        h.total = 1;
        assert!(matches!(
            dec(&h.to_bytes()),
            Err(WireError::NonzeroField { op: Op::Ack, .. })
        ));
        let mut h = write_hdr();
        h.flags = flags::FIRST;
        assert!(matches!(
            dec(&h.to_bytes()),
            Err(WireError::NonzeroField { field: "imm", .. })
        ));
    }

    #[test]
    fn hello_roundtrip_and_magic() {
        let h = Hello {
            target_qpn: 3,
            source_qpn: 9,
            target_nonce: 0x0102_0304_0506_0708,
        };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[0] ^= 1;
        assert!(matches!(Hello::decode(&b), Err(WireError::BadMagic(_))));
        assert!(matches!(
            Hello::decode(&b[..5]),
            Err(WireError::Short { .. })
        ));
    }

    #[test]
    fn psn_order_wraps() {
        assert!(psn_le(1, 1));
        assert!(psn_le(1, 2));
        assert!(!psn_le(2, 1));
        assert!(psn_le(u32::MAX, 0));
        assert!(!psn_le(0, u32::MAX));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64),
                               max in 0usize..(1 << 21)) {
            if let Ok(h) = Header::decode(&bytes, max) {
                // Whatever decodes re-encodes to the same header bytes.
                prop_assert_eq!(&h.to_bytes()[..], &bytes[..HEADER_LEN]);
                prop_assert!(h.len as usize <= max);
            }
            let _ = Hello::decode(&bytes);
        }

        #[test]
        fn valid_write_roundtrips(rkey: u32, psn: u32, raddr in 0u64..(1 << 60),
                                  total in 0u64..(1 << 30), imm: u32, first: bool) {
            let len = total.min(1 << 20) as u32;
            let h = Header { op: Op::Write,
                             flags: flags::LAST | flags::IMM | if first { flags::FIRST } else { 0 },
                             rkey, psn, raddr, total, len, imm };
            prop_assert_eq!(Header::decode(&h.to_bytes(), 1 << 20), Ok(h));
        }
    }
}
