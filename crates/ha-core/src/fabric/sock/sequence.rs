//! Pure decoding of a request stream (what a responder reads off its inbound TCP stream):
//! header bytes → a checked [`Header`] → a [`Step`] that says which bytes of which WRITE the
//! frame's payload is, or that it is a READ request. No I/O and no memory access: the
//! responder validates keys and ranges against its registrations on a WRITE's first segment
//! (the whole `[raddr, raddr + total)` range) and then places exactly `[from, to)`.
//!
//! Rules beyond [`Header::decode`]: only requests (WRITE, READ_REQ) travel on this stream;
//! PSNs are consecutive; a WRITE's segments are contiguous, in ascending order, with the same
//! `total`, the `LAST` flag exactly on the segment that ends it, and no empty segment but a
//! zero-length WRITE's only one or a striped WRITE's first (its first `striped_bytes` travel
//! on the lanes); nothing else starts inside a WRITE.

use super::wire::{flags, striped_bytes, Header, Op, WireError, HEADER_LEN, MAX_SEGMENT_BYTES};

/// Why a request stream is refused (the queue pair goes to ERR).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("reply {0:?} on a request stream")]
    Reply(Op),
    #[error("psn {got} expected {expected}")]
    Psn { got: u32, expected: u32 },
    #[error("WRITE FIRST inside a WRITE")]
    NestedWrite,
    #[error("READ inside a WRITE")]
    ReadInWrite,
    #[error("WRITE segment {0:?} out of order")]
    OutOfOrder(Header),
    #[error("WRITE segment {0:?} does not fit")]
    DoesNotFit(Header),
    #[error("striped WRITE ordinal {got}, expected {expected}")]
    Ordinal { got: u32, expected: u32 },
}

/// What one frame of a request stream asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Payload bytes `[from, to)` (the frame's `len` bytes) of the WRITE `[start, end)`.
    /// `first`: the WRITE starts here (validate `[start, end)` now); `last`: it ends here.
    Write {
        start: u64,
        end: u64,
        from: u64,
        to: u64,
        first: bool,
        last: bool,
    },
    /// A READ request of `total` bytes at `raddr` (no payload follows).
    Read,
}

/// The WRITE in progress: `[start, end)`, placed up to `next`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: u64,
    next: u64,
    end: u64,
    total: u64,
}

/// Sequencing state of one request stream.
#[derive(Clone, Debug, Default)]
pub struct RequestSeq {
    expected_psn: u32,
    write: Option<Span>,
    /// Ordinal of the last striped WRITE (they count up from 1).
    stripe_ordinal: u32,
}

impl RequestSeq {
    pub fn new() -> RequestSeq {
        RequestSeq::default()
    }

    #[cfg(test)]
    /// Whether a WRITE is partly received.
    pub(crate) fn in_write(&self) -> bool {
        self.write.is_some()
    }

    /// Decode the next frame header and check it against the stream so far. After an
    /// error the stream is dead (the state is left as it was).
    pub fn next(&mut self, hb: &[u8]) -> Result<(Header, Step), StreamError> {
        let h = Header::decode(hb, MAX_SEGMENT_BYTES)?;
        if !h.op.is_request() {
            return Err(StreamError::Reply(h.op));
        }
        if h.psn != self.expected_psn {
            return Err(StreamError::Psn {
                got: h.psn,
                expected: self.expected_psn,
            });
        }
        let step = match h.op {
            Op::Write => self.write_segment(&h)?,
            _ => {
                if self.write.is_some() {
                    return Err(StreamError::ReadInWrite);
                }
                Step::Read
            }
        };
        self.expected_psn = h.psn.wrapping_add(1);
        Ok((h, step))
    }

    fn write_segment(&mut self, h: &Header) -> Result<Step, StreamError> {
        if h.has(flags::LANE) {
            // A lane's frame never travels on the main stream.
            return Err(StreamError::OutOfOrder(*h));
        }
        let first = h.has(flags::FIRST);
        let span = if first {
            if self.write.is_some() {
                return Err(StreamError::NestedWrite);
            }
            // No overflow: checked by `Header::decode`.
            let end = h.raddr + h.total;
            Span {
                start: h.raddr,
                next: h.raddr,
                end,
                total: h.total,
            }
        } else {
            match self.write {
                Some(s) if s.next == h.raddr && s.total == h.total => s,
                _ => return Err(StreamError::OutOfOrder(*h)),
            }
        };
        if h.has(flags::STRIPED) {
            // Its first `striped_bytes` come over the lanes; this frame carries none.
            let striped = striped_bytes(h.total, h.lanes);
            if striped == 0 {
                return Err(StreamError::DoesNotFit(*h));
            }
            let expected = self.stripe_ordinal.wrapping_add(1);
            if h.imm != expected {
                return Err(StreamError::Ordinal {
                    got: h.imm,
                    expected,
                });
            }
            self.stripe_ordinal = expected;
            let next = span.start + striped;
            self.write = Some(Span { next, ..span });
            return Ok(Step::Write {
                start: span.start,
                end: span.end,
                from: next,
                to: next,
                first: true,
                last: false,
            });
        }
        let len = h.len as u64;
        let rest = span.end - span.next;
        let last = len == rest;
        if len > rest || last != h.has(flags::LAST) || (!last && len == 0) {
            return Err(StreamError::DoesNotFit(*h));
        }
        let from = span.next;
        let to = from + len;
        self.write = (!last).then_some(Span { next: to, ..span });
        Ok(Step::Write {
            start: span.start,
            end: span.end,
            from,
            to,
            first,
            last,
        })
    }
}

/// Split a recorded request stream (headers followed by their payloads) into frames:
/// `(header, step, payload)` for each frame that was accepted, then the error that ended it
/// (or `None` when the bytes ran out, a partial frame at the end being left unread).
#[allow(clippy::type_complexity)]
pub fn decode_stream(bytes: &[u8]) -> (Vec<(Header, Step, &[u8])>, Option<StreamError>) {
    let mut seq = RequestSeq::new();
    let mut out = Vec::new();
    let mut at = 0usize;
    while bytes.len() - at >= HEADER_LEN {
        let (h, step) = match seq.next(&bytes[at..at + HEADER_LEN]) {
            Ok(v) => v,
            Err(e) => return (out, Some(e)),
        };
        at += HEADER_LEN;
        let n = match step {
            Step::Write { .. } => h.len as usize,
            Step::Read => 0,
        };
        if bytes.len() - at < n {
            break;
        }
        out.push((h, step, &bytes[at..at + n]));
        at += n;
    }
    (out, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::sock::wire::STRIPE_MIN;

    fn write(psn: u32, fl: u8, raddr: u64, total: u64, len: u32) -> [u8; HEADER_LEN] {
        let mut h = Header::new(Op::Write);
        h.flags = fl;
        h.psn = psn;
        h.raddr = raddr;
        h.total = total;
        h.len = len;
        h.to_bytes()
    }

    /// A striped WRITE on the main stream: the STRIPED frame covers the lanes' bytes, the
    /// segments that follow start after them; a STRIPED frame for a WRITE too small to stripe
    /// and a lane's frame are refused.
    #[test]
    fn a_striped_write_resumes_after_the_lanes_share() {
        let total = 1u64 << 20;
        let striped = striped_bytes(total, 4);
        let mut st = Header::new(Op::Write);
        (st.flags, st.raddr, st.total, st.imm, st.lanes) =
            (flags::FIRST | flags::STRIPED, 0x1000, total, 1, 4);
        let mut seq = RequestSeq::new();
        let (_, step) = seq.next(&st.to_bytes()).unwrap();
        let at = 0x1000 + striped;
        assert_eq!(
            step,
            Step::Write {
                start: 0x1000,
                end: 0x1000 + total,
                from: at,
                to: at,
                first: true,
                last: false
            }
        );
        let rest = (total - striped) as u32;
        let (_, step) = seq.next(&write(1, flags::LAST, at, total, rest)).unwrap();
        assert!(matches!(step, Step::Write { last: true, from, .. } if from == at));
        // Resuming anywhere else is out of order.
        let mut seq = RequestSeq::new();
        seq.next(&st.to_bytes()).unwrap();
        assert!(matches!(
            seq.next(&write(1, flags::LAST, 0x1000, total, total as u32)),
            Err(StreamError::OutOfOrder(_))
        ));
        // The next striped WRITE must be ordinal 2: not 1 again, not one from long ago.
        let mut seq = RequestSeq::new();
        seq.next(&st.to_bytes()).unwrap();
        seq.next(&write(1, flags::LAST, at, total, rest)).unwrap();
        for bad in [1, 0x8000_0001] {
            let h = Header {
                psn: 2,
                imm: bad,
                ..st
            };
            assert_eq!(
                seq.clone().next(&h.to_bytes()),
                Err(StreamError::Ordinal {
                    got: bad,
                    expected: 2
                })
            );
        }
        let h = Header {
            psn: 2,
            imm: 2,
            ..st
        };
        assert!(seq.next(&h.to_bytes()).is_ok());
        let small = Header {
            total: STRIPE_MIN - 1,
            ..st
        };
        assert!(matches!(
            RequestSeq::new().next(&small.to_bytes()),
            Err(StreamError::DoesNotFit(_))
        ));
        let mut lane = Header::new(Op::Write);
        let share = (striped / 3) as u32;
        (lane.flags, lane.raddr, lane.total, lane.len, lane.lanes) =
            (flags::LANE, 0x1000, total, share, 4);
        assert!(matches!(
            RequestSeq::new().next(&lane.to_bytes()),
            Err(StreamError::OutOfOrder(_))
        ));
    }

    #[test]
    fn segments_in_order_are_accepted() {
        let mut s = RequestSeq::new();
        let (_, st) = s.next(&write(0, flags::FIRST, 0x1000, 100, 60)).unwrap();
        assert_eq!(
            st,
            Step::Write {
                start: 0x1000,
                end: 0x1064,
                from: 0x1000,
                to: 0x103c,
                first: true,
                last: false
            }
        );
        assert!(s.in_write());
        let (_, st) = s.next(&write(1, flags::LAST, 0x103c, 100, 40)).unwrap();
        assert!(matches!(
            st,
            Step::Write {
                from: 0x103c,
                to: 0x1064,
                last: true,
                first: false,
                ..
            }
        ));
        assert!(!s.in_write());
        // A zero-length WRITE is one empty FIRST|LAST segment.
        let (_, st) = s
            .next(&write(2, flags::FIRST | flags::LAST, 0, 0, 0))
            .unwrap();
        assert!(matches!(
            st,
            Step::Write {
                from: 0,
                to: 0,
                last: true,
                ..
            }
        ));
        let mut r = Header::new(Op::ReadReq);
        r.psn = 3;
        r.total = 8;
        r.raddr = 8;
        assert_eq!(s.next(&r.to_bytes()).unwrap().1, Step::Read);
    }

    #[test]
    fn misordered_streams_are_refused() {
        let mut s = RequestSeq::new();
        assert_eq!(
            s.next(&write(5, flags::FIRST | flags::LAST, 0, 8, 8)),
            Err(StreamError::Psn {
                got: 5,
                expected: 0
            })
        );
        s.next(&write(0, flags::FIRST, 0x1000, 100, 10)).unwrap();
        // Gap, wrong total, nested FIRST, READ inside, LAST too early, empty middle segment.
        assert!(matches!(
            s.clone().next(&write(1, 0, 0x100b, 100, 10)),
            Err(StreamError::OutOfOrder(_))
        ));
        assert!(matches!(
            s.clone().next(&write(1, 0, 0x100a, 101, 10)),
            Err(StreamError::OutOfOrder(_))
        ));
        assert_eq!(
            s.clone().next(&write(1, flags::FIRST, 0x100a, 100, 10)),
            Err(StreamError::NestedWrite)
        );
        let mut r = Header::new(Op::ReadReq);
        r.psn = 1;
        assert_eq!(s.clone().next(&r.to_bytes()), Err(StreamError::ReadInWrite));
        assert!(matches!(
            s.clone().next(&write(1, flags::LAST, 0x100a, 100, 10)),
            Err(StreamError::DoesNotFit(_))
        ));
        assert!(matches!(
            s.clone().next(&write(1, 0, 0x100a, 100, 0)),
            Err(StreamError::DoesNotFit(_))
        ));
        assert_eq!(
            s.clone().next(&Header::new(Op::Ack).to_bytes()),
            Err(StreamError::Reply(Op::Ack))
        );
        // A segment that does not start a WRITE when none is open.
        let mut fresh = RequestSeq::new();
        assert!(matches!(
            fresh.next(&write(0, flags::LAST, 0, 8, 8)),
            Err(StreamError::OutOfOrder(_))
        ));
    }

    #[test]
    fn decode_stream_skips_payloads() {
        let mut bytes = write(0, flags::FIRST, 64, 16, 8).to_vec();
        bytes.extend_from_slice(&[1; 8]);
        bytes.extend_from_slice(&write(1, flags::LAST, 72, 16, 8));
        bytes.extend_from_slice(&[2; 8]);
        bytes.extend_from_slice(&[0xff; HEADER_LEN]);
        let (frames, err) = decode_stream(&bytes);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].2, &[1; 8]);
        assert_eq!(frames[1].2, &[2; 8]);
        assert!(matches!(
            err,
            Some(StreamError::Wire(WireError::UnknownOp(0xff)))
        ));
    }
}
