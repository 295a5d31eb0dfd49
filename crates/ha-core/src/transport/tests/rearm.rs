//! Re-arming a failed path: answers of another attempt or epoch are ignored, and the receiver
//! never probes a re-armed queue pair before the sender's end is connected; the path verifies
//! without any traffic.

use super::*;
use crate::transport::ha::HaCfg;
use ha_proto::data::layout::{CtrlKind, CtrlMsg};

/// Fail the primary over (from the sender's side) and wait until both sides switched.
fn fail_over(p: &mut Pair, flow: &mut Flow) {
    p.ctl
        .inject(error_completion(p.qpn(true, 0), WcStatus::RetryExcErr));
    pump_until(p, flow, Duration::from_secs(10), "switch", |p| {
        p.send.link.epoch == 1 && p.recv.link.epoch == 1
    });
    flow.run(p, 50, Duration::from_secs(30)).unwrap();
}

fn pump_both_until(p: &mut Pair, within: Duration, what: &str, done: impl Fn(&Pair) -> bool) {
    let deadline = Instant::now() + within;
    while !done(p) {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        p.send.pump();
        p.recv.pump();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A pair failed over from path 0 whose sender started re-arming it and whose receiver
/// answered (installed its new queue pair): the sender's new queue pair number.
fn rearm_answered(p: &mut Pair, flow: &mut Flow) -> u32 {
    flow.run(p, 50, Duration::from_secs(30)).unwrap();
    fail_over(p, flow);
    let deadline = Instant::now() + Duration::from_secs(10);
    let sq = loop {
        if let Some(q) = p.send.link.rearm_qpn() {
            break q;
        }
        assert!(Instant::now() < deadline, "no re-arm started");
        p.send.pump();
    };
    let r_old = p.qpn(false, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.qpn(false, 0) == r_old {
        assert!(
            Instant::now() < deadline,
            "the receiver did not answer the re-arm"
        );
        p.recv.pump();
    }
    sq
}

/// Finding (re-arm attempts): `Rearm`/`RearmAck` carried no attempt id, so the answer to an
/// attempt that timed out was taken as the answer to the next one and the sender's new queue
/// pair was connected to one the receiver had already replaced (it never verified).
#[test]
fn an_answer_to_an_earlier_rearm_attempt_is_ignored() {
    let _l = TEST_LOCK.read();
    // Attempts time out after 2 x 1 s + RTO: room for a loaded machine between the steps.
    let mut p = Pair::new(HaCfg {
        rearm_hold: Duration::from_secs(1),
        ..cfg()
    });
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    fail_over(&mut p, &mut flow);
    // The sender's answers are held back until its second attempt is under way.
    let s1 = p.qpn(true, 1);
    p.ctl.hold(s1);
    pump_both_until(&mut p, Duration::from_secs(10), "attempt 1", |p| {
        p.send.link.rearm_pending() == Some((0, 1))
    });
    pump_both_until(&mut p, Duration::from_secs(10), "attempt 2", |p| {
        p.send.link.rearm_pending() == Some((0, 2))
    });
    let r0 = p.recv.link.path(0).qp.qp_num();
    pump_both_until(
        &mut p,
        Duration::from_secs(10),
        "receiver answers attempt 2",
        |p| p.recv.link.path(0).qp.qp_num() != r0,
    );
    p.ctl.release(s1);
    pump_both_until(&mut p, Duration::from_secs(20), "re-armed", |p| {
        p.send.stats().rearms == 1 && p.recv.stats().rearms == 1
    });
    assert_eq!(
        (p.send.stats().rearm_failed, p.recv.stats().rearm_failed),
        (0, 0),
        "a re-arm failed to verify (the stale answer misconnected it)"
    );
    assert!(p.send.link.rearm_attempts() >= 2);
    let (s0, r0) = (p.qpn(true, 0), p.qpn(false, 0));
    assert_eq!(
        p.ctl.peer_of(s0),
        Some(r0),
        "sender's new queue pair aimed elsewhere"
    );
    assert_eq!(p.ctl.peer_of(r0), Some(s0));
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
}

/// Finding (re-arm epoch): a `Rearm` from before a switch was applied to the path set the
/// switch replaced.
#[test]
fn a_rearm_of_an_older_epoch_is_ignored() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(HaCfg {
        failback: false,
        ..cfg()
    });
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 50, Duration::from_secs(30)).unwrap();
    fail_over(&mut p, &mut flow);
    let r0 = p.qpn(false, 0);
    p.recv.on_ctrl(CtrlMsg {
        kind: CtrlKind::Rearm,
        epoch: 0,
        a: 0,
        b: 1,
        endpoint: p.send.link.path(1).qp.local_endpoint(),
    });
    assert_eq!(p.qpn(false, 0), r0, "a stale re-arm replaced the path");
    assert!(!p.recv.link.usable(0));
    flow.run(&mut p, 50, Duration::from_secs(30)).unwrap();
}

/// Finding (re-arm of an idle comm): the receiver probed its re-armed queue pair at once — on
/// verbs a probe into a queue pair whose other end is not connected yet fails after the
/// hardware retries, so a sender that NCCL called rarely never saw its re-arm verified. Now
/// the sender says `RearmDone` over the new path once its end is connected, which verifies
/// both ends, with no traffic and no heartbeat.
#[test]
fn a_rearmed_path_verifies_without_traffic_and_is_never_probed_half_connected() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(HaCfg {
        heartbeat: Duration::from_secs(3600),
        // The first attempt waits this long after the switch: longer than `fail_over`'s 50
        // messages take in any build, so the re-arm cannot start and complete with traffic
        // before the loop below looks (it did in debug builds, with the default 200 ms).
        rearm_hold: Duration::from_secs(3),
        ..cfg()
    });
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 50, Duration::from_secs(30)).unwrap();
    fail_over(&mut p, &mut flow);
    assert!(
        p.send.link.rearm_pending().is_none() && p.send.stats().rearms == 0,
        "re-armed during the traffic"
    );
    // The sender starts a re-arm, then NCCL leaves it alone for a while.
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.send.link.rearm_pending().is_none() {
        assert!(Instant::now() < deadline, "no re-arm started");
        p.send.pump();
    }
    let r0 = p.qpn(false, 0);
    let before = p
        .ctl
        .posts_to_unconnected
        .load(std::sync::atomic::Ordering::Relaxed);
    let end = Instant::now() + Duration::from_millis(500);
    while Instant::now() < end {
        p.recv.pump();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_ne!(p.qpn(false, 0), r0, "the receiver answered the re-arm");
    assert_eq!(
        p.ctl
            .posts_to_unconnected
            .load(std::sync::atomic::Ordering::Relaxed),
        before,
        "the receiver posted on a queue pair whose other end is not connected"
    );
    // NCCL calls the sender again: no data, no heartbeat due; the re-arm verifies.
    pump_both_until(&mut p, Duration::from_secs(10), "verified", |p| {
        p.send.stats().rearms == 1 && p.recv.stats().rearms == 1
    });
}

/// #13 (mixed-load drill, a paused receiver): the sender gave a re-arm attempt up when its
/// `RearmDone` completed in error, although the message had reached the receiver, which
/// counted the path verified; the sender's end closed, the receiver's next probe failed and
/// the receiver reported its standby lost (a false loss, WARN) while the sender was already
/// re-arming. The receiver now verifies a re-arm only when its own probe, sent as `RearmDone`
/// arrives, completes: here it fails, which is a failed re-arm on both sides, no standby loss,
/// and the next attempt re-arms both ends.
#[test]
fn a_rearm_the_sender_gave_up_after_its_message_arrived_is_no_lost_standby() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(HaCfg {
        rearm_hold: Duration::from_millis(300),
        ..cfg()
    });
    let mut flow = Flow::new(&p, 8, 64 << 10);
    // The sender has not read the receiver's answer yet: nothing of its new queue pair has
    // completed when its completions start being held.
    let sq = rearm_answered(&mut p, &mut flow);
    p.ctl.hold(sq);
    let rq = p.qpn(false, 0);
    p.ctl.hold(rq);
    // The sender connects and sends `RearmDone`; the receiver's queue pair takes it (the
    // sender's completion, held, says so).
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.ctl.held(sq) == 0 {
        assert!(Instant::now() < deadline, "RearmDone did not complete");
        p.send.pump();
    }
    // ...but the sender sees it fail: the attempt is given up, its end fenced.
    p.ctl.release_failed(sq, WcStatus::RetryExcErr);
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.send.stats().rearm_failed == 0 {
        assert!(
            Instant::now() < deadline,
            "the sender did not give the attempt up"
        );
        p.send.pump();
    }
    p.ctl.release(rq);
    pump_both_until(&mut p, Duration::from_secs(20), "re-armed", |p| {
        p.send.stats().rearms >= 1 && p.recv.stats().rearms >= 1
    });
    // Traffic and heartbeats for a while: whatever the receiver thinks of path 0 shows.
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    let lost = (p.send.stats().standby_lost, p.recv.stats().standby_lost);
    assert_eq!(lost, (0, 0), "a given-up re-arm counted as a lost standby");
    let rearms = (p.send.stats().rearms, p.recv.stats().rearms);
    assert_eq!(rearms, (1, 1), "re-arms verified (sender, receiver)");
    assert_eq!(
        p.recv.stats().rearm_failed,
        1,
        "the receiver's side of attempt 1"
    );
    assert!(p.send.link.rearm_attempts() >= 2);
    assert!(p.send.link.usable(0) && p.recv.link.usable(0));
}

/// #13 (mixed-load run 6, drills 12 and 20): the receiver's connect back over the re-armed
/// rail timed out (its first SYN lost while the rail came back), while the sender's
/// `RearmDone` got through: the sender reported the path re-armed (verified) although nothing
/// could reach it from the receiver; the drill then cut the other rail and the connection was
/// lost. The receiver now answers `RearmDone` over the new path and the sender verifies only on
/// that answer: here the answer cannot be posted, so attempt 1 fails on both sides without a
/// "verified" anywhere, and attempt 2 re-arms both.
#[test]
fn a_rearm_the_receiver_cannot_answer_is_never_reported_verified() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(HaCfg {
        rearm_hold: Duration::from_millis(300),
        ..cfg()
    });
    let mut flow = Flow::new(&p, 8, 64 << 10);
    rearm_answered(&mut p, &mut flow);
    // The receiver's only post on its new queue pair is its answer: it fails.
    p.ctl.fail_posts(p.qpn(false, 0), 1);
    pump_both_until(&mut p, Duration::from_secs(20), "attempt 1 given up", |p| {
        p.send.stats().rearm_failed >= 1 && p.recv.stats().rearm_failed >= 1
    });
    assert_eq!(
        p.send.stats().rearms,
        0,
        "the sender reported attempt 1 verified"
    );
    pump_both_until(&mut p, Duration::from_secs(20), "re-armed", |p| {
        p.send.stats().rearms >= 1 && p.recv.stats().rearms >= 1
    });
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    let lost = (p.send.stats().standby_lost, p.recv.stats().standby_lost);
    assert_eq!(
        lost,
        (0, 0),
        "a half-verified re-arm counted as a lost standby"
    );
    let rearms = (p.send.stats().rearms, p.recv.stats().rearms);
    assert_eq!(rearms, (1, 1), "re-arms verified (sender, receiver)");
    assert!(p.send.link.usable(0) && p.recv.link.usable(0));
}
