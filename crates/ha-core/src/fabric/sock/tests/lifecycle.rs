//! Devices, registrations, endpoints, the to_err fence, and clean teardown.

use super::*;

#[test]
fn devices_config_and_endpoint() {
    let f = fabric(Duration::from_secs(1), 1 << 20);
    assert_eq!(f.kind(), "sock");
    let d = &f.devices()[0];
    assert_eq!(d.name, "sock:lo");
    assert_eq!(d.guid, 1);
    assert_eq!(d.port, 1);
    assert_eq!(d.link_layer, LinkLayer::Ethernet);
    assert_eq!(
        d.limits,
        DeviceLimits::default(),
        "no limits unless emulated"
    );
    assert_eq!(d.ptr_support, 1);
    assert!(d.speed_mbps > 0);
    assert_eq!(d.pci_path, None); // lo has no device node
    assert!(matches!(f.open_pd(1), Err(FabricError::InvalidArgument(_))));
    let bad = |rails: Vec<SockRail>, seg: usize| {
        SockFabric::new(SockConfig {
            rails,
            retry_timeout: Duration::from_secs(1),
            segment_bytes: seg,
            inline_bytes: 64 << 10,
            inline_gate: None,
            spin: Duration::from_micros(100),
            lanes: 4,
            delack_max: Some(std::time::Duration::from_millis(5)),
            limits: Default::default(),
        })
    };
    assert!(matches!(
        bad(vec![], 1 << 20),
        Err(FabricError::NoDevice(_))
    ));
    assert!(matches!(
        bad(vec![lo()], 0),
        Err(FabricError::InvalidArgument(_))
    ));
    assert!(matches!(
        bad(vec![lo()], wire::MAX_SEGMENT_BYTES + 1),
        Err(FabricError::InvalidArgument(_))
    ));

    for ip in ["10.1.2.3", "fe80::1234:5678"] {
        let ep = SockEndpoint {
            ip: ip.parse().unwrap(),
            port: 4791,
            qpn: 77,
            nonce: 0xfeed_f00d_dead_beef,
        };
        let b = ep.encode();
        assert!(b.len() <= 64);
        assert_eq!(SockEndpoint::decode(&b).unwrap(), ep);
        for cut in 0..b.len() {
            assert!(matches!(
                SockEndpoint::decode(&b[..cut]),
                Err(FabricError::BadPeerAddress(_))
            ));
        }
        let mut v = b.clone();
        v[0] = 9;
        assert!(SockEndpoint::decode(&v).is_err());
        let mut v = b.clone();
        v.push(0);
        assert!(SockEndpoint::decode(&v).is_err());
    }
}

#[test]
fn registration_keys() {
    let _l = TEST_LOCK.read();
    let f = fabric(Duration::from_secs(1), 1 << 20);
    let pd = f.open_pd(0).unwrap();
    let b = Buf::new(64, 0);
    assert!(matches!(
        pd.reg_mr(b.addr(), 0, Access::ALL),
        Err(FabricError::InvalidArgument(_))
    ));
    let m1 = pd.reg_mr(b.addr(), 64, Access::ALL).unwrap();
    let m2 = pd.reg_mr(b.addr() + 8, 8, Access::REMOTE_READ).unwrap();
    let (k1, k2) = (m1.keys(), m2.keys());
    assert_ne!(k1.lkey, 0);
    assert_eq!(k1.lkey, k1.rkey);
    assert_ne!(k1.lkey, k2.lkey);
    assert_eq!((m2.addr(), m2.len()), (b.addr() + 8, 8));
    drop(m1);
    let m3 = pd.reg_mr(b.addr(), 64, Access::ALL).unwrap();
    assert_ne!(m3.keys().lkey, k1.lkey, "key reused at once");
}

#[test]
fn fence_nothing_placed_after_to_err() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    const N: usize = 8 << 20;
    let mut src = Buf::new(N, 0);
    src.pattern(5);
    let mut dst = Buf::new(N, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let wrs: Vec<SendWr> = (0..64)
        .map(|i| {
            wr(
                i,
                SendOp::Write,
                (&src, 0, N, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            )
        })
        .collect();
    a.qp.post_send(&wrs).unwrap();
    // Wait until placement is under way (the first word changed).
    let first = dst.addr() as *const u64;
    let deadline = Instant::now() + LONG;
    // SAFETY: aligned, inside `dst`; volatile because the fabric writes it concurrently.
    while unsafe { first.read_volatile() } == 0 {
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
    b.qp.to_err().unwrap();
    // From here on nothing may land in `dst`.
    dst.bytes_mut().fill(0x5A);
    // The requester sees its stream die: every WR completes (some maybe Success, at least
    // the last ones in error). Then give a stray placement every chance to show up.
    let c = a.wait(64);
    assert!(c.iter().any(|c| !c.status.is_ok()));
    assert!(c.windows(2).all(|w| w[0].wr_id + 1 == w[1].wr_id));
    drop(a);
    drop(md);
    assert!(
        dst.bytes().iter().all(|&x| x == 0x5A),
        "bytes placed after to_err returned"
    );
}

#[test]
fn threads_and_fds_return_to_baseline() {
    let _l = TEST_LOCK.write();
    let threads0 = live_threads();
    let fds0 = open_fds();
    {
        let (f, a, b) = pair(LONG, 1 << 20);
        let src = Buf::new(1 << 20, 1);
        let dst = Buf::new(1 << 20, 0);
        let ms = a.reg(&src, Access::ALL);
        let md = b.reg(&dst, Access::ALL);
        a.qp.post_send(&[
            wr(
                0,
                SendOp::Write,
                (&src, 0, 1 << 20, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            ),
            wr(
                1,
                SendOp::Read,
                (&src, 0, 4096, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            ),
        ])
        .unwrap();
        assert_eq!(a.wait(2).len(), 2);
        // b's responder now waits for a receive (RNR) when everything is dropped.
        a.qp.post_send(&[wr(
            2,
            SendOp::WriteWithImm(1),
            (&src, 0, 8, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        )])
        .unwrap();
        // A queue pair talking to a silent peer, and one never started.
        let (_peer, ep) = silent_peer();
        let c = lone_rts(&f, CAPS, &ep);
        c.qp.post_send(&[wr(
            0,
            SendOp::Write,
            (&src, 0, 8, c.reg(&src, Access::ALL).keys().lkey),
            0x1000,
            5,
        )])
        .unwrap();
        let d = side(&f, CAPS);
        // Listeners of a, b, c, d; senders of a, b, c; a's ack reader; b's responder.
        assert!(
            live_threads() >= threads0 + 9,
            "{} vs {threads0}",
            live_threads()
        );
        // Drop QPs before PDs, PDs before QPs, CQs last: any order must clean up.
        drop(a.pd);
        drop(ms);
        drop((a.qp, b, c, d));
    }
    let deadline = Instant::now() + LONG;
    while live_threads() != threads0 || open_fds() != fds0 {
        assert!(
            Instant::now() < deadline,
            "threads {} vs {threads0}, fds {} vs {fds0}",
            live_threads(),
            open_fds()
        );
        std::thread::yield_now();
    }
}

/// A raw requester's WRITE header (one segment) into `dst`.
fn raw_write(dst: &Buf, rkey: u32, len: u32) -> [u8; wire::HEADER_LEN] {
    let mut h = Header::new(Op::Write);
    h.flags = wire::flags::FIRST | wire::flags::LAST;
    h.rkey = rkey;
    h.raddr = dst.addr() as u64;
    h.total = len as u64;
    h.len = len;
    h.to_bytes()
}

/// Wait until the fabric has started placing into `dst` (first word no longer zero).
fn wait_first_word(dst: &Buf) {
    let deadline = Instant::now() + LONG;
    // SAFETY: aligned, inside `dst`; volatile because the fabric writes it concurrently.
    while unsafe { dst.0.as_ptr().read_volatile() } == 0 {
        assert!(Instant::now() < deadline, "placement never started");
        std::thread::yield_now();
    }
}

#[test]
fn dereg_waits_for_placement_in_progress() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let (_peer, ep) = silent_peer();
    let a = lone_rts(&f, CAPS, &ep);
    let dst = Buf::new(4096, 0);
    let md = a.reg(&dst, Access::REMOTE_WRITE);
    let mut s = raw_stream_to(&a.ep(), a.ep().nonce);
    s.write_all(&raw_write(&dst, md.keys().rkey, 4096)).unwrap();
    s.write_all(&[0xAB; 100]).unwrap();
    wait_first_word(&dst);
    // The responder is inside the segment (pin held): deregistration must wait for it.
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        drop(md);
        tx.send(()).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "dereg did not wait for the placement"
    );
    s.write_all(&[0xAB; 3996]).unwrap();
    rx.recv_timeout(LONG).expect("dereg finished");
    t.join().unwrap();
    assert!(dst.bytes().iter().all(|&x| x == 0xAB));
    let mut ack = [0u8; wire::HEADER_LEN];
    s.read_exact(&mut ack).unwrap();
    let h = Header::decode(&ack, 0).unwrap();
    // PROMPT too where this kernel caps the stream's delayed ACK (`delack.rs`).
    let flags = h.flags & !wire::flags::PROMPT;
    assert_eq!((h.op, h.psn, flags), (Op::Ack, 0, wire::flags::WR_DONE));
}

#[test]
fn stalled_inbound_write_releases_the_region() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(300);
    let f = fabric(retry, 1 << 20);
    let (_peer, ep) = silent_peer();
    let a = lone_rts(&f, CAPS, &ep);
    // 16 KiB of a 64 KiB segment: a remainder this large is read straight into the region, so
    // placement has started before the stall whatever the read timing.
    let dst = Buf::new(64 << 10, 0);
    let md = a.reg(&dst, Access::REMOTE_WRITE);
    let mut s = raw_stream_to(&a.ep(), a.ep().nonce);
    s.write_all(&raw_write(&dst, md.keys().rkey, 64 << 10))
        .unwrap();
    s.write_all(&[0xAB; 16 << 10]).unwrap();
    wait_first_word(&dst);
    // The peer stalls mid-segment: after `retry` the responder hangs up, releasing the pin.
    let t0 = Instant::now();
    drop(md);
    assert!(t0.elapsed() < LONG);
    let mut x = [0u8; 1];
    assert!(
        matches!(s.read(&mut x), Ok(0) | Err(_)),
        "stalled stream not closed"
    );
    // Like a verbs responder, the queue pair itself is not failed by a broken inbound stream.
    assert_eq!(a.qp.state(), QpState::Rts);
}
