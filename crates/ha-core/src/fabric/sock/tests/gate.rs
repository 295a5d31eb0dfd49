//! The inline gate (`inline_gate.rs`) through real queue pairs: an 8 KiB message is written
//! by the posting thread once its queue pair has been the only larger sender for the window,
//! and handed to the sender thread while another queue pair sends larger messages too. The
//! fabric has a gate of its own; the exclusive test lock keeps other tests' inline writes out
//! of the process-wide count.

use super::*;

const SIZE: usize = 8 << 10;

/// A fabric whose queue pairs write up to 8 KiB inline behind a gate of their own.
fn gated_fabric() -> SockFabric {
    SockFabric::new(SockConfig {
        rails: vec![lo()],
        retry_timeout: LONG,
        segment_bytes: 1 << 20,
        inline_bytes: SIZE,
        inline_gate: Some(Box::leak(Box::new(InlineGate::new()))),
        spin: Duration::from_micros(100),
        lanes: 4,
        delack_max: Some(std::time::Duration::from_millis(5)),
        limits: Default::default(),
    })
    .unwrap()
}

/// One side's registrations for the test's messages.
struct Mrs {
    src: Box<dyn MemoryRegion>,
    dst: Box<dyn MemoryRegion>,
}

/// Post message `i` (8 KiB of `src` at slot `i`) from `s` to `r` (its receive first): how
/// many batches the posting thread wrote itself during the post.
fn post(s: &Side, r: &Side, m: &Mrs, src: &Buf, dst: &Buf, i: usize) -> u64 {
    r.qp.post_recv(100 + i as u64).unwrap();
    let before = inline_stats().0;
    let w = wr(
        i as u64,
        SendOp::WriteWithImm(i as u32),
        (src, i * SIZE, SIZE, m.src.keys().lkey),
        dst.addr() + i * SIZE,
        m.dst.keys().rkey,
    );
    s.qp.post_send(&[w]).unwrap();
    inline_stats().0 - before
}

/// Wait for message `i` at both ends and check its bytes.
fn complete(s: &Side, r: &Side, src: &Buf, dst: &Buf, i: usize) {
    assert_eq!(statuses(&s.wait(1)), vec![(i as u64, WcStatus::Success)]);
    let c = r.wait(1);
    assert_eq!((c[0].wr_id, c[0].imm), (100 + i as u64, Some(i as u32)));
    assert!(
        dst.bytes()[i * SIZE..(i + 1) * SIZE] == src.bytes()[i * SIZE..(i + 1) * SIZE],
        "message {i}: bytes differ"
    );
}

/// Wait out `window`, yielding the CPU (the sender thread may still be finishing a write).
fn wait_out(window: Duration) {
    let t = Instant::now();
    while t.elapsed() < window {
        std::thread::yield_now();
    }
}

#[test]
fn an_8k_message_goes_inline_only_while_its_queue_pair_sends_alone() {
    let _l = TEST_LOCK.write();
    let f = gated_fabric();
    let (a, b) = (side(&f, CAPS), side(&f, CAPS));
    connect(&a, &b);
    let (c, d) = (side(&f, CAPS), side(&f, CAPS));
    connect(&c, &d);
    let mut src = Buf::new(32 * SIZE, 0);
    src.pattern(31);
    let (dst, dst2) = (Buf::new(32 * SIZE, 0xEE), Buf::new(32 * SIZE, 0xEE));
    let ma = Mrs {
        src: a.reg(&src, Access::LOCAL_WRITE),
        dst: b.reg(&dst, Access::REMOTE_WRITE),
    };
    let mc = Mrs {
        src: c.reg(&src, Access::LOCAL_WRITE),
        dst: d.reg(&dst2, Access::REMOTE_WRITE),
    };
    let window = crate::fabric::sock::inline_gate::ALONE_FOR;
    let mut i = 0;
    // Alone for the window (counted from the gate's first message): one of a few messages
    // goes inline. (One may find the stream still held by the sender thread after the
    // previous message, which a loaded host makes likely: then it goes to that thread.)
    let alone = |from: &mut usize| {
        wait_out(window);
        (0..4).any(|_| {
            let n = post(&a, &b, &ma, &src, &dst, *from);
            complete(&a, &b, &src, &dst, *from);
            *from += 1;
            n == 1
        })
    };
    assert_eq!(
        post(&a, &b, &ma, &src, &dst, i),
        0,
        "the gate's first message"
    );
    complete(&a, &b, &src, &dst, i);
    i += 1;
    assert!(alone(&mut i), "alone for the window, never inline");
    // Another queue pair posts right before: not alone, whatever the stream's state. (A pair
    // of posts the host took the window or longer to make proves nothing: tried again.)
    let mut judged = false;
    for _ in 0..4 {
        post(&c, &d, &mc, &src, &dst2, i);
        let t = Instant::now();
        let n = post(&a, &b, &ma, &src, &dst, i + 1);
        let quick = t.elapsed() < window / 2;
        complete(&c, &d, &src, &dst2, i);
        complete(&a, &b, &src, &dst, i + 1);
        i += 2;
        if quick {
            assert_eq!(n, 0, "went inline right after another queue pair's message");
            judged = true;
            break;
        }
    }
    assert!(
        judged,
        "the host never made two posts within half the window"
    );
    // Alone again for the window: inline again.
    assert!(alone(&mut i), "alone again, never inline");
    assert_eq!((a.qp.state(), c.qp.state()), (QpState::Rts, QpState::Rts));
}
