//! Wire format of the `sock` fabric: the fixed 36-byte frame header (the hello: `hello.rs`).
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
//! | 2      | 2    | lanes    | WRITE with `STRIPED`: streams of the queue pair; else 0     |
//! | 4      | 4    | rkey     | remote key (WRITE, READ_REQ)                                |
//! | 8      | 4    | psn      | packet sequence number (see the requester/responder docs)  |
//! | 12     | 8    | raddr    | WRITE: address of this segment; READ_RESP: offset in read   |
//! | 20     | 8    | total    | length of the whole work request                            |
//! | 28     | 4    | len      | payload bytes of this frame                                 |
//! | 32     | 4    | imm      | WRITE with `IMM`: immediate; with `STRIPED`: its ordinal;   |
//! |        |      |          | NAK: syndrome                                               |
//!
//! Striping: a queue pair may open up to [`MAX_LANES`]` - 1` extra streams (lanes) to the same
//! peer queue pair, each starting with a lane hello. A WRITE of at least [`STRIPE_MIN`] bytes
//! then sends its first [`striped_bytes`] bytes as one WRITE frame per lane (`LANE`, `psn` =
//! the striped WRITE's ordinal, `raddr`/`total` = the whole WRITE, `imm` = the share's offset
//! in it, `lanes` = the number of streams: every stream validates the whole range, and a share
//! is exactly the one the layout gives that lane), and on the main stream a `FIRST | STRIPED`
//! frame without
//! payload (`imm` = the same ordinal, `lanes` = the number of streams) followed by the rest of
//! the WRITE as usual. The responder places the rest as it comes, but stores its last word,
//! delivers its immediate and acknowledges it only once every lane has placed that ordinal's
//! frame, so all of those still come after all its bytes.

use std::fmt;

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 36;
/// Largest payload a frame may carry, whatever the sender's segment size.
pub const MAX_SEGMENT_BYTES: usize = 16 << 20;
/// Most streams (main + lanes) one queue pair stripes a WRITE over.
pub const MAX_LANES: u16 = 8;
/// Smallest WRITE that is striped: NCCL's full pipeline step (4 MiB buffer / 8 steps);
/// smaller ones are latency-bound, and the lanes' hand-offs cost them more than they gain
/// (bench/results/2026-11-27-sock-lanes.md).
pub const STRIPE_MIN: u64 = 512 << 10;

/// Bytes of a `total`-byte WRITE that each lane of a queue pair with `lanes` streams carries:
/// `total / lanes` in 4 KiB units, at most [`MAX_SEGMENT_BYTES`]; the main stream carries the
/// rest, at least a share. 0 = not striped.
pub fn stripe_share(total: u64, lanes: u16) -> u64 {
    if !(2..=MAX_LANES).contains(&lanes) || total < STRIPE_MIN {
        return 0;
    }
    (total / u64::from(lanes)).min(MAX_SEGMENT_BYTES as u64) & !4095
}

/// Bytes of a `total`-byte WRITE that go over the lanes: one [`stripe_share`] per lane.
pub fn striped_bytes(total: u64, lanes: u16) -> u64 {
    stripe_share(total, lanes) * u64::from(lanes.max(1) - 1)
}

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
            Op::Write => {
                flags::FIRST
                    | flags::LAST
                    | flags::IMM
                    | flags::QUIET
                    | flags::STRIPED
                    | flags::LANE
            }
            Op::ReadResp => flags::FIRST | flags::LAST,
            Op::Ack => flags::WR_DONE | flags::PROMPT,
            Op::KeepAlive => flags::PROMPT,
            Op::ReadReq | Op::Nak => 0,
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
    /// WRITE, FIRST segment, no payload: the WRITE's first `striped_bytes` travel on the
    /// queue pair's lanes (see the module doc).
    pub const STRIPED: u8 = 32;
    /// WRITE on a lane, alone: one share of a striped WRITE (see the module doc).
    pub const LANE: u8 = 64;
    /// ACK or keep-alive: the responder's kernel acknowledges this stream within a few
    /// milliseconds whatever its thread does (its delayed ACK is capped: `delack.rs`), so
    /// the requester may count a lone segment's silence from its round trip.
    pub const PROMPT: u8 = 128;
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
    #[error("striped WRITE {0}")]
    BadStripe(&'static str),
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
    /// Streams of the queue pair (`STRIPED` only; else 0).
    pub lanes: u16,
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} fl={:#x} rkey={:#x} psn={} raddr={:#x} total={} len={} imm={:#x} lanes={}",
            self.op,
            self.flags,
            self.rkey,
            self.psn,
            self.raddr,
            self.total,
            self.len,
            self.imm,
            self.lanes
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
            lanes: 0,
        }
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Encode into `out`.
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        out[0] = self.op as u8;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.lanes.to_le_bytes());
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
            lanes: reserved,
        };
        if flags & !op.allowed_flags() != 0 {
            return Err(WireError::BadFlags { op, flags });
        }
        if reserved != 0 && !h.has(flags::STRIPED) && !h.has(flags::LANE) {
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
                    || h.has(flags::STRIPED) && (!h.has(flags::FIRST) || h.has(flags::LAST))
                    || h.has(flags::LANE) && h.flags != flags::LANE
                {
                    return Err(WireError::BadFlags { op, flags });
                }
                if h.has(flags::LANE) {
                    // Exactly one of the shares `striped_bytes` lays out: never the main
                    // stream's part (nor its last word).
                    let striped = striped_bytes(h.total, h.lanes);
                    let share = stripe_share(h.total, h.lanes);
                    if share == 0
                        || u64::from(h.len) != share
                        || u64::from(h.imm) % share != 0
                        || u64::from(h.imm) >= striped
                    {
                        return Err(WireError::BadStripe("lane frame is not one of its shares"));
                    }
                    h.check_range()?;
                    return Ok(h);
                }
                if h.has(flags::STRIPED) {
                    if h.len != 0 {
                        return Err(WireError::BadStripe("frame carries payload"));
                    }
                    if h.lanes < 2 || h.lanes > MAX_LANES {
                        return Err(WireError::BadStripe("lane count out of range"));
                    }
                } else if !h.has(flags::IMM) {
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

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// `a` is at or before `b` in wrapping PSN order.
pub fn psn_le(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) < (1 << 31)
}

#[cfg(test)]
mod tests;
