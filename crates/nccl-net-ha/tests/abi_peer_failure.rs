//! A peer whose queue pair dies: the request NCCL is testing returns an error (no hang), and
//! every later call on that connection fails too; closing still works.

mod so;

use nccl_net_abi::common::NCCL_REMOTE_ERROR;
use nccl_net_loader::NcclError;
use so::*;
use std::time::{Duration, Instant};

#[test]
fn closed_receiver_fails_the_pending_send_within_the_retry_window() {
    let p = plugin_with(&[("HA_NCCL_SOCK_RETRY_MS", "300")]);
    let (send, recv, _) = connect_pair(p);
    let mut rb = RegBuf::new(p, &recv, vec![0; 1 << 20]);
    let mut sb = RegBuf::new(p, &send, pattern(1, 1 << 20));
    let rp = rb.ptr();
    // The receiver advertises a buffer, then its connection dies.
    let rr = p
        .irecv(&recv, &[rp], &[1 << 20], &[0], &[rb.mr()])
        .unwrap()
        .unwrap();
    let sp = sb.ptr();
    let sr = until_some(|| p.isend(&send, sp, 1 << 20, 0, sb.mr()).unwrap());
    // Either the data already went through, or it fails: finish the receive, then kill it.
    let _ = wait(p, &rr, &mut [0]);
    rb.dereg(p, &recv);
    p.close_recv(recv).unwrap();
    let _ = wait(p, &sr, &mut [0]);
    // A second send now has nobody to write to: it must fail, not hang.
    let started = Instant::now();
    let outcome = loop {
        match p.isend(&send, sp, 1 << 20, 0, sb.mr()) {
            Err(e) => break Err(e),
            Ok(Some(r)) => break wait(p, &r, &mut [0]),
            Ok(None) => {
                // Nobody will post a receive: the plugin has to notice the dead peer.
                if started.elapsed() > Duration::from_secs(20) {
                    panic!("isend kept answering try-later for a dead peer");
                }
                std::thread::yield_now();
            }
        }
    };
    assert_eq!(
        outcome,
        Err(NcclError(NCCL_REMOTE_ERROR)),
        "after {:?}",
        started.elapsed()
    );
    // Every later call on the connection fails too, and close works.
    assert!(p.isend(&send, sp, 8, 0, sb.mr()).is_err());
    sb.dereg(p, &send);
    p.close_send(send).unwrap();
}
