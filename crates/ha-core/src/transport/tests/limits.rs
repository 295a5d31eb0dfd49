//! Resource limits of the connection layer: completion queues sized from what their queue
//! pairs can owe, and messages above a device's size limit refused up front.

use super::ctl_fabric::{Ctl, CtlFabric};
use super::*;
use crate::engine::Engine;
use crate::transport::mr::MrHandle;
use crate::transport::path::{Path, CQES_PER_QP};
use crate::transport::recv::RecvArg;
use std::sync::Arc;

/// Finding (CQ sizing): one 4096-entry completion queue per device against 64 receives and up
/// to 1024 sends per queue pair overflowed on a mass flush beyond a few dozen queue pairs.
/// Now every queue carries at most what its queue pairs can owe at once.
#[test]
fn completion_queues_are_sized_from_what_their_queue_pairs_can_owe() {
    let _l = TEST_LOCK.read();
    let ctl = Arc::new(Ctl::default());
    let engine = Engine::new(
        Arc::new(CtlFabric::new(pair::sock(), ctl.clone())),
        Duration::from_micros(50),
    );
    let paths: Vec<Path> = (0..100)
        .map(|_| Path::open(engine.lease(0).unwrap(), None).unwrap())
        .collect();
    let loads = ctl.cq_loads();
    assert!(
        loads.len() > 1,
        "100 queue pairs fit no single queue: {loads:?}"
    );
    for l in &loads {
        assert!(
            l.owed <= u64::from(l.depth),
            "a queue of {} entries carries queue pairs owing {}",
            l.depth,
            l.owed
        );
    }
    assert_eq!(loads.iter().map(|l| l.qps).sum::<u32>(), 100);
    assert!(u64::from(CQES_PER_QP) * 100 <= loads.iter().map(|l| u64::from(l.depth)).sum());
    drop(paths);
}

/// Finding (message size): a send above the device's `max_msg_sz` failed the path with a
/// length error, failed over, failed again on the replay and lost the connection. Now it is
/// refused up front with an error that says why; the connection goes on.
#[test]
fn a_send_above_the_devices_message_size_is_refused_up_front() {
    let _l = TEST_LOCK.read();
    let fabric = CtlFabric::new(pair::sock(), Arc::new(Ctl::default())).with_max_msg(64 << 10);
    let mut p = Pair::over(fabric, cfg());
    let big = vec![5u8; 256 << 10];
    let dst = vec![0u8; 256 << 10];
    let reg =
        |dev, b: &Vec<u8>| Arc::new(MrHandle::register(dev, b.as_ptr() as usize, b.len()).unwrap());
    let smr = reg(p.send.device_res(), &big);
    let rmr = reg(p.recv.device_res(), &dst);
    let arg = RecvArg {
        addr: dst.as_ptr() as usize,
        size: dst.len(),
        tag: 3,
        mr: &rmr,
    };
    let rid = p.recv.irecv(&[arg]).unwrap().expect("receive slot");
    let e = loop {
        match p.send.isend(big.as_ptr() as usize, 128 << 10, 3, &smr) {
            Err(e) => break e.to_string(),
            Ok(None) => continue,
            Ok(Some(_)) => panic!("a send above max_msg_sz was accepted"),
        }
    };
    assert!(e.contains("max_msg_sz") && e.contains("131072"), "{e}");
    // The same receive takes a send the device can carry.
    let deadline = Instant::now() + Duration::from_secs(10);
    let sid = loop {
        assert!(
            Instant::now() < deadline,
            "the receive never became matchable"
        );
        if let Some(id) = p
            .send
            .isend(big.as_ptr() as usize, 60 << 10, 3, &smr)
            .unwrap()
        {
            break id;
        }
    };
    let (mut sent, mut got) = (None, None);
    while sent.is_none() || got.is_none() {
        assert!(Instant::now() < deadline, "exchange stuck");
        if sent.is_none() {
            sent = p.send.test(sid).unwrap();
        }
        if got.is_none() {
            got = p.recv.test(rid).unwrap();
        }
    }
    assert_eq!((sent, got), (Some(60 << 10), Some(vec![60 << 10])));
    assert!(dst[..60 << 10].iter().all(|&b| b == 5));
    let mut flow = Flow::new(&p, 8, 32 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.stats().failovers, 0);
}
