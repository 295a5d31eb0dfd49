//! Data path: bytes verified for WRITE, READ, WRITE_WITH_IMM; ordering and counts.

use super::*;

#[test]
fn write_bytes_verified_0_1_4k_64m() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    const BIG: usize = 64 << 20;
    let mut src = Buf::new(BIG, 0);
    let dst = Buf::new(BIG + 64, 0xEE);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    for (i, &n) in [0usize, 1, 4096, BIG].iter().enumerate() {
        src.pattern(i as u64 + 1);
        // Land at an odd offset so the last word is unaligned for 1 and 4096+8.
        let off = if n == 4096 { 8 } else { 3 };
        let w = wr(
            i as u64,
            SendOp::Write,
            (&src, 0, n, ms.keys().lkey),
            dst.addr() + off,
            md.keys().rkey,
        );
        a.qp.post_send(&[w]).unwrap();
        let c = a.wait(1);
        assert_eq!(
            c[0],
            Completion {
                wr_id: i as u64,
                qp_num: a.qp.qp_num(),
                status: WcStatus::Success,
                opcode: WcOpcode::RdmaWrite,
                byte_len: n as u32,
                imm: None,
            }
        );
        assert!(
            dst.bytes()[off..off + n] == src.bytes()[..n],
            "size {n}: bytes differ"
        );
        assert!(
            dst.bytes()[off + n..].iter().all(|&x| x == 0xEE),
            "size {n}: wrote past the end"
        );
    }
    assert!(dst.bytes()[..3].iter().all(|&x| x == 0xEE));
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn multi_segment_writes_and_reads() {
    let _l = TEST_LOCK.read();
    // 4 KiB segments: a 1 MiB+13 write is 257 segments; the aligned tail word of the second
    // write straddles two segments.
    let (_f, a, b) = pair(LONG, 4096);
    let mut src = Buf::new(2 << 20, 0);
    src.pattern(42);
    let dst = Buf::new(2 << 20, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let md = b.reg(&dst, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let cases = [(0usize, 0usize, (1 << 20) + 13), (5, 4, 3 * 4096 + 4)];
    for (i, &(soff, doff, n)) in cases.iter().enumerate() {
        let w = wr(
            i as u64,
            SendOp::Write,
            (&src, soff, n, ms.keys().lkey),
            dst.addr() + (1 << 20) * i + doff,
            md.keys().rkey,
        );
        a.qp.post_send(&[w]).unwrap();
        assert!(a.wait(1)[0].status.is_ok());
        let d = (1 << 20) * i + doff;
        assert!(
            dst.bytes()[d..d + n] == src.bytes()[soff..soff + n],
            "case {i}"
        );
    }
    // Read it back from B into another place in A's buffer.
    let back = Buf::new((1 << 20) + 64, 0);
    let mb = a.reg(&back, Access::LOCAL_WRITE);
    let r = wr(
        9,
        SendOp::Read,
        (&back, 1, (1 << 20) + 13, mb.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    );
    a.qp.post_send(&[r]).unwrap();
    let c = a.wait(1);
    assert_eq!(
        (c[0].status, c[0].opcode, c[0].byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, (1 << 20) + 13)
    );
    assert!(back.bytes()[1..1 + (1 << 20) + 13] == dst.bytes()[..(1 << 20) + 13]);
    assert_eq!((back.bytes()[0], back.bytes()[(1 << 20) + 14]), (0, 0));
}

#[test]
fn read_bytes_verified() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 64 << 10);
    let mut remote = Buf::new(3 << 20, 0);
    remote.pattern(7);
    let local = Buf::new(3 << 20, 0xEE);
    let mr = b.reg(&remote, Access::REMOTE_READ);
    let ml = a.reg(&local, Access::LOCAL_WRITE);
    let mut off = 0;
    for (i, &n) in [0usize, 5, (2 << 20) + 3].iter().enumerate() {
        let r = wr(
            i as u64,
            SendOp::Read,
            (&local, off, n, ml.keys().lkey),
            remote.addr() + 11,
            mr.keys().rkey,
        );
        a.qp.post_send(&[r]).unwrap();
        let c = a.wait(1);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].opcode, c[0].byte_len),
            (i as u64, WcStatus::Success, WcOpcode::RdmaRead, n as u32)
        );
        assert!(local.bytes()[off..off + n] == remote.bytes()[11..11 + n]);
        assert_eq!(local.bytes()[off + n], 0xEE);
        off += n + 1;
    }
}

#[test]
fn write_with_imm_after_earlier_writes() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 256 << 10);
    let mut src = Buf::new(4 << 20, 0);
    src.pattern(3);
    let dst = Buf::new(4 << 20, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    b.qp.post_recv(100).unwrap();
    b.qp.post_recv(101).unwrap();
    let mut wrs: Vec<SendWr> = (0..3)
        .map(|i| {
            let mut w = wr(
                i,
                SendOp::Write,
                (&src, (i as usize) << 20, 1 << 20, ms.keys().lkey),
                dst.addr() + ((i as usize) << 20),
                md.keys().rkey,
            );
            w.signaled = false;
            w
        })
        .collect();
    wrs.push(wr(
        3,
        SendOp::WriteWithImm(0xabcd_0123),
        (&src, 3 << 20, 4096, ms.keys().lkey),
        dst.addr() + (3 << 20),
        md.keys().rkey,
    ));
    // Zero-length WRITE_WITH_IMM: no key needed.
    wrs.push(wr(4, SendOp::WriteWithImm(7), (&src, 0, 0, 0), 0, 0));
    a.qp.post_send(&wrs).unwrap();
    let rc = b.wait(2);
    assert_eq!(
        rc[0],
        Completion {
            wr_id: 100,
            qp_num: b.qp.qp_num(),
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 4096,
            imm: Some(0xabcd_0123),
        }
    );
    assert_eq!((rc[1].wr_id, rc[1].imm, rc[1].byte_len), (101, Some(7), 0));
    // Everything before the immediate is in place once its receive completed.
    assert!(dst.bytes()[..(3 << 20) + 4096] == src.bytes()[..(3 << 20) + 4096]);
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(3, WcStatus::Success), (4, WcStatus::Success)]
    );
}

#[test]
fn many_wrs_complete_in_posting_order() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let mut src = Buf::new(64 << 10, 0);
    src.pattern(9);
    let rbuf = Buf::new(64 << 10, 0);
    let dst = Buf::new(64 << 10, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let mr = a.reg(&rbuf, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let mut wrs = Vec::new();
    let mut imms = 0;
    for i in 0..200u64 {
        let off = (i as usize * 256) % (60 << 10);
        let op = match i % 5 {
            0 => SendOp::Read,
            1 => {
                imms += 1;
                SendOp::WriteWithImm(i as u32)
            }
            _ => SendOp::Write,
        };
        let (lbuf, lkey) = if op == SendOp::Read {
            (&rbuf, mr.keys().lkey)
        } else {
            (&src, ms.keys().lkey)
        };
        let mut w = wr(
            i,
            op,
            (lbuf, off, 100, lkey),
            dst.addr() + off,
            md.keys().rkey,
        );
        w.signaled = i % 3 != 0;
        wrs.push(w);
    }
    for i in 0..imms {
        b.qp.post_recv(1000 + i).unwrap();
    }
    // Post in a few calls.
    for chunk in wrs.chunks(37) {
        a.qp.post_send(chunk).unwrap();
    }
    let want: Vec<(u64, WcStatus)> = wrs
        .iter()
        .filter(|w| w.signaled)
        .map(|w| (w.wr_id, WcStatus::Success))
        .collect();
    assert_eq!(statuses(&a.wait(want.len())), want);
    let rc = b.wait(imms as usize);
    let got: Vec<(u64, Option<u32>)> = rc.iter().map(|c| (c.wr_id, c.imm)).collect();
    let want: Vec<(u64, Option<u32>)> = (0..imms)
        .map(|i| (1000 + i, Some((i * 5 + 1) as u32)))
        .collect();
    assert_eq!(got, want);
}

/// Small WRITE_WITH_IMMs (written by the posting thread itself) and large ones (left to the
/// sender thread) posted back to back, without waiting: every byte lands, receives complete
/// in posting order with their immediates, and the inline path was taken.
#[test]
fn inline_and_sender_thread_writes_interleave_in_posting_order() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    const N: usize = 120;
    const SLOT: usize = 256 << 10;
    let mut src = Buf::new(N * SLOT, 0);
    src.pattern(77);
    let dst = Buf::new(N * SLOT, 0xEE);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    for i in 0..N as u64 {
        b.qp.post_recv(500 + i).unwrap();
    }
    let (inline_before, _) = inline_stats();
    // Sizes: 8 B and 4 KiB go inline when the stream is free; 200 KiB never does.
    let size = |i: usize| [8usize, 200 << 10, 4096, 8, 200 << 10, 64][i % 6];
    for i in 0..N {
        let w = wr(
            i as u64,
            SendOp::WriteWithImm(i as u32),
            (&src, i * SLOT, size(i), ms.keys().lkey),
            dst.addr() + i * SLOT,
            md.keys().rkey,
        );
        a.qp.post_send(&[w]).unwrap();
    }
    let want: Vec<(u64, WcStatus)> = (0..N as u64).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(statuses(&a.wait(N)), want);
    let rc = b.wait(N);
    let got: Vec<(u64, Option<u32>, u32)> =
        rc.iter().map(|c| (c.wr_id, c.imm, c.byte_len)).collect();
    let want: Vec<(u64, Option<u32>, u32)> = (0..N)
        .map(|i| (500 + i as u64, Some(i as u32), size(i) as u32))
        .collect();
    assert_eq!(got, want);
    for i in 0..N {
        let (lo, n) = (i * SLOT, size(i));
        assert!(
            dst.bytes()[lo..lo + n] == src.bytes()[lo..lo + n],
            "slot {i}: bytes differ"
        );
        assert!(
            dst.bytes()[lo + n..lo + SLOT].iter().all(|&x| x == 0xEE),
            "slot {i}: past the end"
        );
    }
    assert!(
        inline_stats().0 > inline_before,
        "no batch was written by the posting thread"
    );
}

/// The responder stops reading (a WRITE_WITH_IMM waits for a receive), so the stream's
/// buffers fill while the posting thread keeps writing small messages itself: a write the
/// socket takes only in part leaves its tail to the sender thread, and once the receives are
/// posted everything arrives intact, in order, exactly once.
#[test]
fn an_inline_write_the_socket_cannot_take_is_finished_by_the_sender_thread() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    const N: usize = 250;
    const SIZE: usize = 60 << 10;
    let mut src = Buf::new(N * SIZE, 0);
    src.pattern(5);
    let dst = Buf::new(N * SIZE, 0xEE);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let (_, tails_before) = inline_stats();
    // No receive is posted: B's responder waits (RNR) at the first WRITE_WITH_IMM and stops
    // reading, while 15 MiB more are posted, each when the previous call returned.
    for i in 0..N {
        let w = wr(
            i as u64,
            SendOp::WriteWithImm(i as u32),
            (&src, i * SIZE, SIZE, ms.keys().lkey),
            dst.addr() + i * SIZE,
            md.keys().rkey,
        );
        a.qp.post_send(&[w]).unwrap();
    }
    // Nothing can complete while B waits for its receive.
    a.none_until(Instant::now() + Duration::from_millis(300));
    for i in 0..N as u64 {
        b.qp.post_recv(1000 + i).unwrap();
    }
    let want: Vec<(u64, WcStatus)> = (0..N as u64).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(statuses(&a.wait(N)), want);
    let got: Vec<(u64, Option<u32>)> = b.wait(N).iter().map(|c| (c.wr_id, c.imm)).collect();
    let want: Vec<(u64, Option<u32>)> = (0..N as u64).map(|i| (1000 + i, Some(i as u32))).collect();
    assert_eq!(got, want);
    assert!(dst.bytes() == src.bytes(), "bytes differ");
    assert!(
        inline_stats().1 > tails_before,
        "no inline write was left unfinished: the test did not fill the socket"
    );
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
}

/// Only message ends (a batch with a WRITE_WITH_IMM) go inline: plain WRITEs (the transport's
/// clear-to-send entries, probes) stay with the sender thread, which batches them — writing
/// each from NCCL's proxy thread cost mid-size all_reduce up to 40 % (measured on the H100
/// machine, bench/results/2026-11-26-sock-fast-path.md).
#[test]
fn plain_writes_are_left_to_the_sender_thread() {
    // Alone: the inline counter is process-wide, and any other test's message ends count.
    let _l = TEST_LOCK.write();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(4096, 3);
    let dst = Buf::new(4096, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let post = |id: u64, op: SendOp| {
        let w = wr(
            id,
            op,
            (&src, 0, 64, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        );
        a.qp.post_send(&[w]).unwrap();
        a.wait(1)
    };
    // The first post waits for the sender thread to connect; then the stream is free.
    assert_eq!(
        statuses(&post(0, SendOp::Write)),
        vec![(0, WcStatus::Success)]
    );
    let before = inline_stats().0;
    for i in 1..=20 {
        assert_eq!(
            statuses(&post(i, SendOp::Write)),
            vec![(i, WcStatus::Success)]
        );
    }
    assert_eq!(inline_stats().0, before, "a plain WRITE went inline");
    // A message end goes inline when the posting thread finds the stream free: the sender
    // thread may hold it for a moment (a loaded host deschedules it there), so a few tries.
    let mut tries = 0;
    while inline_stats().0 == before && tries < 50 {
        b.qp.post_recv(9 + tries).unwrap();
        let id = 21 + tries;
        assert_eq!(
            statuses(&post(id, SendOp::WriteWithImm(5))),
            vec![(id, WcStatus::Success)]
        );
        assert_eq!(b.wait(1)[0].imm, Some(5));
        tries += 1;
    }
    assert!(
        inline_stats().0 > before,
        "no WRITE_WITH_IMM went inline in {tries} posts"
    );
}

/// An unsignaled WRITE's ACK waits for the next signaled one (its frame is `QUIET`), as an RC
/// NIC completes unsignaled work only through a later completion: the transport's
/// clear-to-sends, seven in eight unsignaled, then wake no ack reader. Each write is posted
/// only once the previous one has landed, so without `QUIET` every one would get its own ACK.
#[test]
fn unsignaled_writes_are_acknowledged_with_the_next_signaled_one() {
    // Alone: the ACK counter is process-wide.
    let _l = TEST_LOCK.write();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let mut src = Buf::new(4096, 0);
    src.pattern(11);
    let dst = Buf::new(4096, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let write = |id: u64, signaled: bool| {
        let off = id as usize * 256;
        let mut w = wr(
            id,
            SendOp::Write,
            (&src, off, 256, ms.keys().lkey),
            dst.addr() + off,
            md.keys().rkey,
        );
        w.signaled = signaled;
        a.qp.post_send(&[w]).unwrap();
        off
    };
    // Connected, and every earlier ACK sent.
    write(0, true);
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::Success)]);
    let before = acks_sent();
    for id in 1..=7u64 {
        let off = write(id, false);
        // Polls the destination until the write landed (its bytes are all placed by then).
        let deadline = Instant::now() + LONG;
        while dst.bytes()[off..off + 256] != src.bytes()[off..off + 256] {
            assert!(
                Instant::now() < deadline,
                "unsignaled write {id} never landed"
            );
            std::thread::yield_now();
        }
    }
    write(8, true);
    // The signaled one completes (alone: unsignaled work never does), and one ACK covered all.
    assert_eq!(statuses(&a.wait(1)), vec![(8, WcStatus::Success)]);
    assert_eq!(
        acks_sent() - before,
        1,
        "unsignaled writes were acknowledged one by one"
    );
    assert!(dst.bytes()[..9 * 256] == src.bytes()[..9 * 256]);
    // They left the send queue with it: a full queue's worth of posts is accepted.
    let n = CAPS.max_send_wr as u64;
    for id in 0..n {
        write(id % 16, true);
    }
    assert_eq!(a.wait(n as usize).len(), n as usize);
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Rts, QpState::Rts));
}
