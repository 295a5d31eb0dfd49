//! Error paths: protection, state, flush, retry timer, broken and garbage peers, RNR.

use super::*;

/// A WR at the responder's `rkey`/range/access that must be refused.
fn remote_violation(
    make: impl Fn(&Buf, u32, &Buf, u32) -> (usize, u32),
    access: Access,
    op: SendOp,
) {
    let (_f, a, b) = pair(LONG, 1 << 20);
    let mut src = Buf::new(8192, 0);
    src.pattern(1);
    let dst = Buf::new(8192, 0xEE);
    let ok_dst = Buf::new(64, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, access);
    let mok = b.reg(&ok_dst, Access::REMOTE_WRITE);
    b.qp.post_recv(50).unwrap();
    b.qp.post_recv(51).unwrap();
    let (raddr, rkey) = make(&dst, md.keys().rkey, &ok_dst, mok.keys().rkey);
    let src_before = src.bytes().to_vec();
    let w0 = wr(
        0,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey),
        ok_dst.addr(),
        mok.keys().rkey,
    );
    let w1 = wr(1, op, (&src, 0, 4096, ms.keys().lkey), raddr, rkey);
    let w2 = wr(
        2,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey),
        ok_dst.addr(),
        mok.keys().rkey,
    );
    a.qp.post_send(&[w0, w1, w2]).unwrap();
    assert_eq!(
        statuses(&a.wait(3)),
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    // The responder went to ERR too: its receives flush.
    assert_eq!(
        statuses(&b.wait(2)),
        vec![(50, WcStatus::WrFlushErr), (51, WcStatus::WrFlushErr)]
    );
    assert_eq!(b.qp.state(), QpState::Err);
    assert!(dst.bytes().iter().all(|&x| x == 0xEE), "canary touched");
    assert!(ok_dst.bytes() == &src.bytes()[..64]);
    // A refused READ placed nothing locally either.
    assert!(src.bytes() == src_before.as_slice());
}

#[test]
fn remote_wrong_rkey() {
    let _l = TEST_LOCK.read();
    remote_violation(
        |d, k, _, _| (d.addr(), k ^ 0x8000_0000),
        Access::REMOTE_WRITE,
        SendOp::Write,
    );
}

#[test]
fn remote_out_of_range() {
    let _l = TEST_LOCK.read();
    // 4096 bytes starting 4095 before the end: one byte past the region.
    remote_violation(
        |d, k, _, _| (d.addr() + d.len() - 4095, k),
        Access::REMOTE_WRITE,
        SendOp::Write,
    );
}

#[test]
fn remote_no_write_access() {
    let _l = TEST_LOCK.read();
    remote_violation(
        |d, k, _, _| (d.addr(), k),
        Access::REMOTE_READ,
        SendOp::Write,
    );
}

#[test]
fn remote_no_read_access() {
    let _l = TEST_LOCK.read();
    remote_violation(
        |d, k, _, _| (d.addr(), k),
        Access::REMOTE_WRITE,
        SendOp::Read,
    );
}

#[test]
fn remote_key_of_other_pd_or_deregistered() {
    let _l = TEST_LOCK.read();
    // The key is valid in the requester's PD only: the responder refuses it.
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(4096, 1);
    let dst = Buf::new(4096, 0xEE);
    let ms = a.reg(&src, Access::ALL);
    let in_a = a.reg(&dst, Access::ALL);
    let w = wr(
        0,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey),
        dst.addr(),
        in_a.keys().rkey,
    );
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::RemAccessErr)]);
    assert!(dst.bytes().iter().all(|&x| x == 0xEE));
    drop(b);

    let (_f, a, b) = pair(LONG, 1 << 20);
    let ms = a.reg(&src, Access::ALL);
    let md = b.reg(&dst, Access::ALL);
    let rkey = md.keys().rkey;
    drop(md);
    let w = wr(
        0,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey),
        dst.addr(),
        rkey,
    );
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::RemAccessErr)]);
    assert!(dst.bytes().iter().all(|&x| x == 0xEE));
}

#[test]
fn bad_lkey_is_local_protection_error() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(4096, 1);
    let dst = Buf::new(4096, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let good = |id| {
        wr(
            id,
            SendOp::Write,
            (&src, 0, 64, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        )
    };
    let bad = wr(
        1,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey + 1000),
        dst.addr(),
        md.keys().rkey,
    );
    a.qp.post_send(&[good(0), bad, good(2)]).unwrap();
    assert_eq!(
        statuses(&a.wait(3)),
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::LocProtErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    // Posting in ERR flushes at once.
    a.qp.post_send(&[good(3)]).unwrap();
    a.qp.post_recv(4).unwrap();
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(3, WcStatus::WrFlushErr), (4, WcStatus::WrFlushErr)]
    );

    // Out of the registration, and READ into memory without LOCAL_WRITE.
    let (_f, a, b) = pair(LONG, 1 << 20);
    let ms = a.reg(&src, Access::REMOTE_READ);
    let md = b.reg(&dst, Access::ALL);
    let past = wr(
        0,
        SendOp::Write,
        (&src, 1, 4096, ms.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    );
    a.qp.post_send(&[past]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::LocProtErr)]);
    let (_f, a, b) = pair(LONG, 1 << 20);
    let ms = a.reg(&src, Access::REMOTE_READ);
    let md = b.reg(&dst, Access::ALL);
    let rd = wr(
        0,
        SendOp::Read,
        (&src, 0, 16, ms.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    );
    a.qp.post_send(&[rd]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::LocProtErr)]);
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn to_err_flushes_sends_and_recvs_in_order() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let (_peer, ep) = silent_peer();
    let a = lone_rts(&f, CAPS, &ep);
    let src = Buf::new(4096, 1);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    a.qp.post_recv(100).unwrap();
    a.qp.post_recv(101).unwrap();
    a.qp.post_recv(102).unwrap();
    let wrs: Vec<SendWr> = (0..7)
        .map(|i| {
            let mut w = wr(i, SendOp::Write, (&src, 0, 4096, ms.keys().lkey), 0x1000, 5);
            w.signaled = i % 2 == 0;
            w
        })
        .collect();
    a.qp.post_send(&wrs).unwrap();
    a.none_until(Instant::now() + Duration::from_millis(100));
    a.qp.to_err().unwrap();
    assert_eq!(a.qp.state(), QpState::Err);
    let c = a.wait(10);
    let mut want: Vec<(u64, WcStatus)> = (0..7).map(|i| (i, WcStatus::WrFlushErr)).collect();
    want.extend((100..103).map(|i| (i, WcStatus::WrFlushErr)));
    assert_eq!(statuses(&c), want);
    assert!(c[..7].iter().all(|c| c.opcode == WcOpcode::RdmaWrite));
    assert!(c[7..]
        .iter()
        .all(|c| c.opcode == WcOpcode::RecvRdmaWithImm && c.imm.is_none()));
    // to_err again is harmless and completes nothing.
    a.qp.to_err().unwrap();
    a.none_until(Instant::now() + Duration::from_millis(50));
}

#[test]
fn posting_in_wrong_state_and_queue_limits() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 1,
        traffic_class: None,
    };
    let a = side(&f, caps);
    let src = Buf::new(64, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let w = |id| wr(id, SendOp::Write, (&src, 0, 8, ms.keys().lkey), 0x1000, 5);
    let bad_state = |r: Result<()>, st: QpState| match r {
        Err(FabricError::BadState { state, .. }) => assert_eq!(state, st),
        other => panic!("expected BadState({st:?}), got {other:?}"),
    };
    assert_eq!(a.qp.state(), QpState::Reset);
    bad_state(a.qp.post_send(&[w(0)]), QpState::Reset);
    bad_state(a.qp.post_recv(0), QpState::Reset);
    let (_peer, ep) = silent_peer();
    bad_state(a.qp.to_rtr(&ep), QpState::Reset);
    bad_state(a.qp.to_rts(), QpState::Reset);
    a.qp.to_init().unwrap();
    bad_state(a.qp.to_init(), QpState::Init);
    bad_state(a.qp.post_send(&[w(0)]), QpState::Init);
    a.qp.post_recv(1).unwrap();
    assert!(matches!(a.qp.post_recv(2), Err(FabricError::QueueFull(_))));
    assert!(matches!(
        a.qp.to_rtr(b"garbage"),
        Err(FabricError::BadPeerAddress(_))
    ));
    assert!(matches!(
        a.qp.to_rtr(&[]),
        Err(FabricError::BadPeerAddress(_))
    ));
    a.qp.to_rtr(&ep).unwrap();
    bad_state(a.qp.post_send(&[w(0)]), QpState::Rtr);
    a.qp.to_rts().unwrap();
    assert!(matches!(
        a.qp.post_send(&[w(0), w(1), w(2)]),
        Err(FabricError::QueueFull(_))
    ));
    a.qp.post_send(&[w(0), w(1)]).unwrap();
    assert!(matches!(
        a.qp.post_send(&[w(2)]),
        Err(FabricError::QueueFull(_))
    ));
    a.qp.to_err().unwrap();
    assert_eq!(
        statuses(&a.wait(3)),
        vec![
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr)
        ]
    );
    bad_state(a.qp.to_rts(), QpState::Err);
}

#[test]
fn retry_exceeded_when_nothing_listens() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(300);
    let f = fabric(retry, 1 << 20);
    let ep = {
        let (l, ep) = silent_peer();
        drop(l); // the port now refuses connections
        ep
    };
    let t0 = Instant::now();
    let a = lone_rts(&f, CAPS, &ep);
    let src = Buf::new(64, 1);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    a.qp.post_send(&[wr(
        7,
        SendOp::Write,
        (&src, 0, 8, ms.keys().lkey),
        0x1000,
        5,
    )])
    .unwrap();
    let c = a.wait(1);
    let dt = t0.elapsed();
    assert_eq!(statuses(&c), vec![(7, WcStatus::RetryExcErr)]);
    assert!(
        dt >= retry && dt <= retry + Duration::from_secs(3),
        "{dt:?}"
    );
}

#[test]
fn peer_qp_dropped_fails_next_wr_at_once() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(64, 1);
    let dst = Buf::new(64, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let w = |id| {
        wr(
            id,
            SendOp::Write,
            (&src, 0, 64, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        )
    };
    a.qp.post_send(&[w(0)]).unwrap();
    assert!(a.wait(1)[0].status.is_ok());
    let Side { qp: bqp, .. } = b;
    drop(bqp);
    let t0 = Instant::now();
    a.qp.post_send(&[w(1), w(2)]).unwrap();
    // Well before the 30 s retry timer: the broken stream fails the WR right away.
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn rnr_waits_for_a_receive_with_keepalives() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(500);
    let (_f, a, b) = pair(retry, 1 << 20);
    let src = Buf::new(64, 1);
    let dst = Buf::new(64, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    a.qp.post_send(&[wr(
        0,
        SendOp::WriteWithImm(5),
        (&src, 0, 64, ms.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    )])
    .unwrap();
    // Four retry periods without a receive: the requester must not give up.
    a.none_until(Instant::now() + retry * 4);
    assert_eq!(a.qp.state(), QpState::Rts);
    b.qp.post_recv(9).unwrap();
    let rc = b.wait(1);
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].imm),
        (9, WcStatus::Success, Some(5))
    );
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::Success)]);
    assert!(dst.bytes() == src.bytes());
}

#[test]
fn garbage_on_inbound_stream_fails_only_that_qp() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let (_peer, ep) = silent_peer();
    let a = lone_rts(&f, CAPS, &ep);
    // A second queue pair on the same PD must not be affected.
    let a2 = a.pd.create_qp(&a.cq, CAPS).unwrap();
    a2.to_init().unwrap();
    a2.post_recv(77).unwrap();
    a.qp.post_recv(1).unwrap();
    a.qp.post_recv(2).unwrap();
    let mut s = raw_stream_to(&a.ep(), a.ep().nonce);
    s.write_all(&[0xff; 36]).unwrap();
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a2.state(), QpState::Init);
    // The bad stream is closed.
    let mut b = [0u8; 1];
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
}

#[test]
fn garbage_on_reply_stream_fails_the_requester() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let (l, ep) = silent_peer();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut hello = [0u8; crate::fabric::sock::hello::HELLO_LEN];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(Hello::decode(&hello).unwrap().target_qpn, 1);
        let mut h = Header::new(Op::Ack);
        h.len = 5; // ACKs carry no payload
        s.write_all(&h.to_bytes()).unwrap();
        // Wait for the requester to hang up.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let a = lone_rts(&f, CAPS, &ep);
    let src = Buf::new(64, 1);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    a.qp.post_send(&[
        wr(0, SendOp::Write, (&src, 0, 64, ms.keys().lkey), 0x1000, 5),
        wr(1, SendOp::Write, (&src, 0, 64, ms.keys().lkey), 0x1000, 5),
    ])
    .unwrap();
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(0, WcStatus::RemOpErr), (1, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    peer.join().unwrap();
}

#[test]
fn hello_with_wrong_nonce_is_refused() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(64, 3);
    let dst = Buf::new(64, 0);
    let both_ways = || {
        for (from, to) in [(&a, &b), (&b, &a)] {
            let ms = from.reg(&src, Access::LOCAL_WRITE);
            let md = to.reg(&dst, Access::REMOTE_WRITE);
            from.qp
                .post_send(&[wr(
                    0,
                    SendOp::Write,
                    (&src, 0, 64, ms.keys().lkey),
                    dst.addr(),
                    md.keys().rkey,
                )])
                .unwrap();
            assert_eq!(statuses(&from.wait(1)), vec![(0, WcStatus::Success)]);
        }
    };
    both_ways();
    let ep = a.ep();
    let mut s = raw_stream_to(&ep, ep.nonce ^ 1);
    let mut x = [0u8; 1];
    assert!(
        matches!(s.read(&mut x), Ok(0) | Err(_)),
        "stream not closed"
    );
    // A second stream with the right nonce is refused too: one inbound stream per QP.
    let mut s = raw_stream_to(&ep, ep.nonce);
    assert!(
        matches!(s.read(&mut x), Ok(0) | Err(_)),
        "duplicate stream not closed"
    );
    both_ways();
}
