//! Link liveness at the queue-pair level: a peer whose kernel still acknowledges TCP is waited
//! for however long its process does not answer (a stopped peer is not a dead link), while a
//! link that stops acknowledging fails the oldest work request with `RetryExcErr` within the
//! retry window, as RC hardware's retries would. The dead links are real: a network namespace
//! of the test thread's own whose loopback drops every packet (`tc netem loss 100%`); those
//! tests need root and iproute2 and say why they skip otherwise.

use super::*;

/// A peer whose kernel accepts the stream (backlog) and acknowledges everything, whose
/// process never reads: 8 MiB fill its receive buffer (zero window, answered window probes).
#[test]
fn a_silent_peer_whose_kernel_acknowledges_is_waited_for() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(300);
    let f = fabric(retry, 1 << 20);
    let (peer, ep) = silent_peer();
    let a = lone_rts(&f, CAPS, &ep);
    let src = Buf::new(8 << 20, 1);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    a.qp.post_send(&[
        wr(
            0,
            SendOp::Write,
            (&src, 0, 8 << 20, ms.keys().lkey),
            0x1000,
            5,
        ),
        wr(1, SendOp::Read, (&src, 0, 0, 0), 0x1000, 5),
    ])
    .unwrap();
    // Over twice the probe grace: nothing fails.
    a.none_until(Instant::now() + Duration::from_secs(7));
    assert_eq!(a.qp.state(), QpState::Rts);
    // The peer goes away for real (the listener's close resets the stream): a hard error.
    let t0 = Instant::now();
    drop(peer);
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(0, WcStatus::RetryExcErr), (1, WcStatus::WrFlushErr)]
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(a.qp.state(), QpState::Err);
}

/// Runs `f` on a thread of its own in a fresh network namespace (so every socket and thread
/// the fabric opens from there lives in it) holding two local addresses, [`NEAR`] and [`FAR`],
/// on the two ends of a veth pair; `None` when that is not possible here (not root, no
/// iproute2).
fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) of this thread's network namespace only; no memory involved.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!(
                "SKIPPED: unshare(CLONE_NEWNET): {}",
                std::io::Error::last_os_error()
            );
            return None;
        }
        let setup: [&[&str]; 6] = [
            &["link", "set", "lo", "up"],
            &["link", "add", "va", "type", "veth", "peer", "name", "vb"],
            &["addr", "add", "10.99.0.1/24", "dev", "va"],
            &["addr", "add", "10.99.0.2/24", "dev", "vb"],
            &["link", "set", "va", "up"],
            &["link", "set", "vb", "up"],
        ];
        for args in setup {
            if !ip_ok(args) {
                eprintln!(
                    "SKIPPED: `ip {}` failed (iproute2 missing?)",
                    args.join(" ")
                );
                return None;
            }
        }
        Some(f())
    })
    .join()
    .expect("netns test thread")
}

const NEAR: &str = "10.99.0.1";
const FAR: &str = "10.99.0.2";

fn ip_ok(args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The far address goes away: nothing sent to it is delivered (or acknowledged) any more,
/// while its sockets live on — a link that died under a live connection.
fn blackhole_far() {
    assert!(
        ip_ok(&["addr", "del", "10.99.0.2/24", "dev", "vb"]),
        "ip addr del failed"
    );
}

fn rail_fabric(ip: &str, retry: Duration) -> SockFabric {
    rail_fabric_capped(ip, retry, Some(Duration::from_millis(5)))
}

/// [`rail_fabric`] with the responders' delayed-ACK cap `delack` (`None`: the kernel's).
fn rail_fabric_capped(ip: &str, retry: Duration, delack: Option<Duration>) -> SockFabric {
    SockFabric::new(SockConfig {
        rails: vec![SockRail {
            name: ip.into(),
            ip: ip.parse().unwrap(),
        }],
        retry_timeout: retry,
        segment_bytes: 1 << 20,
        inline_bytes: 64 << 10,
        inline_gate: None,
        spin: Duration::from_micros(100),
        lanes: 4,
        delack_max: delack,
        limits: Default::default(),
    })
    .unwrap()
}

/// Near and far queue pairs, connected.
fn near_far(retry: Duration) -> (SockFabric, SockFabric, Side, Side) {
    let (fa, fb) = (rail_fabric(NEAR, retry), rail_fabric(FAR, retry));
    let (a, b) = (side(&fa, CAPS), side(&fb, CAPS));
    connect(&a, &b);
    (fa, fb, a, b)
}

/// One 64 KiB WRITE from `a` into `b`; the buffers and registrations to keep alive.
fn write_one(a: &Side, b: &Side, id: u64) -> (Buf, Buf, Vec<Box<dyn MemoryRegion>>) {
    let src = Buf::new(64 << 10, id as u8);
    let dst = Buf::new(64 << 10, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    a.qp.post_send(&[wr(
        id,
        SendOp::Write,
        (&src, 0, 64 << 10, ms.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    )])
    .unwrap();
    (src, dst, vec![ms, md])
}

/// WR 1 (64 KiB) completes and lands on a healthy link.
fn write_ok(a: &Side, b: &Side) {
    let (src, dst, _mrs) = write_one(a, b, 1);
    assert_eq!(statuses(&a.wait(1)), vec![(1, WcStatus::Success)]);
    assert!(dst.bytes() == src.bytes());
}

/// The far end goes silent; WR 2 then fails `RetryExcErr` within the retry window (not
/// before it, at most 3 s after) and leaves the queue pair in error.
fn cut_fails_the_next_wr(a: &Side, b: &Side, retry: Duration) {
    blackhole_far();
    let t0 = Instant::now();
    let _kept = write_one(a, b, 2);
    let c = a.wait(1);
    let dt = t0.elapsed();
    assert_eq!(statuses(&c), vec![(2, WcStatus::RetryExcErr)]);
    assert!(dt >= retry, "fired early: {dt:?}");
    assert!(dt <= retry + Duration::from_secs(3), "fired late: {dt:?}");
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn a_link_that_stops_acknowledging_fails_within_the_retry_window() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(400);
    let r = in_private_netns(move || {
        let (_fa, _fb, a, b) = near_far(retry);
        write_ok(&a, &b);
        cut_fails_the_next_wr(&a, &b, retry);
    });
    if r.is_none() {
        eprintln!("a_link_that_stops_acknowledging_fails_within_the_retry_window: skipped");
    }
}

/// The queue pair idled until its ack reader waited with the long tick (up to twice the
/// retry window) when the link died: the post of the next WR kicks that reader back to its
/// short tick, so the WR fails `RetryExcErr` as soon as on a busy queue pair (it would be up
/// to a long tick later without the kick).
#[test]
fn a_link_that_died_while_the_queue_pair_idled_fails_the_next_wr() {
    // Exclusive: the reader counters are process-wide.
    let _l = TEST_LOCK.write();
    let retry = Duration::from_millis(400);
    let r = in_private_netns(move || {
        let (_fa, _fb, a, b) = near_far(retry);
        write_ok(&a, &b);
        // Idle until readers wait with their long tick (four quiet ticks: ~160 ms here).
        let (long0, kicked0) = crate::fabric::sock::reader::long_wait_counts();
        let deadline = Instant::now() + Duration::from_secs(10);
        while crate::fabric::sock::reader::long_wait_counts().0 < long0 + 2 {
            assert!(Instant::now() < deadline, "no reader went quiet");
            a.none_until(Instant::now() + Duration::from_millis(20));
        }
        cut_fails_the_next_wr(&a, &b, retry);
        let (_, kicked) = crate::fabric::sock::reader::long_wait_counts();
        assert!(kicked > kicked0, "the post did not kick the ack reader");
    });
    if r.is_none() {
        eprintln!("a_link_that_died_while_the_queue_pair_idled_fails_the_next_wr: skipped");
    }
}

/// Everything of the WR reached the peer's kernel, then the link died while the peer's process
/// had not answered yet (nothing unacknowledged at the TCP level): the kernel's keep-alive
/// probes (after 1 s of silence) go unanswered and the link is judged dead a window later.
#[test]
fn a_link_that_dies_after_the_data_was_acknowledged_fails_through_keepalive() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(300);
    let r = in_private_netns(move || {
        let f = rail_fabric(NEAR, retry);
        // A silent peer on the far address: its kernel takes the bytes, its process never
        // answers (a stopped responder).
        let l = TcpListener::bind((FAR, 0)).unwrap();
        let ep = SockEndpoint {
            ip: FAR.parse().unwrap(),
            port: l.local_addr().unwrap().port(),
            qpn: 1,
            nonce: 2,
        };
        let a = lone_rts(&f, CAPS, &ep.encode());
        let src = Buf::new(4096, 1);
        let ms = a.reg(&src, Access::LOCAL_WRITE);
        a.qp.post_send(&[wr(
            3,
            SendOp::Write,
            (&src, 0, 4096, ms.keys().lkey),
            0x10,
            5,
        )])
        .unwrap();
        // Alive for many windows (the peer's kernel answers keep-alive probes)...
        a.none_until(Instant::now() + Duration::from_secs(3));
        blackhole_far();
        let t0 = Instant::now();
        // ... until keep-alive (1 s of silence, then 1 s probes) finds nobody answering.
        let c = a.wait(1);
        let dt = t0.elapsed();
        assert_eq!(statuses(&c), vec![(3, WcStatus::RetryExcErr)]);
        assert!(dt <= Duration::from_secs(5), "took {dt:?}");
        drop(l);
    });
    if r.is_none() {
        eprintln!("a_link_that_dies_after_the_data_was_acknowledged: skipped");
    }
}

/// The link dies while the posting thread is writing small sends onto the stream itself (the
/// inline path): every WR posted is accounted for exactly once — a prefix completes
/// `Success`, then one `RetryExcErr` within the retry window, the rest flush — and the bytes
/// of every WR that completed `Success` are in place at the peer.
#[test]
fn a_link_cut_while_the_posting_thread_writes_inline_fails_cleanly() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(400);
    let r = in_private_netns(move || {
        let (_fa, _fb, a, b) = near_far(retry);
        const N: usize = 200;
        const SIZE: usize = 512;
        let mut src = Buf::new(N * SIZE, 0);
        src.pattern(11);
        let dst = Buf::new(N * SIZE, 0);
        let ms = a.reg(&src, Access::LOCAL_WRITE);
        let md = b.reg(&dst, Access::REMOTE_WRITE);
        for i in 0..N as u64 + 3 {
            b.qp.post_recv(10_000 + i).unwrap();
        }
        let (inline_before, _) = inline_stats();
        let mut done = Vec::new();
        let mut posted = 0;
        let mut cut_at = None;
        // One small WRITE_WITH_IMM at a time, each posted as soon as the last completed; the
        // far address goes away after 50 of them, with the next one already posted.
        while posted < N {
            let w = wr(
                posted as u64,
                SendOp::WriteWithImm(posted as u32),
                (&src, posted * SIZE, SIZE, ms.keys().lkey),
                dst.addr() + posted * SIZE,
                md.keys().rkey,
            );
            a.qp.post_send(&[w]).unwrap();
            posted += 1;
            if posted == 51 {
                blackhole_far();
                cut_at = Some(Instant::now());
            }
            let c = a.wait(1);
            let failed = c[0].status != WcStatus::Success;
            done.extend(statuses(&c));
            if failed {
                break;
            }
        }
        let cut_at = cut_at.expect("cut");
        // Post more on the failed queue pair: they flush at once.
        for i in posted..posted + 3 {
            let w = wr(
                i as u64,
                SendOp::Write,
                (&src, 0, SIZE, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            );
            a.qp.post_send(&[w]).unwrap();
        }
        done.extend(statuses(&a.wait(3)));
        let first_bad = done
            .iter()
            .position(|&(_, s)| s != WcStatus::Success)
            .expect("a failure");
        assert!(first_bad >= 50, "failed before the cut: {done:?}");
        assert_eq!(done[first_bad].1, WcStatus::RetryExcErr, "{done:?}");
        assert!(
            done[first_bad + 1..]
                .iter()
                .all(|&(_, s)| s == WcStatus::WrFlushErr),
            "{done:?}"
        );
        let ids: Vec<u64> = done.iter().map(|&(id, _)| id).collect();
        assert_eq!(
            ids,
            (0..ids.len() as u64).collect::<Vec<_>>(),
            "every WR exactly once, in order"
        );
        let dt = cut_at.elapsed();
        assert!(
            dt <= retry + Duration::from_secs(3),
            "failed late: {dt:?} after the cut"
        );
        for i in 0..first_bad {
            let lo = i * SIZE;
            assert!(
                dst.bytes()[lo..lo + SIZE] == src.bytes()[lo..lo + SIZE],
                "WR {i}: bytes differ"
            );
        }
        assert_eq!(a.qp.state(), QpState::Err);
        assert!(
            inline_stats().0 >= inline_before + 50,
            "the sends did not go inline"
        );
    });
    if r.is_none() {
        eprintln!("a_link_cut_while_the_posting_thread_writes_inline_fails_cleanly: skipped");
    }
}

/// A responder that waits for a receive (a WRITE_WITH_IMM arrived before its receive was
/// posted) does not read its stream meanwhile, so its kernel holds back acknowledgements of
/// what keeps arriving (Linux delays an ACK that would not open the window, up to 40 ms). Its
/// keep-alives carry those acknowledgements: the sender's link never looks silent for long.
#[test]
fn a_responder_waiting_for_a_receive_keeps_the_link_from_looking_silent() {
    // Alone: it times a thread's wake-ups (other sock tests would load the cores).
    let _l = TEST_LOCK.write();
    let (_f, a, b) = pair(Duration::from_secs(5), 64 << 10);
    let src = Buf::new(1 << 20, 7);
    let dst = Buf::new(1 << 20, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (lkey, rkey) = (ms.keys().lkey, md.keys().rkey);
    // No receive posted at b: its responder waits at the first write, while 6 MiB more
    // arrive (more than the kernel acknowledges at once while nobody reads).
    let mut wrs = vec![wr(
        0,
        SendOp::WriteWithImm(1),
        (&src, 0, 8, lkey),
        dst.addr(),
        rkey,
    )];
    for i in 1..=96u64 {
        wrs.push(wr(
            i,
            SendOp::Write,
            (&src, 0, 64 << 10, lkey),
            dst.addr(),
            rkey,
        ));
    }
    a.qp.post_send(&wrs).unwrap();
    let t0 = Instant::now();
    let mut worst = Duration::ZERO;
    while t0.elapsed() < Duration::from_millis(400) {
        if let Some(s) = a.qp.link_silence() {
            worst = worst.max(s);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    b.qp.post_recv(99).unwrap();
    let done = statuses(&a.wait(97));
    assert_eq!(
        done,
        (0..97).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    // With keep-alives every 50 ms this read 40 ms (the kernel's delayed ACK); every 10 ms,
    // 8-12 ms.
    assert!(worst < net::SILENCE_FLOOR, "worst silence {worst:?}");
}

/// A lone small segment on a link that died: from a peer whose responder says its kernel
/// acknowledges promptly (its delayed ACK capped, `PROMPT`), the link's silence counts from
/// the round trip, so it shows within tens of milliseconds; from a peer without the cap, not
/// before TCP's retransmission timeout (200 ms at least), as always. Skipped where the kernel
/// has no cap (a kernel without `TCP_DELACK_MAX_US`, added in 2025).
#[test]
fn a_lone_segment_is_silence_at_once_only_from_a_peer_that_acknowledges_promptly() {
    let _l = TEST_LOCK.read();
    if !super::super::delack::supported() {
        eprintln!("SKIPPED: this kernel caps no delayed ACK (no TCP_DELACK_MAX_US)");
        return;
    }
    for delack in [Some(Duration::from_millis(5)), None] {
        let r = in_private_netns(move || {
            let retry = Duration::from_secs(5);
            let (fa, fb) = (
                rail_fabric_capped(NEAR, retry, delack),
                rail_fabric_capped(FAR, retry, delack),
            );
            let (a, b) = (side(&fa, CAPS), side(&fb, CAPS));
            connect(&a, &b);
            write_ok(&a, &b); // its ACK says whether b's kernel acknowledges promptly
            let healthy_done = Instant::now();
            blackhole_far();
            let src = Buf::new(64, 7);
            let dst = Buf::new(64, 0);
            let ms = a.reg(&src, Access::LOCAL_WRITE);
            let md = b.reg(&dst, Access::REMOTE_WRITE);
            a.qp.post_send(&[wr(
                3,
                SendOp::Write,
                (&src, 0, 64, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            )])
            .unwrap();
            // 40 ms of a dead link under one segment of 64 bytes.
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(40) {
                a.bell.wait(Duration::from_millis(2));
            }
            let silence = a.qp.link_silence().expect("sock reports link silence");
            (silence, healthy_done.elapsed())
        });
        let Some((silence, since_ack)) = r else {
            return;
        };
        if delack.is_some() {
            assert!(
                silence >= Duration::from_millis(30),
                "prompt peer: {silence:?}"
            );
        } else if since_ack < Duration::from_millis(150) {
            // Less than TCP's least retransmission timeout since the last acknowledgement.
            assert_eq!(silence, Duration::ZERO, "peer without the cap");
        } else {
            eprintln!("(no check without the cap: this thread was held up {since_ack:?})");
        }
    }
}
