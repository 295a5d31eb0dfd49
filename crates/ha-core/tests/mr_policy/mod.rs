//! What the MR-policy tests share: one connected pair on two loopback rails (a primary and a
//! standby path per connection), a registration, and the live registration count.

use super::common::{until_token, wait_done};
use ha_core::api::ops::{self, RecvBuf};
use ha_core::fabric::counters;
use std::time::{Duration, Instant};

/// Set up the plugin on two `sock` rails with `HA_NCCL_MR_POLICY=policy`.
pub fn init(policy: &str) {
    for (k, v) in [
        ("HA_NCCL_FABRIC", "sock"),
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("HA_NCCL_SOCK_RAILS", "127.0.0.1,127.0.0.2"),
        ("HA_NCCL_ENABLE_BACKUP", "1"),
        ("HA_NCCL_MR_POLICY", policy),
    ] {
        std::env::set_var(k, v);
    }
    ops::init().expect("init");
    assert_eq!(ops::devices().unwrap(), 2, "two rails");
}

/// Registrations one `regMr` of host memory on a connection with a standby adds at once, and
/// a verified message through that registration.
pub fn registrations_added_by_one_reg_mr() -> usize {
    let mut handle = [0u8; 128];
    let listen = ops::listen(0, &mut handle).expect("listen");
    let (mut send, mut recv) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while send == 0 || recv == 0 {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if send == 0 {
            send = ops::connect(0, &mut handle).expect("connect");
        }
        if recv == 0 {
            recv = ops::accept(listen).expect("accept");
        }
        std::thread::yield_now();
    }
    ops::close_listen(listen).expect("closeListen");
    let sb: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let mut rb = vec![0u8; 4096];
    let rmr = ops::reg_mr(recv, rb.as_mut_ptr() as usize, rb.len(), 1).expect("regMr recv");
    let before = counters::snapshot().mrs;
    let smr = ops::reg_mr(send, sb.as_ptr() as usize, sb.len(), 1).expect("regMr send");
    let added = counters::snapshot().mrs - before;
    let rr = until_token("irecv", || {
        ops::irecv(
            recv,
            &[RecvBuf {
                addr: rb.as_mut_ptr() as usize,
                size: rb.len() as i64,
                tag: 1,
                mr: rmr,
            }],
        )
        .expect("irecv")
    });
    let sr = until_token("isend", || {
        ops::isend(send, sb.as_ptr() as usize, sb.len() as i64, 1, smr).expect("isend")
    });
    assert_eq!(wait_done(sr), vec![4096]);
    assert_eq!(wait_done(rr), vec![4096]);
    assert!(rb == sb, "bytes differ");
    ops::dereg_mr(send, smr).expect("deregMr");
    ops::dereg_mr(recv, rmr).expect("deregMr");
    ops::close_send(send).expect("closeSend");
    ops::close_recv(recv).expect("closeRecv");
    added
}
