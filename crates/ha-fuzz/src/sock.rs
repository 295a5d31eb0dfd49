//! Targets `sock_header` and `sock_stream`: the `sock` fabric's frame header, stream hello
//! and endpoint decoders, and the request-stream decoder a responder runs on what a peer
//! sends (which bytes of which WRITE each payload is).

use super::input::Input;
use ha_core::fabric::sock::hello::Hello;
use ha_core::fabric::sock::sequence::{decode_stream, Step};
use ha_core::fabric::sock::wire::{flags, Header, Op, HEADER_LEN, MAX_SEGMENT_BYTES};
use ha_core::fabric::sock::SockEndpoint;

/// `[max_len u32][bytes...]`: the bytes as a frame header (payload bound `max_len`), as a
/// stream hello and as a queue-pair endpoint.
pub fn sock_header(data: &[u8]) {
    let mut inp = Input::new(data);
    let max = inp.u32() as usize % (2 * MAX_SEGMENT_BYTES);
    let b = inp.rest();
    if let Ok(h) = Header::decode(b, max) {
        assert_eq!(&h.to_bytes()[..], &b[..HEADER_LEN], "header not canonical");
        assert!(h.len as usize <= max);
        assert!(
            h.raddr.checked_add(h.total).is_some()
                || !matches!(h.op, Op::Write | Op::ReadReq | Op::ReadResp)
        );
        if h.op == Op::Write || h.op == Op::ReadResp {
            assert!(h.len as u64 <= h.total);
        }
        if h.has(flags::IMM) {
            assert!(h.op == Op::Write && h.has(flags::LAST));
        }
        if h.has(flags::PROMPT) {
            assert!(matches!(h.op, Op::Ack | Op::KeepAlive));
        }
    }
    if let Ok(h) = Hello::decode(b) {
        assert_eq!(&h.encode()[..], &b[..h.encode().len()]);
    }
    if let Ok(ep) = SockEndpoint::decode(b) {
        assert_eq!(ep.encode(), b, "endpoint not canonical");
        assert!(ep.port != 0 && ep.qpn != 0);
    }
}

/// The bytes as a request stream: every WRITE payload the decoder hands out lies inside the
/// WRITE's range (the range a responder validates against its registrations), segments are
/// contiguous and a WRITE ends exactly at its end.
pub fn sock_stream(data: &[u8]) {
    let (frames, err) = decode_stream(data);
    let mut psn = 0u32;
    let mut open: Option<(u64, u64, u64)> = None; // (start, end, next)
    for (h, step, payload) in &frames {
        assert_eq!(h.psn, psn, "psn skipped");
        psn = psn.wrapping_add(1);
        match *step {
            Step::Write {
                start,
                end,
                from,
                to,
                first,
                last,
            } => {
                assert!(
                    start <= from && from <= to && to <= end,
                    "segment outside its WRITE"
                );
                assert_eq!(end - start, h.total);
                assert_eq!(to - from, payload.len() as u64);
                assert!(payload.len() <= MAX_SEGMENT_BYTES);
                if first {
                    assert!(open.is_none(), "WRITE started inside a WRITE");
                    assert_eq!(from, start);
                } else {
                    let (s, e, next) = open.expect("segment outside a WRITE");
                    assert_eq!((s, e, next), (start, end, from), "segment out of order");
                }
                if last {
                    assert_eq!(to, end, "WRITE ended early");
                    open = None;
                } else {
                    assert!(to < end && to > from);
                    open = Some((start, end, to));
                }
            }
            Step::Read => {
                assert!(open.is_none(), "READ inside a WRITE");
                assert_eq!(h.op, Op::ReadReq);
            }
        }
    }
    if let Some(e) = err {
        assert!(!e.to_string().is_empty());
    }
}

fn write(psn: u32, fl: u8, raddr: u64, total: u64, len: u32, imm: u32) -> [u8; HEADER_LEN] {
    let mut h = Header::new(Op::Write);
    h.flags = fl;
    h.psn = psn;
    h.raddr = raddr;
    h.total = total;
    h.len = len;
    h.imm = imm;
    h.to_bytes()
}

pub(super) fn header_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = (1u32 << 20).to_le_bytes().to_vec();
    w.extend_from_slice(&write(
        7,
        flags::FIRST | flags::LAST | flags::IMM,
        0x1000,
        64,
        64,
        5,
    ));
    out.push(w);
    let mut a = 64u32.to_le_bytes().to_vec();
    let mut ack = Header::new(Op::Ack);
    ack.flags = flags::WR_DONE | flags::PROMPT;
    a.extend_from_slice(&ack.to_bytes());
    out.push(a);
    let mut h = 0u32.to_le_bytes().to_vec();
    h.extend_from_slice(
        &Hello {
            target_qpn: 3,
            source_qpn: 4,
            target_nonce: 5,
            lane: 0,
        }
        .encode(),
    );
    out.push(h);
    let mut e = 0u32.to_le_bytes().to_vec();
    e.extend_from_slice(
        &SockEndpoint {
            ip: "127.0.0.1".parse().expect("ip"),
            port: 4000,
            qpn: 2,
            nonce: 9,
        }
        .encode(),
    );
    out.push(e);
    out
}

pub(super) fn stream_seeds() -> Vec<Vec<u8>> {
    let mut s = write(0, flags::FIRST, 0x1000, 24, 16, 0).to_vec();
    s.extend_from_slice(&[1; 16]);
    s.extend_from_slice(&write(1, flags::LAST | flags::IMM, 0x1010, 24, 8, 3));
    s.extend_from_slice(&[2; 8]);
    let mut r = Header::new(Op::ReadReq);
    r.psn = 2;
    r.raddr = 0x2000;
    r.total = 4096;
    s.extend_from_slice(&r.to_bytes());
    s.extend_from_slice(&write(3, flags::FIRST | flags::LAST, 0, 0, 0, 0));
    vec![s]
}
