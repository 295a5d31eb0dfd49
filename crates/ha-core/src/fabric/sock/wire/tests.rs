//! Wire format tests: frame encode/decode round trips, and every malformed frame refused.

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
        lanes: 0,
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
    // PROMPT only on what a responder sends back to say it lives: ACK and keep-alive.
    for op in [Op::Ack, Op::KeepAlive] {
        let mut h = Header::new(op);
        h.flags = flags::PROMPT | if op == Op::Ack { flags::WR_DONE } else { 0 };
        assert_eq!(dec(&h.to_bytes()).map(|d| d.flags), Ok(h.flags), "{op:?}");
    }
    for op in [Op::Write, Op::ReadReq, Op::ReadResp, Op::Nak] {
        let mut b = Header::new(op).to_bytes();
        b[1] |= flags::PROMPT;
        assert!(
            matches!(dec(&b), Err(WireError::BadFlags { .. })),
            "{op:?} with PROMPT"
        );
    }
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
fn striped_bytes_leave_the_main_stream_a_share() {
    let m = STRIPE_MIN;
    assert_eq!(striped_bytes(m - 1, 4), 0);
    assert_eq!(striped_bytes(1 << 30, 1), 0);
    assert_eq!(striped_bytes(1 << 30, MAX_LANES + 1), 0);
    assert_eq!(striped_bytes(m, 4), 3 * (m / 4));
    assert_eq!(striped_bytes(1 << 20, 4), 3 << 18);
    // Shares are whole 4 KiB pages; the main stream keeps the rest (at least a share).
    assert_eq!(striped_bytes(m + 4093, 4), 3 * (m / 4));
    assert_eq!(
        striped_bytes((3 << 20) + 5, 8),
        7 * ((((3 << 20) + 5) / 8) & !4095)
    );
    // A share is one frame: at most MAX_SEGMENT_BYTES.
    assert_eq!(striped_bytes(1 << 32, 2), MAX_SEGMENT_BYTES as u64);
}

#[test]
fn striped_and_lane_frames_are_checked() {
    let dec = |h: &Header| Header::decode(&h.to_bytes(), 1 << 24);
    let mut st = Header::new(Op::Write);
    (st.flags, st.rkey, st.raddr, st.total, st.imm, st.lanes) =
        (flags::FIRST | flags::STRIPED, 5, 0x1000, 1 << 20, 9, 4);
    assert_eq!(dec(&st), Ok(st));
    for (f, why) in [
        (flags::STRIPED, "no FIRST"),
        (flags::FIRST | flags::STRIPED | flags::LAST, "LAST"),
    ] {
        let h = Header { flags: f, ..st };
        assert!(matches!(dec(&h), Err(WireError::BadFlags { .. })), "{why}");
    }
    for (h, why) in [
        (Header { len: 8, ..st }, "payload"),
        (Header { lanes: 1, ..st }, "1 stream"),
        (
            Header {
                lanes: MAX_LANES + 1,
                ..st
            },
            "9 streams",
        ),
    ] {
        assert!(matches!(dec(&h), Err(WireError::BadStripe(_))), "{why}");
    }
    // Only a STRIPED frame may say how many streams there are.
    let h = Header {
        flags: flags::FIRST,
        imm: 0,
        ..st
    };
    assert_eq!(dec(&h), Err(WireError::Reserved(4)));
    // 1 MiB over 4 streams: 256 KiB shares at 0, 256 and 512 KiB; the main keeps the rest.
    let mut lane = Header::new(Op::Write);
    (
        lane.flags, lane.raddr, lane.total, lane.len, lane.imm, lane.lanes,
    ) = (flags::LANE, 0x1000, 1 << 20, 256 << 10, 512 << 10, 4);
    assert_eq!(dec(&lane), Ok(lane));
    for (h, why) in [
        (
            Header {
                imm: 768 << 10,
                ..lane
            },
            "the main stream's part",
        ),
        (
            Header {
                imm: (256 << 10) + 4096,
                ..lane
            },
            "between shares",
        ),
        (Header { len: 4096, ..lane }, "part of a share"),
        (Header { len: 0, ..lane }, "empty"),
        (Header { lanes: 1, ..lane }, "1 stream"),
        (Header { lanes: 0, ..lane }, "no stream count"),
        (
            Header {
                total: STRIPE_MIN - 1,
                len: 4096,
                imm: 0,
                ..lane
            },
            "too small to stripe",
        ),
    ] {
        assert!(matches!(dec(&h), Err(WireError::BadStripe(_))), "{why}");
    }
    let h = Header {
        flags: flags::LANE | flags::LAST,
        ..lane
    };
    assert!(matches!(dec(&h), Err(WireError::BadFlags { .. })));
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
    }

    #[test]
    fn valid_write_roundtrips(rkey: u32, psn: u32, raddr in 0u64..(1 << 60),
                              total in 0u64..(1 << 30), imm: u32, first: bool) {
        let len = total.min(1 << 20) as u32;
        let h = Header { op: Op::Write,
                         flags: flags::LAST | flags::IMM | if first { flags::FIRST } else { 0 },
                         rkey, psn, raddr, total, len, imm, lanes: 0 };
        prop_assert_eq!(Header::decode(&h.to_bytes(), 1 << 20), Ok(h));
    }
}
