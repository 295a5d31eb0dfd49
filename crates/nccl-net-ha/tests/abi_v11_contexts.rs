//! ext-net v11 contexts (one per NCCL communicator) through the built library: two contexts
//! alive at once, each with its own connection; `finalize` of one closes what it still owns
//! (its comms, and with them their queue pairs' threads) while the other keeps working; a
//! finalized context is dead. One test per binary: it counts the plugin's threads.

mod so;

use nccl_net_abi::common::{NCCL_INVALID_USAGE, NCCL_NET_TRAFFIC_CLASS_UNDEF};
use nccl_net_loader::{Comm, NcclError, NetCtx, PluginV8 as Plugin};
use so::*;
use std::time::{Duration, Instant};

/// Threads of the `sock` fabric's queue pairs (`sock-*`) in this process.
fn qp_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|n| n.trim().starts_with("sock-"))
        .count()
}

/// Wait (bounded) for a condition that background threads make true.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::yield_now();
    }
    f()
}

/// A connected pair in context `ctx`, its listen comm left open (owned by `ctx`).
fn pair_in(p: &Plugin, ctx: &NetCtx) -> (Comm, Comm, Comm) {
    let (mut handle, listen) = p.listen_in(ctx, listen_dev()).expect("listen");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if send.is_none() {
            send = p
                .connect_in(ctx, connect_dev(), &mut handle)
                .expect("connect");
        }
        if recv.is_none() {
            recv = p.accept(&listen).expect("accept");
        }
        std::thread::yield_now();
    }
    (listen, send.unwrap(), recv.unwrap())
}

/// One verified message over a pair.
fn exchange(p: &Plugin, send: &Comm, recv: &Comm, seq: u64) {
    let mut sb = RegBuf::new(p, send, pattern(seq, 8192));
    let mut rb = RegBuf::new(p, recv, vec![0; 8192]);
    let rr = p
        .irecv_sized(recv, &[rb.ptr()], &[8192], &[0], &[rb.mr()], false)
        .unwrap()
        .unwrap();
    let sp = sb.ptr();
    let sr = until_some(|| p.isend_sized(send, sp, 8192, 0, sb.mr()).unwrap());
    wait(p, &sr, &mut [0]).unwrap();
    let mut sz = [0];
    wait(p, &rr, &mut sz).unwrap();
    assert_eq!(sz[0], 8192);
    assert!(rb.data == pattern(seq, 8192));
    sb.dereg(p, send);
    rb.dereg(p, recv);
}

#[test]
fn two_contexts_and_finalize_of_one() {
    if !runs(Abi::V11) {
        return;
    }
    let p = plugin_for(Abi::V11);
    let a = p.init_context(0xa, NCCL_NET_TRAFFIC_CLASS_UNDEF).unwrap();
    let b = p.init_context(0xb, NCCL_NET_TRAFFIC_CLASS_UNDEF).unwrap();
    assert_ne!(a.as_ptr(), b.as_ptr(), "one context per communicator");

    let (b_listen, b_send, b_recv) = pair_in(p, &b);
    exchange(p, &b_send, &b_recv, 1);
    assert!(
        eventually(|| qp_threads() > 0),
        "B's queue pairs run threads"
    );
    let b_threads = qp_threads();

    let (a_listen, a_send, a_recv) = pair_in(p, &a);
    exchange(p, &a_send, &a_recv, 2);
    assert!(
        eventually(|| qp_threads() > b_threads),
        "A's queue pairs add threads: {} vs {b_threads}",
        qp_threads()
    );

    // A ends with its comms still open (as after an abort): finalize closes them, and their
    // queue pairs' threads end; B's are untouched.
    p.finalize(a).unwrap();
    assert!(
        eventually(|| qp_threads() == b_threads),
        "threads after finalize(A): {} (B alone had {b_threads})",
        qp_threads()
    );
    let closed = Err(NcclError(NCCL_INVALID_USAGE));
    assert_eq!(p.close_send(a_send), closed, "A's send comm was closed");
    assert_eq!(p.close_recv(a_recv), closed, "A's recv comm was closed");
    assert_eq!(
        p.close_listen(a_listen),
        closed,
        "A's listen comm was closed"
    );

    // B keeps working, and can still connect.
    exchange(p, &b_send, &b_recv, 3);
    let (b_listen2, b_send2, b_recv2) = pair_in(p, &b);
    exchange(p, &b_send2, &b_recv2, 4);
    for c in [b_send, b_send2] {
        p.close_send(c).unwrap();
    }
    for c in [b_recv, b_recv2] {
        p.close_recv(c).unwrap();
    }
    for c in [b_listen, b_listen2] {
        p.close_listen(c).unwrap();
    }
    // Everything B made is closed: finalize has nothing left to close.
    p.finalize(b).unwrap();
    assert!(
        eventually(|| qp_threads() == 0),
        "threads left: {}",
        qp_threads()
    );
}
