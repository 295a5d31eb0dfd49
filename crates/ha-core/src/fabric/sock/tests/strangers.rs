//! Strangers on a rail's listener: silent clients, clients sending garbage and clients that
//! send half a hello cannot delay the real streams of queue pairs, and the listener keeps a
//! bounded set of them, for a bounded time, with no thread of its own per client.

use super::*;
use crate::fabric::sock::listener::{HELLO_WAIT, MAX_PENDING};

/// 100 silent clients and 100 clients sending garbage connect to a protection domain's listener
/// first; then two queue pairs of that domain connect through it and move verified data. With a
/// listener that read hellos one at a time (1 s each) the silent clients alone held it for
/// 100 s, far past the 3 s retry window in which the queue pairs must connect.
#[test]
fn silent_and_garbage_clients_do_not_delay_real_streams() {
    // Alone: it counts the process's threads and pending hellos, which other tests change.
    let _l = TEST_LOCK.write();
    let f = fabric(Duration::from_secs(3), 1 << 20);
    let a = side(&f, CAPS);
    let b = side(&f, CAPS);
    let port = b.ep().port;
    let threads_before = live_threads();
    let mut strangers = Vec::new();
    for i in 0..200u32 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        if i % 2 == 1 {
            // Garbage: 64 bytes that are not a hello (and a few that start like one).
            let mut g = [0xA5u8; 64];
            if i % 10 == 1 {
                g[..7].copy_from_slice(b"HASOCK1");
            }
            s.write_all(&g).unwrap();
        }
        strangers.push(s);
    }
    assert!(
        live_threads() <= threads_before,
        "strangers got threads: {} -> {}",
        threads_before,
        live_threads()
    );
    connect(&a, &b);
    let mut src = Buf::new(1 << 20, 0);
    src.pattern(3);
    let dst = Buf::new(1 << 20, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    b.qp.post_recv(7).unwrap();
    a.qp.post_send(&[wr(
        1,
        SendOp::WriteWithImm(9),
        (&src, 0, 1 << 20, ms.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    )])
    .unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(1, WcStatus::Success)]);
    assert_eq!(b.wait(1)[0].imm, Some(9));
    assert!(dst.bytes() == src.bytes(), "bytes differ");
    assert!(pending_hellos() <= 2 * MAX_PENDING, "{}", pending_hellos());
    drop(strangers);
}

/// More silent clients than the pending set holds: it stays bounded (the longest waiting are
/// closed first), the rest are closed at their deadline, and the set empties.
#[test]
fn the_pending_set_is_bounded_and_empties() {
    // Alone: it counts the process's threads and pending hellos, which other tests change.
    let _l = TEST_LOCK.write();
    let f = fabric(LONG, 1 << 20);
    let a = side(&f, CAPS);
    let port = a.ep().port;
    let mut silent = Vec::new();
    for _ in 0..MAX_PENDING + 50 {
        silent.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    // A client that sends half a hello and then nothing is a stranger too.
    let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
    half.write_all(&b"HASOCK1\0"[..]).unwrap();
    let deadline = Instant::now() + LONG;
    let mut most = 0;
    // The evicted and expired ones are closed by the listener: their reads see the end.
    let mut closed = 0;
    for s in silent.iter_mut().chain(std::iter::once(&mut half)) {
        s.set_read_timeout(Some(HELLO_WAIT + Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 1];
        most = most.max(pending_hellos());
        assert!(Instant::now() < deadline);
        match s.read(&mut b) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            r => panic!("a stranger's stream was neither closed nor reset: {r:?}"),
        }
    }
    assert_eq!(closed, MAX_PENDING + 51);
    assert!(most <= MAX_PENDING + 1, "pending set held {most}");
    while pending_hellos() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} still pending",
            pending_hellos()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(a);
}
