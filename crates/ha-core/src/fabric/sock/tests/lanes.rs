//! Striping over lanes: large WRITEs land whole, complete after all their bytes, and are
//! refused whole (the test fabric opens 4 streams per queue pair).

use super::*;
use crate::fabric::sock::striped_writes;
use crate::fabric::sock::wire::{flags, striped_bytes, STRIPE_MIN};

/// WRITE_WITH_IMMs below, at and well above the striping size, to unaligned addresses, in one
/// post behind an unsignaled striped WRITE: every byte lands, nothing past the end, each
/// receive reports the whole length, and the striped ones did go over the lanes.
#[test]
fn striped_writes_land_whole_and_complete_after_all_their_bytes() {
    // Alone: the striping counter is process-wide.
    let _l = TEST_LOCK.write();
    let (_f, a, b) = pair(LONG, 1 << 20);
    const SPAN: usize = 80 << 20;
    let mut src = Buf::new(SPAN, 0);
    src.pattern(21);
    let dst = Buf::new(SPAN, 0xEE);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let sizes = [
        STRIPE_MIN as usize - 1,
        STRIPE_MIN as usize,
        STRIPE_MIN as usize + 4093,
        (3 << 20) + 5,
        64 << 20,
    ];
    let before = striped_writes();
    // An unsignaled striped WRITE first: its bytes must be in place when the others complete.
    let mut off = 0;
    let mut first = wr(
        99,
        SendOp::Write,
        (&src, 0, 1 << 20, ms.keys().lkey),
        dst.addr() + 1,
        md.keys().rkey,
    );
    first.signaled = false;
    let mut wrs = vec![first];
    let mut spans = vec![(1usize, 0usize, 1usize << 20)];
    off += (1 << 20) + 64;
    for (i, &n) in sizes.iter().enumerate() {
        let at = off + 3;
        wrs.push(wr(
            i as u64,
            SendOp::WriteWithImm(i as u32 + 7),
            (&src, at, n, ms.keys().lkey),
            dst.addr() + at + 1,
            md.keys().rkey,
        ));
        spans.push((at + 1, at, n));
        off = at + n + 64;
    }
    assert!(off < SPAN);
    for i in 0..sizes.len() {
        b.qp.post_recv(100 + i as u64).unwrap();
    }
    a.qp.post_send(&wrs).unwrap();
    let rc = b.wait(sizes.len());
    for (i, c) in rc.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.imm, c.byte_len as usize),
            (
                100 + i as u64,
                WcStatus::Success,
                Some(i as u32 + 7),
                sizes[i]
            )
        );
    }
    assert_eq!(
        statuses(&a.wait(sizes.len())),
        (0..sizes.len() as u64)
            .map(|i| (i, WcStatus::Success))
            .collect::<Vec<_>>()
    );
    let d = dst.bytes();
    let s = src.bytes();
    let mut end = 0;
    for &(to, from, n) in &spans {
        assert!(
            d[end..to].iter().all(|&x| x == 0xEE),
            "wrote outside a WRITE before {to}"
        );
        assert!(
            d[to..to + n] == s[from..from + n],
            "WRITE of {n} bytes at {to} differs"
        );
        end = to + n;
    }
    assert!(
        d[end..].iter().all(|&x| x == 0xEE),
        "wrote past the last WRITE"
    );
    // 1 MiB, 256 KiB, 256 KiB + 4093, 3 MiB + 5 and 64 MiB went over the lanes.
    assert_eq!(striped_writes() - before, 5);
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
}

/// A striped WRITE to memory the peer may not write is refused whole: remote access error,
/// both queue pairs in ERR, not one byte placed by the main stream or a lane.
#[test]
fn a_striped_write_out_of_bounds_is_refused_whole() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(4 << 20, 5);
    let dst = Buf::new(4 << 20, 0xEE);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    // Ends 4 KiB past the region: the lanes' shares are inside it, the main stream's is not.
    let w = wr(
        1,
        SendOp::Write,
        (&src, 0, 2 << 20, ms.keys().lkey),
        dst.addr() + (2 << 20) + 4096,
        md.keys().rkey,
    );
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(1, WcStatus::RemAccessErr)]);
    let deadline = Instant::now() + LONG;
    while b.qp.state() != QpState::Err {
        assert!(
            Instant::now() < deadline,
            "the responder's queue pair stayed up"
        );
        std::thread::yield_now();
    }
    assert!(
        dst.bytes().iter().all(|&x| x == 0xEE),
        "a refused WRITE placed bytes"
    );
}

/// A rogue peer announces a WRITE striped over 4 streams but never opens a lane: the
/// responder places the main stream's share, waits (keep-alives going out meanwhile), then
/// ends the queue pair after ten retry windows. The WRITE never completes: its receive is
/// flushed and its last word was never stored.
#[test]
fn a_striped_write_whose_lanes_never_come_fails_the_queue_pair() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(250);
    let f = fabric(retry, 1 << 20);
    let (_peer, ep) = silent_peer();
    let v = lone_rts(&f, CAPS, &ep);
    const LEN: usize = 1 << 20;
    let mem = Buf::new(LEN, 0xEE);
    let mr = v.reg(&mem, Access::REMOTE_WRITE);
    v.qp.post_recv(1).unwrap();
    let mut s = raw_stream_to(&v.ep(), v.ep().nonce);
    let striped = striped_bytes(LEN as u64, 4);
    let mut st = Header::new(Op::Write);
    (st.flags, st.rkey, st.raddr, st.total, st.imm, st.lanes) = (
        flags::FIRST | flags::STRIPED,
        mr.keys().rkey,
        mem.addr() as u64,
        LEN as u64,
        1,
        4,
    );
    let mut rest = Header::new(Op::Write);
    (rest.flags, rest.rkey, rest.psn, rest.raddr, rest.total) = (
        flags::LAST | flags::IMM,
        mr.keys().rkey,
        1,
        mem.addr() as u64 + striped,
        LEN as u64,
    );
    rest.len = (LEN as u64 - striped) as u32;
    rest.imm = 9;
    let mut frames = st.to_bytes().to_vec();
    frames.extend_from_slice(&rest.to_bytes());
    frames.extend(std::iter::repeat_n(0x5a, rest.len as usize));
    s.write_all(&frames).unwrap();
    let started = Instant::now();
    assert_eq!(statuses(&v.wait(1)), vec![(1, WcStatus::WrFlushErr)]);
    let took = started.elapsed();
    assert!(took >= retry * 10, "gave up after {took:?}");
    assert_eq!(v.qp.state(), QpState::Err);
    let b = mem.bytes();
    assert!(
        b[..striped as usize].iter().all(|&x| x == 0xEE),
        "lane shares appeared"
    );
    assert!(
        b[LEN - 8..].iter().all(|&x| x == 0xEE),
        "the last word was stored"
    );
}
