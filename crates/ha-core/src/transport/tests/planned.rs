//! The planned switch back to the preferred path, and real failures in its middle: of the
//! target before the sender asked, of the target after the receiver switched (the sender then
//! commits and fails over in a row), of the path being left at either end after the sender
//! asked, and a receiver that refuses. Every case ends with both sides on one path at one
//! epoch and every message intact, exactly once.

use super::*;
use ha_proto::data::layout::{CtrlKind, CtrlMsg};

const HOLD: Duration = Duration::from_millis(300);

/// A pair whose traffic failed over from path 0 and whose path 0 was re-armed (both sides
/// verified it): the next planned switch returns home.
fn failed_over_and_rearmed(cfg: HaCfg, stats: &str) -> (Pair, Flow) {
    let mut p = Pair::split(cfg, stats);
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    fail_path(&mut p, &mut flow, true, 0);
    assert!(settled_on(&p, 1));
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "re-arm", |p| {
        rearmed(p, 1)
    });
    (p, flow)
}

/// Step the flow until the sender has data in flight on `path` (its completions held).
fn in_flight(p: &mut Pair, flow: &mut Flow, path: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.send.link.path(path).data_in_flight() {
        assert!(
            Instant::now() < deadline,
            "no data in flight on path {path}"
        );
        flow.step(p).unwrap();
    }
}

/// Pump only the sender until it asked the receiver for a planned switch.
fn sender_asks(p: &mut Pair) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.send.link.planned().is_some_and(|x| x.requested) {
        assert!(Instant::now() < deadline, "the sender never asked");
        p.send.pump();
        std::thread::yield_now();
    }
}

#[test]
fn traffic_returns_home_with_a_planned_switch_no_fence_no_replay_no_error() {
    let _l = TEST_LOCK.read();
    let stats = stats_path("return");
    let (mut p, mut flow) = failed_over_and_rearmed(home_cfg(HOLD), stats.to_str().unwrap());
    let replays = (p.send.stats().replays, p.recv.stats().replays);
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "return", |p| {
        settled_on(p, 0)
    });
    assert_eq!((p.send.link.epoch, p.recv.link.epoch), (2, 2));
    for (who, s) in [("send", p.send.stats()), ("recv", p.recv.stats())] {
        assert_eq!(
            (s.failovers, s.returns, s.plans_aborted),
            (1, 1, 0),
            "{who}"
        );
        assert_eq!(s.stale_dropped, 0, "{who}");
    }
    assert_eq!(
        (p.send.stats().replays, p.recv.stats().replays),
        replays,
        "the return replayed"
    );
    // The path left is the standby again: connected, verified.
    assert!(p.send.link.usable(1) && p.recv.link.usable(1));
    let at_return = (p.send.link.path_bytes(), p.recv.link.path_bytes());
    flow.run(&mut p, 300, Duration::from_secs(30)).unwrap();
    let after = (p.send.link.path_bytes(), p.recv.link.path_bytes());
    assert_eq!(
        after.0[1], at_return.0[1],
        "sender: path 1 carried data after the return"
    );
    assert_eq!(
        after.1[1], at_return.1[1],
        "receiver: path 1 carried data after the return"
    );
    assert!(after.0[0] > at_return.0[0] && after.1[0] > at_return.1[0]);
    assert_eq!(p.recv.duplicates(), 0);
    assert_eq!(p.send.stats().standby_lost + p.recv.stats().standby_lost, 0);
    // The stats file has each switch with the bytes per path at that moment.
    let ev = switch_events(&stats);
    let kinds: Vec<(&str, &str)> = ev.iter().map(|e| (e.0.as_str(), e.1.as_str())).collect();
    for want in [
        ("send", "failover"),
        ("recv", "failover"),
        ("send", "return"),
        ("recv", "return"),
    ] {
        assert!(kinds.contains(&want), "{want:?} missing in {ev:?}");
    }
    let ret = ev
        .iter()
        .find(|e| e.0 == "send" && e.1 == "return")
        .unwrap();
    assert_eq!((ret.2, ret.3), (1, 0));
    assert!(
        ret.4[1] > 0,
        "path 1 carried the traffic while home was away"
    );
    drop(p);
    let _ = std::fs::remove_file(&stats);
}

/// The target fails while the sender still drains the path it leaves (before it asked the
/// receiver): the plan is abandoned, traffic stays, the target is re-armed and the return
/// happens later.
#[test]
fn a_target_that_fails_before_the_sender_asked_abandons_the_plan() {
    let _l = TEST_LOCK.read();
    let (mut p, mut flow) = failed_over_and_rearmed(home_cfg(HOLD), "");
    // The sender's completions on path 1 are held: it cannot finish draining it.
    let s1 = p.qpn(true, 1);
    p.ctl.hold(s1);
    in_flight(&mut p, &mut flow, 1);
    pump_until(&mut p, &mut flow, Duration::from_secs(10), "plan", |p| {
        p.send.link.planned().is_some()
    });
    assert!(!p.send.link.planned().unwrap().requested);
    p.ctl
        .inject(error_completion(p.qpn(true, 0), WcStatus::RetryExcErr));
    pump_until(&mut p, &mut flow, Duration::from_secs(10), "abandon", |p| {
        matches!(p.send.link.phase, Phase::Normal)
    });
    assert_eq!(p.send.stats().plans_aborted, 1);
    assert_eq!(p.send.link.active, 1);
    p.ctl.release(s1);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    pump_until(&mut p, &mut flow, Duration::from_secs(30), "return", |p| {
        settled_on(p, 0) && rearmed(p, 2)
    });
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!(p.recv.duplicates(), 0);
    assert_eq!(p.send.stats().failovers, 1);
}

/// The target fails as the receiver switches to it: its first post there fails. The receiver
/// fails over back from it at once (`Switch` of the next epoch over the path it had left); the
/// sender, which never saw the first `Switch`, commits its plan and fails over in a row.
#[test]
fn a_target_that_fails_as_the_receiver_switches_ends_with_a_failover_back() {
    let _l = TEST_LOCK.read();
    // No heartbeat: the receiver's first post on its re-armed path 0 is the switch's.
    let cfg = HaCfg {
        heartbeat: Duration::from_secs(3600),
        ..home_cfg(HOLD)
    };
    let (mut p, mut flow) = failed_over_and_rearmed(cfg, "");
    let r0 = p.qpn(false, 0);
    p.ctl_r.fail_posts(r0, 1);
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(20),
        "switch and back",
        |p| p.send.link.epoch == 3 && settled_on(p, 1),
    );
    for (who, s) in [("send", p.send.stats()), ("recv", p.recv.stats())] {
        assert_eq!((s.returns, s.failovers), (1, 2), "{who}");
    }
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    assert_eq!(p.recv.duplicates(), 0);
    assert_eq!(
        p.send.stats().stale_dropped + p.recv.stats().stale_dropped,
        0
    );
}

/// The path being left fails at the sender after it asked: a failover replaces the plan (the
/// receiver's answer to either serves).
#[test]
fn the_path_left_failing_at_the_sender_after_it_asked_is_a_failover() {
    let _l = TEST_LOCK.read();
    let (mut p, mut flow) = failed_over_and_rearmed(home_cfg(HOLD), "");
    sender_asks(&mut p);
    p.ctl
        .inject(error_completion(p.qpn(true, 1), WcStatus::RetryExcErr));
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "settle", |p| {
        p.send.link.epoch == 2 && settled_on(p, 0)
    });
    assert_eq!(p.send.stats().failovers, 2);
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    assert_eq!(p.recv.duplicates(), 0);
}

/// The path being left fails at the receiver after the sender asked: the receiver fails over
/// (fence, drain) and its `Switch` commits the sender's plan (or the sender, seeing that path
/// break first, fails over too) — nothing replayed either way.
#[test]
fn the_path_left_failing_at_the_receiver_after_the_sender_asked_commits_the_plan() {
    let _l = TEST_LOCK.read();
    let (mut p, mut flow) = failed_over_and_rearmed(home_cfg(HOLD), "");
    sender_asks(&mut p);
    let replays = p.send.stats().replays;
    p.ctl_r
        .inject(error_completion(p.qpn(false, 1), WcStatus::RetryExcErr));
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "settle", |p| {
        p.send.link.epoch == 2 && settled_on(p, 0)
    });
    // The sender commits its plan with the receiver's `Switch` — or, when it sees the
    // path it left break first (the receiver's fence shut it), fails over: one switch either
    // way, nothing replayed.
    let s = p.send.stats();
    assert_eq!(s.returns + s.failovers, 2, "{s:?}");
    assert_eq!(p.recv.stats().failovers, 2, "the receiver failed over");
    assert_eq!(p.send.stats().replays, replays);
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    assert_eq!(p.recv.duplicates(), 0);
}

/// The receiver refuses a plan whose target failed on its side (`PlanNak`): the sender resumes
/// on the path it had drained; the target is re-armed and the return happens later.
#[test]
fn a_refused_plan_resumes_on_the_path_it_drained() {
    let _l = TEST_LOCK.read();
    let (mut p, mut flow) = failed_over_and_rearmed(home_cfg(HOLD), "");
    sender_asks(&mut p);
    p.ctl_r
        .inject(error_completion(p.qpn(false, 0), WcStatus::RetryExcErr));
    pump_until(&mut p, &mut flow, Duration::from_secs(10), "refusal", |p| {
        matches!(p.send.link.phase, Phase::Normal) && p.send.stats().plans_aborted == 1
    });
    assert_eq!((p.send.link.active, p.send.link.epoch), (1, 1));
    assert_eq!(p.recv.stats().plans_aborted, 1);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    pump_until(&mut p, &mut flow, Duration::from_secs(30), "return", |p| {
        settled_on(p, 0) && p.send.stats().returns == 1
    });
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!(p.recv.duplicates(), 0);
}

/// A receiver waiting for the path it leaves to drain abandons the plan when its target fails
/// (and says so), and when the drain does not come within the failover deadline; traffic
/// stays where it is.
#[test]
fn a_receiver_waiting_to_switch_abandons_on_a_target_failure_and_on_its_deadline() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(cfg());
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    // A request naming sends that will never come: the receiver waits.
    let ask = |p: &Pair| CtrlMsg {
        kind: CtrlKind::PlanReq,
        epoch: p.recv.link.epoch,
        a: p.recv.machine.delivered() + 1_000,
        b: 1,
        endpoint: Vec::new(),
    };
    let m = ask(&p);
    p.recv.on_ctrl(m);
    assert!(p.recv.link.planned().is_some());
    p.recv.pump();
    assert!(
        p.recv.link.planned().is_some(),
        "switched without the drain"
    );
    p.ctl
        .inject(error_completion(p.qpn(false, 1), WcStatus::RetryExcErr));
    pump_until(&mut p, &mut flow, Duration::from_secs(10), "abandon", |p| {
        p.recv.link.planned().is_none()
    });
    assert_eq!(p.recv.stats().plans_aborted, 1);
    assert_eq!((p.recv.link.active, p.recv.link.epoch), (0, 0));
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    // Re-armed, asked again: this time nothing drains until the deadline.
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "re-arm", |p| {
        rearmed(p, 1)
    });
    let m = ask(&p);
    p.recv.on_ctrl(m);
    // The deadline counts ticks that came in time (a late tick restarts it): bounded
    // generously for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(60);
    while p.recv.link.planned().is_some() {
        assert!(Instant::now() < deadline, "never abandoned");
        p.recv.pump();
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(p.recv.stats().plans_aborted, 2);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!((p.send.link.active, p.send.link.epoch), (0, 0));
}

/// Clear-to-sends are signaled one in eight (no completion to poll per message, as NCCL's IB
/// transport does); the others stay in flight on their path until a later completion covers
/// them. A planned switch waits for nothing in flight on the path left: when the receiver's
/// last post there is an unsignaled clear-to-send and nothing else is posted (no traffic while
/// the switch is due), a probe behind it must say when it completed, or the plan never
/// finishes (it was refused at its deadline before the probe was posted).
#[test]
fn a_planned_switch_covers_an_unsignaled_clear_to_send_with_a_probe() {
    let _l = TEST_LOCK.read();
    let stats = stats_path("cts-cover");
    let hold = Duration::from_secs(2);
    let (mut p, mut flow) = failed_over_and_rearmed(home_cfg(hold), stats.to_str().unwrap());
    let (sig0, unsig0) = (
        p.ctl_r
            .cts_signaled
            .load(std::sync::atomic::Ordering::Relaxed),
        p.ctl_r
            .cts_unsignaled
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    assert!(
        unsig0 > 0 && sig0 > 0,
        "signaled {sig0}, unsignaled {unsig0}"
    );
    // One in eight by sequence number; a failover re-posts the open ones (each signaled as
    // its number says), so a few more than an eighth may be signaled.
    let total = sig0 + unsig0;
    assert!(
        sig0 * 4 <= total,
        "{sig0} of {total} clear-to-sends signaled, expected about one in eight"
    );
    // Each is one receive's: a WRITE of its entry and the two tail words only (protocol 8).
    let lens = p.ctl_r.cts_lens.lock().clone();
    assert_eq!(
        lens,
        std::collections::HashMap::from([(48, total)]),
        "clear-to-sends by WRITE length"
    );
    // Traffic stops with an unsignaled clear-to-send last on path 1.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(settled_on(&p, 1) && p.recv.link.path(1).needs_cover()) {
        assert!(
            Instant::now() < deadline,
            "no unsignaled clear-to-send last"
        );
        flow.step(&mut p).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while !settled_on(&p, 0) {
        assert!(
            Instant::now() < deadline,
            "no return home while an unsignaled clear-to-send was last on the path left \
             (plans aborted: send {}, recv {})",
            p.send.stats().plans_aborted,
            p.recv.stats().plans_aborted
        );
        p.send.pump();
        p.recv.pump();
        std::thread::sleep(Duration::from_millis(1));
    }
    for (who, s) in [("send", p.send.stats()), ("recv", p.recv.stats())] {
        assert_eq!((s.returns, s.plans_aborted), (1, 0), "{who}");
    }
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
}
