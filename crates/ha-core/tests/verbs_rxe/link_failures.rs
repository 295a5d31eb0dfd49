//! Link failures on real verbs: far end down and blackhole (retry exceeded, then recovery)
//! and near end down (PORT_ERR, then PORT_ACTIVE).

use crate::rig::*;
use crate::transfer;
use ha_core::fabric::verbs::AsyncEventKind;
use ha_core::fabric::{Access, Fabric, QpState, SendOp, WcStatus};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- link failures

#[test]
fn far_end_down_fails_with_retry_exceeded_then_recovers() {
    let rig = rig_or_skip!("far_end_down_fails_with_retry_exceeded_then_recovers");
    // 4.096 µs × 2^14 = 67 ms per try, 4 tries: the error should come in well under 2 s.
    let f = open(&cfg(14, 3));
    let (a, b) = (dev_index(&f, &rig.a.0.dev), dev_index(&f, &rig.a.1.dev));
    // Keeps the device open across the test, so its events keep being read.
    let _keep = f.open_pd(a).unwrap();
    let (x, y) = connect(&f, a, b);
    transfer(&x, &y, 4096, 1);
    let ev = f.port_events(a).unwrap();
    let seen = ev.event_count();
    let mut dst = vec![0u8; 4096];
    let mut src = pattern(4096, 4);
    let dmr = y.reg(&mut dst, Access::REMOTE_WRITE);
    let smr = x.reg(&mut src, Access::LOCAL_WRITE);
    let _repair = rig.repair_on_drop("A");
    rig.link(&["A", "down", "far"]);
    let t = Instant::now();
    x.qp.post_send(&[write(
        11,
        SendOp::Write,
        &src,
        &*smr,
        dst.as_ptr() as u64,
        dmr.keys().rkey,
    )])
    .unwrap();
    let s = x.wait(1, Duration::from_secs(30));
    println!("far end down: {:?} after {:?}", s[0].status, t.elapsed());
    assert_eq!((s[0].wr_id, s[0].status), (11, WcStatus::RetryExcErr));
    assert_eq!(x.qp.state(), QpState::Err);
    // The veth pair lost carrier on both ends: rxe0a reports PORT_ERR too.
    let e = ev.wait_for(seen, Duration::from_secs(10), |e| {
        e.kind == AsyncEventKind::PortErr
    });
    assert!(e.is_some(), "no PORT_ERR: {:?}", ev.events_after(seen));
    assert!(!ev.healthy());
    drop((x, y));
    let seen = ev.event_count();
    rig.link(&["A", "up"]);
    let e = ev.wait_for(seen, Duration::from_secs(10), |e| {
        e.kind == AsyncEventKind::PortActive
    });
    assert!(e.is_some(), "no PORT_ACTIVE: {:?}", ev.events_after(seen));
    // New queue pairs (GID resolved afresh) work again on the repaired rail.
    let (x, y) = connect(&f, a, b);
    assert!(ev.healthy());
    transfer(&x, &y, 4096, 5);
}

#[test]
fn blackhole_fails_with_retry_exceeded_and_no_event() {
    let rig = rig_or_skip!("blackhole_fails_with_retry_exceeded_and_no_event");
    let f = open(&cfg(14, 2));
    let (a, b) = (dev_index(&f, &rig.b.0.dev), dev_index(&f, &rig.b.1.dev));
    let (x, y) = connect(&f, a, b);
    transfer(&x, &y, 1024, 2);
    let ev = f.port_events(a).unwrap();
    let seen = ev.event_count();
    let _repair = rig.repair_on_drop("B");
    rig.link(&["B", "blackhole", "near"]);
    let t = Instant::now();
    transfer_expect_error(&x, &y, WcStatus::RetryExcErr);
    println!("blackhole: RETRY_EXC_ERR after {:?}", t.elapsed());
    assert!(ev.healthy(), "ports stay ACTIVE under a blackhole");
    assert!(
        ev.events_after(seen)
            .iter()
            .all(|e| e.kind != AsyncEventKind::PortErr),
        "{:?}",
        ev.events_after(seen)
    );
}

fn transfer_expect_error(x: &Side, y: &Side, want: WcStatus) {
    let mut dst = vec![0u8; 1024];
    let mut src = pattern(1024, 8);
    let dmr = y.reg(&mut dst, Access::REMOTE_WRITE);
    let smr = x.reg(&mut src, Access::LOCAL_WRITE);
    x.qp.post_send(&[write(
        21,
        SendOp::Write,
        &src,
        &*smr,
        dst.as_ptr() as u64,
        dmr.keys().rkey,
    )])
    .unwrap();
    let s = x.wait(1, Duration::from_secs(30));
    assert_eq!((s[0].wr_id, s[0].status), (21, want));
}

#[test]
fn near_end_down_raises_port_err_and_up_port_active() {
    let rig = rig_or_skip!("near_end_down_raises_port_err_and_up_port_active");
    let f = open(&data_cfg());
    let a = dev_index(&f, &rig.a.0.dev);
    let other = dev_index(&f, &rig.b.0.dev);
    // Events are read while the device is open.
    let _pds = (f.open_pd(a).unwrap(), f.open_pd(other).unwrap());
    let (ev, ev_b) = (f.port_events(a).unwrap(), f.port_events(other).unwrap());
    let (seen, seen_b) = (ev.event_count(), ev_b.event_count());
    assert!(ev.healthy());
    let _repair = rig.repair_on_drop("A");
    rig.link(&["A", "down", "near"]);
    let e = ev.wait_for(seen, Duration::from_secs(10), |e| {
        e.kind == AsyncEventKind::PortErr
    });
    assert!(e.is_some(), "no PORT_ERR: {:?}", ev.events_after(seen));
    assert!(!ev.healthy());
    let seen = ev.event_count();
    rig.link(&["A", "up"]);
    let e = ev.wait_for(seen, Duration::from_secs(10), |e| {
        e.kind == AsyncEventKind::PortActive
    });
    assert!(e.is_some(), "no PORT_ACTIVE: {:?}", ev.events_after(seen));
    assert!(ev.healthy());
    assert!(ev_b.healthy());
    assert!(
        ev_b.events_after(seen_b)
            .iter()
            .all(|e| e.kind != AsyncEventKind::PortErr),
        "rail B saw rail A's failure"
    );
}
