//! Eager sends on a real `sock` connection: small messages go into the receiver's eager ring
//! when their clear-to-send is not there yet, through failovers in either direction; a receive
//! of several buffers is refused by name while they are on; off, nothing goes eagerly.

use super::*;
use crate::transport::mr::MrHandle;
use crate::transport::recv::RecvArg;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Run `flow` until some send went eagerly (whether one does depends on a race with its
/// clear-to-send, which a loaded host may tilt for a while), at most 20 s.
fn run_until_eager(p: &mut Pair, flow: &mut Flow) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.ctl.eager_writes.load(Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "no eager send in 20 s of small messages"
        );
        flow.run(p, 50, Duration::from_secs(30)).unwrap();
    }
}

/// Small messages (1..=4096 bytes) go eagerly and arrive intact; with the limit at 0 none do.
#[test]
fn small_sends_go_eagerly_and_arrive_intact_and_none_do_when_off() {
    let _l = TEST_LOCK.read();
    for (bytes, eager) in [(4096, true), (0, false)] {
        let mut p = Pair::new(HaCfg {
            eager_bytes: bytes,
            ..cfg()
        });
        let mut flow = Flow::new(&p, 8, 4096);
        flow.run(&mut p, 400, Duration::from_secs(30)).unwrap();
        if eager {
            // Whether a send finds its clear-to-send already there is a race (a responder that
            // polls after small messages reads clear-to-sends sooner): run until one did not.
            run_until_eager(&mut p, &mut flow);
        } else {
            let n = p.ctl.eager_writes.load(Ordering::Relaxed);
            assert_eq!(
                n, 0,
                "HA_NCCL_SOCK_EAGER=0: every send waits for its clear-to-send"
            );
        }
        assert_eq!(p.recv.duplicates(), 0);
    }
}

/// Sends larger than the limit always wait for their clear-to-send.
#[test]
fn sends_over_the_limit_never_go_eagerly() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(HaCfg {
        eager_bytes: 16,
        ..cfg()
    });
    // Sizes 1..=16: eager allowed; then 17..=64 K only.
    let mut small = Flow::new(&p, 8, 16);
    run_until_eager(&mut p, &mut small);
    let before = p.ctl.eager_writes.load(Ordering::Relaxed);
    let mut p = Pair::new(HaCfg {
        eager_bytes: 16,
        ..cfg()
    });
    let mut large = Flow::sized(&p, 8, 17, 64 << 10);
    large.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!(
        p.ctl.eager_writes.load(Ordering::Relaxed),
        0,
        "{before} before"
    );
}

/// Failovers of either side's path in the middle of eager traffic: every message arrives
/// exactly once, intact, and eager sends go on over the standby.
#[test]
fn eager_traffic_survives_failovers_of_either_side_exactly_once() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(cfg());
    let mut flow = Flow::new(&p, 16, 512);
    run_until_eager(&mut p, &mut flow);
    fail_path(&mut p, &mut flow, true, 0);
    flow.run(&mut p, 300, Duration::from_secs(30)).unwrap();
    // The failed path re-armed (a standby again), then the receiver's active path fails.
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "re-arm", |p| {
        rearmed(p, 1)
    });
    let before = p.ctl.eager_writes.load(Ordering::Relaxed);
    let active = p.recv.link.active;
    fail_path(&mut p, &mut flow, false, active);
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.ctl.eager_writes.load(Ordering::Relaxed) == before {
        assert!(
            Instant::now() < deadline,
            "eager sends go on after the failovers"
        );
        flow.run(&mut p, 50, Duration::from_secs(30)).unwrap();
    }
    assert_eq!(p.recv.duplicates(), 0);
}

/// With eager sends on, the connection takes one buffer per receive (the device advertises
/// `maxRecvs` 1) and says so; off, two buffers are fine.
#[test]
fn a_receive_of_two_buffers_is_refused_by_name_while_eager_sends_are_on() {
    let _l = TEST_LOCK.read();
    for (bytes, refused) in [(4096, true), (0, false)] {
        let mut p = Pair::new(HaCfg {
            eager_bytes: bytes,
            ..cfg()
        });
        let bufs: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; 64]).collect();
        let mrs: Vec<_> = bufs
            .iter()
            .map(|b| {
                Arc::new(
                    MrHandle::register(p.recv.device_res(), b.as_ptr() as usize, b.len()).unwrap(),
                )
            })
            .collect();
        let args: Vec<RecvArg> = (0..2)
            .map(|i| RecvArg {
                addr: bufs[i].as_ptr() as usize,
                size: 64,
                tag: i as i32,
                mr: &mrs[i],
            })
            .collect();
        let r = p.recv.irecv(&args);
        if refused {
            let e = r.expect_err("refused").to_string();
            assert!(
                e.contains("HA_NCCL_SOCK_EAGER") && e.contains("maxRecvs 1"),
                "{e}"
            );
        } else {
            assert!(r.unwrap().is_some());
        }
    }
}

/// Clear-to-sends that find their path's send queue without room wait (flow control) instead
/// of failing the path: with room for only 4, eager traffic goes on intact, exactly once,
/// some clear-to-sends wait (an unsignaled one last gets a probe behind it, whose completion
/// frees the room), and so on through a failover of the receiver's path.
#[test]
fn clear_to_sends_without_room_wait_and_every_message_arrives_once() {
    let _l = TEST_LOCK.read();
    // Eager sends on (receives complete before their clear-to-send is read) and off (every
    // send waits for its clear-to-send, which the switch re-posts before its Switch message).
    for eager_bytes in [cfg().eager_bytes, 0] {
        let mut p = Pair::new(HaCfg {
            eager_bytes,
            ..cfg()
        });
        p.recv.cts_room = 4;
        let mut flow = Flow::new(&p, 16, 512);
        let deadline = Instant::now() + Duration::from_secs(20);
        while p.recv.cts_waited() == 0 {
            assert!(
                Instant::now() < deadline,
                "eager {eager_bytes}: no clear-to-send waited in 20 s"
            );
            flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
        }
        flow.run(&mut p, 300, Duration::from_secs(30)).unwrap();
        let active = p.recv.link.active;
        fail_path(&mut p, &mut flow, false, active);
        flow.run(&mut p, 300, Duration::from_secs(30)).unwrap();
        assert_eq!(p.recv.duplicates(), 0);
    }
}
