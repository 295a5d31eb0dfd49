//! A rogue peer speaking raw frames on a queue pair's inbound stream (no requester checks
//! on its side): WRITEs outside the registered range, across its edges, with a wrong, stale
//! or deregistered-midway key, segments that leave their WRITE. Each is refused before any
//! byte outside what the registration allows is touched (guard bytes around the region are
//! checked), the queue pair goes to ERR with its receives flushed, and the rogue's stream is
//! closed (after a NAK with the access syndrome where the key or range was at fault).

use super::*;
use crate::fabric::sock::wire::{flags, syndrome, HEADER_LEN};

const GUARD: usize = 4096;
const REGION: usize = 4096;
const CANARY: u8 = 0xEE;

/// A victim queue pair (inbound stream only) with memory `[guard | region | guard]`, the
/// middle registered for remote writes, and two receives posted.
struct Victim {
    _peer: TcpListener,
    side: Side,
    mem: Buf,
    mr: Option<Box<dyn MemoryRegion>>,
}

impl Victim {
    fn new(f: &SockFabric) -> Victim {
        let (peer, ep) = silent_peer();
        let side = lone_rts(f, CAPS, &ep);
        let mem = Buf::new(GUARD + REGION + GUARD, CANARY);
        let mr = side
            .pd
            .reg_mr(mem.addr() + GUARD, REGION, Access::REMOTE_WRITE)
            .unwrap();
        side.qp.post_recv(1).unwrap();
        side.qp.post_recv(2).unwrap();
        Victim {
            _peer: peer,
            side,
            mem,
            mr: Some(mr),
        }
    }
    fn base(&self) -> u64 {
        (self.mem.addr() + GUARD) as u64
    }
    fn rkey(&self) -> u32 {
        self.mr.as_ref().unwrap().keys().rkey
    }
    /// Byte ranges (offsets into the whole buffer) that may differ from the canary.
    fn assert_untouched_except(&self, written: std::ops::Range<usize>) {
        for (i, b) in self.mem.bytes().iter().enumerate() {
            if !written.contains(&i) {
                assert_eq!(*b, CANARY, "byte {i} (region at {GUARD}) was written");
            }
        }
    }
    /// The queue pair failed: both receives flushed, state ERR.
    fn assert_failed(&self) {
        assert_eq!(
            statuses(&self.side.wait(2)),
            vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(self.side.qp.state(), QpState::Err);
    }
}

fn write_hdr(psn: u32, fl: u8, rkey: u32, raddr: u64, total: u64, len: u32) -> [u8; HEADER_LEN] {
    let mut h = Header::new(Op::Write);
    h.flags = fl;
    h.rkey = rkey;
    h.psn = psn;
    h.raddr = raddr;
    h.total = total;
    h.len = len;
    h.to_bytes()
}

/// Frames the victim sends back until it closes the stream.
fn replies(s: &mut TcpStream) -> Vec<Header> {
    let mut out = Vec::new();
    let mut hb = [0u8; HEADER_LEN];
    while s.read_exact(&mut hb).is_ok() {
        out.push(Header::decode(&hb, 0).expect("the victim sends well-formed replies"));
    }
    out
}

fn assert_nak_access(rs: &[Header], psn: u32) {
    let last = rs.last().expect("no reply before the close");
    assert_eq!(last.op, Op::Nak, "{rs:?}");
    assert_eq!((last.psn, last.imm), (psn, syndrome::REMOTE_ACCESS));
    assert!(rs[..rs.len() - 1].iter().all(|h| h.op == Op::Ack));
}

/// One single-segment WRITE of `len` bytes at `raddr` with `rkey`, which must be refused
/// with a NAK and touch nothing.
fn refused_write(raddr: impl Fn(&Victim) -> u64, rkey: impl Fn(&Victim) -> u32, len: u32) {
    let f = fabric(LONG, 1 << 20);
    let v = Victim::new(&f);
    let mut s = raw_stream_to(&v.side.ep(), v.side.ep().nonce);
    let mut frame = write_hdr(
        0,
        flags::FIRST | flags::LAST,
        rkey(&v),
        raddr(&v),
        len as u64,
        len,
    )
    .to_vec();
    frame.extend(std::iter::repeat_n(0x5a, len as usize));
    s.write_all(&frame).unwrap();
    assert_nak_access(&replies(&mut s), 0);
    v.assert_failed();
    v.assert_untouched_except(0..0);
}

#[test]
fn write_past_the_end_of_the_region() {
    let _l = TEST_LOCK.read();
    refused_write(|v| v.base() + REGION as u64 - 8, |v| v.rkey(), 16);
}

#[test]
fn write_before_the_start_of_the_region() {
    let _l = TEST_LOCK.read();
    refused_write(|v| v.base() - 8, |v| v.rkey(), 16);
}

#[test]
fn write_into_the_guard_far_away() {
    let _l = TEST_LOCK.read();
    refused_write(|v| v.base() + REGION as u64 + 64, |v| v.rkey(), 64);
}

#[test]
fn write_with_a_wrong_key() {
    let _l = TEST_LOCK.read();
    refused_write(|v| v.base(), |v| v.rkey() ^ 0x4000_0000, 64);
}

#[test]
fn write_with_a_deregistered_key() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let mut v = Victim::new(&f);
    let rkey = v.rkey();
    drop(v.mr.take());
    let mut s = raw_stream_to(&v.side.ep(), v.side.ep().nonce);
    let mut frame = write_hdr(0, flags::FIRST | flags::LAST, rkey, v.base(), 64, 64).to_vec();
    frame.extend_from_slice(&[0x5a; 64]);
    s.write_all(&frame).unwrap();
    assert_nak_access(&replies(&mut s), 0);
    v.assert_failed();
    v.assert_untouched_except(0..0);
}

/// First segment `[base, base+32)` of a 64-byte WRITE, placed and observed.
fn first_half(v: &Victim, s: &mut TcpStream) {
    let mut frame = write_hdr(0, flags::FIRST, v.rkey(), v.base(), 64, 32).to_vec();
    frame.extend_from_slice(&[0x11; 32]);
    s.write_all(&frame).unwrap();
    let deadline = Instant::now() + LONG;
    let base = v.mem.addr() + GUARD;
    // SAFETY: volatile reads of bytes inside `v.mem`, which lives; the responder may be
    // receiving into them right now, so they are read one by one, volatile, until placed.
    let placed =
        || (0..32).all(|i| unsafe { std::ptr::read_volatile((base + i) as *const u8) } == 0x11);
    while !placed() {
        assert!(Instant::now() < deadline, "first segment not placed");
        std::thread::yield_now();
    }
}

#[test]
fn segment_that_leaves_its_write() {
    let _l = TEST_LOCK.read();
    for second in [
        // Jumps past the region (a valid header, out of sequence).
        |b: u64| write_hdr(1, flags::LAST, 0, b + REGION as u64, 64, 32),
        // Goes back over the first segment.
        |b: u64| write_hdr(1, flags::LAST, 0, b, 64, 32),
        // Claims more than the WRITE has left.
        |b: u64| write_hdr(1, flags::LAST, 0, b + 32, 64, 64),
        // Changes the WRITE's total to reach further.
        |b: u64| write_hdr(1, flags::LAST, 0, b + 32, 1 << 20, 32),
    ] {
        let f = fabric(LONG, 1 << 20);
        let v = Victim::new(&f);
        let mut s = raw_stream_to(&v.side.ep(), v.side.ep().nonce);
        first_half(&v, &mut s);
        let mut frame = second(v.base()).to_vec();
        frame.extend_from_slice(&[0x22; 64]);
        s.write_all(&frame).unwrap();
        let rs = replies(&mut s);
        assert!(rs.iter().all(|h| h.op == Op::Ack), "{rs:?}");
        v.assert_failed();
        v.assert_untouched_except(GUARD..GUARD + 32);
    }
}

#[test]
fn region_deregistered_between_segments() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let mut v = Victim::new(&f);
    let mut s = raw_stream_to(&v.side.ep(), v.side.ep().nonce);
    first_half(&v, &mut s);
    drop(v.mr.take());
    let mut frame = write_hdr(1, flags::LAST, 0, v.base() + 32, 64, 32).to_vec();
    frame.extend_from_slice(&[0x22; 32]);
    s.write_all(&frame).unwrap();
    assert_nak_access(&replies(&mut s), 1);
    v.assert_failed();
    v.assert_untouched_except(GUARD..GUARD + 32);
}
